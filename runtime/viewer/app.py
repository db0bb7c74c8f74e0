"""The viewer's web app: HTML pages (Jinja2 templates, one packaged stylesheet, no script) and the JSON API
they are built from, over a run directory's index (index.py), which each request brings up to date, so the
pages follow a run that is still going.

  GET /                          the run: rollouts, solved rate and reward per harness; plots over steps
  GET /rollouts                  rollouts, filtered, sorted and paged (query.RolloutQuery)
  GET /rollouts/{id}             one rollout: grader output, reward, its calls in order, its training tokens
  GET /api/metrics               the learner's StepMetrics, one per step
  GET /api/rollouts              a page of rollouts as JSON (the same query)
  GET /api/rollouts/{id}         one rollout as JSON (`colour` picks what the token colours encode)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from harnessrl.runtime.learner.metrics import StepMetrics
from harnessrl.runtime.trajectory.models import TurnDelta
from harnessrl.runtime.viewer import charts
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
    sequences: list[SequenceView]


def summarize(rows: list[RolloutRow]) -> list[HarnessSummary]:
    """Per harness, over its training rollouts."""
    by: dict[str, list[RolloutRow]] = {}
    for row in rows:
        if not row.evaluation:
            by.setdefault(row.harness, []).append(row)
    out = []
    for harness, rs in sorted(by.items()):
        rewards = [r.reward for r in rs if r.reward is not None]
        out.append(HarnessSummary(harness=harness, rollouts=len(rs), scored=sum(r.scored for r in rs),
                                  solved=sum(r.solved for r in rs),
                                  mean_reward=sum(rewards) / len(rewards) if rewards else None))
    return out


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
        return RolloutView(row=row, grader_output=c.grader_output, error=c.error,
                           prefix_breaks={k.value: n for k, n in c.prefix_breaks.items()},
                           calls=call_views(index.calls(row.session_id), detok), sequences=sequences)

    @app.get("/api/metrics")
    def metrics() -> list[StepMetrics]:
        index.refresh()
        return index.metrics

    @app.get("/api/rollouts")
    def rollouts(q: Annotated[RolloutQuery, Query()]) -> RolloutPage:
        return select(index.refresh(), q)

    @app.get("/api/rollouts/{rollout_id}")
    def rollout_json(rollout_id: str, colour: Colouring = Colouring.logprob) -> RolloutView:
        return rollout(rollout_id, colour)

    @app.get("/", response_class=HTMLResponse)
    def run_page(request: Request) -> HTMLResponse:
        rows = index.refresh()
        metrics = index.metrics
        return templates.TemplateResponse(request, "run.html", {
            "run": run_dir.name, "harnesses": summarize(rows), "metrics": metrics, "chart": charts.svg(metrics)})

    @app.get("/rollouts", response_class=HTMLResponse)
    def rollouts_page(request: Request, q: Annotated[RolloutQuery, Query()]) -> HTMLResponse:
        rows = index.refresh()
        return templates.TemplateResponse(request, "rollouts.html", {
            "run": run_dir.name, "page": select(rows, q), "q": q, "link": link, "sortable": SORTABLE,
            "harnesses": sorted({r.harness for r in rows}), "tasks": sorted({r.task_id for r in rows if r.task_id}),
            "versions": sorted({r.version for r in rows if r.version is not None})})

    @app.get("/rollouts/{rollout_id}", response_class=HTMLResponse)
    def rollout_page(request: Request, rollout_id: str, colour: Colouring = Colouring.logprob) -> HTMLResponse:
        return templates.TemplateResponse(request, "rollout.html", {
            "run": run_dir.name, "view": rollout(rollout_id, colour), "colour": colour, "colourings": list(Colouring)})

    return app
