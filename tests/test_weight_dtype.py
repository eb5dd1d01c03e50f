"""The weight dtype of a native target and its drafter (``dtype=``).

By default the weight matrices keep the checkpoint's dtype (the bundled pair is float32);
``dtype="bfloat16"`` / ``"float16"`` keeps them as 2 bytes a weight (widened in registers, the
arithmetic float32), halving the bytes a step reads; ``dtype="q8_0"`` / ``"q4_k"`` quantizes the
layers' maps into 8-bit blocks or 4-bit super-blocks (about a quarter, or an eighth, of float32's
bytes). Bad values are typed
``invalid-argument`` errors. Greedy speculative output equals target-only output in every dtype.
"""

from __future__ import annotations

import os

import pytest

import dspark
from dspark.bundled import bundled_dir

ROOT = bundled_dir()
PROMPT = [[5, 17, 99, 3, 250, 7], [1200, 8, 41]]

# On the device-generic path (forced by ``tensor`` or ``fused``) every weight is a float32
# tensor holding the chosen values.
TENSOR_PATH = os.environ.get("DSPARK_KERNEL_PATH", "").strip().lower() in ("tensor", "fused")


def test_the_default_keeps_the_checkpoint_dtype() -> None:
    t = dspark.NativeTarget.from_pretrained(ROOT / "target")
    assert t.weight_dtype == "float32"
    assert t.weight_bytes_per_step > 0


@pytest.mark.parametrize(
    ("name", "want"),
    [("bfloat16", "bfloat16"), ("bf16", "bfloat16"), ("float16", "float16"), ("f32", "float32")],
)
def test_dtype_names_choose_the_kept_dtype(name: str, want: str) -> None:
    wide = dspark.NativeTarget.from_pretrained(ROOT / "target")
    t = dspark.NativeTarget.from_pretrained(ROOT / "target", dtype=name)
    if TENSOR_PATH:
        assert t.weight_dtype == "float32"
        return
    assert t.weight_dtype == want
    if want != "float32":
        assert t.weight_bytes_per_step * 2 == wide.weight_bytes_per_step


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_greedy_speculative_equals_target_only(dtype: str) -> None:
    t = dspark.NativeTarget.from_pretrained(ROOT / "target", dtype=dtype)
    d = dspark.Drafter.from_pretrained(ROOT / "drafter", t, dtype=dtype)
    s = dspark.Speculator(t, d)
    assert s.generate(PROMPT, 16).tokens == s.generate_target_only(PROMPT, 16).tokens


@pytest.mark.parametrize(
    ("quant", "bytes_below", "logits_within"), [("Q8_0", 0.6, 0.08), ("q4_k", 0.45, 0.25)]
)
def test_quantized_layers_keep_greedy_output_exact(
    quant: str, bytes_below: float, logits_within: float
) -> None:
    wide = dspark.NativeTarget.from_pretrained(ROOT / "target")
    t = dspark.NativeTarget.from_pretrained(ROOT / "target", dtype=quant)
    assert t.weight_dtype == quant.lower()
    if not TENSOR_PATH:
        assert t.weight_bytes_per_step < bytes_below * wide.weight_bytes_per_step
    # The drafter's own layers stay float; it borrows the target's embedding and head.
    d = dspark.Drafter.from_pretrained(ROOT / "drafter", t)
    s = dspark.Speculator(t, d, verify="full")
    spec = s.generate(PROMPT, 24)
    assert spec.tokens == s.generate_target_only(PROMPT, 24).tokens
    assert spec.stats.acceptance_length > 1.5
    # Close to the float32 model: quantized weights and activations move the logits a little.
    import numpy as np

    a = np.asarray(wide.logits(PROMPT[0]))
    b = np.asarray(t.logits(PROMPT[0]))
    assert 0 < np.abs(a - b).max() <= logits_within * max(1.0, np.abs(a).max())
    with pytest.raises(dspark.InputError) as e:
        dspark.Drafter.from_pretrained(ROOT / "drafter", t, dtype=quant)
    assert e.value.code == "invalid-argument" and quant.lower() in str(e.value)


def test_an_unknown_quantized_format_lists_the_supported_ones() -> None:
    with pytest.raises(dspark.InputError) as e:
        dspark.NativeTarget.from_pretrained(ROOT / "target", dtype="q3_k")
    assert e.value.code == "invalid-argument"
    assert "q8_0" in str(e.value) and "q4_k" in str(e.value)


@pytest.mark.parametrize("bad", ["int8", "float64", "", "bf-16"])
def test_bad_names_are_invalid_arguments(bad: str) -> None:
    with pytest.raises(dspark.InputError) as e:
        dspark.NativeTarget.from_pretrained(ROOT / "target", dtype=bad)
    assert e.value.code == "invalid-argument"
    assert "dtype" in str(e.value)
    native = dspark.NativeTarget.from_pretrained(ROOT / "target")
    with pytest.raises(dspark.InputError) as e:
        dspark.Drafter.from_pretrained(ROOT / "drafter", native, dtype=bad)
    assert e.value.code == "invalid-argument"


@pytest.mark.parametrize("bad", [0, 2.5, b"bf16", ["bf16"]])
def test_non_string_dtypes_are_invalid_arguments(bad: object) -> None:
    with pytest.raises(dspark.InputError) as e:
        dspark.NativeTarget.from_pretrained(ROOT / "target", dtype=bad)
    assert e.value.code == "invalid-argument"


def test_a_narrowing_that_overflows_is_a_typed_error(tmp_path) -> None:
    """A weight beyond float16's range (1e5) loaded as float16 is a ``non-finite`` error naming
    the tensor, at load: never a model that returns infinite logits. float32 and bfloat16 hold
    it."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    target = tmp_path / "target"
    shutil.copytree(ROOT / "target", target)
    tensors = load_file(target / "model.safetensors")
    name = next(n for n in sorted(tensors) if n.endswith("mlp.down_proj.weight"))
    big = tensors[name].copy()
    big.flat[7] = np.float32(1e5)
    tensors[name] = big
    save_file(tensors, target / "model.safetensors")
    with pytest.raises(dspark.DSparkError) as e:
        dspark.NativeTarget.from_pretrained(target, dtype="float16")
    assert e.value.code == "non-finite", e.value
    assert name in str(e.value) and "float16" in str(e.value)
    for ok in ("float32", "bfloat16"):
        t = dspark.NativeTarget.from_pretrained(target, dtype=ok)
        assert np.isfinite(np.asarray(t.logits([5, 17, 99]))).all()


@pytest.mark.parametrize("quant", ["q8_0", "q4_k"])
def test_a_weight_a_format_cannot_hold_is_a_typed_error_naming_it(tmp_path, quant: str) -> None:
    """An infinite weight cannot be quantized: ``invalid-argument`` naming the tensor, at load."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    target = tmp_path / "target"
    shutil.copytree(ROOT / "target", target)
    tensors = load_file(target / "model.safetensors")
    name = next(n for n in sorted(tensors) if n.endswith("self_attn.o_proj.weight"))
    bad = tensors[name].copy()
    bad.flat[3] = np.float32(np.inf)
    tensors[name] = bad
    save_file(tensors, target / "model.safetensors")
    with pytest.raises(dspark.InputError) as e:
        dspark.NativeTarget.from_pretrained(target, dtype=quant)
    assert e.value.code == "invalid-argument", e.value
    assert name in str(e.value) and quant in str(e.value)
