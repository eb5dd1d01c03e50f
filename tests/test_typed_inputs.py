"""Values entering from Python at the boundaries added since the first hardening pass:
``NativeTarget.logits``, ``dspark.Engine`` requests and options, and ``TorchDrafter``'s load
arguments and dtypes. Each call ends in a typed error with a known code or a correct result:
no silent truncation of floats or bools to ids, no ``TypeError`` / ``OverflowError``, and the
torch drafter runs in bf16 and f16.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from strategies import CODES, ODD_SCALARS, PROPS, given, st

import dspark
from dspark.bundled import bundled_dir


@pytest.fixture(scope="module")
def native() -> Any:
    return dspark.NativeTarget.from_pretrained(bundled_dir() / "target")


@pytest.fixture(scope="module")
def drafter(native: Any) -> Any:
    return dspark.Drafter.from_pretrained(bundled_dir() / "drafter", native, sts=False)


@pytest.mark.parametrize(
    ("ids", "code"),
    [
        ([1.7, 2.2], "invalid-argument"),
        ([True], "invalid-argument"),
        (["a"], "invalid-argument"),
        ("12", "invalid-argument"),
        (None, "invalid-argument"),
        ([], "invalid-argument"),
        ([2**70], "token-out-of-range"),
        ([-1], "token-out-of-range"),
        ([3000], "token-out-of-range"),
        ([[1, 2], [3]], "bad-shape"),
        (np.array([1.0, 2.0]), "unsupported-dtype"),
        (np.array([[1, 2], [3, 4]]), "bad-shape"),
    ],
)
def test_native_logits_arguments_are_typed(native: Any, ids: object, code: str) -> None:
    with pytest.raises(dspark.InputError) as e:
        native.logits(ids)
    assert e.value.code == code, e.value


def test_native_logits_accept_ints_of_any_integer_kind(native: Any) -> None:
    ref = native.logits([1, 2, 3])
    assert ref.shape == (3, native.vocab_size)
    for ids in ((1, 2, 3), np.array([1, 2, 3], np.int32), [np.int64(1), 2, np.uint16(3)]):
        np.testing.assert_array_equal(native.logits(ids), ref)


@PROPS
@given(
    ids=st.one_of(
        st.lists(st.one_of(st.integers(-5, 3005), st.sampled_from(ODD_SCALARS)), max_size=4),
        st.sampled_from(ODD_SCALARS),
    )
)
def test_native_logits_end_typed_or_right(native: Any, ids: Any) -> None:
    try:
        out = native.logits(ids)
    except dspark.DSparkError as e:
        assert e.code in CODES and e.code != "internal", e
        return
    seq = list(ids) if isinstance(ids, (list, tuple)) else [ids]  # a single int is one id
    ints = (int, np.integer)
    assert all(isinstance(i, ints) and not isinstance(i, bool) for i in seq)
    assert all(0 <= int(i) < native.vocab_size for i in seq)
    assert out.shape == (len(seq), native.vocab_size) and np.isfinite(out).all()


# -- the engine's requests -----------------------------------------------------------------


@PROPS
@given(
    field=st.sampled_from(
        ["max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop_token_ids", "max_drafts"]
    ),
    value=st.one_of(
        st.sampled_from([*ODD_SCALARS, "x", [1.5], [True], [-1], [2**70]]),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
    ),
)
def test_engine_request_fields_end_typed_or_accepted(
    native: Any, drafter: Any, field: str, value: Any
) -> None:
    eng = dspark.Engine(native, drafter)
    kw: dict[str, Any] = {"max_new_tokens": 3}
    kw[field] = value
    try:
        rid = eng.add_request([5, 6, 7], kw.pop("max_new_tokens"), **kw)
    except dspark.DSparkError as e:
        assert e.code in CODES and e.code != "internal", e
        assert field in str(e), e
        return
    # Accepted: it runs to its end (huge budgets are cut short by aborting it).
    eng.step()
    eng.abort(rid)
    out = eng.run()
    assert all(0 <= t < native.vocab_size for toks in out.values() for t in toks)


@pytest.mark.parametrize(
    "kw",
    [
        {"max_running": True},
        {"max_running": 2.0},
        {"kv_tokens": -1},
        {"kv_tokens": 2**80},
        {"max_batched_tokens": "8"},
        {"num_speculative_tokens": 1.5},
        {"verify": 2.5},
        {"verify": None},
        {"record_confidence": 1},
    ],
)
def test_engine_options_are_typed(native: Any, drafter: Any, kw: dict[str, Any]) -> None:
    with pytest.raises(dspark.DSparkError) as e:
        dspark.Engine(native, drafter, **kw)
    assert e.value.code in CODES and e.value.code != "internal"


# -- the torch drafter ---------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_torch_drafter_runs_in_half_precision(dtype_name: str) -> None:
    """A bf16 / f16 target with a drafter of the same dtype: greedy speculative decoding gives
    the target's own greedy tokens (the drafter's precision changes acceptance, not output), and
    sampling runs and stays in the vocabulary."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype_name)
    target = AutoModelForCausalLM.from_pretrained(bundled_dir() / "target", dtype=dtype).eval()
    d = dspark.TorchDrafter.from_pretrained(bundled_dir() / "drafter", target, dtype=dtype)
    prompts = [[5, 17, 300, 2], [9, 9, 40]]
    spec = dspark.Speculator(target, d)
    assert spec.generate(prompts, 12).tokens == spec.generate_target_only(prompts, 12).tokens
    sampled = dspark.Speculator(target, d, temperature=0.8, seed=4).generate(prompts, 12).tokens
    assert all(len(t) == 12 and all(0 <= x < 3000 for x in t) for t in sampled)


@pytest.mark.torch
@pytest.mark.parametrize(
    ("kw", "code"),
    [
        ({"dtype": "float16"}, "invalid-argument"),
        ({"dtype": None}, "invalid-argument"),
        ({"dtype": "int8"}, "unsupported-dtype"),
        ({"dtype": "float64"}, "unsupported-dtype"),
        ({"path": None}, "invalid-argument"),
        ({"path": 3}, "invalid-argument"),
        ({"path": ""}, "invalid-argument"),
    ],
)
def test_torch_drafter_load_arguments_are_typed(kw: dict[str, Any], code: str) -> None:
    torch = pytest.importorskip("torch")
    from dspark.bundled import load_pair

    if kw.get("dtype") in ("int8", "float64"):
        kw = {"dtype": getattr(torch, kw["dtype"])}
    path = kw.pop("path", bundled_dir() / "drafter")
    with pytest.raises(dspark.DSparkError) as e:
        dspark.TorchDrafter.from_pretrained(path, load_pair().target, **kw)
    assert e.value.code == code, e.value
