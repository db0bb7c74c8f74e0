"""A runner's Prometheus metrics (`RunnerConfig.metricsPort`): its rollouts by outcome and how long they took,
what runs now, leases and their failures, and the acks the coordinator gave."""

from __future__ import annotations

from collections.abc import Callable

from harnessrl.runtime.contracts.coordinator import Completion
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Rollouts take seconds (a one-shot reply) to hours (a long agent session).
ROLLOUT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 2400, 3600, 7200)


class RunnerMetrics:
    def __init__(self, pool: str, harness: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"pool": pool, "harness": harness}
        self._rollouts = Counter("harnessrl_runner_rollouts", "Rollouts run to an outcome", ["pool", "harness", "outcome"],
                                 registry=self.registry)
        self._seconds = Histogram("harnessrl_runner_rollout_seconds", "A rollout's time from start to grade",
                                  ["pool", "harness"], buckets=ROLLOUT_BUCKETS, registry=self.registry).labels(**labels)
        self.leases = Counter("harnessrl_runner_leases", "Rollouts leased from the coordinator", ["pool", "harness"],
                              registry=self.registry).labels(**labels)
        self.lease_errors = Counter("harnessrl_runner_lease_errors", "Lease calls that failed (the coordinator "
                                    "unreachable or refusing)", ["pool", "harness"], registry=self.registry).labels(**labels)
        self.unacked = Counter("harnessrl_runner_completions_unknown", "Completions the coordinator did not know "
                               "(it restarted from an older checkpoint)", ["pool", "harness"],
                               registry=self.registry).labels(**labels)
        self._active = Gauge("harnessrl_runner_active_rollouts", "Rollouts running now", ["pool", "harness"],
                             registry=self.registry).labels(**labels)
        self.labels = labels

    def completed(self, completion: Completion) -> None:
        self._rollouts.labels(**self.labels, outcome=completion.outcome.value).inc()
        if (t := completion.timings) is not None:
            self._seconds.observe(t.seconds)

    def observe_active(self, count: Callable[[], float]) -> None:
        self._active.set_function(count)
