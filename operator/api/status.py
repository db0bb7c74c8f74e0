"""Status pieces shared by both kinds: conditions (as metav1.Condition) and how to update them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from harnessrl.operator.api.common import ApiModel, Unique, free_form
from pydantic import Field, StringConstraints

ConditionStatus = Literal["True", "False", "Unknown"]



class Condition(ApiModel):
    """One aspect of the resource's state, as metav1.Condition."""

    type: Annotated[
        str, StringConstraints(min_length=1, max_length=316, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*)?$")
    ] = Field(description="Condition type, e.g. Ready, Training, Complete, Failed, Suspended.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: Annotated[
        str,
        StringConstraints(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
    ] = Field(description="Machine-readable CamelCase reason for the last transition.")
    message: Annotated[str, StringConstraints(max_length=32768)] = Field(
        default="", description="Human-readable detail of the last transition."
    )
    last_transition_time: datetime = Field(description="When status last changed.", strict=False)
    observed_generation: int = Field(
        default=0, ge=0, description="metadata.generation the condition was computed from."
    )


def status_time(now: datetime | None = None) -> datetime:
    """`now` (default: the clock) as status timestamps carry it: whole seconds, as the API server stores them."""
    return (now or datetime.now(UTC)).replace(microsecond=0)


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str = "",
    generation: int = 0,
    now: datetime | None = None,
) -> list[Condition]:
    """Return `conditions` with `type_` set; lastTransitionTime moves only when status changes."""
    old = next((c for c in conditions if c.type == type_), None)
    when = old.last_transition_time if old is not None and old.status == status else status_time(now)
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=when,
        observed_generation=generation,
    )
    return [new if c.type == type_ else c for c in conditions] if old else [*conditions, new]


# A map list keyed by type, so two writers can't duplicate a type.
Conditions = Annotated[list[Condition], Unique("type")]


def conditions_field(description: str) -> Any:
    return Field(default_factory=list, max_length=16, description=description)


def kopf_field() -> Any:
    """Room for kopf's own bookkeeping, which it writes under status.kopf."""
    return Field(
        default=None,
        description="Bookkeeping of the operator framework (kopf); not part of the API.",
        json_schema_extra=free_form(),
    )
