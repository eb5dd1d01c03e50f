"""Issue 14 regressions of ``dspark.Speculator`` and the drafters: typed errors on user input."""

from __future__ import annotations

from typing import Any

import pytest
from spec_fixtures import checkpoint, load_drafter, single_thread, target, torch  # noqa: F401

import dspark

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_thread")]


@pytest.fixture(scope="module")
def drafter(target, checkpoint):
    return load_drafter("Drafter", checkpoint("own"), target)


@pytest.fixture(scope="module")
def spec(target, drafter):
    return dspark.Speculator(target, drafter)


def _code(call: Any, cls: type = dspark.InputError) -> str:
    with pytest.raises(cls) as e:
        call()
    return e.value.code


def test_three_dimensional_input_ids_are_refused(spec):
    assert _code(lambda: spec.generate(torch.ones(1, 2, 3, dtype=torch.long), 2)) == "bad-shape"
    assert _code(lambda: spec.generate([[[1, 2]]], 2)) == "bad-shape"
    assert _code(lambda: spec.generate([[1, [2]]], 2)) == "bad-shape"
    # The accepted forms still work.
    for ids in ([1, 2, 3], [[1, 2, 3], [4, 5]], torch.tensor([1, 2, 3]), torch.tensor([[1, 2]])):
        out = spec.generate(ids, 2)
        assert all(len(t) == 2 for t in out.tokens)


@pytest.mark.parametrize("n", [2.7, 2.0, True, "3", None, -1, float("nan")])
def test_max_new_tokens_must_be_a_non_negative_int(spec, n):
    assert _code(lambda: spec.generate([[1, 2]], n)) == "invalid-argument"


def test_prompt_ids_must_be_in_the_vocabulary(spec):
    v = spec.target.vocab_size
    assert _code(lambda: spec.generate([[1, v]], 2)) == "token-out-of-range"
    assert _code(lambda: spec.generate([[-1, 2]], 2)) == "token-out-of-range"
    assert _code(lambda: spec.generate(torch.tensor([[1, v + 5]]), 2)) == "token-out-of-range"
    assert _code(lambda: spec.generate([[1.0, 2.0]], 2)) == "invalid-argument"
    assert _code(lambda: spec.generate(torch.tensor([[1.0, 2.0]]), 2)) == "unsupported-dtype"
    assert _code(lambda: spec.generate("hello", 2)) == "invalid-argument"


def test_stop_token_ids_must_be_in_the_vocabulary(spec):
    v = spec.target.vocab_size
    assert _code(lambda: spec.generate([[1, 2]], 2, [v])) == "token-out-of-range"
    assert _code(lambda: spec.generate([[1, 2]], 2, [-3])) == "token-out-of-range"
    assert _code(lambda: spec.generate([[1, 2]], 2, ["eos"])) == "invalid-argument"
    assert len(spec.generate([[1, 2]], 2, torch.tensor([v - 1])).tokens) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": "hot"},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"top_k": 2.5},
        {"top_k": True},
        {"top_k": 2**64},
        {"top_p": "x"},
        {"top_p": float("nan")},
        {"num_speculative_tokens": 1.5},
        {"seed": 1.5},
        {"verify": float("nan")},
        {"verify": [0.5]},
        {"verify": True},
        {"verify": "scheduled", "steps_per_second": [(-1, 5.0)]},
        {"verify": "scheduled", "steps_per_second": [("a", "b")]},
        {"verify": "scheduled", "steps_per_second": [(1, 5.0)], "steps_interpolation": "cubic"},
        {"verify": "pipelined", "steps_per_second": [(1, 5.0)], "steps_interpolation": 3},
    ],
)
def test_bad_speculator_options_are_typed(target, drafter, kwargs):
    with pytest.raises(dspark.DSparkError) as e:
        dspark.Speculator(target, drafter, **kwargs)
    assert e.value.code in ("invalid-argument", "too-large", "bad-config")


def test_drafter_arguments_are_typed(target, checkpoint, drafter):
    state = drafter.new_state()
    w = drafter.context_width
    assert _code(lambda: state.extend(torch.zeros(2, w), -1)) == "invalid-argument"
    assert _code(lambda: state.extend(torch.zeros(2, w), 1.5)) == "invalid-argument"
    assert _code(lambda: state.extend(torch.zeros(2, w, device="meta"), 0)) == "invalid-argument"
    assert _code(lambda: state.truncate(-1)) == "invalid-argument"
    assert _code(lambda: drafter.propose_states([object()], [1])) == "invalid-argument"
    assert _code(lambda: drafter.propose_states(state, [1])) == "invalid-argument"
    assert _code(lambda: drafter.propose(torch.zeros(1, 2, w), [1], top_k=-1)) == (
        "invalid-argument"
    )
    assert _code(lambda: drafter.propose(torch.zeros(1, 2, w), [1], seed=-1)) == (
        "invalid-argument"
    )
    assert _code(lambda: drafter.propose(torch.zeros(1, 2, w), [1.5])) == "invalid-argument"
    # Positions past the documented limit (RoPE in f32; `start + T` must never wrap).
    assert _code(lambda: state.extend(torch.zeros(2, w), 2**62)) == "too-large"
    assert _code(lambda: state.extend(torch.zeros(2, w), 2**64 - 1)) == "too-large"
    big = {"start_positions": 2**62}
    assert _code(lambda: drafter.propose(torch.zeros(1, 2, w), [1], **big)) == "too-large"
    assert drafter.propose(torch.zeros(1, 2, w), [1], start_positions=2**24).tokens.shape[0] == 1
    assert _code(lambda: dspark.Drafter.from_pretrained(None, target)) == "invalid-argument"
    torch_drafter = load_drafter("TorchDrafter", checkpoint("own"), target)
    ts = torch_drafter.new_state()
    assert _code(lambda: ts.extend(torch.zeros(2, w), 1.5)) == "invalid-argument"
    assert _code(lambda: ts.truncate("1")) == "invalid-argument"
    assert (
        _code(lambda: torch_drafter.propose(torch.zeros(1, 2, w), [1], seed=[1.5]))
        == "unsupported-dtype"
    )
