"""``dspark.confidence`` and the verify-length schedulers, against plain numpy/Python."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dspark


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


@pytest.mark.parametrize("with_prev", [True, False])
def test_confidence_matches_numpy(rng, with_prev):
    b, k, h, r = 5, 7, 24, 6
    hidden = rng.normal(0, 1, (b, k, h)).astype(np.float32)
    prev = rng.normal(0, 1, (b, k, r)).astype(np.float32)
    w = rng.normal(0, 0.3, h + (r if with_prev else 0)).astype(np.float32)
    got = dspark.confidence(hidden, prev if with_prev else None, w, 0.25)
    feats = np.concatenate([hidden, prev], -1) if with_prev else hidden
    want = sigmoid(feats.astype(np.float64) @ w.astype(np.float64) + 0.25)
    assert got.dtype == np.float32 and got.shape == (b, k)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_confidence_sts_list_json_and_linear_weight(rng, tmp_path):
    b, k, h = 3, 4, 8
    hidden = rng.normal(0, 1, (b, k, h)).astype(np.float32)
    w = rng.normal(0, 0.5, (1, h)).astype(np.float32)  # an nn.Linear(h, 1) weight
    temps = [1.0, 1.5, 2.0, 3.0]
    z = hidden.astype(np.float64) @ w[0].astype(np.float64) - 0.1
    want = sigmoid(z / np.array(temps))
    got = dspark.confidence(hidden, None, w, np.array([-0.1], dtype=np.float32), sts=temps)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    path = tmp_path / "sts.json"
    path.write_text(json.dumps({"temperatures": temps, "note": "ignored"}))
    np.testing.assert_allclose(dspark.confidence(hidden, None, w, -0.1, sts=path), got, rtol=1e-6)


def test_threshold_lengths():
    c = np.array([[0.9, 0.8, 0.2, 0.9], [0.1, 0.9, 0.9, 0.9], [0.9, 0.9, 0.9, 0.9]], np.float32)
    assert dspark.schedule_threshold(c, 0.5) == [2, 0, 4]
    assert dspark.schedule_threshold(c, 0.95) == [0, 0, 0]


def _sps(table, n):
    """Step-function SPS with constant tokens/s past the last point (the engine's contract)."""
    pts = sorted(table)
    last_n, last_v = pts[-1]
    if n > last_n:
        return last_v * last_n / n
    return next(v for m, v in pts if m >= n)


def _ranked(c):
    b, k = c.shape
    surv = np.cumprod(np.clip(c.astype(np.float64), 0, 1), axis=1)
    order = sorted(
        ((surv[r, j], r, j) for r in range(b) for j in range(k)), key=lambda x: (-x[0], x[1], x[2])
    )
    return order


def reference_lengths(c, table):
    b = c.shape[0]
    lengths, tokens, tau = [0] * b, b, float(b)
    theta = tau * _sps(table, tokens)
    for a, r, _ in _ranked(c):
        nxt = (tau + a) * _sps(table, tokens + 1)
        if nxt <= theta:
            break
        theta, tau, tokens = nxt, tau + a, tokens + 1
        lengths[r] += 1
    return lengths


def reference_lengths_ahead(c, table, ahead):
    """Algorithm 1 with the look-ahead: a slot also pays if it and its request's next slots,
    priced with ``ahead``, would raise the objective."""
    b, k = c.shape
    lengths, tokens, tau = [0] * b, b, float(b)
    theta = tau * _sps(table, tokens)
    for a, r, j in _ranked(c):
        nxt = (tau + a) * _sps(table, tokens + 1)
        pays = nxt > theta
        t, s = tau + a, a
        for m, i in enumerate(range(j + 1, k), start=2):
            s *= min(max(float(ahead[r, i]), 0.0), 1.0)
            t += s
            pays = pays or (s > 0 and t * _sps(table, tokens + m) > theta)
        if not pays:
            break
        theta, tau, tokens = nxt, tau + a, tokens + 1
        lengths[r] += 1
    return lengths


def reference_lengths_batch(c, table, ahead):
    """The batch-wide look-ahead: request r verifies slot j when the best round holding it
    (other requests' slots at current survival, r's later slots priced with ``ahead``, any
    number of them taken highest first) beats the best round that stops r at j."""
    b, k = c.shape
    unit = np.clip(np.nan_to_num(c.astype(np.float64)), 0, 1)
    pred = np.clip(np.nan_to_num(ahead.astype(np.float64)), 0, 1)
    surv = np.cumprod(unit, axis=1)

    def best(r, extra, tau, tokens):
        values = sorted([surv[q, i] for q in range(b) if q != r for i in range(k)] + extra)
        theta = tau * _sps(table, tokens)
        for a in reversed(values):
            if a <= 0:
                break
            tau, tokens = tau + a, tokens + 1
            theta = max(theta, tau * _sps(table, tokens))
        return theta

    lengths = [0] * b
    for r in range(b):
        tau = float(b)
        for j in range(k):
            a = surv[r, j]
            if a <= 0:
                break
            rest = list(a * np.cumprod(pred[r, j + 1 :]))
            if best(r, rest, tau + a, b + j + 1) <= best(r, [], tau, b + j):
                break
            tau += a
            lengths[r] = j + 1
    return lengths


def reference_pipelined(stale, current, table):
    b = stale.shape[0]
    tau, best, cap = float(b), b * _sps(table, b), 0
    for n, (a, _, _) in enumerate(_ranked(stale)):
        tau += a
        theta = tau * _sps(table, b + n + 1)
        if theta > best:
            best, cap = theta, n + 1
    lengths = [0] * b
    for _, r, _ in _ranked(current)[:cap]:
        lengths[r] += 1
    return lengths


def test_schedulers_match_a_python_reference(rng):
    table = [(1, 30.0), (4, 28.0), (8, 25.0), (16, 20.0), (32, 12.0), (64, 7.0)]
    for _ in range(50):
        b, k = int(rng.integers(1, 6)), int(rng.integers(1, 8))
        c = rng.uniform(0.3, 1.0, (b, k)).astype(np.float32)
        stale = np.clip(c + rng.normal(0, 0.1, c.shape), 0, 1).astype(np.float32)
        assert dspark.schedule_lengths(c, table) == reference_lengths(c, table)
        assert dspark.schedule_pipelined(stale, c, table) == reference_pipelined(stale, c, table)
        assert dspark.schedule_lengths(c, table, ahead=stale) == reference_lengths_ahead(
            c, table, stale
        )
        assert dspark.schedule_lengths(
            c, table, ahead=stale, batch_wide=True
        ) == reference_lengths_batch(c, table, stale)


def test_look_ahead_crosses_a_cliff_and_checks_its_shape():
    # Verifying up to 3 tokens costs one step, 4+ cost twice: the early stop halts before
    # the cliff; predicted acceptance high enough to repay it lets the scan cross.
    table = [(3, 10.0), (4, 5.0), (9, 5.0)]
    c = np.full((1, 8), 0.95, np.float32)
    assert dspark.schedule_lengths(c, table) == [2]
    assert dspark.schedule_lengths(c, table, ahead=np.full((1, 8), 0.95, np.float32)) == [8]
    assert dspark.schedule_lengths(c, table, ahead=np.zeros((1, 8), np.float32)) == [2]
    with pytest.raises(dspark.InputError) as e:
        dspark.schedule_lengths(c, table, ahead=np.ones((1, 7), np.float32))
    assert e.value.code == "bad-shape"


def test_batch_wide_look_ahead_crosses_a_cliff_the_whole_batch_repays():
    # 4 requests of 8 drafts: one 12-token tile, then a second (+40%), plus the drafter (every
    # size in the table: step and linear read it alike).
    ms = [100 + 1.5 * n + 40 * ((n + 11) // 12 - 1) + 60 for n in range(1, 37)]
    table = [(n, 1e3 / m) for n, m in enumerate(ms, start=1)]
    c = np.full((4, 8), 0.85, np.float32)
    assert dspark.schedule_lengths(c, table, ahead=c) == [2, 2, 2, 2]
    assert dspark.schedule_lengths(c, table, ahead=c, batch_wide=True) == [5, 5, 5, 5]
    # Without ``ahead`` a request's own later slots count for nothing; others' still do.
    assert dspark.schedule_lengths(c, table, batch_wide=True) == reference_lengths_batch(
        c, table, np.zeros_like(c)
    )
    with pytest.raises(dspark.InputError) as e:
        dspark.schedule_lengths(c, table, ahead=np.ones((4, 7), np.float32), batch_wide=True)
    assert e.value.code == "bad-shape"


def test_scheduler_extremes():
    table = [(1, 10.0), (100, 10.0)]  # verifying is free: take every slot that may survive
    assert dspark.schedule_lengths(np.ones((2, 3), np.float32), table) == [3, 3]
    assert dspark.schedule_lengths(np.zeros((2, 3), np.float32), table) == [0, 0]
    assert dspark.schedule_lengths(
        np.ones((1, 2), np.float32), [(1, 1.0), (2, 0.5), (3, 0.45)], "linear"
    ) == [0]
