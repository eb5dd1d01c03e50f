"""DraftSpec.from_pretrained: config shapes, the noise-token chain, typed errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import dspark
from dspark.example import draft_config
from helpers import expect_code, write_json


def spec(**overrides: Any) -> dspark.DraftSpec:
    cfg: dict[str, Any] = draft_config("full")
    for key, value in overrides.items():
        if value is ...:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return dspark.DraftSpec.from_pretrained(cfg)


def test_from_dict_and_from_path_agree(tmp_path: Path) -> None:
    path = write_json(tmp_path / "d" / "config.json", draft_config("full"))
    a = dspark.DraftSpec.from_pretrained(draft_config("full"))
    for source in (path, path.parent, str(path.parent)):
        b = dspark.DraftSpec.from_pretrained(source)
        assert {k: v for k, v in b.to_dict().items() if k != "source"} == {
            k: v for k, v in a.to_dict().items() if k != "source"
        }
    assert a.format == "deepspec" and a.block_size == 4 and a.markov_rank == 16
    assert a.capture_layer_ids == [i + 1 for i in a.target_layer_ids]


# --- the noise-token chain: first hit wins, null vs missing matters ---------------------------


def test_chain_order() -> None:
    s = spec(mask_token_id=7, dspark_noise_token_id=8, pard_token=9, ptd_token_id=10)
    assert (s.noise_token_id, s.noise_token_source) == (7, "mask_token_id")
    s = spec(dflash_config={"mask_token_id": 3}, mask_token_id=7)
    assert (s.noise_token_id, s.noise_token_source) == (3, "dflash_config.mask_token_id")
    s = spec(mask_token_id=..., dspark_noise_token_id=8, pard_token=9)
    assert (s.noise_token_id, s.noise_token_source) == (8, "dspark_noise_token_id")
    s = spec(mask_token_id=..., pard_token=9, ptd_token_id=10)
    assert (s.noise_token_id, s.noise_token_source) == (9, "pard_token")
    s = spec(mask_token_id=..., ptd_token_id=10)
    assert (s.noise_token_id, s.noise_token_source) == (10, "ptd_token_id")


def test_null_mask_token_id_falls_through() -> None:
    s = spec(mask_token_id=None, pard_token=5)
    assert (s.noise_token_id, s.noise_token_source) == (5, "pard_token")


def test_no_noise_token_names_all_five_keys() -> None:
    with pytest.raises(dspark.ConfigError) as info:
        spec(mask_token_id=None)
    assert info.value.code == "no-noise-token"
    for key in (
        "dflash_config.mask_token_id",
        "mask_token_id",
        "dspark_noise_token_id",
        "pard_token",
        "ptd_token_id",
    ):
        assert key in str(info.value)


@pytest.mark.parametrize("bad", [True, 3.5, "7", [1]])
def test_non_integer_noise_token_is_bad_config(bad: object) -> None:
    with pytest.raises(dspark.ConfigError) as info:
        spec(mask_token_id=bad)
    assert info.value.code == "bad-config"
    assert "mask_token_id" in str(info.value)


@pytest.mark.parametrize("bad", [-1, 1000, 10**12])
def test_noise_token_out_of_range(bad: int) -> None:
    with pytest.raises(dspark.ConfigError) as info:
        spec(mask_token_id=bad)
    assert info.value.code == "noise-token-out-of-range"


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"markov_rank": -1}, "markov_rank"),
        ({"markov_head_type": "quantum"}, "markov_head_type"),
        ({"target_layer_ids": [3, 1]}, "target_layer_ids"),
        ({"target_layer_ids": [1, 1]}, "target_layer_ids"),
        ({"target_layer_ids": [1, 5]}, "target_layer_ids"),  # 6 target layers: 5 is the final one
        ({"block_size": 0}, "block_size"),
        ({"block_size": True}, "block_size"),
        ({"hidden_size": ...}, "hidden_size"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ],
)
def test_invalid_configs_name_the_key(overrides: dict[str, Any], key: str) -> None:
    with pytest.raises(dspark.ConfigError) as info:
        spec(**overrides)
    assert info.value.code == "bad-config"
    assert key in str(info.value)
    assert "<dict>" in str(info.value)


def test_broken_json_file_is_typed(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"vocab_size": ')
    with pytest.raises(dspark.ConfigError) as info:
        dspark.DraftSpec.from_pretrained(tmp_path)
    assert info.value.code == "bad-config"
    assert "config.json" in str(info.value)
    (tmp_path / "config.json").write_bytes(b'{"a": "\xff"}')
    with pytest.raises(dspark.ConfigError):
        dspark.DraftSpec.from_pretrained(tmp_path)


def test_missing_config_is_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(dspark.CheckpointError) as info:
        dspark.DraftSpec.from_pretrained(tmp_path / "nope")
    assert info.value.code == "missing-file"


def test_speculators_layer_ids_are_capture_semantics() -> None:
    cfg = {
        "architectures": ["DSparkDraftModel"],
        "speculators_model_type": "dspark",
        "block_size": 8,
        "mask_token_id": 154856,
        "draft_vocab_size": 32000,
        "aux_hidden_state_layer_ids": [8, 23, 39, 55, 70],
        "markov_rank": 256,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "sample_from_anchor": False,
        "transformer_layer_config": {
            "model_type": "qwen3",
            "vocab_size": 154880,
            "hidden_size": 64,
            "num_hidden_layers": 5,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "intermediate_size": 128,
            "rms_norm_eps": 1e-6,
        },
    }
    s = dspark.DraftSpec.from_pretrained(cfg)
    assert s.format == "speculators"
    assert s.capture_layer_ids == [8, 23, 39, 55, 70]
    assert s.target_layer_ids == [7, 22, 38, 54, 69]
    assert (s.vocab_size, s.draft_vocab_size) == (154880, 32000)
    assert s.sample_from_anchor is False


@pytest.mark.parametrize(
    "config",
    [
        {"block_size": float("nan")},
        {"architectures": ["Qwen3DSparkModel"], "vocab_size": float("inf")},
        {"x": {1, 2}},
        {("a", "b"): 1},
    ],
)
def test_config_dict_that_is_not_json_is_a_config_error(config):
    e = expect_code("bad-config", dspark.DraftSpec.from_pretrained, config, cls=dspark.ConfigError)
    assert "<dict>" in str(e)


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda: dspark.DraftSpec.from_pretrained(None), "invalid-argument"),
    ],
)
def test_untyped_config_arguments_are_typed(call, code):
    with pytest.raises(dspark.DSparkError) as e:
        call()
    if code is not None:
        assert e.value.code == code, f"{e.value.code}: {e.value}"
