"""Wire models of the trajectory: validation and derived fields."""

from __future__ import annotations

import math
from array import array

import pytest
from harnessrl.runtime.trajectory.models import (
    SessionSequences,
    TrainingSequence,
    Turn,
    TurnDelta,
    capture_problems,
    pack,
)
from pydantic import ValidationError


def seq(**overrides: object) -> TrainingSequence:
    fields: dict[str, object] = {
        "session_id": "s",
        "node_ids": [0, 1],
        "token_ids": [1, 2, 3, 4],
        "loss_mask": [0, 1, 0, 1],
        "logprobs": [0.0, -0.5, 0.0, -1.0],
        "policy_versions": [3, 3, 5, 5],
    }
    return TrainingSequence.model_validate(fields | overrides)


def test_policy_versions_are_judged_on_sampled_tokens() -> None:
    s = seq(policy_versions=[1, 3, 9, 5])
    assert (s.min_policy_version, s.max_policy_version, s.num_sampled) == (3, 5, 2)
    dumped = s.model_dump()
    assert dumped["min_policy_version"] == 3 and dumped["max_policy_version"] == 5


def test_all_context_sequence_falls_back_to_all_versions() -> None:
    s = seq(loss_mask=[0, 0, 0, 0], logprobs=[0.0] * 4, policy_versions=[2, 4, 4, 4])
    assert (s.min_policy_version, s.max_policy_version) == (2, 4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"loss_mask": [0, 1, 0]}, "equal lengths"),
        ({"logprobs": [0.0]}, "equal lengths"),
        ({"loss_mask": [0, 2, 0, 1]}, "0 or 1"),
        ({"node_ids": []}, "at least one node"),
    ],
)
def test_misaligned_sequences_are_rejected(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        seq(**overrides)


def test_sequence_round_trips_through_json() -> None:
    s = seq()
    assert TrainingSequence.model_validate_json(s.model_dump_json()) == s
    batch = SessionSequences(session_id="s", turns=2, tool_calls=1, sequences=[s])
    assert SessionSequences.model_validate_json(batch.model_dump_json()) == batch


@pytest.mark.parametrize(
    ("turn", "problem"),
    [
        (Turn(prompt_ids=[1], completion_ids=[2, 3], logprobs=[-1.0]), "1 logprobs for 2"),
        (Turn(prompt_ids=[1], completion_ids=[2], logprobs=[math.nan]), "finite"),
        (Turn(prompt_ids=[1], completion_ids=[2], logprobs=[math.inf]), "finite"),
        (Turn(prompt_ids=[1], completion_ids=[2], logprobs=[0.25]), "<= 0"),
        (Turn(prompt_ids=[], completion_ids=[2], logprobs=[-1.0]), "empty prompt"),
        (Turn(prompt_ids=[-4], completion_ids=[2], logprobs=[-1.0]), "negative"),
    ],
)
def test_capture_problems_name_the_defect(turn: Turn, problem: str) -> None:
    assert any(problem in p for p in capture_problems(turn))


def test_a_good_capture_has_no_problems() -> None:
    assert capture_problems(Turn(prompt_ids=[1, 2], completion_ids=[3], logprobs=[0.0])) == []


def test_a_journal_delta_packs_its_arrays_exactly_and_old_list_records_still_read() -> None:
    logprobs = [-0.0, -1e-300, -math.inf, math.nan, -0.1 + -0.2]
    packed = {"id": 0, "parent": None, "prompt_tail": pack(array("i", [0, 2**31 - 1, -1])),
              "completion_ids": pack(array("i", [7])), "logprobs": pack(array("d", logprobs))}
    assert all(isinstance(packed[k], str) for k in ("prompt_tail", "completion_ids", "logprobs"))
    delta = TurnDelta.model_validate(packed)
    assert delta.prompt_tail == [0, 2**31 - 1, -1] and delta.completion_ids == [7]
    assert array("d", delta.logprobs).tobytes() == array("d", logprobs).tobytes()  # bit for bit, NaN and -0.0 too
    as_lists = {**packed, "prompt_tail": [0, 2**31 - 1, -1], "completion_ids": [7], "logprobs": [-0.5]}
    assert TurnDelta.model_validate(as_lists).prompt_tail == delta.prompt_tail  # a journal from before packing


@pytest.mark.parametrize("bad", ["not base64!", pack(array("i", [1]))[:-4] + "AAA=", 5])
def test_a_delta_whose_packed_array_is_unreadable_is_refused(bad: object) -> None:
    with pytest.raises(ValidationError):
        TurnDelta.model_validate({"id": 0, "parent": None, "prompt_tail": bad, "completion_ids": [], "logprobs": []})
