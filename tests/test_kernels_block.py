"""``dspark.sample_block``: the recorded q, the padded mask, seeds, dtypes, the torch reference."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import check_distribution

import dspark

V_T = 12
RANK = 4


def softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - np.where(np.isfinite(m), m, 0.0))
    return e / e.sum(axis=-1, keepdims=True)


def expected_q(base_row, w1, w2, prev_target, *, temperature, valid, table, top_k, scale):
    """q of one slot (in target space), from DESIGN.md, in float64."""
    b = np.asarray(base_row, dtype=np.float64).copy()
    b[valid:] = -np.inf
    logits = scale * (b + w2.astype(np.float64) @ w1[prev_target].astype(np.float64))
    logits[valid:] = -np.inf
    if top_k is not None:
        keep = np.argsort(-b, kind="stable")[:top_k]
        masked = np.full_like(logits, -np.inf)
        masked[keep] = logits[keep]
        logits = masked
    if temperature == 0.0:
        q = np.zeros_like(logits)
        q[int(np.argmax(logits))] = 1.0
    else:
        q = softmax(logits / temperature)
    out = np.zeros(V_T)
    ids = table if table is not None else np.arange(valid)
    out[ids] = q[: len(ids)]
    return out


def layout(kind: str, rng):
    """(base [B?], w1, w2, target_vocab_size, d2t, table, valid) for a vocab kind."""
    if kind == "full":
        vd, vin, tv, table = V_T, V_T, None, None
    elif kind == "padded":
        vd, vin, tv, table = 16, 16, V_T, None
    else:
        vd, vin, tv = 8, V_T, V_T
        table = np.sort(rng.choice(V_T, vd, replace=False))
    w1 = rng.normal(0, 0.8, (vin, RANK)).astype(np.float32)
    w2 = rng.normal(0, 0.8, (vd, RANK)).astype(np.float32)
    d2t = None if table is None else (table - np.arange(vd)).astype(np.int64)
    valid = vd if table is not None else V_T
    return vd, w1, w2, tv, d2t, table, valid


@pytest.mark.parametrize("kind", ["full", "padded", "reduced"])
@pytest.mark.parametrize(
    ("temperature", "top_k", "scale"), [(0.0, None, 1.0), (1.0, None, 1.0), (0.7, 3, 1.3)]
)
def test_recorded_q_matches_the_formula(rng, kind, temperature, top_k, scale):
    vd, w1, w2, tv, d2t, table, valid = layout(kind, rng)
    batch, slots = 64, 4
    base = rng.normal(0, 1.5, (batch, slots, vd)).astype(np.float32)
    if valid < vd:
        base[..., valid:] = 1e4
    anchors = rng.integers(0, V_T, batch)
    blk = dspark.sample_block(
        base,
        w1,
        w2,
        anchors,
        temperature=temperature,
        seed=7,
        target_vocab_size=tv,
        d2t=d2t,
        top_k=top_k,
        logit_scale=scale,
    )
    tokens, q, prev = blk.tokens, blk.draft_logits, blk.prev_embeddings
    assert tokens.dtype == np.int64 and tokens.shape == (batch, slots)
    assert q.dtype == np.float32 and q.shape == (batch, slots, V_T)
    assert prev.dtype == np.float32 and prev.shape == (batch, slots, RANK)
    for b in range(batch):
        x_prev = int(anchors[b])
        for k in range(slots):
            want = expected_q(
                base[b, k],
                w1,
                w2,
                x_prev,
                temperature=temperature,
                valid=valid,
                table=table,
                top_k=top_k,
                scale=scale,
            )
            np.testing.assert_allclose(softmax(q[b, k]), want, atol=2e-5)
            np.testing.assert_array_equal(prev[b, k], w1[x_prev])
            assert want[tokens[b, k]] > 0, "token drawn outside its recorded support"
            x_prev = int(tokens[b, k])


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, None), (0.7, 4)])
def test_empirical_draft_distribution_equals_recorded_q(rng, temperature, top_k):
    """50,000 identical requests: slot 0 (and slot 1 given x_0) follow the recorded q."""
    vd, w1, w2, _, _, _, _ = layout("full", rng)
    batch = 50_000
    base = np.ascontiguousarray(
        np.broadcast_to(rng.normal(0, 1.0, (2, vd)).astype(np.float32), (batch, 2, vd))
    )
    blk = dspark.sample_block(
        base, w1, w2, np.full(batch, 5), temperature=temperature, seed=11, top_k=top_k
    )
    q0 = softmax(blk.draft_logits[0, 0])
    assert np.array_equal(
        blk.draft_logits[:, 0], np.broadcast_to(blk.draft_logits[0, 0], (batch, V_T))
    )
    check_distribution(blk.tokens[:, 0], q0, what="slot 0")
    mode = np.bincount(blk.tokens[:, 0]).argmax()
    rows = blk.tokens[:, 0] == mode
    q1 = blk.draft_logits[rows, 1]
    assert (q1 == q1[0]).all(), "slot 1's q must depend only on x_0"
    check_distribution(blk.tokens[rows, 1], softmax(q1[0]), what="slot 1 | x_0")


@pytest.mark.parametrize("temperature", [0.0, 1.0, 3.0])
@pytest.mark.parametrize("top_k", [None, 2])
def test_padded_rows_with_huge_logits_never_come_out(rng, temperature, top_k):
    vd, w1, w2, tv, _, _, _ = layout("padded", rng)
    w2[V_T:] = 100.0
    batch = 4096
    base = rng.normal(0, 1.0, (batch, 3, vd)).astype(np.float32)
    base[..., V_T:] = 1e6
    blk = dspark.sample_block(
        base,
        w1,
        w2,
        rng.integers(0, vd, batch),
        temperature=temperature,
        seed=3,
        target_vocab_size=tv,
        top_k=top_k,
    )
    assert blk.tokens.max() < V_T
    assert blk.draft_logits.shape[-1] == V_T


def test_same_seed_same_tokens_and_scalar_seed_streams_by_row(rng):
    vd, w1, w2, *_ = layout("full", rng)
    base = rng.normal(0, 1.0, (400, 3, vd)).astype(np.float32)
    anchors = rng.integers(0, V_T, 400)
    a = dspark.sample_block(base, w1, w2, anchors, temperature=1.0, seed=5)
    b = dspark.sample_block(base, w1, w2, anchors, temperature=1.0, seed=5)
    c = dspark.sample_block(base, w1, w2, anchors, temperature=1.0, seed=6)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert (a.tokens != c.tokens).any()
    # Scalar seed: row r uses stream (seed, r), so a prefix batch gives the same rows.
    half = dspark.sample_block(base[:200], w1, w2, anchors[:200], temperature=1.0, seed=5)
    np.testing.assert_array_equal(half.tokens, a.tokens[:200])


def test_per_request_seeds_make_results_independent_of_batch_order(rng):
    vd, w1, w2, tv, d2t, *_ = layout("reduced", rng)
    batch = 300
    base = rng.normal(0, 1.0, (batch, 4, vd)).astype(np.float32)
    anchors = rng.integers(0, V_T, batch)
    seeds = rng.integers(0, 2**63, batch, dtype=np.uint64)
    perm = rng.permutation(batch)
    kw = dict(temperature=0.9, target_vocab_size=tv, d2t=d2t)
    a = dspark.sample_block(base, w1, w2, anchors, seed=seeds, **kw)
    b = dspark.sample_block(
        np.ascontiguousarray(base[perm]), w1, w2, anchors[perm], seed=seeds[perm], **kw
    )
    np.testing.assert_array_equal(a.tokens[perm], b.tokens)
    np.testing.assert_array_equal(a.draft_logits[perm], b.draft_logits)
    np.testing.assert_array_equal(a.prev_embeddings[perm], b.prev_embeddings)


def test_f16_inputs_match_f32_of_the_same_values(rng):
    vd, w1, w2, *_ = layout("full", rng)
    base = rng.normal(0, 1.0, (64, 3, vd)).astype(np.float16)
    w1h, w2h = w1.astype(np.float16), w2.astype(np.float16)
    anchors = rng.integers(0, V_T, 64)
    for t in (0.0, 1.0):
        h = dspark.sample_block(base, w1h, w2h, anchors, temperature=t, seed=1)
        f = dspark.sample_block(
            base.astype(np.float32),
            w1h.astype(np.float32),
            w2h.astype(np.float32),
            anchors,
            temperature=t,
            seed=1,
        )
        np.testing.assert_array_equal(h.tokens, f.tokens)
        np.testing.assert_allclose(h.draft_logits, f.draft_logits, rtol=1e-6)


@pytest.mark.torch
class TestTorch:
    torch = pytest.importorskip("torch")

    @pytest.mark.parametrize("kind", ["full", "padded", "reduced"])
    @pytest.mark.parametrize(("top_k", "scale"), [(None, 1.0), (3, 0.8)])
    def test_greedy_path_equals_torch_reference_exactly(self, rng, kind, top_k, scale):
        from torch_reference import markov_block

        torch = self.torch
        vd, w1, w2, tv, d2t, _, _ = layout(kind, rng)
        batch = 128
        base = rng.normal(0, 1.5, (batch, 5, vd)).astype(np.float32)
        if tv is not None and d2t is None:
            base[..., tv:] = 1e4
        anchors = rng.integers(0, V_T, batch)
        # The same tensors and options for both (only the vocabulary keyword is named apart).
        tensors = [torch.from_numpy(a) for a in (base, w1, w2, anchors)]
        options = {
            "temperature": 0.0,
            "d2t": None if d2t is None else torch.from_numpy(d2t),
            "top_k": top_k,
            "logit_scale": scale,
        }
        got = dspark.sample_block(*tensors, target_vocab_size=tv, **options)
        ref = markov_block(*tensors, target_vocab=tv, **options)
        assert isinstance(got.tokens, torch.Tensor) and got.tokens.dtype == torch.int64
        assert torch.equal(got.tokens, ref.tokens)
        assert torch.equal(got.prev_embeddings, ref.prev_embeddings)
        assert torch.equal(torch.softmax(got.draft_logits, -1), torch.softmax(ref.draft_logits, -1))

    def test_bf16_inputs_match_f32_of_the_same_values(self, rng):
        torch = self.torch
        vd, w1, w2, *_ = layout("padded", rng)
        base = torch.from_numpy(rng.normal(0, 1.0, (32, 3, vd)).astype(np.float32)).bfloat16()
        w1b, w2b = torch.from_numpy(w1).bfloat16(), torch.from_numpy(w2).bfloat16()
        anchors = torch.from_numpy(rng.integers(0, V_T, 32))
        for t in (0.0, 0.8):
            kw = dict(temperature=t, seed=2, target_vocab_size=V_T)
            b = dspark.sample_block(base, w1b, w2b, anchors, **kw)
            f = dspark.sample_block(base.float(), w1b.float(), w2b.float(), anchors, **kw)
            assert torch.equal(b.tokens, f.tokens)
            torch.testing.assert_close(b.draft_logits, f.draft_logits, rtol=1e-6, atol=0)
