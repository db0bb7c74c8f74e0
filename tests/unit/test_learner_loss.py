"""The GRPO step's loss and gradients against TRL's own `GRPOTrainer._compute_loss` on the same batch.

TRL's method is called unbound, on an object carrying just the attributes it reads (the trainer itself needs a
dataset, reward functions and an accelerator), with the same tiny model and the same tokens: the loss, the
gradients and the clip statistics must agree. Packing/accumulation must not change the gradient either.
"""

from __future__ import annotations

import contextlib
import copy
import math
import types
from collections import defaultdict
from dataclasses import replace
from typing import Any

import pytest
import torch
from harnessrl.runtime.contracts.learner_config import GrpoConfig
from harnessrl.runtime.learner.loss import loss_normalizer
from harnessrl.runtime.learner.packing import Sample, pack, pack_flat, split_by_tokens, split_mini_batches
from harnessrl.runtime.learner.trainer import PolicyTrainer, sequence_logps
from harnessrl.runtime.trajectory.models import TrainingSequence

PROMPT = 6
DR_GRPO_TOKENS = 64


def tiny_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    model = Qwen2ForCausalLM(cfg).float()
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))  # TRL reads entropy too
    return model


def make_samples(n: int = 5) -> list[Sample]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        comp = 3 + i % 4  # ragged completions (right padding); equal prompts keep positions identical in TRL
        ids = torch.randint(1, 96, (PROMPT + comp,), generator=g).tolist()
        lps = (-torch.rand(comp, generator=g) * 8 - 0.05).tolist()  # straddles the model's ~ -log(96)
        seq = TrainingSequence(session_id=f"s{i}", node_ids=[0], token_ids=ids, loss_mask=[0] * PROMPT + [1] * comp,
                               logprobs=[0.0] * PROMPT + lps, policy_versions=[0] * len(ids))
        out.append(Sample(sequence=seq, advantage=[1.2, -0.7, 0.4, -1.5, 0.9, 0.1][i % 6]))
    return out


def trl_inputs(samples: list[Sample]) -> dict[str, torch.Tensor]:
    width = max(len(s.sequence.token_ids) for s in samples) - PROMPT
    B = len(samples)
    comp_ids = torch.zeros(B, width, dtype=torch.long)
    comp_mask = torch.zeros(B, width, dtype=torch.long)
    old = torch.zeros(B, width)
    for i, s in enumerate(samples):
        c = s.sequence.token_ids[PROMPT:]
        comp_ids[i, : len(c)] = torch.tensor(c)
        comp_mask[i, : len(c)] = 1
        old[i, : len(c)] = torch.tensor(s.sequence.logprobs[PROMPT:])
    return {
        "prompt_ids": torch.tensor([s.sequence.token_ids[:PROMPT] for s in samples]),
        "prompt_mask": torch.ones(B, PROMPT, dtype=torch.long),
        "completion_ids": comp_ids,
        "completion_mask": comp_mask,
        "advantages": torch.tensor([s.advantage for s in samples]),
        "old_per_token_logps": old,
        "num_items_in_batch": comp_mask.sum(),
    }


class _Accel:
    num_processes = 1
    is_main_process = True

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def reduce(self, t: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return t

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        return t


def trl_loss(model: torch.nn.Module, inputs: dict[str, Any], loss_type: str, low: float, high: float,
             is_ratio: torch.Tensor | None = None, level: str = "token",
             beta: float = 0.0) -> tuple[torch.Tensor, dict[str, list[float]]]:
    from trl.trainer.grpo_trainer import GRPOTrainer

    metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
    fake = types.SimpleNamespace(
        accelerator=_Accel(), model=model, aux_loss_enabled=False, top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, importance_sampling_level=level, beta=beta, loss_type=loss_type,
        epsilon_low=low, epsilon_high=high, use_vllm=is_ratio is not None,
        vllm_importance_sampling_correction=is_ratio is not None, current_gradient_accumulation_steps=1,
        _entropy_bonus_enabled=False, _metrics=metrics, max_completion_length=DR_GRPO_TOKENS,
        args=types.SimpleNamespace(delta=None, steps_per_generation=1, use_bias_correction_kl=True),
    )
    fake._get_per_token_logps_and_entropies = types.MethodType(GRPOTrainer._get_per_token_logps_and_entropies, fake)
    if is_ratio is not None:
        inputs = {**inputs, "importance_sampling_ratio": is_ratio}
    return GRPOTrainer._compute_loss(fake, model, inputs), metrics["train"]


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def ours(model: torch.nn.Module, samples: list[Sample], cfg: GrpoConfig,
         old: torch.Tensor | None = None) -> tuple[float, float, dict[str, torch.Tensor]]:
    trainer = PolicyTrainer(model, cfg)
    model.zero_grad(set_to_none=True)
    [mb] = pack(samples, budget=10_000)
    n = loss_normalizer(cfg, mb.loss_tokens, mb.input_ids.size(0))
    loss, stats = trainer.micro_batch_loss(mb, n, old)
    loss.backward()
    return float(loss), stats.clipped / mb.loss_tokens, grads(model)


def assert_same_grads(ours_: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert ours_.keys() == ref.keys() and ref
    for name, g in ref.items():
        torch.testing.assert_close(ours_[name], g, rtol=1e-4, atol=1e-6, msg=name)


# (loss type, importance-sampling level, clip low, clip high): DAPO/GRPO/Dr. GRPO, GSPO's sequence-level ratio
# (TRL importance_sampling_level="sequence"), and CISPO, whose clip high is the weight's cap ε_max.
VARIANTS = [("dapo", "token", 0.2, 0.28), ("grpo", "token", 0.2, 0.28), ("dr_grpo", "token", 0.2, 0.28),
            ("dapo", "sequence", 3e-4, 4e-4), ("grpo", "sequence", 3e-4, 4e-4), ("cispo", "token", 0.2, 1.5)]


@pytest.mark.parametrize(("loss_type", "level", "low", "high"), VARIANTS)
def test_loss_and_gradients_match_trl(loss_type: str, level: str, low: float, high: float) -> None:
    # Without the correction the ratio is taken against the engine's logprobs directly, as TRL's "old".
    model = tiny_model()
    samples = make_samples()
    cfg = GrpoConfig(loss_type=loss_type, clip_low=low, clip_high=high, dr_grpo_tokens=DR_GRPO_TOKENS,
                     importance_sampling_level=level, vllm_importance_sampling_correction=False)
    model.zero_grad(set_to_none=True)
    ref, metrics = trl_loss(model, trl_inputs(samples), loss_type, low, high, level=level)
    ref.backward()
    ref_grads = grads(model)
    loss, clip_frac, our_grads = ours(model, samples, cfg)
    assert loss == pytest.approx(float(ref), rel=1e-5, abs=1e-7)
    if loss_type == "cispo":
        assert 0 < clip_frac == pytest.approx(metrics["cispo_clip_ratio"][0], rel=1e-5)  # the cap bites
    elif level == "token":
        assert metrics["clip_ratio/region_mean"][0] > 0  # random behaviour logprobs: the clip is exercised
        assert clip_frac == pytest.approx(metrics["clip_ratio/region_mean"][0], rel=1e-5)
    else:
        assert 0 < clip_frac < 1  # some sequences' ratios are clipped, not all
    assert_same_grads(our_grads, ref_grads)


def trl_is_ratio(old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, mode: str,
                 clip_min: float | None, clip_max: float | None) -> torch.Tensor:
    """TRL's vLLM importance-sampling ratio, as `GRPOTrainer._generate_and_score_completions` computes it
    (trl 1.16, grpo_trainer.py: the block under `vllm_importance_sampling_correction`), line for line."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    lo = clip_min if clip_min is not None else -math.inf
    hi = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < lo) | (ratio > hi), value=0.0)


def near_policy_samples(model: torch.nn.Module, n: int = 8) -> list[Sample]:
    """Samples whose engine logprobs are the model's own plus noise: token ratios straddle a band around 1, and
    so do the ratios of some whole sequences (a stale or mismatched engine)."""
    samples = make_samples(n)
    [mb] = pack(samples, 10_000)
    with torch.no_grad():
        own = sequence_logps(model, mb)
    g = torch.Generator().manual_seed(3)
    out = []
    for row, i in enumerate(mb.sequence_ids):
        s = samples[i].sequence
        k = len(s.token_ids)
        noisy = own[row, :k] + torch.randn(k, generator=g) * 0.5 + 0.1 * (i - n / 2)
        lps = [float(v) if m else 0.0 for v, m in zip(noisy, s.loss_mask, strict=True)]
        out.append((i, Sample(sequence=s.model_copy(update={"logprobs": lps}), advantage=samples[i].advantage)))
    return [x for _, x in sorted(out, key=lambda t: t[0])]


@pytest.mark.parametrize(("mode", "clip_min", "clip_max"), [
    ("token_truncate", 0.5, 2.0), ("token_mask", 0.5, 2.0),  # token_mask with a band: IcePop
    ("sequence_truncate", 0.5, 2.0), ("sequence_mask", 0.5, 2.0), ("token_truncate", None, 1.5),
])
def test_importance_sampling_correction_matches_trl(mode: str, clip_min: float | None, clip_max: float) -> None:
    model = tiny_model()
    samples = near_policy_samples(model)
    cfg = GrpoConfig(loss_type="dapo", vllm_importance_sampling_mode=mode,
                     vllm_importance_sampling_clip_min=clip_min, vllm_importance_sampling_clip_max=clip_max)
    trainer = PolicyTrainer(model, cfg)
    [mb] = pack(samples, budget=10_000)
    trainer_old = trainer._score_no_grad(mb)
    # TRL's inputs: old = the trainer's own logprobs, the ratio from them and vLLM's (the engine's).
    inputs = trl_inputs(samples)
    old_c = torch.zeros_like(inputs["old_per_token_logps"])
    for i, s in enumerate(samples):
        n = len(s.sequence.token_ids) - PROMPT
        old_c[i, :n] = trainer_old[mb.sequence_ids.index(i), PROMPT : PROMPT + n]
    mask = inputs["completion_mask"].float()
    ratio = trl_is_ratio(old_c, inputs["old_per_token_logps"], mask, mode, clip_min, clip_max)
    raw = trl_is_ratio(old_c, inputs["old_per_token_logps"], mask, mode.split("_")[0] + "_truncate", None, math.inf)
    outside = ((raw > clip_max) | (raw < (clip_min or 0.0))).expand_as(mask) * mask
    assert 0 < int(outside.sum()) < int(mask.sum())  # the band bites on some tokens, not all
    model.zero_grad(set_to_none=True)
    ref, _ = trl_loss(model, {**inputs, "old_per_token_logps": old_c}, "dapo", 0.2, 0.28, ratio)
    ref.backward()
    ref_grads = grads(model)
    for proximal in (trainer_old, None):  # None: the step's only update takes its own forward as the proximal
        model.zero_grad(set_to_none=True)
        norm = loss_normalizer(cfg, mb.loss_tokens, len(samples))
        loss, stats = trainer.micro_batch_loss(mb, norm, proximal)
        loss.backward()
        assert float(loss) == pytest.approx(float(ref), rel=1e-5, abs=1e-7)
        assert_same_grads(grads(model), ref_grads)
        counted = stats.masked if mode.endswith("mask") else stats.truncated
        assert sum(counted) == int(outside.sum()) and sum(stats.masked) + sum(stats.truncated) == sum(counted)


def test_kl_penalty_to_the_base_policy_matches_trl() -> None:
    # TRL's beta with its default bias-corrected KL, the reference being the base model: ours is the same LoRA
    # model with its adapter switched off; TRL's reference here is a separate copy of the base weights.
    from peft import LoraConfig, get_peft_model

    base = tiny_model()
    reference = copy.deepcopy(base)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(5)
    with torch.no_grad():  # a trained adapter: the policy has moved away from its base
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    samples = near_policy_samples(model)
    inputs = trl_inputs(samples)
    with torch.no_grad():
        from trl.trainer.grpo_trainer import GRPOTrainer

        def trl_logps(m: torch.nn.Module) -> torch.Tensor:
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
            attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
            lps, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
                types.SimpleNamespace(accelerator=_Accel()), m, ids, attention, inputs["completion_ids"].size(1))
            return lps

        ref_logps, policy_logps = trl_logps(reference), trl_logps(model)
        d = ref_logps - policy_logps  # the k3 KL to the base, unweighted by the ratio (TRL logs it weighted)
        mask = inputs["completion_mask"]
        expected_kl = float(((torch.exp(d) - d - 1) * mask).sum() / mask.sum())
    cfg = GrpoConfig(beta=0.5, vllm_importance_sampling_correction=False)
    model.zero_grad(set_to_none=True)
    ref, _ = trl_loss(model, {**inputs, "ref_per_token_logps": ref_logps}, "dapo", 0.2, 0.28, beta=0.5)
    ref.backward()
    ref_grads = grads(model)
    trainer = PolicyTrainer(model, cfg)
    [mb] = pack(samples, budget=10_000)
    model.zero_grad(set_to_none=True)
    loss, stats = trainer.micro_batch_loss(mb, loss_normalizer(cfg, mb.loss_tokens, len(samples)), None)
    loss.backward()
    assert float(loss) == pytest.approx(float(ref), rel=1e-5, abs=1e-7)
    assert stats.base_kl / mb.loss_tokens == pytest.approx(expected_kl, rel=1e-4) and expected_kl > 1e-3
    assert_same_grads(grads(model), ref_grads)
    unpenalised, _ = trainer.micro_batch_loss(mb, loss_normalizer(cfg, mb.loss_tokens, len(samples)), None)
    assert float(unpenalised) == pytest.approx(float(loss))  # the adapter is back on after the base's forward


def test_a_steps_corrected_tokens_are_counted_per_harness() -> None:
    # IcePop-style masking ([0.5, 2]): the tokens masked are counted per harness in the step's stats, the same
    # whether rows are padded or packed, and whether the proximal policy is the forward's own (one update) or
    # scored up front (several updates; lr 0 keeps the policy where it was).
    model = tiny_model()
    samples = [replace(s, harness="slow" if i % 3 == 0 else "fast", rollout=f"r{i}")
               for i, s in enumerate(near_policy_samples(model))]
    expected: dict[str, int] = {}
    with torch.no_grad():
        for s in samples:
            [alone] = pack([s], 10_000)
            ratio = torch.exp(sequence_logps(model, alone) - alone.behaviour_logps)
            n = int((((ratio < 0.5) | (ratio > 2.0)) & (alone.loss_mask > 0)).sum())
            expected[s.harness] = expected.get(s.harness, 0) + n
    assert expected["slow"] > 0 and expected["fast"] > 0
    for padding_free, mini_batches in ((False, 1), (True, 1), (True, 2)):
        cfg = GrpoConfig(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_min=0.5,
                         vllm_importance_sampling_clip_max=2.0, lr=0.0, micro_batch_tokens=30,
                         padding_free=padding_free, mini_batches=mini_batches)
        stats = PolicyTrainer(tiny_model(), cfg).step(samples)
        assert stats.is_masked_by_harness == expected, (padding_free, mini_batches)
        assert stats.is_truncated_by_harness == {}


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_packing_and_accumulation_do_not_change_the_gradient(loss_type: str) -> None:
    # The step equals the one-big-batch step whatever the micro-batch budget (defect 4: each micro-batch's
    # loss is divided by the whole update's normaliser, so accumulated gradients sum to the unsplit one).
    samples = make_samples(7)
    cfg_one = GrpoConfig(loss_type=loss_type, micro_batch_tokens=10_000, lr=0.0, max_grad_norm=None)  # type: ignore[arg-type]
    cfg_many = cfg_one.model_copy(update={"micro_batch_tokens": 24})
    assert len(pack(samples, 24)) > 3
    results = []
    for cfg in (cfg_one, cfg_many):
        model = tiny_model()
        stats = PolicyTrainer(model, cfg).step(samples)
        results.append((stats, grads(model)))
    (s1, g1), (s2, g2) = results
    assert s2.micro_batches > s1.micro_batches == 1
    assert s1.loss == pytest.approx(s2.loss, rel=1e-5)
    assert s1.loss_tokens == s2.loss_tokens == sum(sum(s.sequence.loss_mask) for s in samples)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_steps_token_budget_splits_updates_not_forward_passes() -> None:
    # grpo.max_tokens_per_step caps the tokens of one optimiser update; micro_batch_tokens sizes a forward pass.
    samples = make_samples(6)
    sizes = [len(s.sequence.token_ids) for s in samples]
    chunks = split_by_tokens(samples, 2 * max(sizes))
    assert [s for c in chunks for s in c] == samples and all(sum(len(s.sequence.token_ids) for s in c) <= 2 * max(sizes)
                                                            for c in chunks)
    assert split_by_tokens(samples, None) == [samples]
    model = tiny_model()
    cfg = GrpoConfig(micro_batch_tokens=10_000, max_tokens_per_step=2 * max(sizes), lr=1e-3)
    trainer = PolicyTrainer(model, cfg)
    trainer.step(samples)
    steps = {int(st["step"]) for st in trainer.optimizer.state.values()}
    assert steps == {len(chunks)} and len(chunks) >= 3


def test_pack_respects_budget_and_keeps_every_sequence() -> None:
    samples = make_samples(9)
    mbs = pack(samples, budget=30)
    assert sorted(i for mb in mbs for i in mb.sequence_ids) == list(range(9))
    for mb in mbs:
        assert mb.input_ids.numel() <= 30 or mb.input_ids.size(0) == 1
        for row, i in enumerate(mb.sequence_ids):
            s = samples[i].sequence
            assert mb.input_ids[row, : len(s.token_ids)].tolist() == s.token_ids
            assert mb.advantages[row] == pytest.approx(samples[i].advantage)
    assert [len(m) for m in split_mini_batches(samples, 4)] == [3, 2, 2, 2]


def test_a_step_moves_the_policy_toward_positive_advantage() -> None:
    model = tiny_model()
    samples = make_samples(4)
    cfg = GrpoConfig(lr=1e-2, max_grad_norm=None)
    trainer = PolicyTrainer(model, cfg)
    [mb] = pack(samples, 10_000)
    before = trainer._score_no_grad(mb)
    for _ in range(3):
        trainer.step(samples)
    after = trainer._score_no_grad(mb)
    for row, i in enumerate(mb.sequence_ids):
        m = mb.loss_mask[row] > 0
        delta = float((after[row][m] - before[row][m]).sum())
        assert (delta > 0) == (samples[i].advantage > 0), (i, delta)


def test_padding_free_rows_score_every_sequence_as_its_own_forward() -> None:
    # transformers 5 reads packed sequences from position_ids (a block-causal mask for sdpa on CPU, varlen on
    # flash): the logprobs of a concatenated row equal each sequence's own unpadded forward.
    model = tiny_model()
    samples = make_samples(5)
    [flat] = pack_flat(samples, 10_000)
    assert flat.input_ids.shape == (1, sum(len(s.sequence.token_ids) for s in samples))  # not one padding token
    with torch.no_grad():
        packed = sequence_logps(model, flat)[0]
        start = 0
        for j, i in enumerate(flat.sequence_ids):
            n = len(samples[i].sequence.token_ids)
            [alone] = pack([samples[i]], 10_000)
            own = sequence_logps(model, alone)[0]
            got = packed[start: start + n]
            assert int(flat.segments[0, start]) == j
            # Position 0 of a sequence is never predicted (and masked); the rest must match.
            torch.testing.assert_close(got[1:], own[1:], rtol=1e-5, atol=1e-5)
            assert flat.loss_mask[0, start] == 0
            start += n


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_padding_free_step_equals_the_padded_step(loss_type: str) -> None:
    samples = make_samples(7)
    results = []
    for padding_free in (False, True):
        cfg = GrpoConfig(loss_type=loss_type, micro_batch_tokens=30, lr=0.0, max_grad_norm=None,  # type: ignore[arg-type]
                         padding_free=padding_free)
        model = tiny_model()
        stats = PolicyTrainer(model, cfg).step(samples)
        results.append((stats, grads(model)))
    (padded, g1), (flat, g2) = results
    assert flat.loss == pytest.approx(padded.loss, rel=1e-5)
    assert flat.tokens == padded.tokens == sum(len(s.sequence.token_ids) for s in samples)
    # What the forward passes compute: real tokens only, against padded rows.
    assert sum(mb.input_ids.numel() for mb in pack_flat(samples, 30)) == flat.tokens
    assert sum(mb.input_ids.numel() for mb in pack(samples, 30)) > flat.tokens
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-4, atol=1e-6, msg=name)
