"""The native target's KV cache dtype (``kv_dtype=``, ``--kv-dtype``).

Keys and values are kept in ``float16`` (the default), ``bfloat16`` or ``float32``, attention
still computed in f32: a half cache halves the bytes a decode step reads at a long context.
Greedy speculative output equals target-only output with the same cache dtype; a half cache
moves the logits by its rounding only; bad names are typed ``invalid-argument`` errors that
list the choices.
"""

from __future__ import annotations

import numpy as np
import pytest

import dspark
from dspark.bundled import bundled_dir
from dspark.cli import main as cli_main

ROOT = bundled_dir()
# A long prompt (past several 16-key panels and a cache growth) and a short one.
LONG = [int(x) for x in (np.arange(300) * 7919 % 2900 + 50)]
PROMPTS = [LONG, [5, 17, 99, 3, 250, 7]]


@pytest.mark.parametrize(
    ("name", "want"),
    [("float16", "float16"), ("f16", "float16"), ("bf16", "bfloat16"), ("float32", "float32")],
)
def test_names_choose_the_cache_dtype_and_greedy_output_stays_exact(name: str, want: str) -> None:
    t = dspark.NativeTarget.from_pretrained(ROOT / "target", kv_dtype=name)
    assert t.kv_dtype == want
    s = dspark.Speculator(t, dspark.Drafter.from_pretrained(ROOT / "drafter", t), verify="full")
    assert s.generate(PROMPTS, 16).tokens == s.generate_target_only(PROMPTS, 16).tokens


def test_the_default_and_the_rounding_of_a_half_cache() -> None:
    default = dspark.NativeTarget.from_pretrained(ROOT / "target")
    assert default.kv_dtype in ("float16", "bfloat16", "float32")
    wide = dspark.NativeTarget.from_pretrained(ROOT / "target", kv_dtype="float32")
    half = dspark.NativeTarget.from_pretrained(ROOT / "target", kv_dtype="float16")
    a, b = np.asarray(wide.logits(LONG)), np.asarray(half.logits(LONG))
    assert 0 < np.abs(a - b).max() <= 0.01 * max(1.0, np.abs(a).max())


@pytest.mark.parametrize("bad", ["int8", "q8_0", "", "float64"])
def test_bad_names_are_invalid_arguments_listing_the_choices(bad: str) -> None:
    with pytest.raises(dspark.InputError) as e:
        dspark.NativeTarget.from_pretrained(ROOT / "target", kv_dtype=bad)
    msg = str(e.value)
    assert e.value.code == "invalid-argument"
    assert "kv_dtype" in msg and "float16" in msg and "bfloat16" in msg, msg
    with pytest.raises(dspark.InputError) as e:
        dspark.NativeTarget.from_pretrained(ROOT / "target", kv_dtype=3)  # type: ignore[arg-type]
    assert e.value.code == "invalid-argument" and "kv_dtype" in str(e.value)


def test_generate_takes_kv_dtype_natively(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", "--target", str(ROOT / "target"), "--drafter", str(ROOT / "drafter")]
    args += ["--prompt", "def f(x):", "--max-new-tokens", "8", "--quiet", "--json"]
    assert cli_main([*args, "--kv-dtype", "bfloat16"]) == 0
    assert '"tokens"' in capsys.readouterr().out
    assert cli_main([*args, "--kv-dtype", "int8"]) == 2
