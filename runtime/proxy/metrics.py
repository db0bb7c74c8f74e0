"""Prometheus metrics of one proxy replica (own registry, so several apps can live in one test process)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field

from harnessrl.runtime.proxy.tool_check import ToolMismatch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass
class ProxyMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "harnessrl_proxy_requests", "Dialect requests answered, by dialect and outcome", ["dialect", "outcome"], registry=r
        )
        self.turns = Counter("harnessrl_proxy_turns", "Captured turns, by validity", ["valid"], registry=r)
        self.tokens = Counter("harnessrl_proxy_tokens", "Tokens captured", ["kind"], registry=r)
        self.sessions_created = Counter("harnessrl_proxy_sessions_created", "Sessions created", registry=r)
        self.sessions_ended = Counter("harnessrl_proxy_sessions_ended", "Sessions ended, by reason", ["reason"], registry=r)
        self.sessions_live = Gauge("harnessrl_proxy_sessions_live", "Sessions held by this replica", registry=r)
        self.inflight = Gauge("harnessrl_proxy_inflight_calls", "Engine calls in flight", registry=r)
        self.upstream_latency = Histogram(
            "harnessrl_proxy_upstream_seconds", "Engine call time (to the last byte)", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.journal_latency = Histogram(
            "harnessrl_proxy_journal_seconds", "Time from enqueueing a journal record to its durability",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.engine_failures = Counter(
            "harnessrl_proxy_engine_failures", "Engine connection failures", ["engine"], registry=r
        )
        self.spliced = Counter("harnessrl_proxy_spliced_calls",
                               "Calls sent with earlier sampled replies spliced into the prompt", registry=r)
        self.tool_mismatches = Counter(
            "harnessrl_proxy_tool_mismatches", "Tool calls the harness cannot run: to a tool the call did not offer "
            "(unknown) or with arguments its schema refuses (invalid)", ["harness", "kind"], registry=r,
        )
        self.prefix_breaks = Counter(
            "harnessrl_proxy_prefix_breaks", "Captured calls that started one more training sequence, by cause",
            ["harness", "cause"], registry=r,
        )
        self.rejected = Counter("harnessrl_proxy_admission_rejected", "Calls refused by admission control", registry=r)
        self.policy_version = Gauge("harnessrl_proxy_policy_version", "Policy version sent upstream", registry=r)
        # Each labelled series looked up once: `labels()` takes a lock and builds its key every time, and every call
        # counts three series. The label values are few (dialects, outcomes, validity, kind).
        self._request = functools.cache(self.requests.labels)
        self._turn = functools.cache(self.turns.labels)
        self._tokens = functools.cache(self.tokens.labels)

    def count_request(self, dialect: str, outcome: str) -> None:
        self._request(dialect, outcome).inc()

    def count_turn(self, trainable: bool, completion_tokens: int) -> None:
        self._turn("true" if trainable else "false").inc()
        self._tokens("completion").inc(completion_tokens)

    def count_mismatch(self, harness: str, mismatch: ToolMismatch) -> None:
        for kind, n in (("unknown", mismatch.unknown), ("invalid", mismatch.invalid)):
            if n:
                self.tool_mismatches.labels(harness=harness, kind=kind).inc(n)


class _Merged(Collector):
    """Every worker's series, each with a `worker` label, one family per metric name."""

    def __init__(self, texts: dict[str, str]) -> None:
        self.texts = texts

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for worker, text in self.texts.items():
            for family in text_string_to_metric_families(text):
                merged = families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type, family.unit)
                )
                merged.samples += [s._replace(labels={**s.labels, "worker": worker}) for s in family.samples]
        yield from families.values()


def merged_exposition(texts: dict[str, str]) -> bytes:
    """One scrape of a replica with several workers: each worker's own exposition (name -> text), its series
    labelled `worker`. Summing over the label gives the replica's figures; a restarted worker's counters start
    again from zero, as any restarted process's do."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(texts))
    return generate_latest(registry)
