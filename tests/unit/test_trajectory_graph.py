"""Linking turns into a call graph, the training sequences it yields, and the journal's delta form.

Besides worked examples, hypothesis generates agent-like sessions (continuations, retries, sub-agents, rewrites)
and checks the invariants against a brute-force O(turns²) oracle."""

from __future__ import annotations

import gc
import json
import math
import random

from harnessrl.runtime.trajectory.graph import SessionGraph
from harnessrl.runtime.trajectory.models import BreakCause, TrainingSequence, Turn, TurnDelta
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def turn(prompt: list[int], completion: list[int], version: int = 0, tools: int = 0, **kw: object) -> Turn:
    logprobs = kw.pop("logprobs", [-0.1 * (i + 1) for i in range(len(completion))])
    return Turn.model_validate(
        {"prompt_ids": prompt, "completion_ids": completion, "logprobs": logprobs, "policy_version": version}
        | {"tool_calls": tools}
        | kw
    )


def test_a_multi_turn_session_is_one_chain_and_one_sequence() -> None:
    g = SessionGraph("s")
    a = g.add(turn([1, 2, 3], [10, 11], version=1, tools=1))
    b = g.add(turn([1, 2, 3, 10, 11, 4, 5], [12], version=2, tools=1))
    c = g.add(turn([1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14], version=2))
    assert (a.parent, b.parent, c.parent) == (None, 0, 1)
    assert (b.shared_prefix, c.shared_prefix) == (5, 8)
    [s] = g.training_sequences()
    assert s.node_ids == [0, 1, 2]
    assert s.token_ids == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14]
    assert s.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert s.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.1, 0.0, -0.1, -0.2]
    assert s.policy_versions == [1] * 5 + [2] * 6
    assert (s.min_policy_version, s.max_policy_version, s.tool_calls) == (1, 2, 2)
    assert g.tool_calls == 2


def test_retries_become_siblings_and_each_sample_is_trained_once() -> None:
    g = SessionGraph("s")
    g.add(turn([1, 2], [3]))
    g.add(turn([1, 2, 3, 4], [5]))  # continues turn 0
    g.add(turn([1, 2, 3, 4], [6]))  # retry of turn 1: same prompt
    assert [g.node(i).parent for i in range(3)] == [None, 0, 0]
    assert g.children(0) == [1, 2] and g.leaves() == [1, 2]
    first, second = g.training_sequences()
    assert first.token_ids == [1, 2, 3, 4, 5] and first.loss_mask == [0, 0, 1, 0, 1]
    # Turn 0's sample is context in the second sequence: trained once, not twice.
    assert second.token_ids == [1, 2, 3, 4, 6] and second.loss_mask == [0, 0, 0, 0, 1]


def test_sub_agents_and_rewritten_histories_start_new_roots() -> None:
    g = SessionGraph("s")
    g.add(turn([1, 2, 3], [4]))
    g.add(turn([7, 8], [9]))  # a sub-agent with its own system prompt
    g.add(turn([1, 2, 3, 5], [6]))  # history rewritten: turn 0's completion is not in the prompt
    g.add(turn([7, 8, 9, 1], [2]))  # the sub-agent continues
    assert g.roots() == [0, 1, 2] and g.node(3).parent == 1
    assert [s.node_ids for s in g.training_sequences()] == [[0], [2], [1, 3]]


def test_each_prefix_break_is_counted_with_where_the_prompt_left_the_earlier_calls() -> None:
    g = SessionGraph("s")
    causes = [g.add(turn(prompt, completion)).break_cause for prompt, completion in [
        ([1, 2, 3], [10, 11]),
        ([1, 2, 3], [12]),  # the same prompt again
        ([1, 2, 3, 10, 11, 4], [13]),  # continues turn 0, which turn 1 already branched from: extends a leaf
        ([1, 2, 3, 10, 99, 4], [14]),  # turn 0's reply resent changed (re-tokenised)
        ([1, 2, 3, 10, 11, 5], [15]),  # another message after turn 0's reply
        ([1, 7], [16]),  # another system prompt: a side call
        ([1, 2, 3, 10, 11, 4, 13, 6], [17]),  # continues turn 2: extends a leaf
    ]]
    assert causes == [None, BreakCause.retry, None, BreakCause.reply_changed, BreakCause.history_changed,
                      BreakCause.history_changed, None]
    assert g.breaks == {BreakCause.retry: 1, BreakCause.reply_changed: 1, BreakCause.history_changed: 2}
    # Each break is one more training sequence than the first call's.
    assert len(g.training_sequences()) == 1 + sum(g.breaks.values())
    assert [g.node(i).break_cause for i in range(len(g))] == causes


def test_the_most_recent_of_identical_turns_is_the_parent() -> None:
    g = SessionGraph("s")
    g.add(turn([1], [2]))
    g.add(turn([1], [2]))  # a retry that sampled the same tokens
    assert g.add(turn([1, 2, 3], [4])).parent == 1


def test_untrainable_turns_stay_as_context_and_are_counted() -> None:
    g = SessionGraph("s")
    g.add(turn([1], [2, 3], logprobs=[-0.5, math.nan]))
    g.add(turn([1, 2, 3, 4], [5], trainable=False))
    g.add(turn([1, 2, 3, 4, 5, 6], [7]))
    [s] = g.training_sequences()
    assert s.loss_mask == [0, 0, 0, 0, 0, 0, 1]
    assert s.logprobs == [0.0] * 6 + [-0.1]
    assert all(math.isfinite(x) for x in s.logprobs)
    assert g.sequences().untrainable_turns == 2
    assert json.loads(g.sequences().model_dump_json())["turns"] == 3


def test_a_negative_id_in_a_shared_prefix_keeps_every_later_turn_untrainable() -> None:
    """Linking scans only a turn's new tokens for invalid ids when its parent's were valid; a prefix that was
    not valid is rescanned, so its defect is still found in every turn that shares it."""
    g = SessionGraph("s")
    g.add(turn([1, -4, 2], [3]))
    g.add(turn([1, -4, 2, 3, 5], [6]))
    g.add(turn([1, -4, 2, 3, 5, 6, 7], [8]))
    clean = SessionGraph("c")
    clean.add(turn([1, 4, 2], [3]))
    clean.add(turn([1, 4, 2, 3, -5], [6]))  # the defect is in the new tokens only
    clean.add(turn([1, 4, 2, 3, -5, 6, 7], [8]))
    assert g.sequences().untrainable_turns == 3 and clean.sequences().untrainable_turns == 2


def test_a_dropped_graph_is_freed_without_the_garbage_collector() -> None:
    """A proxy drops thousands of finished sessions: their graphs must hold no reference cycles, or each would
    wait in memory for a full collection (and make it longer)."""
    gc.collect()
    gc.disable()
    try:
        g = SessionGraph("s")
        g.add(turn([1, 2, 3], [4, 5]))
        g.add(turn([1, 2, 3, 4, 5, 6], [7]))
        g.add(turn([1, 2, 9], [8]))  # splits the first edge
        assert g.sequences().turns == 3 and g.node(1).turn.prompt_ids == [1, 2, 3, 4, 5, 6]
        del g
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_delta_stores_only_tokens_beyond_the_parent() -> None:
    g = SessionGraph("s")
    g.add(turn(list(range(100)), [100, 101]))
    g.add(turn([*range(102), 500, 501], [502], version=4, tools=2, finish_reason="tool_calls", model="p-v4"))
    d = TurnDelta.model_validate(g.delta(1))  # the journal's form is a valid TurnDelta
    assert (d.parent, d.prompt_tail, d.completion_ids) == (0, [500, 501], [502])
    assert (d.policy_version, d.tool_calls, d.finish_reason, d.model) == (4, 2, "tool_calls", "p-v4")
    restored = SessionGraph.from_deltas(
        "s", [TurnDelta.model_validate_json(json.dumps(g.delta(i))) for i in range(2)]
    )
    assert restored.node(1) == g.node(1)
    assert restored.sequences() == g.sequences()


def test_bad_journals_are_refused_with_a_reason() -> None:
    g = SessionGraph("s")
    orphan = TurnDelta(id=0, parent=3, prompt_tail=[1], completion_ids=[2], logprobs=[-1.0])
    try:
        g.add_delta(orphan)
    except ValueError as exc:
        assert "parent 3" in str(exc)
    else:
        raise AssertionError("an orphan delta was accepted")
    gap = TurnDelta(id=5, parent=None, prompt_tail=[1], completion_ids=[2], logprobs=[-1.0])
    try:
        g.add_delta(gap)
    except ValueError as exc:
        assert "out of order" in str(exc)
    else:
        raise AssertionError("a delta out of order was accepted")


# ---------------------------------------------------------------------------------------- linking cost


def link_cost(g: SessionGraph, t: Turn) -> tuple[int, int]:
    steps, compared = g.index.steps, g.index.compared
    g.add(t)
    return g.index.steps - steps, g.index.compared - compared


def test_linking_cost_does_not_grow_with_earlier_turns() -> None:
    rng = random.Random(0)
    prompt = [rng.randrange(1000) for _ in range(300)]
    costs = []
    for earlier in (1, 1000):
        g = SessionGraph("s")
        for i in range(earlier):  # unrelated sessions' worth of roots in a disjoint token range
            g.add(turn([2000 + i % 50, *[rng.randrange(2000, 3000) for _ in range(20)]], [5000]))
        g.add(turn(prompt[:100], prompt[100:120]))
        costs.append(link_cost(g, turn(prompt, [7])))
    assert costs[0] == costs[1]
    steps, compared = costs[0]
    assert steps <= 3 and compared <= len(prompt)


def test_linking_cost_is_bounded_by_prompt_length_in_long_chains() -> None:
    g = SessionGraph("s")
    prompt: list[int] = [1, 2, 3]
    for i in range(400):
        completion = [10_000 + i]
        steps, compared = link_cost(g, turn(prompt, completion))
        assert steps <= len(prompt) + 1 and compared <= len(prompt)
        prompt = prompt + completion + [20_000 + i, 30_000 + i]
    assert len(g.roots()) == 1 and len(g.training_sequences()) == 1


# ---------------------------------------------------------------------------------------- properties

TOKENS = st.integers(min_value=0, max_value=12)  # a small alphabet makes accidental shared prefixes common


@st.composite
def sessions(draw: st.DrawFn) -> list[Turn]:
    turns: list[Turn] = []
    for _ in range(draw(st.integers(min_value=1, max_value=14))):
        kind = draw(st.sampled_from(["continue", "retry", "fresh", "rewrite"]) if turns else st.just("fresh"))
        if kind == "fresh":
            prompt = draw(st.lists(TOKENS, min_size=1, max_size=6))
        else:
            base = turns[draw(st.integers(min_value=0, max_value=len(turns) - 1))]
            if kind == "continue":
                prompt = base.prompt_ids + base.completion_ids + draw(st.lists(TOKENS, max_size=4))
            elif kind == "retry":
                prompt = list(base.prompt_ids)
            else:
                cut = draw(st.integers(min_value=0, max_value=len(base.prompt_ids)))
                prompt = base.prompt_ids[:cut] + draw(st.lists(TOKENS, min_size=1, max_size=4))
        completion = draw(st.lists(TOKENS, max_size=4))
        logprobs = draw(st.lists(st.floats(-20, 0), min_size=len(completion), max_size=len(completion)))
        turns.append(
            Turn(
                prompt_ids=prompt,
                completion_ids=completion,
                logprobs=logprobs,
                policy_version=draw(st.integers(0, 5)),
                tool_calls=draw(st.integers(0, 2)),
                trainable=draw(st.booleans()) or draw(st.booleans()),
            )
        )
    return turns


def oracle_parent(turns: list[Turn], k: int) -> int | None:
    """Brute force: the latest earlier turn with the longest prompt+completion that prefixes turn k's prompt."""
    best, best_len = None, -1
    prompt = turns[k].prompt_ids
    for j in range(k):
        seq = turns[j].prompt_ids + turns[j].completion_ids
        if prompt[: len(seq)] == seq and len(seq) >= best_len:
            best, best_len = j, len(seq)
    return best


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions())
def test_linking_matches_the_brute_force_oracle_and_prompts_reconstruct(turns: list[Turn]) -> None:
    g = SessionGraph("s")
    for k, t in enumerate(turns):
        node = g.add(t)
        assert node.parent == oracle_parent(turns, k)
        assert node.break_cause in oracle_causes(turns, k)
    for k, t in enumerate(turns):
        assert g.prompt_ids(k) == t.prompt_ids
        assert g.node(k).turn.completion_ids == t.completion_ids
    assert g.tool_calls == sum(t.tool_calls for t in turns)
    assert sum(g.breaks.values()) == len(g.leaves()) - 1


def oracle_causes(turns: list[Turn], k: int) -> set[BreakCause | None]:
    """Brute force: the causes turn k's prefix break may be given (None when it extends a leaf): retry when its
    prompt lies within an earlier sequence; else, where it leaves the earlier sequences that agree with it
    furthest, reply_changed or history_changed as the differing token was sampled or written (sequences that
    differ at the same point may say both)."""
    parent = oracle_parent(turns, k)
    if k > 0 and (parent is None or any(oracle_parent(turns, j) == parent for j in range(parent + 1, k))):
        prompt = turns[k].prompt_ids
        seqs = [turns[j].prompt_ids + turns[j].completion_ids for j in range(k)]
        agree = [next((i for i, (a, b) in enumerate(zip(prompt, s, strict=False)) if a != b), min(len(prompt), len(s)))
                 for s in seqs]
        reach = max(agree)
        if reach == len(prompt):
            return {BreakCause.retry}
        return {BreakCause.reply_changed if len(turns[j].prompt_ids) <= reach else BreakCause.history_changed
                for j in range(k) if agree[j] == reach < len(seqs[j])}
    return {None}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(), st.randoms(use_true_random=False))
def test_linking_from_a_known_prefix_turn_matches_linking_from_the_root(turns: list[Turn], rng: random.Random) -> None:
    """The proxy names a turn whose prompt+completion the prompt starts with (`after`); any such turn gives the
    link a walk from the root gives."""
    g, from_root = SessionGraph("s"), SessionGraph("s")
    for k, t in enumerate(turns):
        prefixing = [j for j in range(k)
                     if t.prompt_ids[: len(turns[j].prompt_ids) + len(turns[j].completion_ids)]
                     == turns[j].prompt_ids + turns[j].completion_ids]
        node, expected = g.add(t, rng.choice(prefixing) if prefixing else None), from_root.add(t)
        assert (node.parent, node.shared_prefix) == (expected.parent, expected.shared_prefix)
        assert node.parent == oracle_parent(turns, k)
    for k, t in enumerate(turns):
        assert g.prompt_ids(k) == t.prompt_ids and g.delta(k) == from_root.delta(k)


@settings(max_examples=150, deadline=None)
@given(sessions())
def test_sequences_cover_every_sample_exactly_once(turns: list[Turn]) -> None:
    g = SessionGraph("s")
    for t in turns:
        g.add(t)
    sequences = g.training_sequences()
    assert sorted(s.node_ids[-1] for s in sequences) == g.leaves()
    trained_counts = [0] * len(turns)
    for s in sequences:
        assert isinstance(s, TrainingSequence)
        assert s.token_ids == g.sequence_ids(s.node_ids[-1])
        # Walk the path: each node contributes its tail (context) then its completion (sampled).
        pos = 0
        for i in s.node_ids:
            t = turns[i]
            start = len(t.prompt_ids)
            end = start + len(t.completion_ids)
            mask = s.loss_mask[start:end]
            assert all(m == 0 for m in s.loss_mask[pos:start])
            if any(mask):
                assert all(mask) and t.trainable
                assert s.logprobs[start:end] == t.logprobs
                trained_counts[i] += 1
            assert s.policy_versions[pos:end] == [t.policy_version] * (end - pos)
            pos = end
        assert all(lp == 0.0 for lp, m in zip(s.logprobs, s.loss_mask, strict=True) if not m)
    for i, t in enumerate(turns):
        expected = 1 if t.trainable and t.completion_ids else 0
        assert trained_counts[i] == expected


@settings(max_examples=75, deadline=None)
@given(sessions())
def test_journal_deltas_rebuild_the_same_graph(turns: list[Turn]) -> None:
    g = SessionGraph("s")
    for t in turns:
        g.add(t)
    deltas = [TurnDelta.model_validate_json(json.dumps(g.delta(i))) for i in range(len(turns))]
    # A delta never repeats its parent's tokens.
    assert sum(len(d.prompt_tail) for d in deltas) <= sum(len(t.prompt_ids) for t in turns)
    rebuilt = SessionGraph.from_deltas("s", deltas)
    assert rebuilt.sequences() == g.sequences() and rebuilt.breaks == g.breaks
    assert [rebuilt.node(i) for i in range(len(turns))] == [g.node(i) for i in range(len(turns))]


def test_memory_is_proportional_to_unique_tokens() -> None:
    """A 20-turn agent session (a ~500-token tool result per turn, real-sized token ids) keeps ~12 bytes per
    unique token, not turns × context: the proxy's per-session budget is 0.5 MB at these sizes."""
    import tracemalloc

    rng = random.Random(1)
    prompt = [rng.randrange(150_000) for _ in range(1000)]
    turns = []
    for _ in range(20):
        completion = [rng.randrange(150_000) for _ in range(50)]
        # Fresh int objects per call, as JSON parsing gives the proxy.
        turns.append(Turn.model_validate_json(turn(prompt, completion).model_dump_json()))
        prompt = prompt + completion + [rng.randrange(150_000) for _ in range(500)]
    unique = len(turns[-1].prompt_ids) + len(turns[-1].completion_ids)
    g = SessionGraph("s")
    tracemalloc.start()
    try:
        for t in turns:
            g.add(t)
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held / unique < 24, f"{held} bytes for {unique} unique tokens"
    assert held < 300_000
