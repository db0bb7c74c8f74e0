"""The harnessrl proxy's own latency histograms (its `/metrics`), summarised for a level: how long its calls waited
on the engine and on the journal, which the load generator sees only as one added latency. Pure."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

# What each wait is called in results.md, and the proxy's histogram that times it (runtime/proxy/metrics.py).
WAITS = {
    "engine call": "harnessrl_proxy_upstream_seconds",
    "journal": "harnessrl_proxy_journal_seconds",
}


class WaitSummary(BaseModel):
    """One histogram over a level. The percentiles are bucket bounds: p90 <= `p90_ms` (None: above the top bound)."""

    count: int
    mean_ms: float
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None


def summarize_waits(metrics_text: str) -> dict[str, WaitSummary]:
    """The waits found in a Prometheus text exposition; a histogram with no observations is left out."""
    # Summed over the other labels: a replica of several workers labels each worker's series.
    buckets: dict[str, dict[float, float]] = {}
    totals: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            base, _, kind = sample.name.rpartition("_")
            if kind == "bucket":
                by_le = buckets.setdefault(base, {})
                le = float(sample.labels["le"])
                by_le[le] = by_le.get(le, 0.0) + sample.value
            elif kind in ("count", "sum"):
                by_kind = totals.setdefault(base, {})
                by_kind[kind] = by_kind.get(kind, 0.0) + sample.value
    out: dict[str, WaitSummary] = {}
    for label, name in WAITS.items():
        count = int(totals.get(name, {}).get("count", 0))
        if count == 0:
            continue
        cumulative = sorted(buckets.get(name, {}).items())
        out[label] = WaitSummary(
            count=count,
            mean_ms=totals[name]["sum"] / count * 1000,
            p50_ms=_bound(cumulative, 0.50 * count),
            p90_ms=_bound(cumulative, 0.90 * count),
            p99_ms=_bound(cumulative, 0.99 * count),
        )
    return out


def _bound(cumulative: list[tuple[float, float]], rank: float) -> float | None:
    """The upper bound, in ms, of the first bucket that holds `rank` observations (None for +Inf)."""
    for upper, seen in cumulative:
        if seen >= rank:
            return None if math.isinf(upper) else upper * 1000
    return None


def render_waits(waits: dict[str, WaitSummary]) -> str:
    """`engine call mean 42 ms (p50 <= 25, p90 <= 100, p99 <= 250 ms); journal ...`"""

    def bound(ms: float | None) -> str:
        return "above the top bucket" if ms is None else f"≤ {ms:g}"

    return "; ".join(
        f"{label} mean {w.mean_ms:.1f} ms (p50 {bound(w.p50_ms)}, p90 {bound(w.p90_ms)}, p99 {bound(w.p99_ms)} ms; "
        f"{w.count:,} timed)"
        for label, w in waits.items()
    )
