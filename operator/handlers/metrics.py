"""The operator's own Prometheus metrics: reconciles by kind and outcome, how long they take, the queue, and
whether this replica leads. Served by `harnessrl operator --metrics-port`."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

OUTCOMES = ("ok", "api_error", "error")


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

    def observe_queue(self, depth: Callable[[], float]) -> None:
        self._queue.set_function(depth)

    def observe_known(self, kind: str, count: Callable[[], float]) -> None:
        self._known.labels(kind=kind).set_function(count)
