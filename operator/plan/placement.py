"""Where components find each other and their files: a Placement, and the cluster's (Services by DNS, fixed
paths in the containers)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import PurePosixPath

from harnessrl.operator.plan.names import child_name, proxy_headless_name
from harnessrl.operator.plan.types import ComponentKind

POD_IP_ENV = "POD_IP"  # a Pod's own IP, from the downward API (status.podIP)
ADAPTER_STORE_PORT = 8001  # the adapter store beside each engine server


class Placement(ABC):
    """Where components find each other and their files: in a cluster, or on one machine."""

    engine_port: int = 8000
    proxy_port: int = 8080
    learner_port: int = 8090
    runner_metrics_port: int | None = None  # where runners serve /metrics; None: they do not
    # Whether whoever runs the engines here restarts them on each policy the learner publishes (weightSync restart).
    restarts_engines: bool = False
    # The variable that holds a component's own IP (a Pod's), for what must bind an address of its own (the
    # learner's NCCL rendezvous); None: components run on loopback.
    own_address_env: str | None = None

    @abstractmethod
    def engine_url(self, run: str, replica: int) -> str:
        """Base URL (no /v1) of one engine replica: the learner hot-loads weights into each one."""

    @abstractmethod
    def proxy_url(self, run: str) -> str:
        """Base URL of the proxy (any replica: POST /sessions answers with the owning replica's URL)."""

    @abstractmethod
    def coordinator_url(self, run: str) -> str:
        """Base URL of the learner's coordinator."""

    @abstractmethod
    def path(self, what: str) -> str:
        """A file or directory the components use; `what` is one of PATHS."""

    def adapter_store_url(self, run: str, replica: int) -> str | None:
        """Where the learner uploads adapters for an engine replica; None where engines read the learner's files."""
        return None

    def proxy_replica_urls(self, run: str, replicas: int) -> list[str]:
        """Each proxy replica's own base URL, for what must reach every replica (the policy: each serves its own
        sessions); empty where one proxy process serves at `proxy_url`."""
        return []


# Names of the files and directories a Placement locates.
PATHS = (
    "config",  # the component's rendered config file
    "proxy-admin-token",  # the proxy's admin bearer token (a Secret)
    "runner-token",  # the runners' credential at the coordinator (a Secret)
    "hub-token",  # the Hub token of the export (a Secret)
    "base-model-token",  # a Hub token that reads a gated or private base model (a Secret)
    "tasks-token",  # a Hub token that reads a gated or private task dataset (a Secret)
    "e2b-api-key",  # the E2B API key of an e2b-sandbox pool (a Secret)
    "wandb-api-key",  # the W&B API key of spec.tracking.wandb (a Secret)
    "mlflow-tracking-uri",  # the MLflow tracking URI of spec.tracking.mlflow (a Secret)
    "mlflow-token",  # its bearer token (a Secret)
    "trackio-token",  # the Hugging Face token trackio writes to its Space with (a Secret)
    "journal",  # the proxy's journal directory
    "checkpoints",  # the learner's checkpoint directory
    "base-model",  # base weights the learner trains on
    "tasks",  # the task set, for runners
    "task-ids",  # the task ids of the trained split, for the learner
    "adapter-store-token",  # an EnginePool's adapter store token (a Secret)
    "engine-api-key",  # the API key an EnginePool's vLLM servers require (a Secret)
    "engine-env",  # a directory per engine variable whose value is a Secret: <dir>/<NAME>/value
)


def eval_task_ids_file(task_ids_file: str) -> str:
    """Where the eval split's task ids go: beside the trained split's (the same volume in a Pod)."""
    return str(PurePosixPath(task_ids_file).with_name("eval-ids.txt"))


def validation_task_ids_file(task_ids_file: str) -> str:
    """Where the validation split's task ids go (spec.eval.validationSplit), beside the others."""
    return str(PurePosixPath(task_ids_file).with_name("validation-ids.txt"))


class ClusterPlacement(Placement):
    """Components in Pods: Services by DNS, files at fixed paths in the containers."""

    runner_metrics_port = 9102  # scraped by the chart's PodMonitor
    own_address_env = POD_IP_ENV  # the downward API's status.podIP (kube/learner.py)

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def engine_url(self, run: str, replica: int) -> str:
        return self._server_url(child_name(run, ComponentKind.ENGINE), replica, self.engine_port)

    def _server_url(self, statefulset: str, replica: int, port: int) -> str:
        # Each StatefulSet Pod has a stable DNS name under the headless Service of the same name.
        return f"http://{statefulset}-{replica}.{statefulset}.{self.namespace}.svc:{port}"

    def proxy_url(self, run: str) -> str:
        return f"http://{run}-proxy.{self.namespace}.svc:{self.proxy_port}"

    def proxy_replica_url(self, run: str, pod: str) -> str:
        """A proxy replica's own base URL: its StatefulSet Pod's DNS name under the proxy's headless Service (what
        `POST /sessions` answers with, and where the learner sets the policy)."""
        return f"http://{pod}.{proxy_headless_name(run)}.{self.namespace}.svc:{self.proxy_port}"

    def proxy_replica_urls(self, run: str, replicas: int) -> list[str]:
        return [self.proxy_replica_url(run, f"{child_name(run, ComponentKind.PROXY)}-{i}") for i in range(replicas)]

    def coordinator_url(self, run: str) -> str:
        return f"http://{run}-learner.{self.namespace}.svc:{self.learner_port}"

    def path(self, what: str) -> str:
        return CLUSTER_PATHS[what]

    def adapter_store_url(self, run: str, replica: int) -> str | None:
        return self._server_url(child_name(run, ComponentKind.ENGINE), replica, ADAPTER_STORE_PORT)

    def engine_pool_urls(self, pool: str, replica: int) -> tuple[str, str]:
        """(server, adapter store) base URLs of one server of an EnginePool."""
        name = child_name(pool, ComponentKind.ENGINE_POOL)
        return self._server_url(name, replica, self.engine_port), self._server_url(name, replica, ADAPTER_STORE_PORT)


CLUSTER_PATHS: dict[str, str] = {
    "config": "/etc/harnessrl/config.yaml",
    "proxy-admin-token": "/var/run/secrets/harnessrl/proxy-admin/token",
    "runner-token": "/var/run/secrets/harnessrl/runner/token",
    "hub-token": "/var/run/secrets/harnessrl/hub/token",
    "base-model-token": "/var/run/secrets/harnessrl/base-model-token/token",
    "tasks-token": "/var/run/secrets/harnessrl/tasks-token/token",
    "e2b-api-key": "/var/run/secrets/harnessrl/e2b/api-key",
    "wandb-api-key": "/var/run/secrets/harnessrl/wandb/api-key",
    "mlflow-tracking-uri": "/var/run/secrets/harnessrl/mlflow-uri/uri",
    "mlflow-token": "/var/run/secrets/harnessrl/mlflow-token/token",
    "trackio-token": "/var/run/secrets/harnessrl/trackio/token",
    "journal": "/var/lib/harnessrl/journal",
    "checkpoints": "/var/lib/harnessrl/checkpoints",
    "base-model": "/var/lib/harnessrl/model",
    "tasks": "/var/lib/harnessrl/tasks",
    "task-ids": "/var/lib/harnessrl/task-ids/ids.txt",
    "adapter-store-token": "/var/run/secrets/harnessrl/adapter-store/token",
    "engine-api-key": "/var/run/secrets/harnessrl/engine-api-key/token",
    "engine-env": "/var/run/secrets/harnessrl/engine-env",
}


assert set(CLUSTER_PATHS) == set(PATHS)
