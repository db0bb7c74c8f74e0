"""`harnessrl eval`: pass@1 of checkpoints on the held-out split under each harness pool, on this machine.

    harnessrl eval RUN_FILES... --checkpoint DIR|base [--checkpoint ...] --volume CLAIM=DIR --out DIR
                   [--split test] [--harness POOL ...] [--limit N] [--attempts K]

The TrainingRun's plan (operator/plan/) gives the engine, proxy and runner configs, realised as local
processes as `harnessrl run` does (harnessrl/local/run.py). The engine and proxy start once; for each checkpoint its
LoRA adapter is hot-loaded into the engine under its own name, the proxy is told to serve that name (PUT
/policy), and an eval coordinator (runtime/evaluation) hands every (task × pool × attempt) to the pools'
unmodified runners. Output, under --out: pass_at_1.txt (what is printed: the matrix, then each later checkpoint
paired with the first: McNemar test, tool calls on the tasks both solve), pass_at_1.csv, paired.csv, pass_at_1.png,
eval/<checkpoint>/results.json (every rollout's outcome), logs/. Re-running with the same --out reuses finished
checkpoints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import TypeVar

import httpx
from pydantic import BaseModel

from harnessrl.local.run import (
    LocalPlacement,
    LocalRunError,
    parse_mapping,
    prepare_secrets,
    process_specs,
    read_inputs,
    resolve_model,
    resolve_tasks,
)
from harnessrl.local.supervisor import ProcessSpec, Supervisor, SupervisorError
from harnessrl.operator.api.manifest import ManifestError
from harnessrl.operator.api.trainingrun import HarnessRef
from harnessrl.operator.plan import build_plan
from harnessrl.operator.plan.engine import VLLM_LORA_RANKS
from harnessrl.operator.plan.types import Plan, PlanError
from harnessrl.runtime.contracts.coordinator import PoolHarness
from harnessrl.runtime.contracts.engine_config import EngineConfig, LoraSettings
from harnessrl.runtime.contracts.proxy import PolicyState, ProxyClient
from harnessrl.runtime.engine.lora import LoraEndpointError, load_lora_adapter
from harnessrl.runtime.evaluation.config import EvalConfig
from harnessrl.runtime.evaluation.coordinator import EvalResults, EvalStatus
from harnessrl.runtime.evaluation.matrix import (
    build_matrix,
    format_paired,
    format_table,
    write_csv,
    write_paired_csv,
    write_png,
)
from harnessrl.runtime.evaluation.paired import paired_comparisons
from harnessrl.runtime.harness.tasks import TaskError, load_dir, split_tasks
from harnessrl.runtime.programs import python_module

BASE = "base"
_M = TypeVar("_M", bound=BaseModel)


class EvalRunError(RuntimeError):
    """The evaluation cannot start: the message says what to pass or fix."""


class Checkpoint(BaseModel):
    label: str
    adapter: Path | None  # None: the base model
    rank: int = 0
    policy_version: int = 0


class Setup(BaseModel):
    plan: Plan
    placement_out: Path
    coordinator_port: int
    proxy_url: str
    engine_urls: list[str]
    checkpoints: list[Checkpoint]
    task_ids: list[str]
    attempts: int
    split: str


LABELLED = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)=(.+)$")


def resolve_checkpoint(arg: str) -> Checkpoint:
    """`base`, a learner checkpoint root (with `latest`), a step dir (`step-N/policy/`), or an adapter dir; any
    of these as `LABEL=...` to name its column (two runs' checkpoints share step names)."""
    labelled = LABELLED.match(arg)
    if labelled:
        return resolve_checkpoint(labelled.group(3)).model_copy(update={"label": labelled.group(1)})
    if arg == BASE:
        return Checkpoint(label=BASE, adapter=None)
    path = Path(arg).expanduser().resolve()
    if not path.is_dir():
        raise EvalRunError(f"--checkpoint {arg}: no such directory (pass a checkpoint directory or 'base')")
    if (path / "latest").is_file():
        path = path / (path / "latest").read_text().strip()
    if (path / "policy" / "adapter_config.json").is_file():
        step_dir, adapter = path, path / "policy"
    elif (path / "adapter_config.json").is_file():
        step_dir, adapter = (path.parent if path.name == "policy" else path), path
    elif (path / "config.json").is_file() or (path / "policy" / "config.json").is_file():
        raise EvalRunError(
            f"--checkpoint {arg} holds full weights, not a LoRA adapter; evaluate it by pointing "
            "spec.model.base at it and passing --checkpoint base"
        )
    else:
        raise EvalRunError(f"--checkpoint {arg}: no LoRA adapter (adapter_config.json) in it or in its policy/")
    try:
        rank = int(json.loads((adapter / "adapter_config.json").read_text())["r"])
    except (ValueError, KeyError, TypeError) as exc:
        raise EvalRunError(f"--checkpoint {arg}: unreadable adapter_config.json ({exc})") from None
    version = 0
    if (step_dir / "meta.json").is_file():
        version = int(json.loads((step_dir / "meta.json").read_text()).get("policy_version", 0))
    return Checkpoint(label=step_dir.name, adapter=adapter, rank=rank, policy_version=version)


def resolve_checkpoints(args: list[str]) -> list[Checkpoint]:
    checkpoints = [resolve_checkpoint(a) for a in args]
    labels = [c.label for c in checkpoints]
    twice = sorted({x for x in labels if labels.count(x) > 1})
    if twice:
        raise EvalRunError(f"--checkpoint given twice for {', '.join(twice)}")
    return checkpoints


def with_lora_serving(plan: Plan, checkpoints: list[Checkpoint]) -> Plan:
    """The engine must serve adapters (of the largest rank given) even if the run syncs weights another way."""
    ranks = [c.rank for c in checkpoints if c.adapter is not None]
    assert plan.engine is not None  # build_plan gives every run its own engine on one machine
    engine = plan.engine.config
    assert isinstance(engine, EngineConfig)
    if not ranks:
        return plan
    fitting = [r for r in VLLM_LORA_RANKS if r >= max(ranks)]
    if not fitting:
        raise EvalRunError(f"LoRA rank {max(ranks)} is above vLLM's largest ({VLLM_LORA_RANKS[-1]})")
    rank = max(fitting[0], engine.lora.max_rank if engine.lora.enabled else 0)
    lora = LoraSettings.model_validate({**engine.lora.model_dump(), "enabled": True, "max_rank": rank})
    config = engine.model_copy(update={"lora": lora})
    return plan.model_copy(update={"engine": plan.engine.model_copy(update={"config": config})})


def select_tasks(tasks_dir: Path, split: str, limit: int | None) -> list[str]:
    if split not in ("train", "test"):
        raise EvalRunError(f"--split {split!r}: Harbor-format task sets have splits train and test")
    try:
        ids = sorted(split_tasks(load_dir(tasks_dir), "test" if split == "test" else "train"))
    except TaskError as exc:
        raise EvalRunError(f"tasks: {exc}") from None
    if not ids:
        raise EvalRunError(f"no task in split {split!r} under {tasks_dir}")
    return ids[:limit] if limit is not None else ids


def prepare(args: argparse.Namespace) -> Setup:
    run, pools = read_inputs(args.files)
    spec = run.spec
    defaults = spec.eval
    chosen: list[str] = args.harness or (defaults.harnesses if defaults else []) or [h.pool for h in spec.harnesses]
    missing = [p for p in chosen if p not in pools]
    if missing:
        found = ", ".join(sorted(pools)) or "none"
        raise EvalRunError(f"--harness {', '.join(missing)}: no such HarnessPool in the files given (found: {found})")
    checkpoints = resolve_checkpoints(args.checkpoint)
    split = args.split or (defaults.split if defaults else "test")
    limit = args.limit if args.limit is not None else (defaults.limit if defaults else None)
    attempts = args.attempts or (defaults.attempts if defaults else 1)
    if attempts < 1 or (limit is not None and limit < 1):
        raise EvalRunError("--attempts and --limit must be at least 1")
    # Only what evaluation needs: the chosen pools (unweighted), no export, no schedule of its own.
    spec = spec.model_copy(
        update={"harnesses": [HarnessRef(pool=p) for p in dict.fromkeys(chosen)], "export": None, "eval": None}
    )
    volumes = parse_mapping(args.volume, "--volume")
    secret_files = parse_mapping(args.secret, "--secret")
    out: Path = args.out.expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    placement = LocalPlacement(out, resolve_model(run, volumes, secret_files), resolve_tasks(run, volumes, secret_files),
                               spec.engine.replicas, spec.proxy.workers)
    task_ids = select_tasks(placement.tasks_dir, split, limit)
    plan = build_plan(run.metadata.name, "local", spec, {n: p.spec for n, p in pools.items()}, placement)
    plan = with_lora_serving(plan, checkpoints)
    prepare_secrets(plan, placement, secret_files)
    return Setup(
        plan=plan,
        placement_out=out,
        coordinator_port=placement.learner_port,
        proxy_url=placement.proxy_url(plan.run),
        engine_urls=[placement.engine_url(plan.run, i) for i in range(spec.engine.replicas)],
        checkpoints=checkpoints,
        task_ids=task_ids,
        attempts=attempts,
        split=split,
    )


def adapter_name(served: str, label: str) -> str:
    return f"{served}-eval-{re.sub(r'[^A-Za-z0-9._-]', '-', label)}"


def activate(setup: Setup, checkpoint: Checkpoint, admin_token: str) -> PolicyState:
    """Load the checkpoint's adapter into every engine and have the proxy serve it."""
    served = setup.plan.spec.model.served_name
    policy = PolicyState(model=served, version=0)
    if checkpoint.adapter is not None:
        policy = PolicyState(model=adapter_name(served, checkpoint.label), version=checkpoint.policy_version)
        for url in setup.engine_urls:
            try:
                load_lora_adapter(url, policy.model, str(checkpoint.adapter))
            except LoraEndpointError as exc:
                raise EvalRunError(f"the engine refused checkpoint {checkpoint.label}'s adapter: {exc}") from None

    async def put() -> None:
        async with httpx.AsyncClient(timeout=30.0) as http:
            await ProxyClient(http, admin_token).put_policy(setup.proxy_url, policy)

    try:
        asyncio.run(put())
    except httpx.HTTPStatusError as exc:
        refusal = f"HTTP {exc.response.status_code} {exc.response.text[:300]}"
        raise EvalRunError(f"the proxy refused the policy {policy.model}: {refusal}") from None
    return policy


def eval_config(setup: Setup, checkpoint: Checkpoint, policy: PolicyState) -> EvalConfig:
    work = setup.placement_out / "eval" / checkpoint.label
    return EvalConfig(
        label=checkpoint.label,
        pools=[PoolHarness(pool=r.pool or "", harness=r.harness or "") for r in setup.plan.runners],
        task_ids=setup.task_ids,
        attempts=setup.attempts,
        model=policy.model,
        policy_version=policy.version,
        proxy_url=setup.proxy_url,
        journal=work / "journal.jsonl",
        results=work / "results.json",
        runner_token_file=setup.placement_out / "secrets" / "runner-token",
        port=setup.coordinator_port,
    )


def reuse_results(config: EvalConfig) -> EvalResults | None:
    """Finished results of the same evaluation (same pools, tasks, attempts) from an earlier run, else None.
    A different evaluation under the same label starts over."""
    marker = config.results.parent / "config.json"
    same = ("pools", "task_ids", "attempts")
    if marker.exists():
        old = EvalConfig.model_validate_json(marker.read_text())
        if old.model_dump(include=set(same)) != config.model_dump(include=set(same)):
            config.journal.unlink(missing_ok=True)
            config.results.unlink(missing_ok=True)
    config.results.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(config.model_dump_json(indent=2) + "\n")
    if config.results.exists():
        results = EvalResults.model_validate_json(config.results.read_text())
        return results if results.done else None
    return None


def progress_line(status: EvalStatus) -> str:
    finished = status.scored + status.unscored
    pools = ", ".join(f"{p.pool} {p.solved}/{p.scored} solved" for p in status.pools)
    unscored = f", {status.unscored} unscored" if status.unscored else ""
    return (f"harnessrl eval: {status.label}: {finished}/{status.rollouts} rollouts done, "
            f"{status.leased} running{unscored}; {pools}")


def evaluate_checkpoint(setup: Setup, checkpoint: Checkpoint, base: Supervisor, admin_token: str) -> EvalResults:
    policy = activate(setup, checkpoint, admin_token)
    config = eval_config(setup, checkpoint, policy)
    done = reuse_results(config)
    if done is not None:
        print(f"harnessrl eval: {checkpoint.label}: reusing finished results in {config.results}", flush=True)
        return done
    out = setup.placement_out
    config_path = out / "config" / f"eval-{checkpoint.label}.json"
    config_path.write_text(config.model_dump_json(indent=2) + "\n")
    url = f"http://127.0.0.1:{config.port}"
    runner_names = {r.name for r in setup.plan.runners}
    phase = Supervisor(restart_budget=max(setup.plan.restart_budget, 1))
    try:
        phase.start(ProcessSpec(
            name="eval-coordinator",
            argv=python_module("harnessrl.runtime.evaluation.coordinator", "--config", str(config_path)),
            env={},
            log=out / "logs" / f"eval-coordinator-{checkpoint.label}.log",
            health_url=f"{url}/healthz",
        ))
        for spec in process_specs(setup.plan, out):
            if spec.name in runner_names:
                phase.start(spec)
        print(f"harnessrl eval: {checkpoint.label}: {len(config.task_ids)} {setup.split} tasks × "
              f"{len(config.pools)} pool(s) × {config.attempts} attempt(s), model {policy.model}", flush=True)
        last, last_at = "", 0.0
        while True:
            status = _get(f"{url}/v1/status", EvalStatus)
            if status is not None:
                line = progress_line(status)
                if line != last or time.monotonic() - last_at > 30:
                    print(line, flush=True)
                    last, last_at = line, time.monotonic()
                if status.done:
                    break
            base.check()
            phase.check()
            time.sleep(1.0)
        results = _get(f"{url}/v1/results", EvalResults)
        if results is None:
            raise EvalRunError(f"the eval coordinator stopped answering; see {out / 'logs'}")
        return results
    finally:
        phase.stop_all()


def _get(url: str, model: type[_M]) -> _M | None:
    try:
        resp = httpx.get(url, timeout=10.0)
    except httpx.HTTPError:
        return None  # restarting: the supervisor brings it back
    return model.model_validate(resp.json()) if resp.status_code == 200 else None


def execute(setup: Setup) -> int:
    out = setup.placement_out
    base = Supervisor(restart_budget=max(setup.plan.restart_budget, 1))
    keep = {setup.plan.proxy.name} | {f"engine-{i}" for i in range(len(setup.engine_urls))}
    results: dict[str, EvalResults] = {}
    try:
        for spec in process_specs(setup.plan, out):
            if spec.name in keep:
                print(f"harnessrl eval: starting {spec.name} (log: {spec.log})", flush=True)
                base.start(spec)
        admin_token = (out / "secrets" / "proxy-admin-token").read_text().strip()
        for checkpoint in setup.checkpoints:
            results[checkpoint.label] = evaluate_checkpoint(setup, checkpoint, base, admin_token)
    except KeyboardInterrupt:
        print("\nharnessrl eval: interrupted; stopping (run again with the same --out to resume)", flush=True)
        return 130
    except (SupervisorError, EvalRunError) as exc:
        print(f"harnessrl eval: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        base.stop_all()
    print(f"\n{write_report(results, out, f'{len(setup.task_ids)} {setup.split} tasks', setup.attempts)}")
    print(f"harnessrl eval: wrote pass_at_1.txt, pass_at_1.csv, paired.csv and pass_at_1.png in {out}", flush=True)
    return 0


def write_report(results: dict[str, EvalResults], out: Path, tasks: str, attempts: int) -> str:
    """The matrix of `results` (label -> results, in column order) and each later checkpoint paired with the first,
    written under `out` as text, CSVs and a heatmap; returns the text."""
    matrix = build_matrix({label: r.pools for label, r in results.items()})
    paired = paired_comparisons({label: r.slots for label, r in results.items()})
    report = f"pass@1 on {tasks}, {attempts} attempt(s) each (solved/scored):\n{format_table(matrix)}\n"
    if paired:
        report += f"\n{format_paired(matrix, paired)}\n"
    (out / "pass_at_1.txt").write_text(report)
    write_csv(matrix, out / "pass_at_1.csv")
    write_paired_csv(paired, out / "paired.csv")
    write_png(matrix, out / "pass_at_1.png")
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="harnessrl eval", description="pass@1 of checkpoints under each harness pool")
    parser.add_argument("files", nargs="+", type=Path, help="YAML files with one TrainingRun and its HarnessPools")
    parser.add_argument("--checkpoint", action="append", required=True, metavar="[LABEL=]DIR|base",
                        help="a learner checkpoint (checkpoints dir, step-N dir or adapter dir) or 'base', optionally "
                             "named LABEL= for its column; repeatable")
    parser.add_argument("--out", type=Path, required=True, help="where results, logs and the matrix go")
    parser.add_argument("--volume", action="append", default=[], metavar="CLAIM=DIR",
                        help="where a PersistentVolumeClaim's files are on this machine")
    parser.add_argument("--secret", action="append", default=[], metavar="NAME=FILE",
                        help="the value of a Secret a pool names (e.g. an E2B key)")
    parser.add_argument("--split", help="task split (default: spec.eval.split, else test)")
    parser.add_argument("--harness", action="append", metavar="POOL",
                        help="HarnessPool to evaluate under; repeatable (default: spec.eval.harnesses, else the run's)")
    parser.add_argument("--limit", type=int, help="evaluate at most N tasks (default: spec.eval.limit)")
    parser.add_argument("--attempts", type=int, help="samples per task and pool (default: spec.eval.attempts, else 1)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        setup = prepare(args)
    except (EvalRunError, LocalRunError, ManifestError, PlanError) as exc:
        print(f"harnessrl eval: {exc}", file=sys.stderr)
        return 2
    return execute(setup)
