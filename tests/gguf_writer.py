"""A small GGUF writer for the tests (llama.cpp's format, version 3): metadata of the common
value types, tensors in F32, F16 or Q8_0 (quantized here with numpy: ``d = max|x| / 127`` in f16,
levels rounded half away from zero), and a converter of a checkpoint directory (safetensors and
``config.json``, the ``tokenizer.json`` as a ``gpt2`` tokenizer) into one such file, named as
llama.cpp's converter names a Qwen3 model's tensors. Written from the format's description, so
that the engine's reader is checked against an independent writer."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

ALIGN = 32
F32, F16, Q8_0 = 0, 1, 8

#: GGUF's value types.
_U32, _I32, _F32, _BOOL, _STRING, _ARRAY = 4, 5, 6, 7, 8, 9


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _value(v: Any) -> tuple[int, bytes]:
    """``(type, bytes)`` of a metadata value: bool, int (u32, or i32 when negative), float
    (f32), str, or a list of one of those."""
    if isinstance(v, bool):
        return _BOOL, struct.pack("<B", v)
    if isinstance(v, int):
        return (_I32, struct.pack("<i", v)) if v < 0 else (_U32, struct.pack("<I", v))
    if isinstance(v, float):
        return _F32, struct.pack("<f", v)
    if isinstance(v, str):
        return _STRING, _string(v)
    if isinstance(v, list):
        kind = _value(v[0])[0] if v else _U32
        body = b"".join(_value(x)[1] for x in v)
        return _ARRAY, struct.pack("<IQ", kind, len(v)) + body
    raise TypeError(type(v))


def q8_0(x: np.ndarray) -> bytes:
    """Row-major ``x`` (a multiple of 32 wide) as Q8_0 blocks."""
    blocks = x.astype(np.float32).reshape(-1, 32)
    d = (np.abs(blocks).max(axis=1) / 127.0).astype(np.float16)
    inv = np.where(d > 0, 1.0 / np.maximum(d.astype(np.float32), 1e-30), 0.0)
    v = blocks * inv[:, None]
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).clip(-127, 127).astype(np.int8)
    out = np.empty((blocks.shape[0], 34), dtype=np.uint8)
    out[:, :2] = d.view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def write(path: Path, metadata: dict[str, Any], tensors: dict[str, tuple[np.ndarray, int]]) -> None:
    """A GGUF file at ``path``: ``metadata``, and ``tensors`` (name → (row-major values, type))."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, v in metadata.items():
        kind, body = _value(v)
        head += _string(key) + struct.pack("<I", kind) + body
    data = b""
    for name, (x, kind) in tensors.items():
        raw = {
            F32: lambda a: a.astype("<f4").tobytes(),
            F16: lambda a: a.astype("<f2").tobytes(),
            Q8_0: q8_0,
        }[kind](x)
        dims = list(reversed(x.shape))
        head += _string(name) + struct.pack("<I", len(dims))
        head += b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", kind, len(data))
        data += raw + b"\0" * (-len(raw) % ALIGN)
    head += b"\0" * (-len(head) % ALIGN)
    path.write_bytes(head + data)


#: llama.cpp's names of a Qwen3 layer's tensors.
_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(name: str) -> str:
    """llama.cpp's name of a ``Qwen3ForCausalLM`` tensor."""
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if name in fixed:
        return fixed[name]
    layer, rest = name.removeprefix("model.layers.").split(".", 1)
    part, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER[part]}.{kind}"


def tokenizer_metadata(tokenizer_json: Path) -> dict[str, Any]:
    """A byte-level BPE ``tokenizer.json`` as GGUF's ``gpt2`` tokenizer metadata."""
    tok = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab: dict[str, int] = tok["model"]["vocab"]
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    special = {int(t["id"]) for t in tok.get("added_tokens", [])}
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in tok["model"]["merges"]]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3 if i in special else 1 for i in range(len(tokens))],
        "tokenizer.ggml.merges": merges,
    }


def convert(src: Path, out: Path, matrices: int = F32) -> Path:
    """The Qwen3 checkpoint directory ``src`` as a GGUF file ``out``: 2-D tensors in
    ``matrices`` (F32, F16 or Q8_0), the rest in F32; the config, tokenizer, chat template and
    end-of-sequence id in its metadata."""
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    rope = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta", 1e4))
    meta: dict[str, Any] = {
        "general.architecture": "qwen3",
        "qwen3.block_count": config["num_hidden_layers"],
        "qwen3.context_length": config["max_position_embeddings"],
        "qwen3.embedding_length": config["hidden_size"],
        "qwen3.feed_forward_length": config["intermediate_size"],
        "qwen3.attention.head_count": config["num_attention_heads"],
        "qwen3.attention.head_count_kv": config["num_key_value_heads"],
        "qwen3.attention.key_length": config["head_dim"],
        "qwen3.attention.value_length": config["head_dim"],
        "qwen3.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        "qwen3.rope.freq_base": float(rope),
        **tokenizer_metadata(src / "tokenizer.json"),
        "tokenizer.ggml.eos_token_id": int(config["eos_token_id"]),
        "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
    }
    weights = load_file(str(src / "model.safetensors"))
    tie = bool(config.get("tie_word_embeddings"))
    tensors = {
        gguf_name(name): (x, matrices if x.ndim == 2 else F32)
        for name, x in sorted(weights.items())
        if not (tie and name == "lm_head.weight")
    }
    write(out, meta, tensors)
    return out
