"""`harnessrl run`: a TrainingRun on this machine, without a cluster (the embedded default).

The same Plan the operator turns into manifests is realised here as local processes: vLLM (the CPU build
where there is no GPU), the capture proxy, the learner with its coordinator, and one runner per HarnessPool
with the local sandbox. Everything the run writes lives in its run directory:

    RUN_DIR/plan.json          the rendered plan
    RUN_DIR/config/*.json      each component's config, as it reads it
    RUN_DIR/secrets/           the proxy admin and runner tokens (generated once), the Hub token (from --secret/env)
    RUN_DIR/logs/*.log         one log per component
    RUN_DIR/pids.json          the process id of each running component
    RUN_DIR/journal/           the proxy's captured turns
    RUN_DIR/checkpoints/       checkpoints, metrics.jsonl, eval.jsonl and tracking/ (TensorBoard's event files)

Running the same command again on the same run directory resumes: the proxy rebuilds its sessions from the
journal and the learner continues from its last checkpoint.

With `spec.engine.weightSync: restart` the engines are stopped and started on each policy the learner publishes
(RUN_DIR/checkpoints/sync/policy.json); with `lora` the learner hot-loads it, and loads it again into an
engine that restarted after a crash.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import time
from pathlib import Path

from harnessrl.local.gpus import CUDA_VISIBLE_DEVICES, engine_process, gpu_ids, learner_argv, visible_devices
from harnessrl.local.live import LiveView
from harnessrl.local.preflight import gpu_problem, sandbox_problem, volume_path, volume_problem
from harnessrl.local.supervisor import ProcessSpec, Supervisor, SupervisorError
from harnessrl.operator.api.common import VolumePath
from harnessrl.operator.api.harnesspool import HarnessPool
from harnessrl.operator.api.manifest import ManifestError, load_manifests
from harnessrl.operator.api.trainingrun import HubSource, TrainingRun, TrainingRunSpec
from harnessrl.operator.plan import build_plan
from harnessrl.operator.plan.memory import check_context, check_learner_memory
from harnessrl.operator.plan.placement import PATHS, Placement, eval_task_ids_file, validation_task_ids_file
from harnessrl.operator.plan.pools import pool_names
from harnessrl.operator.plan.types import Component, ComponentKind, Plan, PlanError
from harnessrl.runtime.contracts.engine_config import EngineConfig
from harnessrl.runtime.contracts.engine_launch import engine_argv, engine_env
from harnessrl.runtime.contracts.learner_config import LearnerConfig, SyncMode
from harnessrl.runtime.contracts.learner_memory import context_limit
from harnessrl.runtime.contracts.runner_config import LocalSandboxConfig, RunnerConfig
from harnessrl.runtime.engine.restart import PublishedPolicy, engine_on, read_published, sync_dir
from harnessrl.runtime.harness.tasks import SPLITS, Split, TaskError, load_dir, split_tasks
from harnessrl.runtime.learner.tracking import MODULES, missing
from harnessrl.runtime.ports import free_ports
from harnessrl.runtime.programs import python_module


class LocalRunError(RuntimeError):
    """The run cannot start here: the message says what to pass or fix."""


class LocalPlacement(Placement):
    """Components on 127.0.0.1, each on its own port; files under the run directory."""

    restarts_engines = True  # EngineRestarts, below

    def __init__(self, run_dir: Path, model_dir: Path, tasks_dir: Path, engine_replicas: int,
                 proxy_workers: int) -> None:
        self.run_dir = run_dir
        self.model_dir = model_dir
        self.tasks_dir = tasks_dir
        self.engine_ports = [free_ports() for _ in range(engine_replicas)]
        self.proxy_port = free_ports(1 + proxy_workers)  # its workers serve at the ports after it
        self.learner_port = free_ports()
        self.engine_port = self.engine_ports[0]

    def engine_url(self, run: str, replica: int) -> str:
        return f"http://127.0.0.1:{self.engine_ports[replica]}"

    def proxy_url(self, run: str) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    def coordinator_url(self, run: str) -> str:
        return f"http://127.0.0.1:{self.learner_port}"

    def path(self, what: str) -> str:
        files = {
            "config": self.run_dir / "config",
            "proxy-admin-token": self.run_dir / "secrets" / "proxy-admin-token",
            "runner-token": self.run_dir / "secrets" / "runner-token",
            "hub-token": self.run_dir / "secrets" / "hub-token",
            "base-model-token": self.run_dir / "secrets" / "base-model-token",
            "tasks-token": self.run_dir / "secrets" / "tasks-token",
            "e2b-api-key": self.run_dir / "secrets" / "e2b-api-key",
            "wandb-api-key": self.run_dir / "secrets" / "wandb-api-key",
            "mlflow-tracking-uri": self.run_dir / "secrets" / "mlflow-tracking-uri",
            "mlflow-token": self.run_dir / "secrets" / "mlflow-token",
            "trackio-token": self.run_dir / "secrets" / "trackio-token",
            "journal": self.run_dir / "journal",
            "checkpoints": self.run_dir / "checkpoints",
            "base-model": self.model_dir,
            "tasks": self.tasks_dir,
            "task-ids": self.run_dir / "task-ids.txt",
            "adapter-store-token": self.run_dir / "secrets" / "adapter-store-token",  # none here: no EnginePools
            "engine-api-key": self.run_dir / "secrets" / "engine-api-key",  # nor this
            "engine-env": self.run_dir / "secrets" / "engine-env",
        }
        assert set(files) == set(PATHS)
        return str(files[what])


def read_inputs(files: list[Path]) -> tuple[TrainingRun, dict[str, HarnessPool]]:
    """Exactly one TrainingRun and the HarnessPools it names, from any number of (multi-document) files."""
    runs: list[TrainingRun] = []
    pools: dict[str, HarnessPool] = {}
    for path in files:
        for resource in load_manifests(path):
            if isinstance(resource, TrainingRun):
                runs.append(resource)
            elif isinstance(resource, HarnessPool):
                pools[resource.metadata.name] = resource
            else:
                raise LocalRunError(f"{path}: EnginePool {resource.metadata.name}: EnginePools exist only in a "
                                    "cluster; `harnessrl run` starts the run's own engine")
    if len(runs) != 1:
        raise LocalRunError(f"expected exactly one TrainingRun in {', '.join(map(str, files))}, found {len(runs)}")
    return runs[0], pools


def resolve_volume(ref: VolumePath, volumes: dict[str, Path], what: str) -> Path:
    """A PVC path on this machine: `--volume CLAIM=DIR` says where the claim's files are."""
    problem = volume_problem(ref, volumes, what)
    if problem is not None:
        raise LocalRunError(problem)
    return volume_path(ref, volumes)


def resolve_model(run: TrainingRun, volumes: dict[str, Path], secret_files: dict[str, Path]) -> Path:
    base = run.spec.model.base
    if base.pvc is not None:
        return resolve_volume(base.pvc, volumes, "spec.model.base")
    assert base.hub is not None
    print(f"harnessrl: downloading {base.hub.repo}@{base.hub.revision} ...", flush=True)
    return hub_snapshot(base.hub, "model", "spec.model.base", secret_files)


def hub_snapshot(hub: HubSource, repo_type: str, what: str, secret_files: dict[str, Path]) -> Path:
    """A Hub repository's files (downloaded or cached), or a LocalRunError saying what is missing and how to
    provide it: no network, no token, no such repository or revision. With a tokenSecret, the token is the
    --secret file given for it (else HF_TOKEN or `hf auth login`, as huggingface_hub finds them)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, revision = hub.repo, hub.revision
    token = secret_text(hub.token_secret.name, hub.token_secret.key, secret_files) if hub.token_secret else None
    where = f"{what}: the {repo_type} {repo}@{revision} on {constants.ENDPOINT}"
    give_token = (f"check that Secret {hub.token_secret.name!r} holds a token that can read it" if hub.token_secret
                  else f"name a Secret in {what}.hub.tokenSecret and pass --secret NAME=FILE (or set HF_TOKEN)")
    instead = "or use a pvc source and --volume CLAIM=DIR"
    try:
        return Path(snapshot_download(repo_id=repo, repo_type=repo_type, revision=revision, token=token))
    except GatedRepoError:
        raise LocalRunError(f"{where} is gated: accept its terms on the Hub and {give_token}") from None
    except RepositoryNotFoundError:
        raise LocalRunError(f"{where} does not exist or is private: check the id, or {give_token}, {instead}") from None
    except RevisionNotFoundError:
        raise LocalRunError(f"{where}: no such revision (a branch, tag or commit of the repository)") from None
    except LocalEntryNotFoundError:
        raise LocalRunError(f"{where} cannot be downloaded (no network?) and is not in the Hugging Face cache: "
                            f"download it where there is a network (`hf download {repo} --repo-type {repo_type}`), "
                            f"{instead}") from None
    except HfHubHTTPError as exc:
        if exc.response is not None and exc.response.status_code in (401, 403):
            raise LocalRunError(f"{where} needs a token that can read it: {give_token}, {instead}") from None
        raise LocalRunError(f"{where} cannot be downloaded: {str(exc).strip().splitlines()[0]}") from None
    except OSError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LocalRunError(f"{where} cannot be downloaded: {first}") from None


def resolve_tasks(run: TrainingRun, volumes: dict[str, Path], secret_files: dict[str, Path]) -> Path:
    tasks = run.spec.tasks
    if tasks.pvc is not None:
        return resolve_volume(tasks.pvc, volumes, "spec.tasks")
    if tasks.hub is not None:
        return hub_snapshot(tasks.hub, "dataset", "spec.tasks", secret_files)
    raise LocalRunError("spec.tasks.image needs a cluster; on one machine use a pvc source with --volume CLAIM=DIR")


def write_task_ids(tasks_dir: Path, split: str, limit: int | None, out: Path, what: str = "spec.tasks") -> int:
    """The ids of a split (sorted, at most `limit`) for the learner: `what` is the spec field asking for them."""
    splits: dict[str, Split] = {s: s for s in SPLITS}
    if split not in splits:
        raise LocalRunError(f"{what} split {split!r}: Harbor-format task sets here have splits {', '.join(SPLITS)}")
    try:
        chosen = sorted(split_tasks(load_dir(tasks_dir), splits[split]))
    except TaskError as exc:
        raise LocalRunError(f"{what}: {exc}") from None
    if limit is not None:
        chosen = chosen[:limit]
    if not chosen:
        raise LocalRunError(f"{what}: no task in split {split!r} under {tasks_dir}")
    out.write_text("".join(f"{tid}\n" for tid in chosen))
    return len(chosen)


def write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value)


def prepare_secrets(plan: Plan, placement: LocalPlacement, secret_files: dict[str, Path]) -> None:
    """The proxy admin token and the runner token are generated once per run directory; other Secrets come from
    --secret NAME=FILE, or --secret NAME/KEY=FILE for one key of a Secret whose keys differ."""
    generated = {plan.proxy_admin_secret: "proxy-admin-token", plan.runner_token_secret: "runner-token"}
    for what in generated.values():
        path = Path(placement.path(what))
        if not path.exists():
            write_secret(path, secrets.token_urlsafe(32))
    # Every file, not one per Secret: one Secret may serve several (the Hub token of the export and of trackio).
    needed = {s.path: s for c in plan.components() for s in c.secrets if s.secret not in generated}
    for ref in needed.values():
        write_secret(Path(ref.path), secret_text(ref.secret, ref.key, secret_files))


def secret_text(secret: str, key: str, secret_files: dict[str, Path]) -> str:
    """One key of a Secret, from the file `--secret NAME/KEY=FILE` (or `--secret NAME=FILE`) names."""
    flag = next((f for f in (f"{secret}/{key}", secret) if f in secret_files), None)
    if flag is None:
        raise LocalRunError(f"the run needs Secret {secret!r} (key {key!r}); pass --secret {secret}=FILE")
    try:
        return secret_files[flag].read_text().strip()
    except OSError as exc:
        raise LocalRunError(f"--secret {flag}={secret_files[flag]}: cannot read it ({exc.strerror})") from None


def check_trackers(spec: TrainingRunSpec) -> None:
    """The learner (this Python) must be able to import every tracker the spec reports to: said before anything
    is downloaded or started, not by a learner that fails at start."""
    absent = missing(name for name in spec.tracking.report_to if name != "none")
    if absent:
        raise LocalRunError(f"spec.tracking.reportTo lists {', '.join(absent)}, not installed here: "
                            f"pip install {' '.join(MODULES[name] for name in absent)}")


def local_config(component: Component) -> dict[str, object]:
    """A component's config as the plan rendered it, bound to loopback instead of all interfaces."""
    config = component.config_json()
    if "host" in config:
        config["host"] = "127.0.0.1"
    return config


def engine_specs(plan: Plan, run_dir: Path, policy: PublishedPolicy | None) -> list[ProcessSpec]:
    """One vLLM server per engine replica, on the base model or (weightSync restart) on the published policy."""
    assert plan.engine is not None  # build_plan gives every run its own engine on one machine
    engine = plan.engine.config
    assert isinstance(engine, EngineConfig)
    specs: list[ProcessSpec] = []
    devices = visible_devices(plan, gpu_ids(os.environ))
    for replica, url in enumerate(learner_config(plan).engine.urls):
        port = int(url.rsplit(":", 1)[1])
        replica_config = engine.model_copy(update={"host": "127.0.0.1", "port": port})
        if policy is not None:
            replica_config = engine_on(replica_config, policy)
        specs.append(
            ProcessSpec(
                name=f"engine-{replica}",
                argv=engine_argv(replica_config, python=sys.executable),
                # Variables from Secrets: prepare_secrets wrote each one's file from --secret.
                env=engine_env(replica_config) | {n: Path(f).read_text() for n, f in replica_config.secret_env.items()}
                | {CUDA_VISIBLE_DEVICES: devices[engine_process(replica)]},
                log=run_dir / "logs" / f"engine-{replica}.log",
                health_url=f"{url}/health",
                start_timeout_s=600.0,
            )
        )
    return specs


def published_policy(plan: Plan) -> PublishedPolicy | None:
    """With weightSync restart, the policy the learner last published (a resumed run starts its engines on it)."""
    learner = learner_config(plan)
    if learner.engine.sync != SyncMode.restart:
        return None
    return read_published(sync_dir(learner.checkpoint.dir))


class EngineRestarts:
    """weightSync restart: each policy the learner publishes is served by stopping the engines and starting
    them on it (the proxy already asks for it; calls in between fail as the engine's, and are not scored)."""

    def __init__(self, plan: Plan, run_dir: Path, supervisor: Supervisor, served: PublishedPolicy | None) -> None:
        self.plan, self.run_dir, self.supervisor = plan, run_dir, supervisor
        self.version = served.version if served is not None else 0

    def poll(self) -> None:
        policy = published_policy(self.plan)
        if policy is None or policy.version <= self.version:
            return
        print(f"harnessrl: policy v{policy.version} published; restarting the engine(s) on it", flush=True)
        for spec in engine_specs(self.plan, self.run_dir, policy):
            self.supervisor.replace(spec.name, spec)
        self.version = policy.version


def process_specs(plan: Plan, run_dir: Path, policy: PublishedPolicy | None = None) -> list[ProcessSpec]:
    """Engine replicas, proxy, learner, then runners: each waits for what it talks to."""
    logs, configs = run_dir / "logs", run_dir / "config"
    configs.mkdir(parents=True, exist_ok=True)
    specs = engine_specs(plan, run_dir, policy)
    for component in [plan.proxy, plan.learner, *plan.runners]:
        path = configs / f"{component.name}.json"
        config = local_config(component)
        path.write_text(json.dumps(config, indent=2) + "\n")
        health: str | None = None
        if component.kind in (ComponentKind.PROXY, ComponentKind.LEARNER):
            health = f"http://127.0.0.1:{config['port']}/healthz"
        learner = component.kind == ComponentKind.LEARNER
        specs.append(
            ProcessSpec(
                name=component.name,
                argv=learner_argv(component.gpus, path) if learner
                else python_module("harnessrl.cli", str(component.kind), "--config", str(path)),
                env={CUDA_VISIBLE_DEVICES: visible_devices(plan, gpu_ids(os.environ))[component.name]} if learner else {},
                log=logs / f"{component.name}.log",
                health_url=health,
                # Loading torch and the base model takes the learner a while on a busy CPU.
                start_timeout_s=300.0 if component.kind == ComponentKind.LEARNER else 120.0,
                finishes_run=component.kind == ComponentKind.LEARNER,
                done_on_clean_exit=component.kind == ComponentKind.RUNNER,
            )
        )
    return specs


def parse_mapping(items: list[str], flag: str) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise LocalRunError(f"{flag} takes NAME=PATH, got {item!r}")
        out[name] = Path(value).expanduser().resolve()
    return out


def check_before_downloads(run: TrainingRun, spec: TrainingRunSpec, pools: dict[str, HarnessPool],
                           volumes: dict[str, Path], secret_files: dict[str, Path], run_dir: Path) -> None:
    """Everything this machine can be asked before a download or a start, all problems at once: the pools, the
    volumes, the task split, the GPUs, the Secrets and the local sandbox. A plan made on stand-in paths names
    the Secrets and the runners the real one will (a path never changes what a plan needs)."""
    problems: list[str] = []
    found: dict[str, Path] = {}
    for ref, what in ((spec.model.base.pvc, "spec.model.base"), (spec.tasks.pvc, "spec.tasks")):
        problem = volume_problem(ref, volumes, what) if ref is not None else None
        if problem is not None:
            problems.append(problem)
        elif ref is not None:
            found[what] = volume_path(ref, volumes)
    if spec.tasks.image is not None:
        problems.append("spec.tasks.image needs a cluster; on one machine use a pvc source with --volume CLAIM=DIR")
    elif "spec.tasks" in found:
        try:
            write_task_ids(found["spec.tasks"], spec.tasks.split, spec.tasks.limit, run_dir / "task-ids.txt")
        except LocalRunError as exc:
            problems.append(str(exc))
    gpus = gpu_problem(spec, len(gpu_ids(os.environ)))
    problems += [gpus] if gpus else []
    absent = [name for name in pool_names(spec) if name not in pools]
    if absent:
        problems.append(f"the run names HarnessPool {', '.join(absent)}, defined in none of the files given: "
                        "add the file(s) that define them")
        raise LocalRunError("\n".join(problems))
    placement = LocalPlacement(run_dir, found.get("spec.model.base", run_dir / "model"),
                               found.get("spec.tasks", run_dir / "tasks"), spec.engine.replicas, spec.proxy.workers)
    plan = build_plan(run.metadata.name, "local", spec, {name: pool.spec for name, pool in pools.items()}, placement)
    generated = {plan.proxy_admin_secret, plan.runner_token_secret}
    for secret, key in sorted({(s.secret, s.key) for c in plan.components() for s in c.secrets if s.secret not in generated}):
        try:
            secret_text(secret, key, secret_files)
        except LocalRunError as exc:
            problems.append(str(exc))
    for runner in plan.runners:
        config = runner.config
        assert isinstance(config, RunnerConfig)
        sandbox = sandbox_problem(config.pool, config.sandbox) if isinstance(config.sandbox, LocalSandboxConfig) else None
        problems += [sandbox] if sandbox else []
    if problems:
        raise LocalRunError("\n".join(problems))


def plan_run(args: argparse.Namespace) -> tuple[Plan, LocalPlacement]:
    run, pools = read_inputs(args.files)
    spec = run.spec
    overrides = {name: value for name, value in (("steps", args.steps), ("seed", args.seed)) if value is not None}
    if overrides:
        spec = spec.model_copy(update={"grpo": spec.grpo.model_copy(update=overrides)})
    # Before any download: a run whose learner cannot fit its GPUs is refused as the operator refuses it.
    check_learner_memory(spec)
    check_trackers(spec)
    if spec.active_deadline_seconds is not None:
        print("harnessrl: spec.activeDeadlineSeconds applies in a cluster only; this run goes on until done or Ctrl-C",
              flush=True)
    volumes = parse_mapping(args.volume, "--volume")
    secret_files = parse_mapping(args.secret, "--secret")
    run_dir: Path = args.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    check_before_downloads(run, spec, pools, volumes, secret_files, run_dir)
    model_dir = resolve_model(run, volumes, secret_files)
    # vLLM refuses a context past the model's own positions: said before anything starts.
    config = model_dir / "config.json"
    check_context(spec.engine, context_limit(json.loads(config.read_text())) if config.is_file() else None, str(config))
    placement = LocalPlacement(run_dir, model_dir, resolve_tasks(run, volumes, secret_files),
                               spec.engine.replicas, spec.proxy.workers)
    plan = build_plan(
        run.metadata.name, "local", spec, {name: pool.spec for name, pool in pools.items()}, placement
    )
    n_tasks = write_task_ids(placement.tasks_dir, spec.tasks.split, spec.tasks.limit, Path(placement.path("task-ids")))
    if spec.eval is not None:  # the learner evaluates on this split during training (it applies the limit)
        eval_ids = Path(eval_task_ids_file(placement.path("task-ids")))
        write_task_ids(placement.tasks_dir, spec.eval.split, None, eval_ids, "spec.eval")
        if spec.eval.validation_split is not None:
            validation_ids = Path(validation_task_ids_file(placement.path("task-ids")))
            write_task_ids(placement.tasks_dir, spec.eval.validation_split, None, validation_ids,
                           "spec.eval.validationSplit")
    prepare_secrets(plan, placement, secret_files)
    (run_dir / "plan.json").write_text(plan.model_dump_json(indent=2) + "\n")
    print(
        f"harnessrl: run {plan.run}: {len(plan.runners)} harness pool(s) "
        f"({', '.join(r.harness or '?' for r in plan.runners)}), {n_tasks} {spec.tasks.split} tasks, "
        f"{spec.grpo.steps} steps; run directory {run_dir}",
        flush=True,
    )
    return plan, placement


def _stop_on_sigterm() -> None:
    """SIGTERM (a service manager, `timeout`, `kill`) stops the run as Ctrl-C does, so no component is orphaned."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def supervise(plan: Plan, run_dir: Path, live: bool) -> int:
    _stop_on_sigterm()
    supervisor = Supervisor(restart_budget=max(plan.restart_budget, 1), pid_file=run_dir / "pids.json")
    learner = learner_config(plan)
    view = LiveView(learner.metrics_file(), learner.eval_file(), local_coordinator(plan), live)
    served = published_policy(plan)
    restarts = EngineRestarts(plan, run_dir, supervisor, served) if learner.engine.sync == SyncMode.restart else None
    try:
        for spec in process_specs(plan, run_dir, served):
            print(f"harnessrl: starting {spec.name} (log: {spec.log})", flush=True)
            supervisor.start(spec)
        while not supervisor.check():
            if restarts is not None:
                restarts.poll()
            view.refresh()
            time.sleep(1.0)
        view.refresh(final=True)
        print(f"harnessrl: run {plan.run} finished; run directory {run_dir}", flush=True)
        return 0
    except KeyboardInterrupt:
        print("\nharnessrl: interrupted; stopping components (run again with the same --run-dir to resume)", flush=True)
        return 130
    except SupervisorError as exc:
        print(f"harnessrl run: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        supervisor.stop_all(say=lambda line: print(f"harnessrl: {line}", flush=True))


def learner_config(plan: Plan) -> LearnerConfig:
    config = plan.learner.config
    assert isinstance(config, LearnerConfig)
    return config


def local_coordinator(plan: Plan) -> str:
    return f"http://127.0.0.1:{local_config(plan.learner)['port']}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="harnessrl run", description="Run a TrainingRun on this machine.")
    parser.add_argument("files", nargs="+", type=Path, help="YAML files with one TrainingRun and its HarnessPools")
    parser.add_argument("--run-dir", type=Path, default=Path("runs/local"), help="where the run keeps its state")
    parser.add_argument("--volume", action="append", default=[], metavar="CLAIM=DIR",
                        help="where a PersistentVolumeClaim's files are on this machine")
    parser.add_argument("--secret", action="append", default=[], metavar="NAME[/KEY]=FILE",
                        help="the value of a Secret the run names (e.g. the Hub token), or of one of its keys")
    parser.add_argument("--steps", type=int, help="override spec.grpo.steps")
    parser.add_argument("--seed", type=int, help="override spec.grpo.seed (task order and the adapter's initial weights)")
    parser.add_argument("--no-live", action="store_true", help="print one progress line per step, no live view")
    args = parser.parse_args(argv)
    try:
        plan, _ = plan_run(args)
    except (LocalRunError, ManifestError, PlanError) as exc:
        for line in str(exc).splitlines():  # one line per problem found
            print(f"harnessrl run: {line}", file=sys.stderr)
        return 2
    return supervise(plan, args.run_dir.resolve(), live=not args.no_live and sys.stdout.isatty())
