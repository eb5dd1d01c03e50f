"""The drafters' arguments: every bad value is a typed dspark error with a stable code."""

from __future__ import annotations

from typing import Any

import pytest
from spec_fixtures import checkpoint, load_drafter, single_thread, target, torch  # noqa: F401

import dspark

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_thread")]


@pytest.fixture(scope="module")
def drafter(target, checkpoint):
    return load_drafter("Drafter", checkpoint("own"), target)


def _code(call: Any, cls: type = dspark.InputError) -> str:
    with pytest.raises(cls) as e:
        call()
    return e.value.code


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
    # A float where a seed is meant: invalid-argument (as for the candle drafter); a float
    # tensor of seeds: unsupported-dtype.
    assert (
        _code(lambda: torch_drafter.propose(torch.zeros(1, 2, w), [1], seed=[1.5]))
        == "invalid-argument"
    )
    assert (
        _code(lambda: torch_drafter.propose(torch.zeros(1, 2, w), [1], seed=torch.ones(1)))
        == "unsupported-dtype"
    )
