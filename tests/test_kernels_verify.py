"""``dspark.verify``: greedy equality with the torch reference, structure, seeds, no copies."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import check_distribution

import dspark


def greedy_case(rng, batch=256, slots=5, vocab=40, hit=0.7):
    """Target logits plus drafts that follow the target argmax with probability ``hit``."""
    target = rng.normal(0, 2.0, (batch, slots + 1, vocab)).astype(np.float32)
    best = target.argmax(-1)[:, :slots]
    wrong = (best + rng.integers(1, vocab, best.shape)) % vocab
    drafts = np.where(rng.random(best.shape) < hit, best, wrong).astype(np.int64)
    return target, drafts


def test_greedy_accepts_the_argmax_prefix_then_corrects(rng):
    target, drafts = greedy_case(rng)
    v = dspark.verify(target, drafts)
    best = target.argmax(-1)
    for b in range(target.shape[0]):
        n = 0
        while n < drafts.shape[1] and drafts[b, n] == best[b, n]:
            n += 1
        assert v.num_accepted[b] == n
        np.testing.assert_array_equal(v.tokens[b, :n], drafts[b, :n])
        assert v.tokens[b, n] == best[b, n]
        assert (v.tokens[b, n + 1 :] == -1).all()


def test_num_draft_limits_verification_and_takes_the_bonus_from_row_n(rng):
    target, _ = greedy_case(rng, batch=6, slots=4)
    drafts = target.argmax(-1)[:, :4].astype(np.int64)  # every draft is right
    n = [0, 1, 2, 3, 4, 2]
    v = dspark.verify(target, drafts, num_draft=n)
    best = target.argmax(-1)
    for b, nb in enumerate(n):
        assert v.num_accepted[b] == nb
        assert v.tokens[b, nb] == best[b, nb], "bonus must come from row num_draft"
        assert (v.tokens[b, nb + 1 :] == -1).all()


def test_accepted_stop_token_ends_the_round_without_bonus(rng):
    target, _ = greedy_case(rng, batch=1, slots=4)
    drafts = target.argmax(-1)[:, :4].astype(np.int64)
    stop = int(drafts[0, 1])
    if stop == drafts[0, 0]:
        pytest.skip("degenerate draw")  # pragma: no cover - fixed seed avoids it
    v = dspark.verify(target, drafts, stop_token_ids=[stop])
    assert v.num_accepted.tolist() == [2]
    assert v.tokens[0].tolist() == [*drafts[0, :2].tolist(), -1, -1, -1]


def test_masked_target_ids_are_never_emitted(rng):
    batch, slots, vocab = 20_000, 1, 10
    target = np.broadcast_to(rng.normal(0, 1, (slots + 1, vocab)), (batch, slots + 1, vocab))
    target = np.ascontiguousarray(target, dtype=np.float32)
    target[..., [2, 7]] = -np.inf  # masked vocabulary is allowed and never sampled
    drafts = np.full((batch, slots), 2, dtype=np.int64)  # always rejected: p(2) = 0
    v = dspark.verify(target, drafts, temperature=1.0, seed=4)
    assert (v.num_accepted == 0).all()
    p = np.exp(target[0, 0].astype(np.float64))
    p /= p.sum()
    check_distribution(v.tokens[:, 0], p, what="residual with masked ids")


def test_same_seed_same_result_and_per_request_seeds_ignore_batch_order(rng):
    batch, slots, vocab = 500, 4, 30
    target = rng.normal(0, 1.0, (batch, slots + 1, vocab)).astype(np.float32)
    q = rng.normal(0, 1.0, (batch, slots, vocab)).astype(np.float32)
    drafts = rng.integers(0, vocab, (batch, slots))
    temps = rng.choice([0.0, 0.5, 1.0], batch).astype(np.float32)
    top_p = rng.choice([1.0, 0.9], batch).astype(np.float32)
    seeds = rng.integers(0, 2**63, batch, dtype=np.uint64)
    kw = dict(temperature=temps, top_p=top_p, top_k=[None if i % 3 else 8 for i in range(batch)])
    a = dspark.verify(target, drafts, q, seed=seeds, **kw)
    again = dspark.verify(target, drafts, q, seed=seeds, **kw)
    np.testing.assert_array_equal(a.tokens, again.tokens)
    perm = rng.permutation(batch)
    kw_perm = dict(temperature=temps[perm], top_p=top_p[perm], top_k=[kw["top_k"][i] for i in perm])
    b = dspark.verify(
        np.ascontiguousarray(target[perm]),
        drafts[perm],
        np.ascontiguousarray(q[perm]),
        seed=seeds[perm],
        **kw_perm,
    )
    np.testing.assert_array_equal(a.tokens[perm], b.tokens)
    np.testing.assert_array_equal(a.num_accepted[perm], b.num_accepted)
    # Different seeds do change sampled results.
    c = dspark.verify(target, drafts, q, seed=seeds + np.uint64(1), **kw)
    assert (c.tokens != a.tokens).any()


def test_f16_and_int32_inputs_match_f32_int64(rng):
    batch, slots, vocab = 200, 3, 50
    target = rng.normal(0, 1.0, (batch, slots + 1, vocab)).astype(np.float16)
    q = rng.normal(0, 1.0, (batch, slots, vocab)).astype(np.float16)
    drafts = rng.integers(0, vocab, (batch, slots))
    for t in (0.0, 0.8):
        h = dspark.verify(target, drafts.astype(np.int32), q, temperature=t, seed=9)
        f = dspark.verify(
            target.astype(np.float32), drafts, q.astype(np.float32), temperature=t, seed=9
        )
        np.testing.assert_array_equal(h.tokens, f.tokens)


def test_logits_are_read_in_place_for_non_owning_views(rng):
    """Correct results on a view into a bigger buffer (offset pointer, no owner of its own)."""
    big = rng.normal(0, 1.0, (10, 4, 64)).astype(np.float32)
    view = big[3:8]
    assert view.base is not None and not view.flags.owndata
    drafts = big[3:8, :3].argmax(-1)
    v = dspark.verify(view, drafts)
    assert (v.num_accepted == 3).all()
    np.testing.assert_array_equal(v.tokens[:, 3], big[3:8, 3].argmax(-1))


def _peak_rss_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def test_big_logits_are_not_copied():
    """Peak RSS during verify stays far below the size of the logits (Linux only).

    The fast host path's contract. ``DSPARK_KERNEL_PATH=tensor`` (and ``fused``) build tensors
    from host memory by design (they exist to run the device code on a CPU); on a GPU the logits
    are read in place, which ``tests/test_cuda.py`` checks.
    """
    if dspark.build_info()["kernel_path"] != "fast":
        pytest.skip("the forced device paths copy host memory into tensors by design")
    batch, slots, vocab = 8, 7, 151_936
    target = np.zeros((batch, slots + 1, vocab), dtype=np.float32)  # 39 MB ...
    target = np.concatenate([target] * 4)  # ... times 4: 156 MB, touched
    target[:, :, 5] = 40.0  # p(5) ~ 1 at T = 1
    drafts = np.full((4 * batch, slots), 5, dtype=np.int64)
    if not _peak_rss_reset():
        pytest.skip("needs /proc/self/clear_refs to reset the peak RSS")
    rss = _status_kb("VmRSS")
    v = dspark.verify(target, drafts, temperature=1.0)
    grown_mb = (_status_kb("VmHWM") - rss) / 1024
    assert (v.num_accepted == slots).all()
    assert grown_mb < target.nbytes / 2**20 / 4, f"peak grew by {grown_mb:.0f} MB: logits copied?"


@pytest.mark.torch
class TestTorch:
    torch = pytest.importorskip("torch")

    @pytest.mark.parametrize("with_q", [True, False])
    def test_greedy_path_equals_torch_reference_exactly(self, rng, with_q):
        from torch_reference import verify as ref_verify

        torch = self.torch
        target, drafts = greedy_case(rng, batch=300, slots=6, vocab=64)
        q = rng.normal(0, 1.0, (300, 6, 64)).astype(np.float32) if with_q else None
        n = rng.integers(0, 7, 300)
        stops = [int(drafts[0, 2]), 17]
        t_target, t_drafts = torch.from_numpy(target), torch.from_numpy(drafts)
        t_q = None if q is None else torch.from_numpy(q)
        got = dspark.verify(t_target, t_drafts, t_q, num_draft=n, stop_token_ids=stops)
        ref = ref_verify(
            t_target, t_drafts, t_q, num_draft=torch.from_numpy(n), stop_token_ids=stops
        )
        assert isinstance(got.tokens, torch.Tensor)
        assert got.tokens.dtype == torch.int64 and got.num_accepted.dtype == torch.int64
        assert torch.equal(got.tokens, ref.tokens)
        assert torch.equal(got.num_accepted, ref.num_accepted)

    def test_bf16_target_matches_f32_of_the_same_values(self, rng):
        torch = self.torch
        target = torch.from_numpy(rng.normal(0, 1.0, (100, 4, 80)).astype(np.float32)).bfloat16()
        q = torch.from_numpy(rng.normal(0, 1.0, (100, 3, 80)).astype(np.float32)).bfloat16()
        drafts = torch.from_numpy(rng.integers(0, 80, (100, 3)))
        for t in (0.0, 0.7):
            b = dspark.verify(target, drafts, q, temperature=t, top_k=20, seed=3)
            f = dspark.verify(target.float(), drafts, q.float(), temperature=t, top_k=20, seed=3)
            assert torch.equal(b.tokens, f.tokens)

    def test_grad_tensors_are_detached_not_copied(self):
        torch = self.torch
        target = torch.zeros(2, 3, 10, requires_grad=True)
        v = dspark.verify(target, torch.zeros(2, 2, dtype=torch.int64))
        assert v.tokens.shape == (2, 3)
