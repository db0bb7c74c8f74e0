"""The sampling seed of one engine call in a seeded run.

vLLM samples a request that carries a `seed` from its own generator, so the same call (same prompt, same policy
version, same seed) repeats token for token whatever else the engine batches with it. The seed is derived from
the run's seed, the rollout and the call's index in its session: a rollout retried after a crash, or a run started
again, draws the same tokens, while the rollouts of a group (and the calls of a rollout) draw different ones.
"""

from __future__ import annotations

import hashlib

# vLLM takes any int64 seed; 63 bits keep it non-negative.
SEED_BITS = 63


def call_seed(run_seed: int, rollout_id: str, call_index: int) -> int:
    """The seed of call `call_index` (0-based, counting the session's answered calls) of rollout `rollout_id`.
    Pure: a keyed hash, so nearby run seeds or rollout ids give unrelated seeds."""
    digest = hashlib.blake2b(f"{run_seed}\0{rollout_id}\0{call_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - SEED_BITS)
