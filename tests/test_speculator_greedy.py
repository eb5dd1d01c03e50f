"""Greedy speculative output is identical to target-only greedy output."""

from __future__ import annotations

import pytest
from spec_fixtures import (  # noqa: F401
    VARIANTS,
    checkpoint,
    drafter_classes,
    load_drafter,
    native_target,
    single_thread,
    spec_target,
    target,
    torch,
)
from tiny_models import OracleDrafter, greedy_reference

import dspark

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_thread")]

PROMPTS = [[(7 * i + 3 * j + 1) % 250 for j in range(1 + (5 * i) % 11)] for i in range(8)]
NEW = 12


@pytest.fixture(scope="module")
def reference(target):
    return [greedy_reference(target, p, NEW) for p in PROMPTS]


@pytest.mark.parametrize("cls_name", drafter_classes())
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_batched_equals_target(
    spec_target,
    cls_name,
    variant,
    target,
    checkpoint,
    reference,
):
    drafter = load_drafter(cls_name, checkpoint(variant), target)
    result = dspark.Speculator(spec_target, drafter).generate(PROMPTS, NEW)
    assert result.tokens == reference
    assert result.stats.rounds > 0 and result.stats.request_rounds >= len(PROMPTS)


@pytest.mark.parametrize("cls_name", drafter_classes())
def test_greedy_unbatched_equals_target(spec_target, cls_name, target, checkpoint, reference):
    drafter = load_drafter(cls_name, checkpoint("reduced"), target)
    spec = dspark.Speculator(spec_target, drafter, num_speculative_tokens=3)
    for prompt, ref in zip(PROMPTS[:4], reference[:4], strict=True):
        assert spec.generate(torch.tensor([prompt]), NEW).tokens == [ref]


@pytest.mark.parametrize("corrupt", [0.0, 0.3, 0.7])
def test_greedy_with_partial_acceptance(spec_target, corrupt, target, reference):
    """An oracle drafter gets whole and partial blocks accepted: output still identical."""
    oracle = OracleDrafter(target, PROMPTS, corrupt, seed=1)
    result = dspark.Speculator(spec_target, oracle).generate(PROMPTS, NEW)
    assert result.tokens == reference
    st = result.stats
    assert st.accepted_tokens > 0
    # without stop tokens every round commits its accepted drafts plus one target token
    assert st.committed_tokens == st.accepted_tokens + st.request_rounds
    if corrupt == 0.0:
        # every verified draft is right: the only rejections come from the token budget
        assert st.accepted_tokens == st.drafted_tokens
        assert all(r == 1.0 for r in st.per_position_acceptance)


def test_stop_tokens_end_requests(spec_target, target, checkpoint, reference):
    oracle = OracleDrafter(target, PROMPTS, 0.2, seed=2)
    stop = reference[0][5]
    result = dspark.Speculator(spec_target, oracle).generate(PROMPTS, NEW, stop_token_ids=[stop])
    for got, ref in zip(result.tokens, reference, strict=True):
        want = ref[: ref.index(stop) + 1] if stop in ref else ref
        assert got == want


def test_oracle_rounds_mix_plain_and_drafted(spec_target, target, reference):
    """A table where a drafted round costs far more than a plain one: the scheduled policy takes
    plain rounds (no drafter call) between drafted ones, and the output is still the target's.
    The oracle checks each anchor against greedy decoding, across the plain rounds."""
    oracle = OracleDrafter(target, PROMPTS, 0.2, seed=5, confidence=0.8)
    sps = [(1, 100.0), (8, 100.0), (16, 2.0), (64, 1.0)]
    spec = dspark.Speculator(spec_target, oracle, verify="scheduled", steps_per_second=sps)
    result = spec.generate(PROMPTS, NEW)
    assert result.tokens == reference
    assert result.stats.plain_rounds > 0


def test_on_round_streams_every_committed_token_once(spec_target, target, reference):
    oracle = OracleDrafter(target, PROMPTS, 0.3, seed=3)
    calls: list[list[list[int]]] = []
    result = dspark.Speculator(spec_target, oracle).generate(PROMPTS, NEW, on_round=calls.append)
    assert result.tokens == reference
    # one call after the prefill, then one per round
    assert len(calls) == result.stats.rounds + 1
    assert all(len(c) == len(PROMPTS) for c in calls)
    streamed = [[t for c in calls for t in c[i]] for i in range(len(PROMPTS))]
    assert streamed == reference
    assert all(len(new) == 1 for new in calls[0])  # the prefill commits one token per request


def test_threshold_and_scheduled_verify_stay_exact(spec_target, target, checkpoint, reference):
    drafter = load_drafter("TorchDrafter", checkpoint("own"), target)
    sps = [(1, 100.0), (8, 90.0), (64, 20.0)]
    # "scheduled" without a table measures one on the target at first use.
    policies = [
        (0.5, None, "step"),
        ("scheduled", sps, "step"),
        ("scheduled", sps, "linear"),
        ("scheduled", None, "step"),
        ("pipelined", sps, "linear"),
    ]
    for verify, table, interpolation in policies:
        spec = dspark.Speculator(
            spec_target,
            drafter,
            verify=verify,
            steps_per_second=table,
            steps_interpolation=interpolation,
        )
        result = spec.generate(PROMPTS, NEW)
        assert result.tokens == reference
        assert result.stats.drafted_tokens <= result.stats.request_rounds * drafter.block_size
