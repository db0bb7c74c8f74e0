"""The viewer's web app: HTML pages (Jinja2 templates, one packaged stylesheet, no script) and the JSON API
they are built from, over a run directory's index (index.py), which each request brings up to date, so the
pages follow a run that is still going.

  GET /                          the run: rollouts, solved rate, reward, prefix breaks and tool mismatches per
                                 harness; plots over steps; held-out pass@1 over steps and the harness x checkpoint
                                 matrix, with 95% intervals
  GET /rollouts                  rollouts, filtered, sorted and paged (query.RolloutQuery)
  GET /rollouts/{id}             one rollout: grader output, reward, its calls in order, its call graph, its
                                 training tokens
  GET /compare                   one task under two harnesses or two policy versions, side by side (compare.py)
  GET /api/metrics               the learner's StepMetrics, one per step
  GET /api/evals                 the run's evaluation rounds (EvalRecord), one per evaluated step
  GET /api/rollouts              a page of rollouts as JSON (the same query)
  GET /api/rollouts/{id}         one rollout as JSON (`colour` picks what the token colours encode)
  GET /api/compare               the two sides of /compare as JSON
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from harnessrl.runtime.contracts.coordinator import EvalRecord
from harnessrl.runtime.evaluation.matrix import Matrix, build_matrix
from harnessrl.runtime.learner.evaluation import read_records
from harnessrl.runtime.learner.metrics import StepMetrics
from harnessrl.runtime.trajectory.models import BreakCause, TurnDelta
from harnessrl.runtime.viewer import charts
from harnessrl.runtime.viewer.callgraph import CallGraph, call_graph
from harnessrl.runtime.viewer.compare import CompareQuery, Side, compare_link, compare_row, options, sides
from harnessrl.runtime.viewer.index import RolloutRow, RunIndex, read_config
from harnessrl.runtime.viewer.query import SORTABLE, RolloutPage, RolloutQuery, link, select
from harnessrl.runtime.viewer.tokens import Colouring, Detokenizer, TokenView, token_views
from pydantic import BaseModel

HERE = Path(__file__).parent


class HarnessSummary(BaseModel):
    harness: str
    rollouts: int
    scored: int
    solved: int
    mean_reward: float | None
    unknown_tool_calls: int = 0
    invalid_tool_calls: int = 0
    prefix_breaks: dict[BreakCause, int] = {}


class CallView(BaseModel):
    """One call the harness made, as the proxy journaled it: what it sent beyond the call it continued (its
    parent's prompt and reply), and what was sampled."""

    index: int
    at: float
    status: str
    answered: bool
    error: str | None
    turn: int | None = None
    parent: int | None = None
    policy_version: int | None = None
    finish_reason: str | None = None
    tool_calls: int = 0
    trainable: bool = True
    sent: str = ""
    sampled: str = ""


class SequenceView(BaseModel):
    node_ids: list[int]
    tokens: list[TokenView]


class RolloutView(BaseModel):
    row: RolloutRow
    grader_output: str
    error: str | None
    prefix_breaks: dict[str, int]
    calls: list[CallView]
    graph: CallGraph
    sequences: list[SequenceView]


class Comparison(BaseModel):
    query: CompareQuery  # blanks filled in
    options: list[str]  # what a side may be: the task's harnesses or policy versions
    a: Side
    b: Side
    calls_a: list[CallView]  # of the rollout each side shows
    calls_b: list[CallView]


def summarize(rows: list[RolloutRow]) -> list[HarnessSummary]:
    """Per harness, over its training rollouts."""
    by: dict[str, list[RolloutRow]] = {}
    for row in rows:
        if not row.evaluation:
            by.setdefault(row.harness, []).append(row)
    out = []
    for harness, rs in sorted(by.items()):
        rewards = [r.reward for r in rs if r.reward is not None]
        breaks: dict[BreakCause, int] = {}
        for r in rs:
            for cause, n in r.prefix_breaks.items():
                breaks[cause] = breaks.get(cause, 0) + n
        out.append(HarnessSummary(harness=harness, rollouts=len(rs), scored=sum(r.scored for r in rs),
                                  solved=sum(r.solved for r in rs),
                                  mean_reward=sum(rewards) / len(rewards) if rewards else None,
                                  unknown_tool_calls=sum(r.unknown_tool_calls for r in rs),
                                  invalid_tool_calls=sum(r.invalid_tool_calls for r in rs), prefix_breaks=breaks))
    return out


def eval_matrix(records: list[EvalRecord]) -> Matrix:
    """Held-out pass@1 per harness pool (rows) x evaluated step (columns, `step N`)."""
    return build_matrix({f"step {r.step}": r.pools for r in sorted(records, key=lambda r: r.step)})


def call_views(records: list[dict[str, Any]], detok: Detokenizer) -> list[CallView]:
    views = []
    for i, rec in enumerate(records):
        view = CallView(index=i, at=float(rec["at"]), status=str(rec["status"]), answered=bool(rec["answered"]),
                        error=rec.get("error"))
        if (turn := rec.get("turn")) is not None:
            delta = TurnDelta.model_validate(turn)
            view = view.model_copy(update={
                "turn": delta.id, "parent": delta.parent, "policy_version": delta.policy_version,
                "finish_reason": delta.finish_reason, "tool_calls": delta.tool_calls, "trainable": delta.trainable,
                "sent": detok.text(delta.prompt_tail), "sampled": detok.text(delta.completion_ids),
            })
        views.append(view)
    return views


def create_app(run_dir: Path) -> FastAPI:
    index = RunIndex(run_dir)
    eval_file = run_dir / "checkpoints" / "eval.jsonl"
    model = read_config(run_dir, "learner").get("model", {})
    detok = Detokenizer(Path(model["path"]) if isinstance(model, dict) and model.get("path") else None)
    templates = Jinja2Templates(directory=HERE / "templates")
    app = FastAPI(title=f"harnessrl view {run_dir.name}", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")

    def rollout(rollout_id: str, by: Colouring) -> RolloutView:
        index.refresh()
        row, entry = index.rows.get(rollout_id), index.entry(rollout_id)
        if row is None or entry is None:
            raise HTTPException(404, f"no rollout {rollout_id!r} in the journal")
        c = entry.completion
        sequences = [SequenceView(node_ids=s.node_ids,
                                  tokens=token_views(s, detok.texts(s.token_ids), row.advantage or 0.0, by))
                     for s in entry.sequences]
        records = index.calls(row.session_id)
        return RolloutView(row=row, grader_output=c.grader_output, error=c.error,
                           prefix_breaks={k.value: n for k, n in c.prefix_breaks.items()},
                           calls=call_views(records, detok), graph=call_graph(records, entry.sequences),
                           sequences=sequences)

    def comparison(rows: list[RolloutRow], q: CompareQuery) -> Comparison:
        q, a, b = sides(rows, q)
        return Comparison(query=q, options=options(rows, q.task, q.by), a=a, b=b,
                          calls_a=call_views(index.calls(a.shown.session_id), detok) if a.shown else [],
                          calls_b=call_views(index.calls(b.shown.session_id), detok) if b.shown else [])

    @app.get("/api/metrics")
    def metrics() -> list[StepMetrics]:
        index.refresh()
        return index.metrics

    @app.get("/api/evals")
    def evals() -> list[EvalRecord]:
        return read_records(eval_file)

    @app.get("/api/compare")
    def compare_json(q: Annotated[CompareQuery, Query()]) -> Comparison:
        return comparison(index.refresh(), q)

    @app.get("/api/rollouts")
    def rollouts(q: Annotated[RolloutQuery, Query()]) -> RolloutPage:
        return select(index.refresh(), q)

    @app.get("/api/rollouts/{rollout_id}")
    def rollout_json(rollout_id: str, colour: Colouring = Colouring.logprob) -> RolloutView:
        return rollout(rollout_id, colour)

    @app.get("/", response_class=HTMLResponse)
    def run_page(request: Request) -> HTMLResponse:
        rows = index.refresh()
        metrics, records = index.metrics, read_records(eval_file)
        return templates.TemplateResponse(request, "run.html", {
            "run": run_dir.name, "harnesses": summarize(rows), "metrics": metrics, "chart": charts.svg(metrics),
            "pass_at_1": charts.pass_at_1_svg(records), "matrix": eval_matrix(records)})

    @app.get("/rollouts", response_class=HTMLResponse)
    def rollouts_page(request: Request, q: Annotated[RolloutQuery, Query()]) -> HTMLResponse:
        rows = index.refresh()
        return templates.TemplateResponse(request, "rollouts.html", {
            "run": run_dir.name, "page": select(rows, q), "q": q, "link": link, "sortable": SORTABLE,
            "compare_row": compare_row,
            "harnesses": sorted({r.harness for r in rows}), "tasks": sorted({r.task_id for r in rows if r.task_id}),
            "versions": sorted({r.version for r in rows if r.version is not None})})

    @app.get("/rollouts/{rollout_id}", response_class=HTMLResponse)
    def rollout_page(request: Request, rollout_id: str, colour: Colouring = Colouring.logprob) -> HTMLResponse:
        return templates.TemplateResponse(request, "rollout.html", {
            "run": run_dir.name, "view": rollout(rollout_id, colour), "colour": colour, "colourings": list(Colouring),
            "compare_row": compare_row})

    @app.get("/compare", response_class=HTMLResponse)
    def compare_page(request: Request, q: Annotated[CompareQuery, Query()]) -> HTMLResponse:
        rows = index.refresh()
        return templates.TemplateResponse(request, "compare.html", {
            "run": run_dir.name, "c": comparison(rows, q), "tasks": sorted({r.task_id for r in rows if r.task_id}),
            "compare_link": compare_link})

    return app
