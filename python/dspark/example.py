"""Generate a small, self-consistent random target + DSpark drafter pair.

``dspark make-example DIR`` writes ``DIR/target/`` (an HF transformers ``Qwen3ForCausalLM``:
``config.json``, random ``model.safetensors`` and a byte-level BPE ``tokenizer.json``) and
``DIR/drafter/`` (config + ``model.safetensors`` with DeepSpec tensor names), so ``dspark
inspect`` and ``dspark generate`` run on a fresh machine with nothing downloaded (numpy only to
write it). The weights are random: the pair loads and decodes losslessly, but the drafter
predicts nothing, so its acceptance length is about 1. The layouts exercise the vocabulary rules
the engine enforces:

* ``padded``: draft vocab padded to a multiple of 64 above the target's logical vocab (identity
  map, padded rows masked) — the case the project's seed bug report is about;
* ``full``: draft vocab == target vocab, embed and lm_head shared from the target;
* ``reduced``: a pruned draft vocab with its own lm_head and a ``d2t`` offset table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

import numpy as np

from dspark._args import as_int, as_path
from dspark._chat_template import tokenizer_config
from dspark._errors import raise_error
from dspark._files import staged_dir
from dspark._native import InputError
from dspark._safetensors import save_file

Layout = Literal["padded", "full", "reduced"]

TARGET_VOCAB = 1000
HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 128
TARGET_LAYERS = 6
DRAFT_LAYERS = 2
LAYER_IDS = [1, 3, 4]
RANK = 16
BLOCK = 4
#: Special tokens of the example tokenizer (the last two ids of the target vocabulary).
EOS_ID = TARGET_VOCAB - 2
EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"


def target_config() -> dict[str, object]:
    """A tiny Qwen3-shaped target config."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": TARGET_VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": TARGET_LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "intermediate_size": INTERMEDIATE,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "bos_token_id": EOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": EOS_ID,
        "dtype": "float32",
    }


def target_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """Random ``Qwen3ForCausalLM`` weights (HF names, float32) for :func:`target_config`."""
    rng = np.random.default_rng([seed, 1])

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.5 / float(np.sqrt(shape[-1]))).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    t: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": (rng.standard_normal((TARGET_VOCAB, HIDDEN))).astype(
            np.float32
        ),
        "model.norm.weight": ones(HIDDEN),
        "lm_head.weight": w(TARGET_VOCAB, HIDDEN) * 8.0,
    }
    for i in range(TARGET_LAYERS):
        t.update(_qwen3_layer(f"model.layers.{i}.", w, ones))
    return t


_Tensor = TypeVar("_Tensor")


def _qwen3_layer(
    prefix: str,
    w: Callable[..., _Tensor],
    ones: Callable[[int], _Tensor],
    *,
    hidden: int = HIDDEN,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
    head_dim: int = HEAD_DIM,
    intermediate: int = INTERMEDIATE,
) -> dict[str, _Tensor]:
    """One Qwen3 decoder layer's tensors under ``prefix``, made by ``w`` (weights) and ``ones``
    (norms), called in a fixed order; the example's shape unless given."""
    t = {
        "self_attn.q_proj.weight": w(heads * head_dim, hidden),
        "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
        "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
        "self_attn.o_proj.weight": w(hidden, heads * head_dim),
        "self_attn.q_norm.weight": ones(head_dim),
        "self_attn.k_norm.weight": ones(head_dim),
        "mlp.gate_proj.weight": w(intermediate, hidden),
        "mlp.up_proj.weight": w(intermediate, hidden),
        "mlp.down_proj.weight": w(hidden, intermediate),
        "input_layernorm.weight": ones(hidden),
        "post_attention_layernorm.weight": ones(hidden),
    }
    return {prefix + k: v for k, v in t.items()}


def _drafter_head(
    w: Callable[..., np.ndarray], *, hidden: int, ctx_width: int, v_in: int, v_d: int, rank: int
) -> dict[str, np.ndarray]:
    """A drafter's float16 tensors outside its layers: ``fc`` (from the ``ctx_width`` target
    features), the norms, the Markov head (``v_in`` to ``v_d``) and the confidence head (``w``
    draws in a fixed order)."""
    return {
        "fc.weight": w(hidden, ctx_width),
        "hidden_norm.weight": np.ones(hidden, np.float16),
        "norm.weight": np.ones(hidden, np.float16),
        "markov_head.markov_w1.weight": w(v_in, rank),
        "markov_head.markov_w2.weight": w(v_d, rank),
        "confidence_head.proj.weight": w(1, hidden + rank),
        "confidence_head.proj.bias": np.zeros(1, np.float16),
    }


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 symbols of a byte-level BPE, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = 0
    out = []
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def tokenizer_json() -> dict[str, object]:
    """A byte-level BPE ``tokenizer.json`` with exactly ``TARGET_VOCAB`` tokens.

    Ids 0-255 are the bytes, then fixed two-byte merges of common code characters, then
    ``<|endoftext|>`` (:data:`EOS_ID`) and ``<|mask|>``. Any text encodes (byte fallback is
    built in) and every id decodes. No training, no dependency: deterministic.
    """
    sym = _byte_symbols()
    vocab: dict[str, int] = {s: i for i, s in enumerate(sym)}
    common = " etaoinsrlcdpmu_hfgybw().:=,'\n\"0123456789xkvq[]#"
    chars = [sym[b] for b in dict.fromkeys(common.encode())]
    merges: list[str] = []
    n_merges = EOS_ID - len(vocab)
    for a in chars:
        for b in chars:
            if len(merges) == n_merges:
                break
            vocab[a + b] = len(vocab)
            merges.append(f"{a} {b}")
    if len(merges) != n_merges:  # pragma: no cover - a constant table
        raise AssertionError("example tokenizer: not enough merges")
    specials = [(EOS_ID, EOS_TOKEN), (EOS_ID + 1, MASK_TOKEN)]
    for i, tok in specials:
        vocab[tok] = i
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, tok in specials
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def draft_config(layout: Layout) -> dict[str, object]:
    """A DeepSpec-format DSpark drafter config for ``layout``."""
    vocab = {"padded": 1024, "full": TARGET_VOCAB, "reduced": TARGET_VOCAB}[layout]
    cfg: dict[str, object] = {
        **target_config(),
        "architectures": ["Qwen3DSparkModel"],
        "num_hidden_layers": DRAFT_LAYERS,
        "num_target_layers": TARGET_LAYERS,
        "vocab_size": vocab,
        "block_size": BLOCK,
        "mask_token_id": TARGET_VOCAB + 1 if layout == "padded" else TARGET_VOCAB - 1,
        "target_layer_ids": LAYER_IDS,
        "markov_rank": RANK,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "layer_types": ["full_attention"] * DRAFT_LAYERS,
    }
    if layout == "reduced":
        cfg["draft_vocab_size"] = 256
    return cfg


def draft_tensors(layout: Layout, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights with DeepSpec names and the shapes the config implies."""
    rng = np.random.default_rng(seed)
    cfg = draft_config(layout)
    v_in = int(cfg["vocab_size"])  # type: ignore[call-overload]
    v_d = int(cfg.get("draft_vocab_size", v_in))  # type: ignore[call-overload]

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float16)

    t = _drafter_head(
        w, hidden=HIDDEN, ctx_width=HIDDEN * len(LAYER_IDS), v_in=v_in, v_d=v_d, rank=RANK
    )
    for i in range(DRAFT_LAYERS):
        t.update(_qwen3_layer(f"layers.{i}.", w, lambda n: np.ones(n, np.float16)))
    if layout == "padded":
        # Expanded input vocab (1024 > 1000): the drafter ships its own embedding and lm_head.
        t["embed_tokens.weight"] = w(v_in, HIDDEN)
        t["lm_head.weight"] = w(v_d, HIDDEN)
    if layout == "reduced":
        used = np.sort(rng.choice(TARGET_VOCAB, size=v_d, replace=False))
        t["lm_head.weight"] = w(v_d, HIDDEN)
        t["d2t"] = (used - np.arange(v_d)).astype(np.int64)
        t["t2d"] = np.isin(np.arange(TARGET_VOCAB), used)
    return t


def write_example(root: str | os.PathLike[str], layout: Layout = "padded", seed: int = 0) -> Path:
    """Write ``root/target/{config.json,model.safetensors,tokenizer.json,generation_config.json,
    tokenizer_config.json}`` (with the project's chat template)
    and ``root/drafter/{config.json,model.safetensors}``.

    ``root`` must not exist or be an empty directory; it is written as a temporary sibling
    renamed into place, so a failure (or Ctrl-C) leaves nothing behind. ``seed``: an int in
    ``[0, 2**63)``. Typed errors (``invalid-argument``) for bad arguments, before any work.
    Returns ``root`` as a ``Path``.
    """
    out = as_path(root, "root")
    if layout not in ("padded", "full", "reduced"):
        raise_error(
            InputError, "invalid-argument", f"layout {layout!r}: one of 'padded', 'full', 'reduced'"
        )
    seed = as_int(seed, "seed", hi=2**63 - 1)
    with staged_dir(out, "root") as tmp:
        (tmp / "target").mkdir()
        (tmp / "drafter").mkdir()
        (tmp / "target" / "config.json").write_text(json.dumps(target_config(), indent=2) + "\n")
        (tmp / "target" / "generation_config.json").write_text(
            json.dumps({"bos_token_id": EOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID})
            + "\n"
        )
        (tmp / "target" / "tokenizer.json").write_text(json.dumps(tokenizer_json()) + "\n")
        chat = tokenizer_config(EOS_TOKEN, int(str(target_config()["max_position_embeddings"])))
        (tmp / "target" / "tokenizer_config.json").write_text(json.dumps(chat, indent=2) + "\n")
        save_file(
            target_tensors(seed), tmp / "target" / "model.safetensors", metadata={"format": "pt"}
        )
        (tmp / "drafter" / "config.json").write_text(
            json.dumps(draft_config(layout), indent=2) + "\n"
        )
        save_file(draft_tensors(layout, seed), tmp / "drafter" / "model.safetensors")
    return out
