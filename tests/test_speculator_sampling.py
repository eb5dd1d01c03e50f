"""At T > 0 the speculator's output follows the target's distribution (chi-square, seeded)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import check_distribution
from spec_fixtures import (  # noqa: F401
    checkpoint,
    load_drafter,
    native_target,
    single_thread,
    spec_target,
    target,
    torch,
)

import dspark

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_thread")]

PROMPT = [5, 17, 42, 99, 3]
TRIALS = 20_000


def _probs(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    z = logits.double() / temperature
    if top_k is not None:
        kth = z.topk(top_k, dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    return torch.softmax(z, dim=-1)


@torch.inference_mode()
def _second_token_distribution(model, temperature: float, top_k: int | None) -> np.ndarray:
    """Exact law of the 2nd generated token: sum_a p(a | prompt) p(x | prompt, a)."""
    logits = model(input_ids=torch.tensor([PROMPT])).logits[0, -1]
    p_anchor = _probs(logits, temperature, top_k)
    v = p_anchor.numel()
    batch = torch.cat([torch.tensor([PROMPT]).expand(v, -1), torch.arange(v)[:, None]], dim=1)
    p_next = _probs(model(input_ids=batch).logits[:, -1], temperature, top_k)
    return (p_anchor[:, None] * p_next).sum(0).numpy()


@pytest.mark.parametrize(
    ("kind", "variant", "temperature", "top_k", "drafter_cls"),
    [
        ("hf", "own", 1.0, None, "TorchDrafter"),
        ("hf", "reduced", 1.0, None, "TorchDrafter"),
        ("hf", "padded", 0.7, 20, "TorchDrafter"),
        ("native", "padded", 0.7, 20, "Drafter"),
    ],
)
def test_second_token_follows_target(
    request, kind, variant, temperature, top_k, drafter_cls, target, checkpoint
):
    """The 1st token comes from the prefill, the 2nd from the first speculative round (drafts
    sampled at T and verified by rejection sampling): its law must be the target's. Both kinds
    of target (the native one with the candle drafter: no Python in the loop)."""
    spec_target = target if kind == "hf" else request.getfixturevalue("native_target")
    drafter = load_drafter(drafter_cls, checkpoint(variant), spec_target)
    spec = dspark.Speculator(spec_target, drafter, temperature=temperature, top_k=top_k)
    # One seed per trial: a request's draws depend on its own seed and positions only, so the
    # same prompt under one seed would give one sample TRIALS times.
    seeds = list(range(1234, 1234 + TRIALS))
    result = spec.generate([PROMPT] * TRIALS, max_new_tokens=drafter.block_size, seed=seeds)
    second = np.array([t[1] for t in result.tokens])
    check_distribution(second, _second_token_distribution(target, temperature, top_k), what="2nd")
    st = result.stats
    # The round really speculated: drafts were verified and some accepted, some rejected.
    assert st.drafted_tokens > TRIALS and 0 < st.accepted_tokens < st.drafted_tokens


def test_same_seed_same_output_different_seed_differs(spec_target, target, checkpoint):
    drafter = load_drafter("TorchDrafter", checkpoint("own"), target)
    prompts = [PROMPT, PROMPT[:2]]

    def run(seed: int) -> list[list[int]]:
        return (
            dspark.Speculator(spec_target, drafter, temperature=1.0, seed=seed)
            .generate(prompts, 10)
            .tokens
        )

    assert run(7) == run(7)
    assert run(7) != run(8)
