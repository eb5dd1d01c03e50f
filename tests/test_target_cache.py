"""``HFTarget``'s batched cache: rejected drafts leave holes; compaction removes them exactly."""

from __future__ import annotations

import copy

import pytest
from spec_fixtures import single_thread, target, torch  # noqa: F401
from tiny_models import OracleDrafter, greedy_reference

import dspark
from dspark.target import HFTarget

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_thread")]

LAYERS = [1, 2]


def _history(tgt: HFTarget, rounds: int, turns: bool = False):  # type: ignore[no-untyped-def]
    """A 3-request cache after ``rounds`` of 7-token blocks with different accepted lengths
    (``turns``: each round one request keeps the whole block and the others keep one token)."""
    gen = torch.Generator().manual_seed(0)
    cache = tgt.new_cache(3)
    lengths = [5, 9, 2]
    ids = torch.randint(0, 250, (3, 9), generator=gen)
    tgt.forward(cache, ids, lengths, LAYERS)
    for r in range(rounds):
        block = torch.randint(0, 250, (3, 7), generator=gen)
        tgt.forward(cache, block, [7, 7, 4 if r % 2 and not turns else 7], LAYERS)
        if turns:
            lengths = [n + (7 if i == r % 3 else 1) for i, n in enumerate(lengths)]
        else:
            lengths = [lengths[0] + 1, lengths[1] + 1 + r % 3, lengths[2] + 4]
        tgt.crop(cache, lengths)
    return cache, lengths


def test_compaction_keeps_every_logit(target) -> None:
    tgt = HFTarget(target)
    cache, lengths = _history(tgt, 3)  # narrow enough that crop never compacts on its own
    holes = int((~cache.valid).sum())
    assert holes > 0
    packed = copy.deepcopy(cache)
    assert tgt.compact(packed)
    assert packed.valid.shape[1] == max(lengths) < cache.valid.shape[1]
    assert int((~packed.valid).sum()) == 3 * max(lengths) - sum(lengths)
    assert packed.lengths.tolist() == lengths
    nxt = torch.randint(0, 250, (3, 4), generator=torch.Generator().manual_seed(1))
    a = tgt.forward(cache, nxt, [4, 2, 3], LAYERS)
    b = tgt.forward(packed, nxt, [4, 2, 3], LAYERS)
    for i, n in enumerate([4, 2, 3]):
        torch.testing.assert_close(a.logits[i, :n], b.logits[i, :n], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            a.hidden_states[i, :n], b.hidden_states[i, :n], atol=1e-5, rtol=1e-5
        )


def test_crop_compacts_a_holey_cache_on_its_own(target) -> None:
    tgt = HFTarget(target)
    cache, lengths = _history(tgt, 12, turns=True)
    # without compaction: 9 + 7 columns per round, the fullest row about half holes
    assert cache.valid.shape[1] < (max(lengths) * 4) // 3 + 7 < 9 + 7 * 12
    assert cache.lengths.tolist() == lengths
    assert cache.valid.sum(dim=1).tolist() == lengths


def test_batched_greedy_with_compaction_equals_target(target, monkeypatch) -> None:
    prompts = [[(5 * i + j) % 200 + 1 for j in range(3 + 4 * i)] for i in range(4)]
    new = 40
    ref = [greedy_reference(target, p, new) for p in prompts]
    calls = []
    real = HFTarget.compact

    def spy(self, cache):  # type: ignore[no-untyped-def]
        calls.append(cache.valid.shape[1])
        return real(self, cache)

    monkeypatch.setattr(HFTarget, "compact", spy)
    oracle = OracleDrafter(target, prompts, 0.5, seed=4)
    # Full verification: every round verifies the oracle's half-rejected blocks.
    result = dspark.Speculator(target, oracle, verify="full").generate(prompts, new)
    assert result.tokens == ref
    assert calls, "a half-rejecting batch must trigger compaction"


def test_dense_rows_skip_the_masks_and_match_the_explicit_path(target) -> None:
    """Rows advancing together stay dense (no valid/position tensors); the same history run
    through the explicit-mask path (materialized up front; a crop that leaves every row on
    columns 0..C-1 makes it dense again) gives the same logits, and diverging rows leave the fast
    path with the right masks."""
    tgt = HFTarget(target)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 250, (2, 6), generator=gen)
    blocks = [torch.randint(0, 250, (2, 5), generator=gen) for _ in range(3)]
    fast, slow = tgt.new_cache(2), tgt.new_cache(2)
    slow.valid = slow.valid  # materialize: the explicit path from the start
    assert fast.dense and not slow.dense
    outs = []
    for cache in (fast, slow):
        tgt.forward(cache, prompt, [6, 6], LAYERS)
        got = []
        for r, block in enumerate(blocks):
            got.append(tgt.forward(cache, block, [5, 5], LAYERS).logits)
            tgt.crop(cache, [cache.lengths.tolist()[0] - 5 + 1 + r] * 2)
        outs.append(got)
    assert fast.dense and fast.width == 6 + 1 + 2 + 3
    assert slow.dense and slow.width == fast.width  # restored by its first crop
    assert fast.valid.all() and fast.token_pos[1].tolist() == list(range(fast.width))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # rows part ways: row 0 keeps two tokens of the next block, row 1 keeps one
    w = fast.width
    tgt.forward(fast, blocks[0], [5, 5], LAYERS)
    tgt.crop(fast, [w + 2, w + 1])
    assert not fast.dense
    assert fast.valid.sum(dim=1).tolist() == [w + 2, w + 1]
    assert fast.token_pos[1, : w + 1].tolist() == list(range(w + 1))
    assert fast.lengths.tolist() == [w + 2, w + 1]
