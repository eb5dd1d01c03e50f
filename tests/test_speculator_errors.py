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
