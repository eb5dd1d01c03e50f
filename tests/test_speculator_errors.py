"""Bad pairs and bad arguments raise typed dspark errors with stable codes, never crash."""

from __future__ import annotations

from typing import Any

import pytest
from spec_fixtures import checkpoint, load_drafter, single_thread, target, torch  # noqa: F401
from tiny_models import make_target, write_drafter

import dspark
from dspark.target import HFTarget

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_thread")]


def _code(excinfo: pytest.ExceptionInfo[Any]) -> str:
    return excinfo.value.code


def test_layer_ids_beyond_target_layers(target, checkpoint, tmp_path):
    # Loading: the engine's check (id 3 is the final layer of the 4-layer target; the config
    # itself says num_target_layers = 4, so the config check already catches it).
    bad = write_drafter(tmp_path / "d", target, config_overrides={"target_layer_ids": [0, 3]})
    with pytest.raises(dspark.ConfigError) as e:
        dspark.TorchDrafter.from_pretrained(bad, target)
    assert _code(e) == "bad-config" and "target_layer_ids" in str(e.value)
    # Same ids, config trained on a deeper target: the target fit check rejects it.
    deep = write_drafter(
        tmp_path / "e",
        target,
        config_overrides={"target_layer_ids": [0, 5], "num_target_layers": 8},
    )
    with pytest.raises(dspark.CheckpointError) as e:
        dspark.TorchDrafter.from_pretrained(deep, target)
    assert _code(e) in ("target-mismatch", "multiple")
    assert all(code == "target-mismatch" for code, _ in e.value.problems)
    # Pairing a loaded drafter with a shallower target: the speculator's check.
    drafter = load_drafter("TorchDrafter", checkpoint("shared"), target)
    shallow = make_target(0, num_hidden_layers=3)
    with pytest.raises(dspark.CheckpointError) as e:
        dspark.Speculator(shallow, drafter)
    assert _code(e) == "target-mismatch" and "layer" in str(e.value)


def test_hidden_size_mismatch(target, checkpoint):
    drafter = load_drafter("TorchDrafter", checkpoint("own"), target)
    narrow = make_target(0, hidden_size=32, head_dim=8)
    with pytest.raises(dspark.CheckpointError) as e:
        dspark.Speculator(narrow, drafter)
    assert _code(e) == "target-mismatch" and "width" in str(e.value)
    with pytest.raises(dspark.CheckpointError) as e:
        dspark.TorchDrafter.from_pretrained(checkpoint("own"), narrow)
    assert "hidden" in str(e.value)


class _NoHidden(HFTarget):
    """A target whose model ignores ``output_hidden_states``."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        inner = self.model

        class Wrapped:
            config = inner.config

            def __call__(self, **kw: Any) -> Any:
                out = inner(**kw)
                out.hidden_states = None
                return out

            def parameters(self) -> Any:
                return inner.parameters()

        self.model = Wrapped()


def test_target_without_hidden_states(target, checkpoint):
    drafter = load_drafter("TorchDrafter", checkpoint("shared"), target)
    spec = dspark.Speculator(_NoHidden(target), drafter)
    with pytest.raises(dspark.InputError) as e:
        spec.generate([[1, 2, 3]], 4)
    assert _code(e) == "invalid-argument" and "hidden states" in str(e.value)


def test_shared_weights_must_be_given(target, checkpoint):
    cfg = target.config.to_dict()
    with pytest.raises(dspark.CheckpointError) as e:
        dspark.TorchDrafter.from_pretrained(checkpoint("shared"), {"config": cfg})
    assert _code(e) == "missing-embed-tokens"


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"temperature": -1.0}, "invalid-argument"),
        ({"top_p": 0.0}, "invalid-argument"),
        ({"top_k": 0}, "invalid-argument"),
        ({"num_speculative_tokens": 99}, "invalid-argument"),
        ({"verify": 1.5}, "invalid-argument"),
        ({"verify": "sometimes"}, "invalid-argument"),
        ({"verify": "pipelined"}, "invalid-argument"),  # no steps-per-second table
    ],
)
def test_bad_options(kwargs, code, target, checkpoint):
    drafter = load_drafter("TorchDrafter", checkpoint("own"), target)
    with pytest.raises(dspark.InputError) as e:
        dspark.Speculator(target, drafter, **kwargs)
    assert _code(e) == code


def test_threshold_needs_confidence_head(target, checkpoint):
    drafter = load_drafter("TorchDrafter", checkpoint("dflash"), target)
    with pytest.raises(dspark.ConfigError) as e:
        dspark.Speculator(target, drafter, verify=0.5)
    assert _code(e) == "bad-config"


def test_bad_generate_inputs(target, checkpoint):
    drafter = load_drafter("TorchDrafter", checkpoint("own"), target)
    spec = dspark.Speculator(target, drafter)
    with pytest.raises(dspark.InputError) as e:
        spec.generate([[1, 2], []], 4)
    assert _code(e) == "bad-shape"
    with pytest.raises(dspark.InputError):
        spec.generate([[1, 2]], -1)
    with pytest.raises(dspark.InputError) as e:
        spec.generate([[1, 2]], 4, on_round="print")
    assert _code(e) == "invalid-argument"
    with pytest.raises(dspark.InputError) as e:
        drafter.propose(torch.zeros(1, 3, 5), [1])
    assert _code(e) == "bad-shape"
    with pytest.raises(dspark.InputError) as e:
        drafter.propose(torch.zeros(1, 3, 128), [999])
    assert _code(e) == "token-out-of-range"


def test_not_a_target(checkpoint, target):
    drafter = load_drafter("TorchDrafter", checkpoint("own"), target)
    with pytest.raises(dspark.InputError) as e:
        dspark.Speculator(object(), drafter)
    assert _code(e) == "invalid-argument"


# --- user input to a working speculator --------------------------------------------------------


@pytest.fixture(scope="module")
def drafter(target, checkpoint):
    return load_drafter("Drafter", checkpoint("own"), target)


@pytest.fixture(scope="module")
def spec(target, drafter):
    return dspark.Speculator(target, drafter)


def _input_code(call: Any, cls: type = dspark.InputError) -> str:
    """The ``.code`` of the ``cls`` error ``call()`` raises."""
    with pytest.raises(cls) as e:
        call()
    return e.value.code


def test_three_dimensional_input_ids_are_refused(spec):
    assert (
        _input_code(lambda: spec.generate(torch.ones(1, 2, 3, dtype=torch.long), 2)) == "bad-shape"
    )
    assert _input_code(lambda: spec.generate([[[1, 2]]], 2)) == "bad-shape"
    assert _input_code(lambda: spec.generate([[1, [2]]], 2)) == "bad-shape"
    # The accepted forms still work.
    for ids in ([1, 2, 3], [[1, 2, 3], [4, 5]], torch.tensor([1, 2, 3]), torch.tensor([[1, 2]])):
        out = spec.generate(ids, 2)
        assert all(len(t) == 2 for t in out.tokens)


@pytest.mark.parametrize("n", [2.7, 2.0, True, "3", None, -1, float("nan")])
def test_max_new_tokens_must_be_a_non_negative_int(spec, n):
    assert _input_code(lambda: spec.generate([[1, 2]], n)) == "invalid-argument"


def test_prompt_ids_must_be_in_the_vocabulary(spec):
    v = spec.target.vocab_size
    assert _input_code(lambda: spec.generate([[1, v]], 2)) == "token-out-of-range"
    assert _input_code(lambda: spec.generate([[-1, 2]], 2)) == "token-out-of-range"
    assert _input_code(lambda: spec.generate(torch.tensor([[1, v + 5]]), 2)) == "token-out-of-range"
    assert _input_code(lambda: spec.generate([[1.0, 2.0]], 2)) == "invalid-argument"
    assert _input_code(lambda: spec.generate(torch.tensor([[1.0, 2.0]]), 2)) == "unsupported-dtype"
    assert _input_code(lambda: spec.generate("hello", 2)) == "invalid-argument"


def test_stop_token_ids_must_be_in_the_vocabulary(spec):
    v = spec.target.vocab_size
    assert _input_code(lambda: spec.generate([[1, 2]], 2, [v])) == "token-out-of-range"
    assert _input_code(lambda: spec.generate([[1, 2]], 2, [-3])) == "token-out-of-range"
    assert _input_code(lambda: spec.generate([[1, 2]], 2, ["eos"])) == "invalid-argument"
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


@pytest.mark.parametrize(
    "table",
    [
        [(1, 5.0)],
        [(4, 5.0), (1, 9.0)],
        [(1, 5.0), (1, 4.0)],
        [(1, 0.0), (2, 4.0)],
        [(1, float("nan")), (2, 4.0)],
        [(0, 5.0), (2, 4.0)],
    ],
)
@pytest.mark.parametrize("verify", ["scheduled", "pipelined"])
def test_bad_steps_per_second_tables_are_invalid_arguments(target, drafter, table, verify):
    """A single entry, token counts that do not strictly increase, zeros or NaN: refused by
    name, for either interpolation."""
    for interpolation in ("step", "linear"):
        with pytest.raises(dspark.DSparkError) as e:
            dspark.Speculator(
                target,
                drafter,
                verify=verify,
                steps_per_second=table,
                steps_interpolation=interpolation,
            )
        assert e.value.code == "invalid-argument", (table, interpolation)
        assert "steps_per_second" in str(e.value)


@pytest.mark.parametrize(
    ("cost", "field"),
    [
        ({"flops_per_token": 1.0, "dtype": "float32"}, "weight_bytes"),
        ({"weight_bytes": -5.0, "flops_per_token": 1.0, "dtype": "float32"}, "weight_bytes"),
        ({"weight_bytes": 1.0, "flops_per_token": float("nan"), "dtype": "float32"}, "flops"),
        ({"weight_bytes": 1.0, "flops_per_token": 1.0, "dtype": "int4"}, "dtype"),
        ({"weight_bytes": 1.0, "flops_per_token": 1.0}, "dtype"),
        (
            {"weight_bytes": 1.0, "flops_per_token": 1.0, "dtype": "bf16", "layer_seconds": 0},
            "layer_seconds",
        ),
    ],
)
def test_a_bad_forward_cost_is_named(target, drafter, cost, field):
    """A protocol target's ``forward_cost`` (the scheduler's prior) is checked when the
    speculator is built: a missing or bad field is ``invalid-argument`` naming it."""

    class Costed(HFTarget):
        forward_cost = cost  # type: ignore[assignment]

    with pytest.raises(dspark.DSparkError) as e:
        dspark.Speculator(Costed(target), drafter)
    assert e.value.code == "invalid-argument", str(e.value)
    assert "forward_cost" in str(e.value) and field in str(e.value), str(e.value)


def test_a_stated_forward_cost_is_used(target, drafter):
    """A well-formed ``forward_cost`` is accepted and greedy output stays the target's."""

    stated = {
        "weight_bytes": 1e6,
        "flops_per_token": 2e6,
        "dtype": "float32",
        "layer_seconds": 1e-4,
    }

    class Costed(HFTarget):
        forward_cost = stated  # type: ignore[assignment]

    prompts = [[1, 2, 3], [4, 5]]
    want = dspark.Speculator(target, drafter, verify="full").generate(prompts, 8).tokens
    got = dspark.Speculator(Costed(target), drafter).generate(prompts, 8).tokens
    assert got == want
