"""A memory-bound target + DSpark drafter with the bundled pair's behaviour at a 0.6 B model's cost.

``dspark make-example DIR --memory-bound`` writes ``DIR/target`` (an HF ``Qwen3ForCausalLM``
with Qwen3-0.6B's widths and depth, 0.62 B parameters) and ``DIR/drafter`` (its DeepSpec-format
DSpark drafter, as wide as the target, with a real drafter's five layers). They compute exactly
the function of the bundled tiny pair (``dspark/models/tiny``): the bundled weights are
embedded in the bigger shapes and everything else is zero, so greedy decoding, speculative or
not, gives the bundled pair's tokens, while every forward reads and multiplies the weights of a
0.6 B model. On a CPU that makes decoding bound by memory bandwidth, as it is for real models;
the bundled target fits in cache. Nothing is stored: the pair is generated in about a minute.

How the embedding keeps the function exact (small: hidden ``h``, head_dim ``e``; big: ``H``,
``E``; real arithmetic, so float32 agrees to rounding):

* every hidden-width vector is ``[x; 0]``: embeddings and every weight that reads the hidden
  state are zero-padded in their input columns, every weight that writes it (``o_proj``,
  ``down_proj``, the drafter's ``fc``) in its output rows;
* RMSNorm over ``H`` of ``[x; 0]`` sees a mean square ``h/H`` times the small one: the norm
  weights are scaled by ``sqrt(h/H)`` and ``rms_norm_eps`` by ``h/H``, which makes
  ``w' [x;0] / sqrt(mean' + eps')`` equal ``[w x / sqrt(mean + eps); 0]`` exactly;
* a small head's ``e`` dims sit at big dims ``2i`` and ``E/2 + 2i`` (``E = 2e``): HF Qwen3's
  RoPE rotates pairs ``(j, j + E/2)`` at frequency ``theta^(-2j/E)``, so dim pair
  ``(i, i + e/2)`` at ``theta^(-2i/e)`` lands on pair ``(2i, 2i + E/2)`` at the same frequency;
* q_norm / k_norm run over ``E`` dims of which ``e`` are used: the real rows of ``q_proj`` and
  ``k_proj`` are scaled by ``c = sqrt(h/H * E/e)`` so the shared ``eps'`` is exact for them too
  (RMSNorm is otherwise blind to the scale), which leaves normalised q and k ``sqrt(E/e)`` times
  the small ones; the attention scale is ``1/sqrt(E)`` instead of ``1/sqrt(e)``, so k_norm's
  weights are scaled by ``sqrt(e/E)`` and q_norm's kept: every score is the small score, and
  the keys the cache holds are the small keys;
* small q head ``j`` is big q head ``j``; big kv head ``g`` (read by q heads ``2g, 2g+1``) holds
  the small kv head those q heads read, duplicated where needed (GQA grouping kept);
* the extra q and kv heads, MLP units and layers have all-zero weights, so their residual
  branches add exactly zero; the extra layers come after the small ones, so the drafter's
  ``target_layer_ids`` name the same hidden states;
* the drafter's ``fc`` reads each target feature's first ``h`` columns; its confidence head reads
  ``[h_k; 0; W1[x]]``; the Markov head is unchanged.

Zeros cost what any other value costs in a dense kernel, and no engine here looks at values; to
show it, ``jitter`` replaces every zero by a tiny non-zero value (``±jitter·[0.5, 1)``, fixed per
tensor name). The function then moves by about ``10·jitter`` to ``20·jitter`` in the logits
(first order: the extra query heads that share a KV head with a real one read its values through
their jittered ``o_proj`` columns; the factor follows the size of the bundled weights): with
``jitter=1e-4`` the logits (up to 15 in size) move by under 2e-3 and the greedy tokens stay the
same. Every product of jittered values stays far above float32's (and bfloat16's) smallest
normal number, so no kernel meets denormals either.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from dspark import _files
from dspark._chat_template import tokenizer_config
from dspark._errors import raise_error
from dspark._native import InputError
from dspark._shards import Dtype, TensorSpec, plan_shards, write_shards
from dspark._spm import sentencepiece_model

__all__ = [
    "DRAFT_LAYERS",
    "MAX_JITTER",
    "TARGET_SHAPE",
    "MemoryBoundPair",
    "Shape",
    "bundled_tiny_dir",
    "check_output_dir",
    "target_parameter_count",
    "write_converter_tokenizer",
    "write_memory_bound",
]

#: Qwen3-0.6B's widths and depth with the MLP widened from 3072 to 5120, which takes the
#: 3000-token vocabulary's 0.44 B parameters to 0.62 B.
TARGET_SHAPE_ARGS = {
    "hidden": 1024,
    "heads": 16,
    "kv_heads": 8,
    "head_dim": 128,
    "intermediate": 5120,
    "layers": 28,
}
#: A DeepSpec Qwen3 drafter's depth (the bundled one has 2; the other 3 are zero).
DRAFT_LAYERS = 5
#: Largest safetensors file written (then the checkpoint is sharded, with an index).
MAX_SHARD_BYTES = 1 << 30
#: Largest ``jitter`` accepted: beyond it the function visibly moves (1e-4 is plenty).
MAX_JITTER = 1e-3
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Shape:
    """The widths of a Qwen3 decoder stack."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int

    @classmethod
    def of(cls, config: dict[str, Any]) -> Shape:
        """The shape an HF Qwen3 ``config.json`` describes."""
        return cls(
            int(config["hidden_size"]),
            int(config["num_attention_heads"]),
            int(config["num_key_value_heads"]),
            int(config["head_dim"]),
            int(config["intermediate_size"]),
            int(config["num_hidden_layers"]),
        )


TARGET_SHAPE = Shape(**TARGET_SHAPE_ARGS)


class _Embedding:
    """Where a small stack's weights go in a big one, and how they are scaled."""

    def __init__(self, small: Shape, big: Shape) -> None:
        h, e, H, E = small.hidden, small.head_dim, big.hidden, big.head_dim  # noqa: N806
        if H < h or big.intermediate < small.intermediate or big.heads < small.heads:
            raise AssertionError("the big shape must be at least as wide")
        if E % e or e % 2:
            raise AssertionError("head_dim must grow by an integer factor")
        self.small, self.big = small, big
        f = E // e
        half = e // 2
        # Small head dim i -> big head dim: pair (i, i + e/2) -> (f*i, E/2 + f*i).
        self.head_dims = np.array(
            [f * i for i in range(half)] + [E // 2 + f * i for i in range(half)], np.int64
        )
        self.norm_scale = math.sqrt(h / H)
        self.qk_scale = math.sqrt(h / H * E / e)
        self.k_norm_scale = math.sqrt(e / E)
        small_group = small.heads // small.kv_heads
        big_group = big.heads // big.kv_heads
        sources: dict[int, int] = {}
        for q in range(small.heads):
            g, g_small = q // big_group, q // small_group
            if sources.setdefault(g, g_small) != g_small:
                raise AssertionError("GQA grouping cannot be kept with these head counts")
        self.kv_sources = sources  # big kv head -> small kv head

    def eps(self, eps: float) -> float:
        """The big stack's ``rms_norm_eps``."""
        return eps * self.small.hidden / self.big.hidden

    def _head_rows(self, small_head: int, big_head: int) -> tuple[np.ndarray, np.ndarray]:
        e, E = self.small.head_dim, self.big.head_dim  # noqa: N806
        return big_head * E + self.head_dims, small_head * e + np.arange(e)

    def tensor(self, kind: str, shape: tuple[int, ...], w: np.ndarray | None) -> np.ndarray:
        """The big tensor of ``kind`` holding the small tensor ``w`` (``None``: all zero)."""
        out = np.zeros(shape, np.float32)
        if w is None:
            return out
        h = self.small.hidden
        if kind == "copy":
            out[...] = w
        elif kind == "rows":  # [V, h] -> [V, H]: embeddings and lm_heads
            out[:, :h] = w
        elif kind == "norm":
            out[:h] = w * np.float32(self.norm_scale)
        elif kind in ("q", "o"):
            for j in range(self.small.heads):
                big, small = self._head_rows(j, j)
                if kind == "q":
                    out[big, :h] = w[small] * np.float32(self.qk_scale)
                else:
                    out[:h, big] = w[:, small]
        elif kind in ("k", "v"):
            scale = np.float32(self.qk_scale if kind == "k" else 1.0)
            for g, g_small in self.kv_sources.items():
                big, small = self._head_rows(g_small, g)
                out[big, :h] = w[small] * scale
        elif kind in ("q_norm", "k_norm"):
            scale = np.float32(1.0 if kind == "q_norm" else self.k_norm_scale)
            out[self.head_dims] = w * scale
        elif kind == "mlp_in":
            out[: w.shape[0], :h] = w
        elif kind == "mlp_out":
            out[:h, : w.shape[1]] = w
        elif kind == "fc":  # [h, n*h] -> [H, n*H]
            H = self.big.hidden  # noqa: N806
            for j in range(w.shape[1] // h):
                out[:h, j * H : j * H + h] = w[:, j * h : (j + 1) * h]
        elif kind == "confidence":  # [1, h + r] -> [1, H + r]
            out[:, :h] = w[:, :h]
            out[:, self.big.hidden :] = w[:, h:]
        else:  # pragma: no cover - a fixed table
            raise AssertionError(f"unknown kind {kind}")
        return out


def _layer_specs(prefix: str, s: Shape) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, kind, shape) of one Qwen3 decoder layer's tensors."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    rows: list[tuple[str, str, tuple[int, ...]]] = [
        ("input_layernorm.weight", "norm", (s.hidden,)),
        ("self_attn.q_proj.weight", "q", (q, s.hidden)),
        ("self_attn.k_proj.weight", "k", (kv, s.hidden)),
        ("self_attn.v_proj.weight", "v", (kv, s.hidden)),
        ("self_attn.o_proj.weight", "o", (s.hidden, q)),
        ("self_attn.q_norm.weight", "q_norm", (s.head_dim,)),
        ("self_attn.k_norm.weight", "k_norm", (s.head_dim,)),
        ("post_attention_layernorm.weight", "norm", (s.hidden,)),
        ("mlp.gate_proj.weight", "mlp_in", (s.intermediate, s.hidden)),
        ("mlp.up_proj.weight", "mlp_in", (s.intermediate, s.hidden)),
        ("mlp.down_proj.weight", "mlp_out", (s.hidden, s.intermediate)),
    ]
    return [(prefix + name, kind, shape) for name, kind, shape in rows]


def _target_specs(s: Shape, vocab: int) -> list[tuple[str, str, tuple[int, ...]]]:
    specs: list[tuple[str, str, tuple[int, ...]]] = [
        ("model.embed_tokens.weight", "rows", (vocab, s.hidden))
    ]
    for i in range(s.layers):
        specs += _layer_specs(f"model.layers.{i}.", s)
    return [*specs, ("model.norm.weight", "norm", (s.hidden,))]


def _drafter_specs(
    s: Shape, layers: int, vocab: int, features: int, rank: int, confidence: bool
) -> list[tuple[str, str, tuple[int, ...]]]:
    specs: list[tuple[str, str, tuple[int, ...]]] = [
        ("embed_tokens.weight", "rows", (vocab, s.hidden)),
        ("fc.weight", "fc", (s.hidden, features * s.hidden)),
        ("hidden_norm.weight", "norm", (s.hidden,)),
    ]
    for i in range(layers):
        specs += _layer_specs(f"layers.{i}.", s)
    specs += [
        ("norm.weight", "norm", (s.hidden,)),
        ("lm_head.weight", "rows", (vocab, s.hidden)),
        ("markov_head.markov_w1.weight", "copy", (vocab, rank)),
        ("markov_head.markov_w2.weight", "copy", (vocab, rank)),
    ]
    if confidence:
        specs += [
            ("confidence_head.proj.weight", "confidence", (1, s.hidden + rank)),
            ("confidence_head.proj.bias", "copy", (1,)),
        ]
    return specs


def target_parameter_count(shape: Shape = TARGET_SHAPE, vocab: int = 3000) -> int:
    """Parameters of a tied-embedding Qwen3 target of ``shape`` (0.62 B for the default)."""
    return sum(math.prod(shape_) for _, _, shape_ in _target_specs(shape, vocab))


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The float32 tensors of a (small) safetensors file."""
    data = _files.read_bytes(path, _files.MAX_WEIGHTS_BYTES, "small pair's weights")
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise_error(InputError, "unsupported-dtype", f"{path}: {name} is {info['dtype']}")
        a, b = info["data_offsets"]
        buf = data[8 + n + a : 8 + n + b]
        out[name] = np.frombuffer(buf, "<f4").reshape(info["shape"]).astype(np.float32)
    return out


def _jittered(name: str, values: np.ndarray, jitter: float) -> np.ndarray:
    """``values`` with every exact zero replaced by ``±jitter·[0.5, 1)`` (fixed per name)."""
    zero = values == 0
    count = int(zero.sum())
    if count:
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        mag = np.float32(jitter) * (
            np.float32(0.5) + np.float32(0.5) * rng.random(count, np.float32)
        )
        sign = np.where(rng.random(count) < 0.5, np.float32(-1), np.float32(1))
        values[zero] = mag * sign
    return values


def _write_checkpoint(
    root: Path,
    specs: list[tuple[str, str, tuple[int, ...]]],
    source: Callable[[str], np.ndarray | None],
    emb: _Embedding,
    dtype: Dtype,
    jitter: float | None,
) -> list[Path]:
    kinds = {name: kind for name, kind, _ in specs}
    plan = plan_shards([TensorSpec(n, s) for n, _, s in specs], dtype, MAX_SHARD_BYTES)

    def values(spec: TensorSpec) -> np.ndarray:
        out = emb.tensor(kinds[spec.name], spec.shape, source(spec.name))
        return _jittered(spec.name, out, jitter) if jitter else out

    return write_shards(root, plan, values)


@dataclass(frozen=True)
class MemoryBoundPair:
    """What :func:`write_memory_bound` wrote."""

    root: Path
    target: Path
    drafter: Path
    target_parameters: int
    drafter_parameters: int
    dtype: str
    jitter: float | None


def bundled_tiny_dir() -> Path:
    """The bundled pair the memory-bound pair embeds (``dspark/models/tiny``)."""
    return Path(str(resources.files("dspark") / "models" / "tiny"))


def check_output_dir(root: Path) -> None:
    """Refuse, before any work, an output directory that exists and is not empty, or whose
    parent cannot hold it (``invalid-argument``)."""
    _files.check_output_dir(root, "output directory")


def write_memory_bound(
    root: str | os.PathLike[str],
    *,
    dtype: str = "float32",
    jitter: float | None = None,
    source: str | os.PathLike[str] | None = None,
    shape: Shape = TARGET_SHAPE,
    draft_layers: int = DRAFT_LAYERS,
) -> MemoryBoundPair:
    """Write ``root/target`` and ``root/drafter`` (see the module docstring).

    ``dtype``: ``"float32"`` (the bundled function to float32 rounding) or ``"bfloat16"`` (its
    weights rounded to bfloat16, as 0.6 B checkpoints ship; half the bytes per token).
    ``jitter``: replace every zero by a value of about this size (``(0, MAX_JITTER]``).
    ``source``: the small pair's directory (default: the bundled one); ``shape`` and
    ``draft_layers``: the big widths and depths (tests use smaller ones). Nothing is left behind
    on failure: both directories are written into a temporary directory next to ``root`` that
    is renamed to ``root`` at the end. Same arguments, same bytes.
    """
    from dspark._args import as_float

    if dtype not in DTYPES:
        raise_error(InputError, "unsupported-dtype", f"dtype: {dtype!r} is not one of {DTYPES}")
    if jitter is not None:
        jitter = as_float(jitter, "jitter")
        if not 0.0 < jitter <= MAX_JITTER:
            raise_error(
                InputError, "invalid-argument", f"jitter: {jitter} is not in (0, {MAX_JITTER}]"
            )
    out = Path(root)
    check_output_dir(out)
    small = Path(source) if source is not None else bundled_tiny_dir()
    for need in (
        "target/config.json",
        "target/model.safetensors",
        "target/tokenizer.json",
        "drafter/config.json",
        "drafter/model.safetensors",
    ):
        if not (small / need).is_file():
            raise_error(InputError, "missing-file", f"{small / need}: no such file")
    with _files.staged_dir(out, "output directory") as tmp:
        wdtype: Dtype = "bfloat16" if dtype == "bfloat16" else "float32"
        counts = _write_pair(small, tmp, wdtype, jitter, shape, draft_layers)
    return MemoryBoundPair(out, out / "target", out / "drafter", *counts, dtype, jitter)


def _write_pair(
    small: Path,
    root: Path,
    dtype: Dtype,
    jitter: float | None,
    big: Shape,
    draft_layers: int,
) -> tuple[int, int]:
    t_cfg = _files.read_json(small / "target" / "config.json", "target config")
    d_cfg = _files.read_json(small / "drafter" / "config.json", "drafter config")
    t_small = _read_safetensors(small / "target" / "model.safetensors")
    d_small = _read_safetensors(small / "drafter" / "model.safetensors")
    emb = _Embedding(Shape.of(t_cfg), big)
    if big.layers < emb.small.layers or draft_layers < int(d_cfg["num_hidden_layers"]):
        raise_error(InputError, "invalid-argument", "the big pair must be at least as deep")
    eps = emb.eps(float(t_cfg["rms_norm_eps"]))
    rope = dict(t_cfg.get("rope_parameters") or {"rope_theta": t_cfg["rope_theta"]})
    widths = {
        "hidden_size": big.hidden,
        "num_attention_heads": big.heads,
        "num_key_value_heads": big.kv_heads,
        "head_dim": big.head_dim,
        "intermediate_size": big.intermediate,
        "rms_norm_eps": eps,
        "rope_theta": rope["rope_theta"],
        "rope_parameters": rope,
        "dtype": dtype,
    }
    target_cfg = {
        **t_cfg,
        **widths,
        "num_hidden_layers": big.layers,
        "layer_types": ["full_attention"] * big.layers,
        "max_window_layers": big.layers,
    }
    if not t_cfg.get("tie_word_embeddings"):
        raise_error(InputError, "bad-config", "the small target must tie its embeddings")
    drafter_cfg = {
        **d_cfg,
        **widths,
        "num_hidden_layers": draft_layers,
        "layer_types": ["full_attention"] * draft_layers,
        "num_target_layers": big.layers,
        "max_window_layers": big.layers,
    }
    t_dir, d_dir = root / "target", root / "drafter"
    t_dir.mkdir()
    d_dir.mkdir()
    t_specs = _target_specs(big, int(t_cfg["vocab_size"]))
    d_specs = _drafter_specs(
        big,
        draft_layers,
        int(d_cfg["vocab_size"]),
        len(d_cfg["target_layer_ids"]),
        int(d_cfg["markov_rank"]),
        "confidence_head.proj.weight" in d_small,
    )
    _write_checkpoint(t_dir, t_specs, t_small.get, emb, dtype, jitter)
    _write_checkpoint(d_dir, d_specs, d_small.get, emb, dtype, jitter)
    _write_json(t_dir / "config.json", target_cfg)
    _write_json(d_dir / "config.json", drafter_cfg)
    for name in ("generation_config.json", "tokenizer.json"):
        shutil.copyfile(small / "target" / name, t_dir / name)
    if (small / "drafter" / "sts.json").is_file():
        shutil.copyfile(small / "drafter" / "sts.json", d_dir / "sts.json")
    write_converter_tokenizer(small / "target", t_dir)
    _write_readme(root, big, t_cfg, dtype, jitter)
    return (
        sum(math.prod(s) for _, _, s in t_specs),
        sum(math.prod(s) for _, _, s in d_specs),
    )


def write_converter_tokenizer(target: Path, out: Path) -> None:
    """Write ``out/tokenizer.model`` (the vocabulary of ``target/tokenizer.json`` in
    SentencePiece form, see :mod:`dspark._spm`: what llama.cpp's converter reads for Qwen3)
    and ``out/tokenizer_config.json`` (``tokenizer.json`` as it is, no BOS or EOS added)."""
    tokenizer = _files.read_json(target / "tokenizer.json", "tokenizer", _files.MAX_TOKENIZER_BYTES)
    config = _files.read_json(target / "config.json", "target config")
    (out / "tokenizer.model").write_bytes(sentencepiece_model(tokenizer))
    _write_json(out / "tokenizer_config.json", _tokenizer_config(tokenizer, config))


def _tokenizer_config(tokenizer: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """``tokenizer_config.json``: load ``tokenizer.json`` as it is, add no BOS or EOS; the
    project's chat template."""
    added = {
        str(t["id"]): {k: v for k, v in t.items() if k != "id"}
        for t in tokenizer.get("added_tokens") or []
    }
    eos = added.get(str(config.get("eos_token_id")), {}).get("content")
    doc = tokenizer_config(eos, int(config.get("max_position_embeddings", 4096)))
    return {**doc, "added_tokens_decoder": added}


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2) + "\n")


def _write_readme(
    root: Path, big: Shape, t_cfg: dict[str, Any], dtype: str, jitter: float | None
) -> None:
    n = target_parameter_count(big, int(t_cfg["vocab_size"]))
    zeros = f"zeros replaced by values of about {jitter:g}" if jitter else "exact zeros"
    (root / "README.md").write_text(
        "# dspark memory-bound example pair\n\n"
        f"Written by `dspark make-example --memory-bound` ({dtype}, {zeros}).\n\n"
        f"`target/` is a Qwen3ForCausalLM of {n / 1e9:.2f} B parameters and `drafter/` its DSpark\n"
        "drafter; together they compute the bundled tiny pair's function (its weights embedded,\n"
        "the rest zero), so decoding costs what a 0.6 B model costs while the tokens are the\n"
        "bundled pair's. `target/tokenizer.model` is the same vocabulary in SentencePiece form,\n"
        "for converters that need one (its text splitting differs; feed token ids).\n"
    )


# -- command line (``dspark make-example DIR --memory-bound``) ------------------------------


def jitter_arg(text: str) -> float:
    """argparse type of ``--jitter``: a number in ``(0, MAX_JITTER]``."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value <= MAX_JITTER:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be in (0, {MAX_JITTER:g}], got {text}")
    return value


def describe(pair: MemoryBoundPair) -> str:
    """The one-paragraph summary ``dspark make-example --memory-bound`` prints."""
    zeros = f", zeros jittered by {pair.jitter:g}" if pair.jitter else ""
    return (
        f"wrote {pair.target} (Qwen3, {pair.target_parameters / 1e9:.2f} B parameters, "
        f"{pair.dtype}{zeros}) and {pair.drafter} (DSpark drafter, "
        f"{pair.drafter_parameters / 1e6:.0f} M parameters): the bundled pair's function at a "
        f"0.6 B model's cost; try: dspark generate --target {pair.target} --drafter "
        f"{pair.drafter} --prompt 'def f(x):'"
    )
