"""dspark.inspect and the checkpoint contracts, through the Python surface."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import dspark
from dspark.example import draft_config, draft_tensors, target_config
from helpers import example_pair, write_drafter, write_json

STABLE_KEYS = {
    "ok",
    "draft",
    "vocab",
    "id_map",
    "noise_token",
    "target_layer_ids",
    "capture_layer_ids",
    "shares_target",
    "calibration",
    "errors",
    "warnings",
}


def codes(report: dspark.Report) -> set[str]:
    return {e["code"] for e in report.to_dict()["errors"]}


@pytest.mark.parametrize("layout", ["padded", "full", "reduced"])
def test_generated_examples_load(tmp_path: Path, layout: str) -> None:
    drafter, target = example_pair(tmp_path, layout)
    report = dspark.inspect(drafter, target)
    d = report.to_dict()
    assert report.ok, d["errors"]
    assert set(d) == STABLE_KEYS
    assert d["vocab"]["layout"] == layout
    assert d["id_map"] == ("offset-table" if layout == "reduced" else "identity")
    assert d["draft"] == {
        "format": "deepspec",
        "architecture": "Qwen3DSparkModel",
        "block_size": 4,
        "markov_rank": 16,
        "confidence_head": True,
    }
    assert d["target_layer_ids"] == [1, 3, 4]
    assert d["capture_layer_ids"] == [2, 4, 5]
    assert d["noise_token"]["source"] == "mask_token_id"
    assert d["shares_target"] == {
        "embed_tokens": layout != "padded",
        "lm_head": layout == "full",
    }
    assert json.loads(report.to_json()) == d


def test_inkling_small_padded_vocab_loads_with_identity(tmp_path: Path) -> None:
    """The seed bug: logical target vocab 200058, draft padded to 201024 -> identity, no d2t."""
    cfg = draft_config("full")
    cfg.update(vocab_size=201024, mask_token_id=200059)
    tensors = draft_tensors("full")
    h = int(cfg["hidden_size"])  # type: ignore[call-overload]
    r = int(cfg["markov_rank"])  # type: ignore[call-overload]
    tensors["embed_tokens.weight"] = np.zeros((201024, h), np.float16)
    tensors["lm_head.weight"] = np.zeros((201024, h), np.float16)
    tensors["markov_head.markov_w1.weight"] = np.zeros((201024, r), np.float16)
    tensors["markov_head.markov_w2.weight"] = np.zeros((201024, r), np.float16)
    drafter = write_drafter(tmp_path / "inkling", cfg, tensors)
    target = write_json(tmp_path / "t" / "config.json", {**target_config(), "vocab_size": 200058})
    d = dspark.inspect(drafter, target).to_dict()
    assert d["ok"], d["errors"]
    assert d["vocab"] == {
        "input": 201024,
        "draft": 201024,
        "target": 200058,
        "layout": "padded",
        "expanded_input": True,
    }
    assert d["id_map"] == "identity"


def test_reduced_needs_lm_head_and_d2t_each_reported(tmp_path: Path) -> None:
    tensors = draft_tensors("reduced")
    del tensors["lm_head.weight"], tensors["d2t"], tensors["t2d"]
    drafter = write_drafter(tmp_path / "d", draft_config("reduced"), tensors)
    _, target = example_pair(tmp_path / "pair", "full")
    report = dspark.inspect(drafter, target)
    assert not report.ok
    assert {"missing-lm-head", "missing-d2t"} <= codes(report)


@pytest.mark.parametrize(
    ("layout", "tensor", "code"),
    [
        ("reduced", "d2t", "missing-d2t"),  # a reduced vocabulary with only d2t missing
        ("padded", "embed_tokens.weight", "missing-embed-tokens"),  # expanded input vocabulary
    ],
)
def test_one_missing_tensor_is_the_one_problem(
    tmp_path: Path, layout: str, tensor: str, code: str
) -> None:
    tensors = draft_tensors(layout)
    del tensors[tensor]
    drafter = write_drafter(tmp_path / "d", draft_config(layout), tensors)
    _, target = example_pair(tmp_path / "pair", "full")
    assert codes(dspark.inspect(drafter, target)) == {code}


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda d2t: d2t[:-1], "d2t-wrong-length"),
        (lambda d2t: np.concatenate([[5000], d2t[1:]]), "d2t-out-of-range"),
        (lambda d2t: np.concatenate([[d2t[1] + 1], d2t[1:]]), "d2t-duplicate"),
    ],
)
def test_bad_d2t(tmp_path: Path, mutate, code: str) -> None:  # type: ignore[no-untyped-def]
    tensors = draft_tensors("reduced")
    tensors["d2t"] = np.asarray(mutate(tensors["d2t"]), np.int64)
    drafter = write_drafter(tmp_path / "d", draft_config("reduced"), tensors)
    _, target = example_pair(tmp_path / "pair", "full")
    assert code in codes(dspark.inspect(drafter, target))


def test_sharded_checkpoint(tmp_path: Path) -> None:
    drafter = write_drafter(tmp_path / "d", draft_config("full"), draft_tensors("full"), shards=3)
    _, target = example_pair(tmp_path / "pair", "full")
    assert dspark.inspect(drafter, target).ok


def test_shape_mismatch_names_the_tensor(tmp_path: Path) -> None:
    tensors = draft_tensors("full")
    tensors["fc.weight"] = tensors["fc.weight"][:, :-1]
    drafter = write_drafter(tmp_path / "d", draft_config("full"), tensors)
    _, target = example_pair(tmp_path / "pair", "full")
    errors = dspark.inspect(drafter, target).to_dict()["errors"]
    assert [e["code"] for e in errors] == ["shape-mismatch"]
    assert "fc.weight" in errors[0]["message"]


def test_truncated_safetensors_is_typed(tmp_path: Path) -> None:
    drafter, target = example_pair(tmp_path, "full")
    path = drafter / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    assert codes(dspark.inspect(drafter, target)) == {"bad-safetensors"}


def test_missing_checkpoint_and_broken_config(tmp_path: Path) -> None:
    drafter, target = example_pair(tmp_path, "full")
    (drafter / "model.safetensors").unlink()
    assert codes(dspark.inspect(drafter, target)) == {"missing-file"}
    (drafter / "config.json").write_text("{not json")
    d = dspark.inspect(drafter, target).to_dict()
    assert [e["code"] for e in d["errors"]] == ["bad-config"]
    assert d["draft"] is None and d["vocab"] is None and set(d) == STABLE_KEYS


def test_confidence_head_absent_disables_it_loudly(tmp_path: Path) -> None:
    tensors = draft_tensors("full")
    del tensors["confidence_head.proj.weight"], tensors["confidence_head.proj.bias"]
    drafter = write_drafter(tmp_path / "d", draft_config("full"), tensors)
    _, target = example_pair(tmp_path / "pair", "full")
    d = dspark.inspect(drafter, target).to_dict()
    assert d["ok"]
    assert d["draft"]["confidence_head"] is False
    assert "confidence-head-disabled" in {w["code"] for w in d["warnings"]}


def test_deepseek_v4_drafter_is_its_own_target(tmp_path: Path) -> None:
    h, r, v, n = 16, 4, 300, 43
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": v,
        "hidden_size": h,
        "num_hidden_layers": n,
        "num_attention_heads": 4,
        "intermediate_size": 32,
        "dspark_block_size": 5,
        "dspark_noise_token_id": 299,
        "dspark_target_layer_ids": [40, 41, 42],
        "dspark_markov_rank": r,
        "n_mtp_layers": 3,
    }
    z = np.zeros
    tensors = {
        "embed.weight": z((v, h), np.float16),
        "mtp.0.main_proj.weight": z((h, 3 * h), np.float16),
        "mtp.0.main_norm.weight": z(h, np.float16),
        "mtp.2.norm.weight": z(h, np.float16),
        "mtp.2.markov_head.markov_w1.weight": z((v, r), np.float16),
        "mtp.2.markov_head.markov_w2.weight": z((v, r), np.float16),
        "mtp.2.confidence_head.proj.weight": z((1, h + r), np.float32),
    }
    for s in range(3):
        tensors[f"mtp.{s}.attn.wkv.weight"] = z((h, h), np.float16)
        tensors[f"mtp.{s}.ffn.experts.0.w1.weight"] = z((8, h), np.float16)
    drafter = write_drafter(tmp_path / "dsv4", cfg, tensors)
    d = dspark.inspect(drafter).to_dict()
    assert d["ok"], d["errors"]
    assert d["draft"]["format"] == "deepseek-v4"
    assert d["noise_token"] == {"id": 299, "source": "dspark_noise_token_id"}
    assert d["target_layer_ids"] == [40, 41, 42]
    assert d["shares_target"] == {"embed_tokens": True, "lm_head": True}
    assert d["id_map"] == "identity"


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda: dspark.inspect(None), "invalid-argument"),
        (lambda: dspark.inspect(42), "invalid-argument"),
        (lambda: dspark.inspect("x", target=3.5), "invalid-argument"),
    ],
)
def test_untyped_inspect_arguments_are_typed(call, code):
    with pytest.raises(dspark.DSparkError) as e:
        call()
    if code is not None:
        assert e.value.code == code, f"{e.value.code}: {e.value}"
