"""Experiment tracking (TrainingRun spec.tracking, TRL's `report_to`): each step's metrics and each evaluation
round's pass@1, fanned out to TensorBoard event files (the default), trackio, Weights & Biases or MLflow; and
each step's rollout samples (samples.py: per harness the best, the worst and a random one, each linked to its
page in `harnessrl view`) as a table in each: TensorBoard text (a markdown table), a W&B Table, an MLflow table
artifact (rollouts/samples/step-NNNNNN.json), a trackio Table, all under SAMPLES.

metrics.jsonl and eval.jsonl stay the record (the learner resumes from them, the report reads them); trackers
show it where people look. `Tracking.open` resolves every tracker at once (its package imported, its credential
read), so a missing one fails the learner at start with TrackerUnavailable, not mid-run. Starting the trackers'
runs and logging to them happen in one background thread: a slow tracking server must not hold the
coordinator's event loop, and a tracker that raises is logged once, its credentials blanked, and dropped while
training goes on.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from harnessrl.runtime.contracts.coordinator import EvalRecord
from harnessrl.runtime.contracts.learner_config import (
    LearnerConfig,
    MlflowLink,
    Tracker,
    TrackioLink,
    WandbLink,
)
from harnessrl.runtime.contracts.learner_exit import TRACKER_UNAVAILABLE, LearnerFailure
from harnessrl.runtime.learner.metrics import StepMetrics
from harnessrl.runtime.learner.samples import COLUMNS, RolloutSample, markdown, table_rows

log = logging.getLogger(__name__)

# The module (and the PyPI package of the same name) each tracker needs; tensorboardX is harnessrl's own
# dependency, the others are installed by whoever reports to them.
MODULES: dict[str, str] = {"tensorboard": "tensorboardX", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
# The rollout samples' key: TensorBoard's text tag, W&B's and trackio's table key, MLflow's artifact folder.
SAMPLES = "rollouts/samples"


def missing(report_to: Iterable[str]) -> list[str]:
    """The trackers of `report_to` whose package this Python cannot import."""
    return [name for name in report_to if importlib.util.find_spec(MODULES[name]) is None]


def step_scalars(m: StepMetrics) -> dict[str, float]:
    """`train/<metric>`, and `train/<metric>_by_harness/<harness>` for the per-harness ones (no name is the
    prefix path of another: MLflow's file store keeps a metric as a file at its name)."""
    out: dict[str, float] = {}
    for name, value in m.model_dump(exclude={"step", "time"}).items():
        if isinstance(value, dict):
            out |= {f"train/{name}/{harness}": float(v) for harness, v in value.items()}
        elif value is not None:
            out[f"train/{name}"] = float(value)
    return out


def eval_scalars(rec: EvalRecord) -> dict[str, float]:
    """`eval/pass_at_1/<pool>` ('@' is no character MLflow takes in a metric name)."""
    return {f"eval/pass_at_1/{pool}": p for pool, p in rec.pass_at1().items()}


def hparams(cfg: LearnerConfig) -> dict[str, Any]:
    """The settings a tracker shows beside the curves: `grpo.lr`, `reward.bonus`, `adapter.rank`, ..."""
    sections = {"grpo": cfg.grpo, "reward": cfg.reward, "adapter": cfg.adapter}
    return {f"{section}.{k}": v for section, model in sections.items() for k, v in model.model_dump(mode="json").items()}


class Backend(Protocol):
    credentials: list[str]  # blanked out of anything logged about the tracker

    def start(self, first_step: int) -> None: ...

    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def samples(self, samples: list[RolloutSample], step: int) -> None: ...

    def close(self) -> None: ...


def _import(name: Tracker) -> ModuleType:
    module = MODULES[name]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise LearnerFailure(TRACKER_UNAVAILABLE, f"tracking.report_to lists {name} but {module} cannot be imported "
                             f"({exc}): install it where the learner runs (pip install {module}; on a cluster, "
                             "into the learner image)") from None


def _credential(path: Path, what: str) -> str:
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise LearnerFailure(TRACKER_UNAVAILABLE, f"{what} {path} cannot be read ({exc.strerror})") from None
    if not value:
        raise LearnerFailure(TRACKER_UNAVAILABLE, f"{what} {path} is empty")
    return value


class TensorBoard:
    """Event files in `<tracking dir>/tensorboard`: `tensorboard --logdir` there."""

    def __init__(self, logdir: Path) -> None:
        self.tensorboardx = _import("tensorboard")
        self.logdir = logdir
        self.credentials: list[str] = []

    def start(self, first_step: int) -> None:
        # TensorBoard hides what an earlier process logged from `purge_step` on: the steps a crash lost and this
        # process takes again.
        self.writer = self.tensorboardx.SummaryWriter(str(self.logdir), purge_step=first_step)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # on disk at each step: a live `tensorboard` sees it, a crash loses none

    def samples(self, samples: list[RolloutSample], step: int) -> None:
        self.writer.add_text(SAMPLES, markdown(samples), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Wandb:
    def __init__(self, link: WandbLink, project: str, run_name: str, tracking_dir: Path, config: dict[str, Any]) -> None:
        self.wandb = _import("wandb")
        key = _credential(link.api_key_file, "tracking.wandb.api_key_file")
        os.environ["WANDB_API_KEY"] = key  # where wandb takes a key from without writing it to ~/.netrc
        if link.base_url is not None:
            os.environ["WANDB_BASE_URL"] = link.base_url
        self.credentials = [key]
        self.link, self.project, self.run_name, self.dir, self.config = link, project, run_name, tracking_dir, config

    def start(self, first_step: int) -> None:
        # One W&B run per TrainingRun: its id is kept beside the metrics, and a restarted learner resumes it.
        id_file = self.dir / "wandb-run-id"
        if not id_file.exists():
            id_file.write_text(secrets.token_hex(8))
        self.run = self.wandb.init(project=self.project, entity=self.link.entity, name=self.run_name,
                                   id=id_file.read_text().strip(), resume="allow", dir=str(self.dir), config=self.config)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def samples(self, samples: list[RolloutSample], step: int) -> None:
        self.run.log({SAMPLES: self.wandb.Table(columns=COLUMNS, data=table_rows(samples))}, step=step)

    def close(self) -> None:
        self.run.finish()


class Mlflow:
    """Through an MlflowClient, not mlflow's module functions: their active run is per thread."""

    def __init__(self, link: MlflowLink, project: str, run_name: str, tracking_dir: Path, config: dict[str, Any]) -> None:
        self.mlflow = _import("mlflow")
        self.uri = _credential(link.tracking_uri_file, "tracking.mlflow.tracking_uri_file")
        self.credentials = [self.uri]
        if link.token_file is not None:
            token = _credential(link.token_file, "tracking.mlflow.token_file")
            os.environ["MLFLOW_TRACKING_TOKEN"] = token
            self.credentials.append(token)
        # MLflow logs a run's URL, which holds the tracking URI, at INFO.
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        self.project, self.run_name, self.dir, self.config = project, run_name, tracking_dir, config

    def start(self, first_step: int) -> None:
        entities = importlib.import_module("mlflow.entities")
        self.metric = entities.Metric
        self.client = self.mlflow.MlflowClient(tracking_uri=self.uri)
        # One MLflow run per TrainingRun: its id is kept beside the metrics, and a restarted learner resumes it.
        id_file = self.dir / "mlflow-run-id"
        if id_file.exists():
            self.run_id = id_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
            return
        experiment = self.client.get_experiment_by_name(self.project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(self.project)
        self.run_id = self.client.create_run(experiment_id, run_name=self.run_name).info.run_id
        self.client.log_batch(self.run_id, params=[entities.Param(k, str(v)) for k, v in self.config.items()])
        id_file.write_text(self.run_id)

    def log(self, scalars: dict[str, float], step: int) -> None:
        now_ms = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.metric(k, v, now_ms, step) for k, v in scalars.items()])

    def samples(self, samples: list[RolloutSample], step: int) -> None:
        # A table artifact per step (MLflow shows it as a table). log_table appends to a file of the same name: a
        # step taken again after a resume adds its rows to that step's file a second time.
        rows = table_rows(samples)
        self.client.log_table(self.run_id, data={c: [r[i] for r in rows] for i, c in enumerate(COLUMNS)},
                              artifact_file=f"{SAMPLES}/step-{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Trackio:
    def __init__(self, link: TrackioLink | None, project: str, run_name: str, tracking_dir: Path,
                 config: dict[str, Any]) -> None:
        # Without a Space trackio keeps its database in TRACKIO_DIR (read at import): beside the metrics.
        os.environ["TRACKIO_DIR"] = str(tracking_dir / "trackio")
        self.trackio = _import("trackio")
        self.credentials = []
        if link is not None:
            token = _credential(link.token_file, "tracking.trackio.token_file")
            os.environ["HF_TOKEN"] = token  # what trackio writes to the Space with
            self.credentials.append(token)
        self.space_id = link.space_id if link is not None else None
        self.project, self.run_name, self.config = project, run_name, config

    def start(self, first_step: int) -> None:
        # trackio resumes a run of the same name: a restarted learner goes on logging to it.
        self.trackio.init(project=self.project, name=self.run_name, space_id=self.space_id, config=self.config,
                          resume="allow")

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.trackio.log(scalars, step=step)

    def samples(self, samples: list[RolloutSample], step: int) -> None:
        self.trackio.log({SAMPLES: self.trackio.Table(columns=COLUMNS, data=table_rows(samples))}, step=step)

    def close(self) -> None:
        self.trackio.finish()


def blank(text: str, credentials: list[str]) -> str:
    for secret in credentials:
        text = text.replace(secret, "***")
    return text


class Tracking:
    """The run's trackers, fed in order from one background thread."""

    def __init__(self, backends: dict[Tracker, Backend]) -> None:
        self.backends = backends
        self._queue: queue.Queue[tuple[str, tuple[Any, ...]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="tracking", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, cfg: LearnerConfig) -> Tracking:
        """Every tracker of `cfg.tracking`, resolved now: a LearnerFailure names one that cannot be."""
        t, tracking_dir = cfg.tracking, cfg.tracking_dir()
        tracking_dir.mkdir(parents=True, exist_ok=True)
        config = hparams(cfg)
        backends: dict[Tracker, Backend] = {}
        for name in t.report_to:
            if name == "tensorboard":
                backends[name] = TensorBoard(tracking_dir / "tensorboard")
            elif name == "wandb":
                assert t.wandb is not None  # TrackingConfig holds it
                backends[name] = Wandb(t.wandb, t.project, cfg.run_name, tracking_dir, config)
            elif name == "mlflow":
                assert t.mlflow is not None
                backends[name] = Mlflow(t.mlflow, t.project, cfg.run_name, tracking_dir, config)
            else:
                backends[name] = Trackio(t.trackio, t.project, cfg.run_name, tracking_dir, config)
        if backends:
            log.info("tracking to %s (files in %s)", ", ".join(backends), tracking_dir)
        return cls(backends)

    def start(self, first_step: int) -> None:
        """Start the trackers' runs, in the background; `first_step` is the first step this process logs."""
        self._queue.put(("start", (first_step,)))

    def log_step(self, m: StepMetrics) -> None:
        self._queue.put(("log", (step_scalars(m), m.step)))

    def log_eval(self, rec: EvalRecord) -> None:
        self._queue.put(("log", (eval_scalars(rec), rec.step)))

    def log_samples(self, samples: list[RolloutSample], step: int) -> None:
        if samples:
            self._queue.put(("samples", (samples, step)))

    def close(self, timeout_s: float = 30.0) -> None:
        """Deliver what is queued and end the trackers' runs; an unreachable server gets `timeout_s` for it."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            self._call(*item)
        self._call("close", ())

    def _call(self, method: str, args: tuple[Any, ...]) -> None:
        for name, backend in list(self.backends.items()):
            try:
                getattr(backend, method)(*args)
            except Exception as exc:  # whatever a tracker raises, training goes on without it
                del self.backends[name]
                log.warning("tracker %s failed (%s) and gets no more metrics: %s", name, method,
                            blank(f"{type(exc).__name__}: {exc}", backend.credentials))
