"""The DLPack consumer: dtypes, shapes, zero-copy, contiguity, devices, ownership."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

import dspark
from dspark import _native
from helpers import expect_code, random_block_args, random_target_logits, requires_test_hooks

NUMPY_DTYPES = ["float32", "float16", "int32", "int64", "uint32"]


@requires_test_hooks
@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_dtype_shape_and_pointer(dtype):
    a = np.arange(24, dtype=dtype).reshape(2, 3, 4)
    kind, shape, device, ptr = _native._dlpack_describe(a)
    assert (kind, shape, device) == (dtype, [2, 3, 4], "cpu")
    assert ptr == a.ctypes.data, "the consumer must see the producer's buffer, not a copy"
    assert _native._dlpack_sum(a) == pytest.approx(float(a.astype(np.float64).sum()))


@requires_test_hooks
def test_views_with_offsets_are_read_in_place():
    big = np.arange(1000, dtype=np.float32).reshape(100, 10)
    view = big[37:61]  # a non-owning, C-contiguous view with a byte offset
    _, shape, _, ptr = _native._dlpack_describe(view)
    assert shape == [24, 10] and ptr == view.ctypes.data == big.ctypes.data + 37 * 10 * 4
    assert _native._dlpack_sum(view) == pytest.approx(float(view.sum(dtype=np.float64)))


@requires_test_hooks
def test_zero_dim_and_empty():
    assert _native._dlpack_describe(np.array(3.5, dtype=np.float32))[:2] == ("float32", [])
    assert _native._dlpack_sum(np.array(2.5, dtype=np.float32)) == 2.5
    assert _native._dlpack_describe(np.zeros((0, 5), dtype=np.int64))[:2] == ("int64", [0, 5])
    assert _native._dlpack_sum(np.zeros((3, 0), dtype=np.float32)) == 0.0


@requires_test_hooks
def test_unit_dims_with_any_stride_count_as_contiguous():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    unit = base[:, None, :]  # stride of the size-1 dim is arbitrary
    assert _native._dlpack_describe(unit)[1] == [3, 1, 4]


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a.T,
        lambda a: a[:, ::2],
        lambda a: a[::2],
        lambda a: a.reshape(4, 6)[:, 1:],
    ],
    ids=["transpose", "col-step", "row-step", "col-slice"],
)
@requires_test_hooks
def test_non_contiguous_numpy_is_rejected_not_copied(make):
    a = np.arange(24, dtype=np.float32).reshape(6, 4)
    with pytest.raises(dspark.InputError) as e:
        _native._dlpack_describe(make(a))
    assert e.value.code == "bad-shape"
    assert "contiguous" in str(e.value)


@requires_test_hooks
@pytest.mark.parametrize("dtype", ["float64", "bool", "complex64", "int8", "uint8", "int16"])
def test_unsupported_dtypes(dtype):
    with pytest.raises(dspark.InputError) as e:
        _native._dlpack_describe(np.zeros(4, dtype=dtype))
    assert e.value.code == "unsupported-dtype"


@requires_test_hooks
def test_object_without_dlpack():
    with pytest.raises(dspark.InputError) as e:
        _native._dlpack_describe({"not": "a tensor"})
    assert e.value.code == "unsupported-dtype"


@requires_test_hooks
def test_deleter_runs_once_per_call():
    """The guard calls the producer's deleter: numpy's reference to the array is released."""
    a = np.ones((64, 64), dtype=np.float32)
    before = sys.getrefcount(a)
    for _ in range(200):
        _native._dlpack_describe(a)
        _native._dlpack_sum(a)
    assert sys.getrefcount(a) == before


@requires_test_hooks
def test_errors_after_taking_the_capsule_still_release_it():
    a = np.ones((4, 4), dtype=np.float32).T  # rejected after the capsule was consumed
    before = sys.getrefcount(a)
    failures = 0
    for _ in range(50):
        try:
            _native._dlpack_describe(a)
        except dspark.InputError:
            failures += 1
    assert failures == 50
    assert sys.getrefcount(a) == before


class LegacyOnly:
    """A producer whose ``__dlpack__`` does not take ``max_version`` (pre-1.0 protocol)."""

    def __init__(self, arr):
        self.arr = arr
        self.calls = []

    def __dlpack__(self, stream=None):
        self.calls.append(stream)
        return self.arr.__dlpack__()

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


@requires_test_hooks
def test_legacy_producer_fallback():
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    p = LegacyOnly(a)
    assert _native._dlpack_describe(p)[:2] == ("int64", [2, 3])
    assert p.calls == [None]


class Recording:
    """Records the keyword arguments ``__dlpack__`` is called with."""

    def __init__(self, arr):
        self.arr = arr
        self.kwargs = None

    def __dlpack__(self, **kwargs):
        self.kwargs = kwargs
        return self.arr.__dlpack__(**kwargs)


@requires_test_hooks
def test_versioned_protocol_is_requested_first():
    r = Recording(np.zeros(3, dtype=np.float32))
    _native._dlpack_describe(r)
    assert r.kwargs == {"max_version": (1, 0)}


class Replay:
    """Returns the same capsule every time: the second use must fail cleanly, not crash."""

    def __init__(self, arr):
        self.capsule = arr.__dlpack__()

    def __dlpack__(self, stream=None):
        return self.capsule


@requires_test_hooks
def test_consumed_capsule_is_refused():
    r = Replay(np.zeros(3, dtype=np.float32))
    _native._dlpack_describe(r)
    with pytest.raises(dspark.InputError) as e:
        _native._dlpack_describe(r)
    assert "consumed" in str(e.value)


class FakeCuda:
    """Claims to live on a CUDA device; exporting it must never be attempted."""

    exported = False

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kwargs):
        FakeCuda.exported = True
        raise AssertionError("must not export a CUDA tensor")


@requires_test_hooks
def test_cuda_tensors_are_refused_before_export():
    with pytest.raises(dspark.InputError) as e:
        _native._dlpack_describe(FakeCuda())
    assert e.value.code == "device-unavailable"
    if not dspark.build_info()["cuda"]:
        # The CPU wheel says it has no CUDA; the CUDA wheel reads this argument on the host.
        assert "CUDA tensors are not supported" in str(e.value)
    assert "move to CPU" in str(e.value)
    assert "cuda:0" in str(e.value)
    assert not FakeCuda.exported
    with pytest.raises(dspark.InputError) as e:
        dspark.verify(FakeCuda(), np.zeros((1, 1), dtype=np.int64))
    assert e.value.code == "device-unavailable"
    if dspark.build_info()["cuda"]:
        # The CUDA wheel without a usable device refuses the device itself, saying why.
        assert "cuda:0" in str(e.value) and "CUDA build" in str(e.value)
    else:
        assert "target_logits" in str(e.value)


@requires_test_hooks
def test_readonly_arrays_are_accepted():
    a = np.arange(8, dtype=np.float32)
    a.flags.writeable = False
    assert _native._dlpack_sum(a) == 28.0


@pytest.mark.torch
class TestTorch:
    torch = pytest.importorskip("torch")

    @pytest.mark.parametrize(
        ("dtype", "name"),
        [
            ("float32", "float32"),
            ("float16", "float16"),
            ("bfloat16", "bfloat16"),
            ("int32", "int32"),
            ("int64", "int64"),
            ("uint32", "uint32"),
        ],
    )
    @requires_test_hooks
    def test_dtypes_and_pointer(self, dtype, name):
        torch = self.torch
        t = torch.arange(12).to(getattr(torch, dtype)).reshape(3, 4)
        kind, shape, _, ptr = _native._dlpack_describe(t)
        assert (kind, shape, ptr) == (name, [3, 4], t.data_ptr())
        assert _native._dlpack_sum(t) == pytest.approx(66.0)

    @requires_test_hooks
    def test_storage_offset_view(self):
        t = self.torch.arange(40, dtype=self.torch.bfloat16).reshape(10, 4)
        v = t[3:7]
        assert _native._dlpack_describe(v)[3] == v.data_ptr() == t.data_ptr() + 3 * 4 * 2
        assert _native._dlpack_sum(v) == pytest.approx(float(v.float().sum()))

    @requires_test_hooks
    @pytest.mark.parametrize("make", [lambda t: t.t(), lambda t: t[:, ::2]], ids=["t", "step"])
    def test_non_contiguous_rejected(self, make):
        t = self.torch.zeros(4, 6)
        with pytest.raises(dspark.InputError) as e:
            _native._dlpack_describe(make(t))
        assert e.value.code == "bad-shape"

    @requires_test_hooks
    def test_float64_rejected(self):
        with pytest.raises(dspark.InputError) as e:
            _native._dlpack_describe(self.torch.zeros(3, dtype=self.torch.float64))
        assert e.value.code == "unsupported-dtype"


# --- producers and tensor kinds that once escaped the checks ---------------------------------

B, K, V, R = 2, 3, 10, 4


@requires_test_hooks
def test_dlpack_producer_that_raises_is_typed():
    class Bad:
        def __dlpack__(self, **kw: Any) -> Any:
            raise BufferError("nope")

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    e = expect_code("invalid-argument", _native._dlpack_describe, Bad())
    assert "nope" in str(e)
    e = expect_code("invalid-argument", dspark.verify, random_target_logits(B, K, V), Bad())
    assert "draft_tokens" in str(e)


@requires_test_hooks
@pytest.mark.torch
def test_negative_bit_is_resolved_not_ignored():
    torch = pytest.importorskip("torch")
    t = torch.randn(B, K + 1, V)
    drafts = torch.zeros(B, K, dtype=torch.long)
    neg = torch._neg_view(t)
    assert neg.is_neg()
    got = dspark.verify(neg, drafts, temperature=0.0)
    want = dspark.verify(-t, drafts, temperature=0.0)
    assert torch.equal(got.tokens, want.tokens)
    assert not torch.equal(got.tokens, dspark.verify(t, drafts, temperature=0.0).tokens)
    base, w1, w2, anchors = (torch.from_numpy(a) for a in random_block_args(B, K, V, R))
    got = dspark.sample_block(torch._neg_view(base), w1, w2, anchors)
    assert torch.equal(got.tokens, dspark.sample_block(-base, w1, w2, anchors).tokens)
    h = torch.randn(B, K, 4)
    c = dspark.confidence(torch._neg_view(h), None, torch.ones(4))
    assert torch.allclose(c, dspark.confidence(-h, None, torch.ones(4)))
    # The native layer, given the raw view, refuses it rather than misreading it.
    expect_code("invalid-argument", _native._dlpack_sum, neg)


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["meta", "sparse", "nested", "grad"])
def test_unsupported_torch_tensor_kinds_are_typed(kind):
    torch = pytest.importorskip("torch")
    if kind == "meta":
        t = torch.empty(B, K + 1, V, device="meta")
    elif kind == "sparse":
        t = torch.zeros(B, K + 1, V).to_sparse()
    elif kind == "nested":
        t = torch.nested.nested_tensor([torch.zeros(K + 1, V), torch.zeros(K + 1, V)])
    else:
        t = torch.zeros(B, K + 1, V, requires_grad=True)
    drafts = torch.zeros(B, K, dtype=torch.long)
    if kind == "grad":
        dspark.verify(t, drafts)  # detached by the front: fine
        with pytest.raises(dspark.InputError):
            _native.verify(t, drafts)  # the raw native call: typed, not a RuntimeError
        return
    e = expect_code("invalid-argument", dspark.verify, t, drafts)
    assert "target_logits" in str(e)
    with pytest.raises(dspark.InputError):
        _native.verify(t, drafts)
