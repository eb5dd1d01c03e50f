"""Every bad input raises a ``DSparkError`` subclass with the right ``.code`` (never a crash)."""

from __future__ import annotations

import numpy as np
import pytest

import dspark

B, K, V, R = 2, 3, 10, 4
F32 = np.float32


def target(**over):
    t = np.zeros((B, K + 1, V), F32)
    for key, val in over.items():
        t[key] = val
    return t


def drafts(fill=1):
    return np.full((B, K), fill, dtype=np.int64)


def block_args(vd=V, vin=V, rank=R):
    return (
        np.zeros((B, K, vd), F32),
        np.zeros((vin, rank), F32),
        np.zeros((vd, rank), F32),
        np.zeros(B, dtype=np.int64),
    )


def nan_target():
    t = target()
    t[1, 2, 3] = np.nan
    return t


def inf_target():
    t = target()
    t[0, 0, 0] = np.inf
    return t


VERIFY_CASES = {
    "nan-logits": (
        lambda: dspark.verify(nan_target(), drafts(), temperature=1.0),
        dspark.InputError,
        "non-finite",
    ),
    "inf-logits": (lambda: dspark.verify(inf_target(), drafts()), dspark.InputError, "non-finite"),
    "token-too-big": (
        lambda: dspark.verify(target(), drafts(V)),
        dspark.InputError,
        "token-out-of-range",
    ),
    "token-negative": (
        lambda: dspark.verify(target(), drafts(-1)),
        dspark.InputError,
        "token-out-of-range",
    ),
    "tokens-shape": (
        lambda: dspark.verify(target(), np.zeros((B, K + 1), np.int64)),
        dspark.InputError,
        "bad-shape",
    ),
    "tokens-3d": (
        lambda: dspark.verify(target(), np.zeros((B, K, 1), np.int64)),
        dspark.InputError,
        "bad-shape",
    ),
    "target-2d": (
        lambda: dspark.verify(np.zeros((B, V), F32), drafts()),
        dspark.InputError,
        "bad-shape",
    ),
    "draft-logits-shape": (
        lambda: dspark.verify(target(), drafts(), np.zeros((B, K, V + 1), F32)),
        dspark.InputError,
        "bad-shape",
    ),
    "float64-logits": (
        lambda: dspark.verify(np.zeros((B, K + 1, V)), drafts()),
        dspark.InputError,
        "unsupported-dtype",
    ),
    "float-ids": (
        lambda: dspark.verify(target(), np.zeros((B, K), F32)),
        dspark.InputError,
        "unsupported-dtype",
    ),
    "top-p-zero": (
        lambda: dspark.verify(target(), drafts(), top_p=0.0),
        dspark.InputError,
        "invalid-argument",
    ),
    "top-p-above-one": (
        lambda: dspark.verify(target(), drafts(), top_p=1.5),
        dspark.InputError,
        "invalid-argument",
    ),
    "top-p-per-request": (
        lambda: dspark.verify(target(), drafts(), top_p=[0.5, -0.1]),
        dspark.InputError,
        "invalid-argument",
    ),
    "negative-temperature": (
        lambda: dspark.verify(target(), drafts(), temperature=-0.5),
        dspark.InputError,
        "invalid-argument",
    ),
    "nan-temperature": (
        lambda: dspark.verify(target(), drafts(), temperature=[1.0, float("nan")]),
        dspark.InputError,
        "invalid-argument",
    ),
    "top-k-zero": (
        lambda: dspark.verify(target(), drafts(), top_k=0),
        dspark.InputError,
        "invalid-argument",
    ),
    "per-request-length": (
        lambda: dspark.verify(target(), drafts(), temperature=np.ones(B + 1, F32)),
        dspark.InputError,
        "bad-shape",
    ),
    "num-draft-too-big": (
        lambda: dspark.verify(target(), drafts(), num_draft=[K + 1, 0]),
        dspark.InputError,
        "invalid-argument",
    ),
    "num-draft-length": (
        lambda: dspark.verify(target(), drafts(), num_draft=[1]),
        dspark.InputError,
        "bad-shape",
    ),
    "num-draft-negative": (
        lambda: dspark.verify(target(), drafts(), num_draft=[-1, 0]),
        dspark.InputError,
        "invalid-argument",
    ),
    "stop-token-negative": (
        lambda: dspark.verify(target(), drafts(), stop_token_ids=[-2]),
        dspark.InputError,
        "token-out-of-range",
    ),
    "negative-seed": (
        lambda: dspark.verify(target(), drafts(), seed=-1),
        dspark.InputError,
        "invalid-argument",
    ),
    "seed-length": (
        lambda: dspark.verify(target(), drafts(), seed=[1, 2, 3]),
        dspark.InputError,
        "bad-shape",
    ),
    "non-contiguous": (
        lambda: dspark.verify(np.zeros((V, K + 1, B), F32).transpose(2, 1, 0), drafts()),
        dspark.InputError,
        "bad-shape",
    ),
}


def _block(*, args=None, **kw):
    return dspark.sample_block(*(args or block_args()), **kw)


def _with_anchor(a):
    base, w1, w2, _ = block_args()
    return dspark.sample_block(base, w1, w2, np.array([0, a], dtype=np.int64))


BLOCK_CASES = {
    "anchor-too-big": (lambda: _with_anchor(V), dspark.InputError, "token-out-of-range"),
    "anchor-negative": (lambda: _with_anchor(-3), dspark.InputError, "token-out-of-range"),
    "anchors-length": (
        lambda: dspark.sample_block(*block_args()[:3], np.zeros(B + 1, np.int64)),
        dspark.InputError,
        "bad-shape",
    ),
    "w2-rows": (
        lambda: dspark.sample_block(
            block_args()[0], block_args()[1], np.zeros((V + 1, R), F32), block_args()[3]
        ),
        dspark.InputError,
        "bad-shape",
    ),
    "rank-mismatch": (
        lambda: dspark.sample_block(
            block_args()[0], block_args()[1], np.zeros((V, R + 1), F32), block_args()[3]
        ),
        dspark.InputError,
        "bad-shape",
    ),
    "base-2d": (
        lambda: dspark.sample_block(np.zeros((B, V), F32), *block_args()[1:]),
        dspark.InputError,
        "bad-shape",
    ),
    "w1-too-small-for-targets": (
        lambda: _block(args=block_args(vin=V - 2)),
        dspark.InputError,
        "bad-shape",
    ),
    "negative-temperature": (
        lambda: _block(temperature=-1.0),
        dspark.InputError,
        "invalid-argument",
    ),
    "top-k-zero": (lambda: _block(top_k=0), dspark.InputError, "invalid-argument"),
    "top-k-negative": (lambda: _block(top_k=-1), dspark.InputError, "invalid-argument"),
    "target-vocab-negative": (
        lambda: _block(target_vocab_size=-1),
        dspark.InputError,
        "invalid-argument",
    ),
    "zero-logit-scale": (lambda: _block(logit_scale=0.0), dspark.InputError, "invalid-argument"),
    "float64-weights": (
        lambda: dspark.sample_block(block_args()[0], np.zeros((V, R)), *block_args()[2:]),
        dspark.InputError,
        "unsupported-dtype",
    ),
    "reduced-without-d2t": (
        lambda: _block(target_vocab_size=V + 5),
        dspark.VocabError,
        "missing-d2t",
    ),
    "d2t-out-of-range": (
        lambda: _block(target_vocab_size=V, d2t=np.full(V, 3, np.int64)),
        dspark.VocabError,
        "d2t-out-of-range",
    ),
    "d2t-duplicate": (
        lambda: _block(target_vocab_size=V + 2, d2t=np.array([1, 0] + [0] * (V - 2), np.int64)),
        dspark.VocabError,
        "d2t-duplicate",
    ),
    "d2t-wrong-length": (
        lambda: _block(target_vocab_size=V + 2, d2t=np.zeros(V - 1, np.int64)),
        dspark.VocabError,
        "d2t-wrong-length",
    ),
    "d2t-without-target-vocab": (
        lambda: _block(d2t=np.zeros(V, np.int64)),
        dspark.InputError,
        "invalid-argument",
    ),
}


def _conf(weight_len=6, prev=None, sts=None):
    hidden = np.zeros((B, K, 6), F32)
    return dspark.confidence(hidden, prev, np.zeros(weight_len, F32), sts=sts)


OTHER_CASES = {
    "confidence-weight-length": (lambda: _conf(weight_len=5), dspark.InputError, "bad-shape"),
    "confidence-prev-dtype": (
        lambda: _conf(weight_len=8, prev=np.zeros((B, K, 2), np.float16)),
        dspark.InputError,
        "unsupported-dtype",
    ),
    "confidence-prev-shape": (
        lambda: _conf(weight_len=8, prev=np.zeros((B + 1, K, 2), F32)),
        dspark.InputError,
        "bad-shape",
    ),
    "sts-bad-temperature": (lambda: _conf(sts=[1.0, 0.0, 1.0]), dspark.ConfigError, "bad-config"),
    "sts-missing-file": (
        lambda: _conf(sts="/nonexistent/sts.json"),
        dspark.CheckpointError,
        "missing-file",
    ),
    "sts-too-short": (lambda: _conf(sts=[1.0]), dspark.InputError, "invalid-argument"),
    "sps-empty": (
        lambda: dspark.schedule_lengths(np.ones((B, K), F32), []),
        dspark.InputError,
        "invalid-argument",
    ),
    "sps-interpolation": (
        lambda: dspark.schedule_lengths(np.ones((B, K), F32), [(1, 1.0), (2, 1.0)], "cubic"),
        dspark.InputError,
        "invalid-argument",
    ),
    "pipelined-shapes": (
        lambda: dspark.schedule_pipelined(
            np.ones((B, K), F32), np.ones((B, K + 1), F32), [(1, 1.0), (2, 1.0)]
        ),
        dspark.InputError,
        "bad-shape",
    ),
}

ALL = {
    **{f"verify-{k}": v for k, v in VERIFY_CASES.items()},
    **{f"block-{k}": v for k, v in BLOCK_CASES.items()},
}
ALL.update(OTHER_CASES)


@pytest.mark.parametrize("case", list(ALL), ids=list(ALL))
def test_bad_input_raises_typed_error_with_code(case):
    call, cls, code = ALL[case]
    with pytest.raises(dspark.DSparkError) as e:
        call()
    assert isinstance(e.value, cls), f"{type(e.value).__name__}: {e.value}"
    assert e.value.code == code, str(e.value)
    assert e.value.problems and e.value.problems[0][0] == code


@pytest.mark.torch
def test_torch_non_contiguous_and_float64_rejected():
    torch = pytest.importorskip("torch")
    t = torch.zeros(V, K + 1, B).permute(2, 1, 0)
    with pytest.raises(dspark.InputError) as e:
        dspark.verify(t, torch.ones(B, K, dtype=torch.int64))
    assert e.value.code == "bad-shape"
    with pytest.raises(dspark.InputError) as e:
        dspark.verify(
            torch.zeros(B, K + 1, V, dtype=torch.float64), torch.ones(B, K, dtype=torch.int64)
        )
    assert e.value.code == "unsupported-dtype"
