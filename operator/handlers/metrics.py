"""The operator's own Prometheus metrics: reconciles by kind and outcome, how long they take, the queue, and
whether this replica leads. Served by `harnessrl operator --metrics-port`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from harnessrl.operator.api.enginepool import PoolUsage
from harnessrl.operator.api.trainingrun import RunUsage
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

Usages = dict[tuple[str, str], RunUsage]  # (namespace, run) -> its status.usage
PoolUsages = dict[tuple[str, str], PoolUsage]  # (namespace, EnginePool) -> its status.usage


class UsageCollector(Collector):
    """Each run's and EnginePool's status.usage as counters labelled by namespace and name (chargeback): read at
    scrape time from what the leader last wrote, so an object's series go when it does."""

    def __init__(self, usages: Callable[[], Usages], pool_usages: Callable[[], PoolUsages]) -> None:
        self.usages = usages
        self.pool_usages = pool_usages

    def collect(self) -> Iterator[Metric]:
        run = ["namespace", "run"]
        gpu = CounterMetricFamily("harnessrl_run_gpu_seconds", "GPU-seconds of the run's Pods", labels=[*run, "component"])
        rollouts = CounterMetricFamily("harnessrl_run_rollouts", "Rollouts finished", labels=run)
        sandbox = CounterMetricFamily("harnessrl_run_sandbox_seconds", "Rollouts' time from start to grade", labels=run)
        tokens = CounterMetricFamily("harnessrl_run_tokens", "Tokens sampled (scored rollouts) and trained",
                                     labels=[*run, "kind"])
        for (namespace, name), usage in sorted(self.usages().items()):
            for component, seconds in sorted(usage.gpu_seconds.items()):
                gpu.add_metric([namespace, name, component], seconds)
            rollouts.add_metric([namespace, name], usage.rollouts)
            sandbox.add_metric([namespace, name], usage.sandbox_seconds)
            tokens.add_metric([namespace, name, "sampled"], usage.tokens_sampled)
            tokens.add_metric([namespace, name, "trained"], usage.tokens_trained)
        pool_gpu = CounterMetricFamily("harnessrl_enginepool_gpu_seconds", "GPU-seconds of an EnginePool's servers, "
                                       "which the runs on it share", labels=["namespace", "pool"])
        for (namespace, name), pool_usage in sorted(self.pool_usages().items()):
            pool_gpu.add_metric([namespace, name], pool_usage.gpu_seconds)
        yield from (gpu, rollouts, sandbox, tokens, pool_gpu)


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter("harnessrl_operator_reconciles", "Reconcile passes by kind and outcome "
                                  "(api_error: the API server failed or refused the pass; error: a bug)",
                                  ["kind", "outcome"], registry=self.registry)
        self.duration = Histogram("harnessrl_operator_reconcile_seconds", "Duration of a reconcile pass", ["kind"],
                                  buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=self.registry)
        self.leader = Gauge("harnessrl_operator_leader", "1 while this replica reconciles (holds the Lease)",
                            registry=self.registry)
        self._queue = Gauge("harnessrl_operator_queue_depth", "Objects being reconciled or waiting for a worker",
                            registry=self.registry)
        self._known = Gauge("harnessrl_operator_objects", "TrainingRuns and HarnessPools the operator knows",
                            ["kind"], registry=self.registry)

    def observe_usage(self, usages: Callable[[], Usages], pool_usages: Callable[[], PoolUsages]) -> None:
        self.registry.register(UsageCollector(usages, pool_usages))

    def observe_queue(self, depth: Callable[[], float]) -> None:
        self._queue.set_function(depth)

    def observe_known(self, kind: str, count: Callable[[], float]) -> None:
        self._known.labels(kind=kind).set_function(count)
