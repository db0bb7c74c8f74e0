"""`make cluster-check`: the quickstart's children, rendered by the operator's code, started as containers.

Run inside a network namespace of its own (checks/cluster-check.sh: `unshare --net`), where the podman network it
creates lives: every Pod gets an address there, every ClusterIP Service an address of its own on which a forwarder
container relays each port to the selected Pod (so a process that binds its Service's address fails, as on a
cluster), and headless Services give StatefulSet Pods their DNS names. Pods whose image is not built are reported,
not started. Every container and the network are removed at the end, by name.
"""

from __future__ import annotations

import argparse
import copy
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # after the standard library: the repo root has a folder named `operator`

import yaml  # noqa: E402
from harnessrl.operator.api.harnesspool import HarnessPoolSpec  # noqa: E402
from harnessrl.operator.api.trainingrun import DEFAULT_ENGINE_IMAGE, TrainingRunSpec  # noqa: E402
from harnessrl.operator.kube import Owner, proxy, render  # noqa: E402
from harnessrl.operator.kube import learner as learner_kube  # noqa: E402
from harnessrl.operator.plan import build_plan  # noqa: E402
from harnessrl.operator.plan.placement import ClusterPlacement  # noqa: E402
from harnessrl.operator.plan.types import Images  # noqa: E402

from checks import podspec  # noqa: E402

Manifest = dict[str, Any]
NAMESPACE = "default"
RELAY = "localhost/harnessrl/proxy:0.1.0"  # the forwarders' image: any with Python
# The engine's default image is the CUDA vLLM image from a registry; here its CPU build (`make images`) runs instead.
IMAGES = {DEFAULT_ENGINE_IMAGE: "localhost/harnessrl/engine:0.1.0-cpu"}
SUBNET = "10.89.7"  # pods from .10, Service addresses from .100
FORWARD = """
import asyncio, sys
async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data); await w.drain()
    finally:
        w.close()
async def serve(port, host, target):
    async def one(r, w):
        try:
            tr, tw = await asyncio.open_connection(host, target)
        except OSError:
            w.close(); return
        await asyncio.gather(pipe(r, tw), pipe(tr, w))
    await (await asyncio.start_server(one, "0.0.0.0", port)).serve_forever()
async def main():
    await asyncio.gather(*(serve(int(p), sys.argv[1], int(t)) for p, t in (a.split(":") for a in sys.argv[2:])))
asyncio.run(main())
"""


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=check)


def rendered(example: Path, images: Images) -> list[Manifest]:
    """The run's children as the operator writes them, with the two token Secrets it generates."""
    docs = list(yaml.safe_load_all(example.read_text()))
    pools = {d["metadata"]["name"]: HarnessPoolSpec.model_validate(d["spec"]) for d in docs if d["kind"] == "HarnessPool"}
    run = next(d for d in docs if d["kind"] == "TrainingRun")
    name = run["metadata"]["name"]
    plan = build_plan(name, NAMESPACE, TrainingRunSpec.model_validate(run["spec"]), pools, ClusterPlacement(NAMESPACE),
                      images)
    owner = Owner(name=name, uid="cluster-check")
    return [*render(plan, owner), proxy.admin_secret(plan, owner, secrets.token_urlsafe(24)),
            learner_kube.runner_secret(plan, owner, secrets.token_urlsafe(24))]


def pods(manifests: list[Manifest]) -> list[tuple[str, Manifest, str | None]]:
    """(pod name, pod template (a copy), headless Service) of each workload: one Pod each (replica 0), a StatefulSet's with
    the claims of its volumeClaimTemplates (`<template>-<pod>`) among its volumes, as its controller adds them."""
    out = []
    for m in manifests:
        name = m["metadata"]["name"]
        if m["kind"] == "StatefulSet":
            pod, template = f"{name}-0", copy.deepcopy(m["spec"]["template"])
            template["spec"]["volumes"] = [*template["spec"].get("volumes", []), *(
                {"name": t["metadata"]["name"], "persistentVolumeClaim": {"claimName": f"{t['metadata']['name']}-{pod}"}}
                for t in m["spec"].get("volumeClaimTemplates") or [])]
            out.append((pod, template, m["spec"]["serviceName"]))
        elif m["kind"] in ("Deployment", "Job"):
            out.append((f"{name}-check", copy.deepcopy(m["spec"]["template"]), None))
    return out


class Check:
    def __init__(self, work: Path, claims: dict[str, Path], wait_s: float, images: dict[str, str]) -> None:
        self.work, self.claims, self.wait_s, self.images = work, claims, wait_s, images
        self.network = f"harnessrl-check-{os.getpid()}"
        self.started: list[str] = []
        self.failed = False

    def say(self, pod: str, what: str) -> None:
        print(f"cluster-check: {pod}: {what}", flush=True)

    def make_volume(self, pod: str, vol: podspec.Volume, fs_group: int | None) -> str:
        if vol.memory:
            return "tmpfs"
        where = self.work / pod / vol.name
        if vol.claim in self.claims:
            # A copy, as on a volume whose ownership the kubelet sets to the fsGroup (group-readable, recursively):
            # the sources here are the developer's own files (the tiny model's directory is 0700).
            shutil.copytree(self.claims[vol.claim], where)
            for path in [where, *where.rglob("*")]:
                os.chown(path, 0, fs_group if fs_group is not None else 0)
                path.chmod(path.stat().st_mode | (0o2070 if path.is_dir() else 0o040))
            return str(where)
        where.mkdir(parents=True)
        for f in vol.files:  # as a kubelet writes them: root's, the fsGroup's group, the rendered mode
            path = where / f.path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f.content)
            os.chown(path, 0, fs_group if fs_group is not None else 0)
            path.chmod(f.mode)
        if not vol.files:  # an emptyDir or a claim of its own: world-writable as a kubelet makes an emptyDir
            os.chown(where, 0, fs_group if fs_group is not None else 0)
            where.chmod(0o2777 if fs_group is not None else 0o777)
        else:
            where.chmod(0o755)
        return str(where)

    def run(self, manifests: list[Manifest]) -> None:
        by_kind: dict[str, list[Manifest]] = {}
        for m in manifests:
            by_kind.setdefault(m["kind"], []).append(m)
        config_maps = {m["metadata"]["name"]: m.get("data") or {} for m in by_kind.get("ConfigMap", [])}
        secret_objs = {m["metadata"]["name"]: podspec.secret_data(m) for m in by_kind.get("Secret", [])}
        workloads = pods(manifests)
        ips = {pod: f"{SUBNET}.{10 + i}" for i, (pod, _, _) in enumerate(workloads)}
        services = [s for s in by_kind.get("Service", []) if s["spec"].get("clusterIP") != "None"]
        service_ips = {s["metadata"]["name"]: f"{SUBNET}.{100 + i}" for i, s in enumerate(services)}
        hosts: dict[str, str] = {}
        for svc, ip in service_ips.items():
            for suffix in ("", f".{NAMESPACE}", f".{NAMESPACE}.svc", f".{NAMESPACE}.svc.cluster.local"):
                hosts[svc + suffix] = ip
        for pod, _, headless in workloads:
            if headless:
                for suffix in ("", f".{NAMESPACE}", f".{NAMESPACE}.svc", f".{NAMESPACE}.svc.cluster.local"):
                    hosts[f"{pod}.{headless}{suffix}"] = ips[pod]
        podman("network", "create", "--subnet", f"{SUBNET}.0/24", self.network)
        running: dict[str, tuple[str, Manifest]] = {}
        for pod, template, _ in workloads:
            spec = template["spec"]
            containers = [*(spec.get("initContainers") or []), *spec["containers"]]
            missing = sorted({c["image"] for c in containers if not built(c["image"])})
            for c in containers:
                c["image"] = self.images.get(c["image"], c["image"])
            for c in containers:  # the CPU build (`make images` tags it TAG-cpu) where the image itself is not built
                if c["image"] in missing and built(c["image"] + "-cpu"):
                    self.say(pod, f"{c['name']}: {c['image']} not built, its CPU build {c['image']}-cpu runs")
                    c["image"] += "-cpu"
            missing = sorted({c["image"] for c in containers if not built(c["image"])})
            if missing:
                self.say(pod, f"NOT RUN: image {', '.join(missing)} not built (make images)")
                continue
            if self.start_pod(pod, template, podspec.PodContext(
                    name=pod, namespace=NAMESPACE, ip=ips[pod], config_maps=config_maps, secrets=secret_objs), hosts):
                running[pod] = (ips[pod], template)
        forwarded = self.start_forwarders(services, service_ips, running)
        for pod, (ip, template) in running.items():
            self.await_ready(pod, ip, template)
        for svc, port in forwarded:
            self.reach(svc, port, running)
        for pod, (_, template) in running.items():  # what each Pod said, whatever became of it
            for c in template["spec"]["containers"]:
                self.logs(pod, f"{pod}-{c['name']}", 6)

    def start_pod(self, pod: str, template: Manifest, ctx: podspec.PodContext, hosts: dict[str, str]) -> bool:
        spec = template["spec"]
        fs_group = (spec.get("securityContext") or {}).get("fsGroup")
        try:
            dirs = {v.name: self.make_volume(pod, v, fs_group) for v in podspec.volumes(spec, ctx)}
        except podspec.UnsupportedSpec as exc:
            self.say(pod, f"FAILED: {exc}")
            self.failed = True
            return False
        first: str | None = None  # the Pod's first container: the others join its network namespace
        for kind, containers in (("init", spec.get("initContainers") or []), ("main", spec["containers"])):
            for c in containers:
                name = f"{pod}-{c['name']}"
                argv = podspec.run_argv(spec, c, ctx, name=name, network=self.network, volume_dirs=dirs, hosts=hosts,
                                        join=first)
                if kind == "main" and first is None:
                    first = name
                self.started.append(name)
                done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
                if done.returncode != 0:
                    self.say(pod, f"FAILED: podman run {c['name']}: {done.stderr.strip()[-400:]}")
                    self.failed = True
                    return False
                if kind == "init":
                    code = podman("wait", name, timeout=self.wait_s).stdout.strip()
                    self.say(pod, f"init container {c['name']} exited {code}")
                    if code != "0":
                        self.logs(pod, name)
                        self.failed = True
                        return False
                    podman("rm", name)  # its address is the Pod's: free it for the next container
                    self.started.remove(name)
        self.say(pod, f"started at {ctx.ip}")
        return True

    def start_forwarders(self, services: list[Manifest], service_ips: dict[str, str],
                         running: dict[str, tuple[str, Manifest]]) -> list[tuple[str, int]]:
        """A forwarder container on each Service's address for the Pod it selects; (Service, port) of each."""
        out = []
        relay = RELAY if built(RELAY) else None
        for svc in services:
            name = svc["metadata"]["name"]
            target = next(((ip, t) for pod, (ip, t) in running.items()
                           if podspec.selects(svc["spec"].get("selector") or {}, t["metadata"]["labels"])), None)
            if target is None or relay is None:
                self.say(f"Service {name}", f"{service_ips[name]}: no running Pod selected, no forwarder")
                continue
            ip, template = target
            ports = [f"{p['port']}:{podspec.service_target(svc, template['spec'], p)}" for p in svc["spec"]["ports"]]
            fwd = f"svc-{name}"
            self.started.append(fwd)
            podman("run", "-d", "--name", fwd, "--network", self.network, "--ip", service_ips[name], "--user",
                   "65534:65534", "--read-only", "--cap-drop", "ALL", "--entrypoint", "python3", relay, "-c", FORWARD,
                   ip, *ports)
            self.say(f"Service {name}", f"{service_ips[name]} forwards {', '.join(ports)} to {ip}")
            out += [(name, p["port"]) for p in svc["spec"]["ports"]]
        return out

    def reach(self, service: str, port: int, running: dict[str, tuple[str, Manifest]]) -> None:
        """An HTTP request from inside each running Pod to the Service by its DNS name: any answer means the name,
        its address and the forwarder reach the Pod behind it."""
        url = f"http://{service}.{NAMESPACE}.svc:{port}/"
        probe = f"import urllib.request as u, urllib.error as e\ntry: u.urlopen({url!r}, timeout=5)\nexcept e.HTTPError: pass"
        for pod, (_, template) in running.items():
            name = f"{pod}-{template['spec']['containers'][0]['name']}"
            if podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip() != "running":
                continue  # its exit is reported already
            done = podman("exec", name, "python3", "-c", probe, check=False, timeout=30)
            if done.returncode == 0:
                self.say(pod, f"reaches Service {service} ({url})")
            else:
                self.say(pod, f"FAILED: cannot reach Service {service} ({url}): {done.stderr.strip()[-300:]}")
                self.failed = True

    def await_ready(self, pod: str, ip: str, template: Manifest) -> None:
        deadline = time.monotonic() + self.wait_s
        for c in template["spec"]["containers"]:
            name, url = f"{pod}-{c['name']}", podspec.probe_url(c, ip)
            while True:
                state = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name).stdout.split()
                if state[0] != "running":
                    self.say(pod, f"FAILED: {c['name']} {state[0]} with status {state[1]}")
                    self.logs(pod, name)
                    self.failed = True
                    break
                if url is None and time.monotonic() > deadline:
                    self.say(pod, f"{c['name']} running after {self.wait_s:.0f} s (no readiness probe)")
                    break
                if url is not None and ready(url):
                    self.say(pod, f"{c['name']} ready ({url})")
                    break
                if url is not None and time.monotonic() > deadline:
                    self.say(pod, f"FAILED: {c['name']} not ready after {self.wait_s:.0f} s ({url})")
                    self.logs(pod, name)
                    self.failed = True
                    break
                time.sleep(2)

    def logs(self, pod: str, name: str, lines: int = 15) -> None:
        out = podman("logs", "--tail", str(lines), name, check=False)
        for line in (out.stdout + out.stderr).splitlines()[-lines:]:
            self.say(pod, f"  | {line}")

    def stop(self) -> None:
        for name in reversed(self.started):
            podman("rm", "-f", "-t", "5", name, check=False)
        podman("network", "rm", "-f", self.network, check=False)


def built(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return 200 <= resp.status < 400
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--example", type=Path, default=ROOT / "examples/quickstart/trainingrun.yaml")
    ap.add_argument("--claim", action="append", default=[], help="CLAIM=DIR: a claim's directory")
    ap.add_argument("--work", type=Path, required=True, help="where Pod volumes are made (emptied first)")
    ap.add_argument("--image", action="append", default=[], help="RENDERED=RUN: run another image in its place")
    ap.add_argument("--wait", type=float, default=120, help="seconds each Pod has to become ready")
    args = ap.parse_args()
    claims = {k: Path(v).resolve() for k, v in (c.split("=", 1) for c in args.claim)}
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    args.work.chmod(0o755)
    check = Check(args.work, claims, args.wait, IMAGES | dict(i.split("=", 1) for i in args.image))
    try:
        check.run(rendered(args.example, Images(registry="localhost/harnessrl", tag="0.1.0")))
    finally:
        check.stop()
    print(f"cluster-check: {'FAILED' if check.failed else 'every started Pod passed'}", flush=True)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
