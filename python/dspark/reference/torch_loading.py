"""Load a DeepSpec-format DSpark checkpoint into plain torch tensors for the torch drafter.

The engine decides everything that is a rule (``DraftSpec`` normalizes the config,
``dspark.inspect`` checks the checkpoint against the target and says what is shared,
``IdMap.from_offsets`` validates ``d2t``); this module only moves tensors.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dspark._errors import raise_error, raise_report_errors
from dspark._files import read_json
from dspark._native import CheckpointError, ConfigError, DraftSpec, IdMap, InputError
from dspark._native import inspect as engine_inspect
from dspark.reference.torch_ops import Rope

__all__ = ["DrafterWeights", "load_weights"]

_LAYER_NAMES = {
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "o_proj": "self_attn.o_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "gate_proj": "mlp.gate_proj.weight",
    "up_proj": "mlp.up_proj.weight",
    "down_proj": "mlp.down_proj.weight",
    "input_layernorm": "input_layernorm.weight",
    "post_attention_layernorm": "post_attention_layernorm.weight",
}


@dataclass
class DrafterWeights:
    """Everything the torch forward needs, as ``dtype`` tensors (the Markov and confidence
    heads float32) and plain values."""

    dtype: torch.dtype
    block_size: int
    noise_token_id: int
    vocab_size: int
    draft_vocab_size: int
    target_vocab_size: int
    d2t: torch.Tensor | None
    draft_to_target: torch.Tensor
    own_embed: bool
    own_lm_head: bool
    target_layer_ids: list[int]
    capture_layer_ids: list[int]
    sample_from_anchor: bool
    target_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    logit_scale: float
    rope: Rope
    fc: torch.Tensor
    hidden_norm: torch.Tensor
    norm: torch.Tensor
    embed: torch.Tensor
    lm_head: torch.Tensor
    markov_w1: torch.Tensor | None
    markov_w2: torch.Tensor | None
    conf_w: torch.Tensor | None
    conf_b: float
    conf_with_markov: bool
    layers: list[dict[str, torch.Tensor]] = field(default_factory=list)


def _unpack_target(target: object) -> tuple[dict[str, Any] | None, object, object]:
    """(target config dict, embed weight, lm_head weight) from any accepted target form."""
    if target is None:
        return None, None, None
    if isinstance(target, dict):
        cfg = target.get("config")
        if not isinstance(cfg, dict):
            raise_error(InputError, "invalid-argument", "target dict: 'config' must be a dict")
        return cfg, target.get("embed_tokens"), target.get("lm_head")
    model = getattr(target, "model", None) if not hasattr(target, "config") else target
    if model is None or not hasattr(model, "config"):
        raise_error(InputError, "invalid-argument", f"target: unsupported {type(target).__name__}")
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (
        dict(text.to_dict()),
        None if emb is None else emb.weight,
        None if out is None else out.weight,
    )


def _inspect(path: Path, target_cfg: dict[str, Any] | None) -> dict[str, Any]:
    # The torch drafter has no confidence calibration: `sts.json` is not its concern.
    if target_cfg is None:
        report = engine_inspect(path, sts=False).to_dict()
        # Without a target the engine checks the drafter against itself: fit is not known.
        report["errors"] = [e for e in report["errors"] if e["code"] != "target-mismatch"]
        return report
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path = Path(tmp) / "config.json"
        cfg_path.write_text(json.dumps(target_cfg, default=str))
        return engine_inspect(path, cfg_path, sts=False).to_dict()


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.is_file():
        doc = read_json(index, "shard index")
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict):
            raise_error(CheckpointError, "bad-safetensors", f"{index}: no weight_map")
        files = sorted({str(f) for f in weight_map.values()})
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise_error(CheckpointError, "missing-file", f"{path}: no *.safetensors file")
    out: dict[str, torch.Tensor] = {}
    for name in files:
        for key, value in load_file(str(path / name)).items():
            out[key.removeprefix("model.")] = value
    return out


def _shared(weight: object, rows: int, what: str, code: str) -> torch.Tensor:
    if weight is None:
        raise_error(
            CheckpointError,
            code,
            f"the checkpoint has no {what}: it must be shared from the target, but the target "
            f"gave none (pass an HF model or a dict with {what!r})",
        )
    t = torch.as_tensor(weight).detach()
    if t.ndim != 2 or t.shape[0] < rows:
        raise_error(
            CheckpointError,
            "shape-mismatch",
            f"target {what}: expected at least {rows} rows, got shape {tuple(t.shape)}",
        )
    return t[:rows]


def load_weights(
    path: str | os.PathLike[str], target: object, *, dtype: torch.dtype
) -> DrafterWeights:
    """Load ``path`` (a checkpoint directory) against ``target`` (see ``TorchDrafter``)."""
    root = Path(path)
    spec = DraftSpec.from_pretrained(root).to_dict()
    if spec.get("model_type") not in (None, "qwen3") or spec.get("hidden_act") != "silu":
        raise_error(ConfigError, "bad-config", f"{root}: only Qwen3-shaped drafters are supported")
    target_cfg, t_embed, t_lm = _unpack_target(target)
    report = _inspect(root, target_cfg)
    raise_report_errors(report["errors"])
    vocab, shares = report["vocab"], report["shares_target"]
    v_in, v_d, v_t = int(vocab["input"]), int(vocab["draft"]), int(vocab["target"])
    tensors = _read_tensors(root)

    def get(name: str, as_dtype: torch.dtype = dtype) -> torch.Tensor:
        if name not in tensors:
            raise_error(CheckpointError, "missing-tensor", f"{root}: tensor {name!r} is missing")
        return tensors[name].to(as_dtype)

    # The heads that score and sample (Markov, confidence) run in float32 whatever `dtype`.
    f32 = torch.float32

    embed = (
        _shared(t_embed, v_in, "embed_tokens", "missing-embed-tokens").to(dtype)
        if shares["embed_tokens"]
        else get("embed_tokens.weight")
    )
    lm_head = (
        _shared(t_lm, v_d, "lm_head", "missing-lm-head").to(dtype)
        if shares["lm_head"]
        else get("lm_head.weight")
    )
    d2t = None
    if report["id_map"] != "identity":
        d2t = tensors["d2t"].to(torch.int64)
        IdMap.from_offsets(d2t.numpy().copy(), v_t)  # validates: in range and unique (VocabError)
        to_target = torch.arange(v_d) + d2t
    else:
        to_target = torch.arange(v_d)
        to_target[v_t:] = -1  # padded rows: masked, never drafted
    rope = spec["rope"]
    if rope["rope_type"] not in ("default", "linear") or not rope.get("neox_style", True):
        raise_error(
            ConfigError,
            "bad-config",
            f"{root}: rope_type {rope['rope_type']!r} is not supported by the torch drafter",
        )
    rank = int(spec["markov_rank"])
    has_conf = bool(spec["confidence_head"]) and "confidence_head.proj.weight" in tensors
    conf_b = tensors.get("confidence_head.proj.bias")
    layers = [
        {k: get(f"layers.{i}.{n}") for k, n in _LAYER_NAMES.items()}
        for i in range(int(spec["num_hidden_layers"]))
    ]
    return DrafterWeights(
        dtype=dtype,
        block_size=int(spec["block_size"]),
        noise_token_id=int(spec["noise_token"]["id"]),
        vocab_size=v_in,
        draft_vocab_size=v_d,
        target_vocab_size=v_t,
        d2t=d2t,
        draft_to_target=to_target,
        own_embed=not shares["embed_tokens"],
        own_lm_head=not shares["lm_head"],
        target_layer_ids=[int(i) for i in spec["target_layer_ids"]],
        capture_layer_ids=[int(i) for i in spec["capture_layer_ids"]],
        sample_from_anchor=bool(spec["sample_from_anchor"]),
        target_hidden_size=int(spec["target_hidden_size"]),
        num_heads=int(spec["num_attention_heads"]),
        num_kv_heads=int(spec["num_key_value_heads"]),
        head_dim=int(spec["head_dim"]),
        eps=float(spec["rms_norm_eps"]),
        logit_scale=float(spec.get("logit_scale") or 1.0),
        rope=Rope(
            head_dim=int(spec["head_dim"]),
            theta=float(rope["theta"]),
            partial_rotary_factor=float(rope.get("partial_rotary_factor") or 1.0),
            rope_type=str(rope["rope_type"]),
            factor=float(rope.get("factor") or 1.0),
        ),
        fc=get("fc.weight"),
        hidden_norm=get("hidden_norm.weight"),
        norm=get("norm.weight"),
        embed=embed,
        lm_head=lm_head,
        markov_w1=get("markov_head.markov_w1.weight", f32) if rank > 0 else None,
        markov_w2=get("markov_head.markov_w2.weight", f32) if rank > 0 else None,
        conf_w=get("confidence_head.proj.weight", f32).reshape(-1) if has_conf else None,
        conf_b=float(conf_b.to(torch.float64).reshape(-1)[0]) if conf_b is not None else 0.0,
        conf_with_markov=bool(spec.get("confidence_head_with_markov", False)) and rank > 0,
        layers=layers,
    )
