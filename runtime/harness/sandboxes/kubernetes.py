"""The kubernetes sandbox: one Pod per rollout plus a NetworkPolicy that lets it reach only the proxy and DNS.

The Pod (`sleep infinity` in the pool's image, runtimeClassName/resources/nodeSelector from the pool) is
ownerless — a runner restart must not delete it through garbage collection mid-rollout — but labelled with
the pool, runner and rollout, so a restarted runner reaps what its predecessor left (`start`) and `shutdown`
deletes everything still open. `activeDeadlineSeconds` bounds a Pod whose runner died before reaping it.
Commands run through the exec API (the official client's websocket stream) under coreutils `timeout`; after
every command `kill -9 -1` in the container ends whatever the harness left running.

The grader runs in a Pod of its own (`KubernetesSandbox.grade`): the rollout Pod's manifest (image, security,
fresh volumes) under a NetworkPolicy that allows nothing. Once the rollout Pod's processes are gone, its workspace
is packed there and carried over through exec, and the task's tests written fresh; nothing else of the rollout Pod
(its HOME, root filesystem, /tmp, processes) reaches the grader. The grader Pod is deleted by name when grading
ends. (Its one container also runs the candidate's code that a verifier runs: the chart's admission policy allows
sandbox Pods no second or init container, and the Pod can neither nest namespaces nor switch users.)

Each Pod (and its NetworkPolicy) is named `<run>.<pool>.<id>` (the config's name_prefix and a random id) and
labelled `harnessrl.io/sandbox: <id>` (a label value holds at most 63 characters; the name may be longer): the
chart's admission policy lets a runner exec only into Pods named with its own prefix, so the name is what makes a
grader or rollout Pod its own, and the learner, proxy, engine and other runs' sandboxes out of its reach.

Tasks from an OCI image are mounted into the runner's own pod (an image volume rendered by the operator) and
read as a directory there; the task files travel into the sandbox Pod through exec.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import secrets
import select
import shlex
import ssl
import time
from dataclasses import dataclass
from typing import Any

from harnessrl.runtime.contracts.kubernetes import RESTRICTED_CONTAINER, restricted_pod, tcp_ports
from harnessrl.runtime.contracts.runner_config import KubernetesSandboxConfig
from harnessrl.runtime.harness.sandboxes import remote
from harnessrl.runtime.harness.sandboxes.base import (
    OUTPUT_LIMIT,
    ExecResult,
    GradeResult,
    SandboxError,
    SandboxProvider,
    graded,
    verifier_env,
)
from harnessrl.runtime.harness.tasks import Task

log = logging.getLogger(__name__)

LABEL_MANAGED = "app.kubernetes.io/managed-by"
LABEL_POOL = "harnessrl.io/pool"
LABEL_RUNNER = "harnessrl.io/runner"
LABEL_ROLLOUT = "harnessrl.io/rollout"
LABEL_SANDBOX = "harnessrl.io/sandbox"
CONTAINER = "sandbox"
HOME = "/home/agent"
TESTS = "/tests"
LOGS = "/logs"
# Slack on top of the harness and grader timeouts before the kubelet kills an abandoned Pod.
DEADLINE_SLACK_S = 600
# The tails of a command's output the runner keeps (a file read back in base64 fits stdout's).
STDOUT_LIMIT = max(OUTPUT_LIMIT, remote.MAX_INLINE_BYTES * 4)
STDERR_LIMIT = 64 * 1024
STATUS_LIMIT = 64 * 1024  # the error channel's Status JSON
# The largest workspace (gzip tarball) carried into a grader Pod, and the chunk read per exec (its base64 fits stdout).
WORKSPACE_LIMIT = 64 * 1024 * 1024
CHUNK = 256 * 1024


def label_value(value: str) -> str:
    """A valid label value (≤ 63 chars of [A-Za-z0-9-_.], alphanumeric at both ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", value)[:63].strip("-_.")
    return cleaned or "x"


def sandbox_labels(config: KubernetesSandboxConfig, pool: str, runner_id: str, rollout_id: str, sandbox_id: str) -> dict[str, str]:
    return {
        **config.labels,
        LABEL_MANAGED: "harnessrl",
        LABEL_POOL: label_value(pool),
        LABEL_RUNNER: label_value(runner_id),
        LABEL_ROLLOUT: label_value(rollout_id),
        LABEL_SANDBOX: sandbox_id,
    }


def owner_selector(pool: str, runner_id: str) -> str:
    return f"{LABEL_MANAGED}=harnessrl,{LABEL_POOL}={label_value(pool)},{LABEL_RUNNER}={label_value(runner_id)}"


def pod_manifest(config: KubernetesSandboxConfig, name: str, labels: dict[str, str], deadline_s: int) -> dict[str, Any]:
    mounts = {"workspace": config.workdir, "home": HOME, "tests": TESTS, "logs": LOGS}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": config.image,
        "command": ["sleep", "infinity"],
        "workingDir": config.workdir,
        "env": [{"name": "HOME", "value": HOME}, {"name": "LOGS_DIR", "value": LOGS}],
        "volumeMounts": [{"name": vol, "mountPath": path} for vol, path in mounts.items()],
        "securityContext": RESTRICTED_CONTAINER,
    }
    resources = {k: v for k, v in config.resources.model_dump().items() if v}
    if resources:
        container["resources"] = resources
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 0,
        "activeDeadlineSeconds": deadline_s,
        "securityContext": restricted_pod(config.run_as_user),  # it runs the policy's commands, never as root
        "containers": [container],
        "volumes": [{"name": vol, "emptyDir": {}} for vol in mounts],
    }
    if config.runtime_class_name:
        spec["runtimeClassName"] = config.runtime_class_name
    if config.service_account_name:
        spec["serviceAccountName"] = config.service_account_name
    if config.node_selector:
        spec["nodeSelector"] = dict(config.node_selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": config.namespace, "labels": labels},
        "spec": spec,
    }


def own_selector(config: KubernetesSandboxConfig, labels: dict[str, str]) -> dict[str, Any]:
    """One sandbox's Pod by its id and its run's labels: the id is the runner's to choose (the admission policy
    holds only the run and pool labels), so an id alone would let a runner put its Pod under another run's policy."""
    return {"matchLabels": {k: labels[k] for k in (*config.labels, LABEL_SANDBOX)}}


def grader_network_policy_manifest(config: KubernetesSandboxConfig, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """The grader reaches nothing and nothing reaches it."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": config.namespace, "labels": labels},
        "spec": {"podSelector": own_selector(config, labels), "policyTypes": ["Ingress", "Egress"],
                 "ingress": [], "egress": []},
    }


def network_policy_manifest(config: KubernetesSandboxConfig, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """Deny all ingress; allow egress only to the proxy's pods on its ports, and to cluster DNS."""
    proxy_peer: dict[str, Any] = {"podSelector": {"matchLabels": dict(config.proxy_pod_labels)}}
    if config.proxy_namespace:
        proxy_peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": config.proxy_namespace}}
    dns_peer = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": config.namespace, "labels": labels},
        "spec": {
            "podSelector": own_selector(config, labels),
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [
                {"to": [proxy_peer], "ports": [tcp_ports(config.proxy_port, config.proxy_end_port)]},
                {"to": [dns_peer], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
            ],
        },
    }


def exit_code(status: str | None) -> int | None:
    """The exit code in the Status the server sends on the error channel (3) when the command ends; None when the
    stream ended without one (a dropped connection)."""
    try:
        parsed = json.loads(status or "null")
        if parsed is None:
            return None
        if parsed.get("status") == "Success":
            return 0
        return int(parsed["details"]["causes"][0]["message"])
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


class Tail:
    """The last `limit` bytes of a stream, kept as it comes: at most twice that (and one frame) in memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> None:
        self.parts.append(data)
        self.size += len(data)
        if self.size > 2 * self.limit:
            kept = b"".join(self.parts)[-self.limit:]
            self.parts, self.size = [kept], len(kept)

    def text(self) -> str:
        return b"".join(self.parts)[-self.limit:].decode("utf-8", "replace")


@dataclass
class ExecStream:
    """What one exec's stream brought: the tails of stdout and stderr, the Status JSON, whether it timed out."""

    stdout: Tail
    stderr: Tail
    status: bytes = b""
    timed_out: bool = False


def read_exec(ws: Any, deadline: float, output: ExecStream) -> None:
    """Read the exec's frames (the channel protocol: a channel byte, then data) until the server closes the stream
    or `deadline` (monotonic) passes, one frame at a time, keeping only the tails of stdout and stderr. The
    client's own `update` will not do: it reads every frame already available before it returns, into a buffer
    per channel and a second copy of all output, so a harness that prints without end held the runner's memory
    without end, and its deadline with it."""
    from kubernetes.stream.ws_client import ERROR_CHANNEL, STDERR_CHANNEL, STDOUT_CHANNEL
    from websocket import ABNF

    sock = ws.sock
    while sock.connected:
        if time.monotonic() > deadline:
            output.timed_out = True
            return
        # A TLS socket may hold decrypted frames that select() cannot see.
        pending = isinstance(sock.sock, ssl.SSLSocket) and sock.sock.pending()
        if not pending and not select.select([sock.sock], [], [], 1.0)[0]:
            continue
        opcode, frame = sock.recv_data_frame(True)
        if opcode == ABNF.OPCODE_CLOSE:
            return
        data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode()
        if opcode not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) or len(data) < 2:
            continue
        channel, payload = data[0], data[1:]
        if channel == STDOUT_CHANNEL:
            output.stdout.add(payload)
        elif channel == STDERR_CHANNEL:
            output.stderr.add(payload)
        elif channel == ERROR_CHANNEL and len(output.status) < STATUS_LIMIT:
            output.status += payload


class Unpackable(Exception):
    """The workspace cannot be carried to a grader Pod (a grade failure)."""


class KubernetesSandbox(remote.RemoteShellSandbox):
    def __init__(self, provider: KubernetesProvider, name: str, rollout_id: str) -> None:
        self.provider = provider
        self.name = name
        self.rollout_id = rollout_id
        self.home = HOME
        self.workspace = provider.config.workdir
        self.tests_dir = TESTS
        self.logs_dir = LOGS
        self._closed = False

    async def grade(self, task: Task, timeout_s: float) -> GradeResult:
        """test.sh in a Pod of its own, the rollout Pod's twin with no network: nothing of this Pod reaches it but
        its workspace, copied over once its processes are gone; its HOME, root filesystem, tests and reward
        directory are fresh."""
        try:
            packed = await self.pack(self.workspace)
        except Unpackable as exc:
            return GradeResult(grade=None, output="", error=str(exc))
        grader = await self.provider.open_grader(self.rollout_id)
        try:
            await grader.put_tests(task)
            await grader.unpack(packed, grader.workspace)
            env = {**verifier_env(task, grader), "PYTHONNOUSERSITE": "1"}
            res = await grader.run(["bash", f"{TESTS}/test.sh"], env, timeout_s)
            txt = await grader.read_file(f"{LOGS}/verifier/reward.txt")
            js = await grader.read_file(f"{LOGS}/verifier/reward.json")
        finally:
            await grader.close()
        return graded(res, timeout_s, txt, js)

    async def pack(self, directory: str) -> bytes:
        """A directory of this Pod as a gzip tarball, read in chunks that fit an exec's output. Raises Unpackable
        when what the harness left cannot be packed or is over WORKSPACE_LIMIT: the candidate's failure, not the
        sandbox's."""
        res = await self._sh(remote.pack_line(directory), 300)
        if res.exit_code != 0:
            raise Unpackable(f"packing the workspace failed: {res.stderr[-300:]}")
        path, size_text = res.stdout.split()[:2]
        size = int(size_text)
        try:
            if size > WORKSPACE_LIMIT:
                raise Unpackable(f"the packed workspace is over the {WORKSPACE_LIMIT} bytes a grader pod takes")
            chunks = []
            for offset in range(0, size, CHUNK):
                res = await self._check(remote.read_chunk_line(path, offset, CHUNK), 60, f"reading {directory}")
                chunks.append(base64.b64decode(res.stdout))
        finally:
            await self._sh(f"rm -f {shlex.quote(path)}", 60)
        data = b"".join(chunks)
        if len(data) != size:
            raise SandboxError(f"packing {directory}{self.where}: read {len(data)} of {size} bytes")
        return data

    async def unpack(self, data: bytes, dest: str) -> None:
        argv = ["sh", "-c", remote.unpack_line(len(data), dest)]
        res = await asyncio.to_thread(self.provider.exec, self.name, argv, 300, data)
        if res.exit_code != 0:
            raise SandboxError(f"unpacking into {dest}{self.where} failed: {res.stderr[-300:]}")

    async def _sh(self, line: str, timeout_s: float) -> ExecResult:
        return await asyncio.to_thread(self.provider.exec, self.name, ["sh", "-c", line], timeout_s)

    @property
    def where(self) -> str:
        return f" in pod {self.name}"

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self.provider.delete, self.name)
        self.provider.open_sandboxes.pop(self.name, None)


class KubernetesProvider(SandboxProvider):
    def __init__(
        self, config: KubernetesSandboxConfig, pool: str, runner_id: str, api_client: Any | None = None,
        deadline_s: int = 4 * 3600,
    ) -> None:
        """`deadline_s`: the longest a rollout may take (harness + grader); the Pod's activeDeadlineSeconds adds
        slack to it."""
        from kubernetes import client as k8s

        if api_client is None:
            api_client = self._load_client(config)
        self.config = config
        self.pool = pool
        self.runner_id = runner_id
        self.core = k8s.CoreV1Api(api_client)
        self.net = k8s.NetworkingV1Api(api_client)
        self.deadline_s = deadline_s + DEADLINE_SLACK_S
        self.open_sandboxes: dict[str, KubernetesSandbox] = {}

    @staticmethod
    def _load_client(config: KubernetesSandboxConfig) -> Any:
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config

        if config.kubeconfig is not None:
            return k8s_config.new_client_from_config(config_file=str(config.kubeconfig))
        try:
            k8s_config.load_incluster_config()
        except k8s_config.ConfigException:
            k8s_config.load_kube_config()
        return k8s.ApiClient()

    # -- API calls (blocking; called through asyncio.to_thread) -------------------------------------------

    def create(self, rollout_id: str, grader: bool = False) -> str:
        """A rollout's Pod and NetworkPolicy, or a grader's (the same Pod; no network)."""
        from kubernetes.client.exceptions import ApiException

        sandbox_id = secrets.token_hex(8)
        name = self.config.name_prefix + sandbox_id
        labels = sandbox_labels(self.config, self.pool, self.runner_id, rollout_id, sandbox_id)
        ns = self.config.namespace
        policy = (grader_network_policy_manifest if grader else network_policy_manifest)(self.config, name, labels)
        try:
            # The policy first: the Pod must never run unrestricted, even for a moment.
            self.net.create_namespaced_network_policy(ns, policy)
            self.core.create_namespaced_pod(ns, pod_manifest(self.config, name, labels, self.deadline_s))
        except ApiException as exc:
            self.delete(name)
            raise SandboxError(f"creating sandbox {name}: {exc.status} {exc.reason}") from exc
        return name

    def wait_running(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        deadline = time.monotonic() + self.config.pod_start_timeout_s
        while time.monotonic() < deadline:
            try:
                pod = self.core.read_namespaced_pod(name, self.config.namespace)
            except ApiException as exc:
                raise SandboxError(f"sandbox pod {name}: {exc.status} {exc.reason}") from exc
            phase = pod.status.phase if pod.status else None
            if phase == "Running":
                return
            if phase in ("Failed", "Succeeded"):
                raise SandboxError(f"sandbox pod {name} ended ({phase}) before it ran anything")
            time.sleep(0.5)
        raise SandboxError(f"sandbox pod {name} not running after {self.config.pod_start_timeout_s:.0f}s")

    def exec(self, name: str, argv: list[str], timeout_s: float, stdin: bytes = b"") -> ExecResult:
        """Run argv in the Pod's container; `stdin`, when given, is written to it first (the command reads no more
        than it is told: the stream's stdin is never closed)."""
        from kubernetes.stream import stream

        try:
            ws = stream(
                self.core.connect_get_namespaced_pod_exec, name, self.config.namespace, container=CONTAINER,
                command=argv, stdin=bool(stdin), stdout=True, stderr=True, tty=False, _preload_content=False,
            )
        except Exception as exc:  # the client raises ApiException or websocket errors
            raise SandboxError(f"exec in pod {name} failed: {exc}") from exc
        output = ExecStream(Tail(STDOUT_LIMIT), Tail(STDERR_LIMIT))
        try:
            for offset in range(0, len(stdin), 1 << 20):
                ws.write_stdin(stdin[offset:offset + (1 << 20)])
            read_exec(ws, time.monotonic() + timeout_s, output)
        except Exception as exc:  # websocket errors: the stream broke under the command
            raise SandboxError(f"exec in pod {name} failed: {exc}") from exc
        finally:
            ws.close()
        code = None if output.timed_out else exit_code(output.status.decode("utf-8", "replace"))
        if code is None and not output.timed_out:
            raise SandboxError(f"exec in pod {name}: the connection ended without the command's exit status")
        return ExecResult(exit_code=code if code is not None else -1, stdout=output.stdout.text(),
                          stderr=output.stderr.text(), timed_out=output.timed_out)

    def delete(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        ns = self.config.namespace
        for call in (
            lambda: self.core.delete_namespaced_pod(name, ns, grace_period_seconds=0),
            lambda: self.net.delete_namespaced_network_policy(name, ns),
        ):
            try:
                call()
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("deleting sandbox %s: %s %s", name, exc.status, exc.reason)

    def reap(self) -> int:
        """Delete every sandbox Pod and NetworkPolicy labelled as this runner's."""
        selector = owner_selector(self.pool, self.runner_id)
        ns = self.config.namespace
        names = {p.metadata.name for p in self.core.list_namespaced_pod(ns, label_selector=selector).items}
        names |= {n.metadata.name for n in self.net.list_namespaced_network_policy(ns, label_selector=selector).items}
        for name in names:
            self.delete(name)
        return len(names)

    # -- SandboxProvider ----------------------------------------------------------------------------------

    async def start(self) -> None:
        reaped = await asyncio.to_thread(self.reap)
        if reaped:
            log.info("reaped %d sandboxes left by an earlier runner", reaped)

    async def open(self, rollout_id: str, task: Task) -> KubernetesSandbox:
        sandbox = await self.running(rollout_id, grader=False)
        try:
            if task.environment_dir.is_dir():
                await sandbox.put_dir(remote.tar_b64(task.environment_dir), sandbox.workspace)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def open_grader(self, rollout_id: str) -> KubernetesSandbox:
        """A fresh Pod, with no network, to grade one rollout in."""
        return await self.running(rollout_id, grader=True)

    async def running(self, rollout_id: str, grader: bool) -> KubernetesSandbox:
        name = await asyncio.to_thread(self.create, rollout_id, grader)
        sandbox = KubernetesSandbox(self, name, rollout_id)
        self.open_sandboxes[name] = sandbox
        try:
            await asyncio.to_thread(self.wait_running, name)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def shutdown(self) -> None:
        for sandbox in list(self.open_sandboxes.values()):
            await sandbox.close()
        await asyncio.to_thread(self.reap)
