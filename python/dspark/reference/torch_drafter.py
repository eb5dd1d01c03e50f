"""``dspark.TorchDrafter``: the Qwen3 DSpark drafter in plain torch (reference backend).

Same checkpoints, same contract (:class:`dspark.protocols.DrafterProtocol`) as the candle
``dspark.Drafter``; written for clarity, used by the tests as the reference forward and usable
as a drafter in its own right. Checkpoint rules (vocab layout, sharing, id map, target fit) come
from the engine (``dspark.DraftSpec``, ``dspark.inspect``, ``dspark.IdMap``), not re-derived here.

Forward (DeepSpec ``Qwen3DSparkModel``): ``ctx = hidden_norm(fc(features))``; each layer runs
the block ``[anchor, M, ..., M]`` (pre-norm) with queries over ``[k_proj(ctx); k_proj(block)]``
(k_norm and RoPE on both, non-causal; the context skips ``input_layernorm``), SwiGLU; final
norm; ``lm_head``. Slot k: ``logits = scale * (base_k + W2 W1[x_{k-1}])``, padded rows ``-inf``,
greedy or sampled (Gumbel-max on counter-based uniforms), id map to target ids; confidence
``sigmoid(w . [h_k ; W1[x_{k-1}]] + b)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar

import numpy as np
import torch

from dspark._args import LIMITS, as_float, as_int, as_path, as_seed, is_torch, torch_view
from dspark._errors import raise_error
from dspark._native import DSparkError, InputError
from dspark.protocols import DraftProposal
from dspark.reference.torch_loading import DrafterWeights, load_weights
from dspark.reference.torch_ops import attend, counter_uniforms, mlp, rms_norm

# Temperatures below this draft greedily (the engine's `GREEDY_BELOW`, as vLLM's).
GREEDY_BELOW = 1e-5

if TYPE_CHECKING:
    from dspark._typing import PerRequestInt, TensorLike
    from dspark.protocols import DrafterProtocol, DraftStateProtocol

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _placed(
    fn: Callable[Concatenate[TorchDrafter, _P], _R],
) -> Callable[Concatenate[TorchDrafter, _P], _R]:
    """Run ``fn`` with torch's default device set to the drafter's (its factory calls, such as
    ``torch.arange`` for positions, then make their tensors beside the weights)."""

    @functools.wraps(fn)
    def run(self: TorchDrafter, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._placement():
            return fn(self, *args, **kwargs)

    return run


__all__ = ["DTYPES", "TorchDraftState", "TorchDrafter"]

#: The weight dtypes the torch drafter runs in (the Markov head, the sampling and the
#: confidence head always compute in float32).
DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)


def _as_tensor(value: object, name: str) -> torch.Tensor:
    """``torch.as_tensor`` with typed errors (meta/sparse/nested refused, neg/conj resolved)."""
    try:
        if is_torch(value):
            return torch_view(value, name)
        return torch.as_tensor(value)
    except DSparkError:
        raise
    except Exception as e:
        raise_error(InputError, "invalid-argument", f"{name}: {type(e).__name__}: {e}")


def _per_request_values(value: object, b: int, name: str) -> list[object]:
    """``b`` values from one value or one per request (a list, tuple, tensor or array; an
    integer dtype for tensors and arrays, else ``unsupported-dtype``), each still unread."""
    if is_torch(value) or isinstance(value, np.ndarray):
        t = _as_tensor(value, name)
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise_error(
                InputError, "unsupported-dtype", f"{name}: expected integers, got {t.dtype}"
            )
        values: list[object] = list(t.reshape(-1).tolist())
    elif isinstance(value, (list, tuple)):
        values = list(value)
    else:
        values = [value]
    if len(values) == 1:
        values = values * b
    if len(values) != b:
        raise_error(
            InputError, "bad-shape", f"{name}: expected one value or {b}, got {len(values)}"
        )
    return values


def _per_request(
    value: PerRequestInt | TensorLike, b: int, name: str, *, hi: int | None = None
) -> torch.Tensor:
    """One non-negative int per request (:func:`_per_request_values`, each read by
    :func:`dspark._args.as_int` up to ``hi``) as an int64 tensor ``[b]``."""
    ints = [as_int(v, name, hi=hi) for v in _per_request_values(value, b, name)]
    return torch.tensor(ints, dtype=torch.int64)


def _per_request_ids(value: TensorLike, b: int, name: str, vocab: int) -> torch.Tensor:
    """One id per request in ``[0, vocab)`` (``token-out-of-range``) as an int64 tensor."""
    ids = [as_int(v, name, lo=None) for v in _per_request_values(value, b, name)]
    for i in ids:
        if not 0 <= i < vocab:
            raise_error(InputError, "token-out-of-range", f"{name}: id {i} is outside [0, {vocab})")
    return torch.tensor(ids, dtype=torch.int64)


def _per_request_seeds(value: PerRequestInt, b: int) -> torch.Tensor:
    """One seed per request (:func:`dspark._args.as_seed`: ``[0, 2**64)``) as the int64 tensor
    of the same 64 bits (the counter-based draws work on the bit pattern)."""
    seeds = [as_seed(v) for v in _per_request_values(value, b, "seed")]
    return torch.tensor([s - 2**64 if s >= 2**63 else s for s in seeds], dtype=torch.int64)


class TorchDraftState:
    """Per-request context KV cache of a :class:`TorchDrafter` (post k_norm, post RoPE).

    ``extend`` only queues features; the drafter turns the queued features of every state into
    keys and values in one batched pass when it next proposes (or on :meth:`context_kv`).
    """

    def __init__(self, drafter: TorchDrafter) -> None:
        """An empty context for ``drafter``."""
        self._drafter = drafter
        w = drafter.weights
        empty = torch.zeros(0, w.num_kv_heads, w.head_dim, dtype=w.dtype, device=w.fc.device)
        self._k: list[torch.Tensor] = [empty for _ in w.layers]
        self._v: list[torch.Tensor] = [empty for _ in w.layers]
        self._pending: list[torch.Tensor] = []

    @property
    def _computed(self) -> int:
        return int(self._k[0].shape[0]) if self._k else 0

    @property
    def length(self) -> int:
        """Number of context positions held; the anchor sits at this position."""
        return self._computed + sum(int(p.shape[0]) for p in self._pending)

    def extend(self, features: TensorLike, start_position: int) -> None:
        """Add features ``[T, L*H_t]`` of positions ``start_position..``; held ones are skipped."""
        feats = self._drafter._features(features, 2, "features")
        start_position = as_int(start_position, "start_position", hi=LIMITS["MAX_POSITION"])
        if not 0 <= start_position <= self.length:
            raise_error(
                InputError,
                "invalid-argument",
                f"start_position {start_position}: the context holds {self.length} positions "
                "(no gaps allowed)",
            )
        new = feats[self.length - start_position :]
        if new.shape[0] > 0:
            self._pending.append(new)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions."""
        n = as_int(length, "length")
        if not 0 <= n <= self.length:
            raise_error(
                InputError, "invalid-argument", f"truncate({length}): holds {self.length} positions"
            )
        if n >= self._computed:
            queued = torch.cat(self._pending)[: n - self._computed] if self._pending else None
            self._pending = [queued] if queued is not None and queued.shape[0] else []
            return
        self._k = [k[:n] for k in self._k]
        self._v = [v[:n] for v in self._v]
        self._pending = []

    def context_kv(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer context keys and values ``[length, KVH, D]`` (computes queued features)."""
        with self._drafter._placement():
            self._drafter._flush([self])
        return list(self._k), list(self._v)


class TorchDrafter:
    """Qwen3 DSpark drafter in plain torch; see the module docstring."""

    def __init__(self, weights: DrafterWeights) -> None:
        """Wrap loaded weights (use :meth:`from_pretrained`)."""
        self.weights = weights

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        target: object = None,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> TorchDrafter:
        """Load a DeepSpec-format checkpoint directory.

        ``target``: an HF causal LM, a :class:`dspark.target.HFTarget`, a dict ``{"config":
        dict, "embed_tokens": tensor, "lm_head": tensor}``, or ``None`` when the drafter owns
        both. Shared embed / lm_head are taken from it when the engine's plan says so; a shared
        weight that is not available is a typed error, never random.
        """
        root = as_path(path, "path")
        if not isinstance(dtype, torch.dtype):
            raise_error(
                InputError,
                "invalid-argument",
                f"dtype: expected a torch.dtype such as torch.bfloat16, got {type(dtype).__name__}",
            )
        if dtype not in DTYPES:
            raise_error(
                InputError,
                "unsupported-dtype",
                f"dtype: {dtype} is not one of {', '.join(str(d) for d in DTYPES)}",
            )
        return cls(load_weights(root, target, dtype=dtype))

    @property
    def device(self) -> torch.device:
        """Where the weights are, and so where the forward runs (:meth:`to` moves them)."""
        return self.weights.fc.device

    def to(self, device: str | torch.device) -> TorchDrafter:
        """Move every weight to ``device`` (in place) and return ``self``: the forward and the
        sampling then run there, and inputs given elsewhere are moved there."""
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise_error(InputError, "invalid-argument", f"device: {e}")
        w = self.weights
        try:  # every copy made before any is kept: a failed move leaves the drafter as it was
            moved = {
                f.name: value.to(dev)
                for f in dataclasses.fields(w)
                if isinstance(value := getattr(w, f.name), torch.Tensor)
            }
            layers = [{k: x.to(dev) for k, x in layer.items()} for layer in w.layers]
        except (RuntimeError, AssertionError) as e:  # no such device, or no driver for it
            raise_error(InputError, "device-unavailable", f"device {dev}: {e}")
        for name, value in moved.items():
            setattr(w, name, value)
        w.layers = layers
        return self

    def _placement(self) -> contextlib.AbstractContextManager[object]:
        """torch's default device set to :attr:`device` (nothing to do on the CPU)."""
        dev = self.device
        return contextlib.nullcontext() if dev.type == "cpu" else dev

    # ---- the contract -------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        """Draft tokens per proposal (K)."""
        return self.weights.block_size

    @property
    def noise_token_id(self) -> int:
        """The mask/noise token id."""
        return self.weights.noise_token_id

    @property
    def vocab_size(self) -> int:
        """``V_in``."""
        return self.weights.vocab_size

    @property
    def draft_vocab_size(self) -> int:
        """``V_d``."""
        return self.weights.draft_vocab_size

    @property
    def target_vocab_size(self) -> int:
        """``V_t``."""
        return self.weights.target_vocab_size

    @property
    def draft_id_to_target_id(self) -> torch.Tensor | None:
        """``None`` (identity) or the int64 ``d2t`` offsets ``[V_d]``."""
        d2t = self.weights.d2t
        return None if d2t is None else d2t.clone()

    @property
    def has_own_embed_tokens(self) -> bool:
        """Whether the embedding comes from the checkpoint."""
        return self.weights.own_embed

    @property
    def has_own_lm_head(self) -> bool:
        """Whether the lm_head comes from the checkpoint."""
        return self.weights.own_lm_head

    @property
    def target_layer_ids(self) -> list[int]:
        """DeepSpec layer ids."""
        return list(self.weights.target_layer_ids)

    @property
    def capture_layer_ids(self) -> list[int]:
        """HF ``hidden_states`` indices of the same layers."""
        return list(self.weights.capture_layer_ids)

    @property
    def sample_from_anchor(self) -> bool:
        """DeepSpec layout (slot k predicts ``n+k+1``) when true, else the 1+K layout."""
        return self.weights.sample_from_anchor

    @property
    def has_confidence_head(self) -> bool:
        """Whether proposals carry confidences."""
        return self.weights.conf_w is not None

    @property
    def target_hidden_size(self) -> int:
        """Width of one target feature (the context is ``L * target_hidden_size`` wide)."""
        return self.weights.target_hidden_size

    def new_state(self) -> TorchDraftState:
        """An empty per-request context."""
        return TorchDraftState(self)

    @torch.inference_mode()
    @_placed
    def propose(
        self,
        context_hidden_states: TensorLike,
        anchors: TensorLike,
        *,
        start_positions: PerRequestInt = 0,
        temperature: float = 0.0,
        seed: PerRequestInt = 0,
    ) -> DraftProposal:
        """Stateless proposal; see :meth:`dspark.protocols.DrafterProtocol.propose`."""
        hidden, base = self.forward_block(context_hidden_states, anchors, start_positions)
        a = self._anchors(anchors, hidden.shape[0])
        return self._sample(hidden, base, a, temperature, _per_request_seeds(seed, a.numel()))

    @torch.inference_mode()
    @_placed
    def propose_states(
        self,
        states: Sequence[TorchDraftState],
        anchors: TensorLike,
        *,
        temperature: float = 0.0,
        seed: PerRequestInt = 0,
    ) -> DraftProposal:
        """One block pass per state; anchor ``i`` sits at ``states[i].length``."""
        b = len(states)
        if b == 0 or not all(isinstance(s, TorchDraftState) for s in states):
            raise_error(InputError, "invalid-argument", "states: TorchDraftState objects needed")
        a = self._anchors(anchors, b)
        self._flush(states)
        lens = torch.tensor([s.length for s in states])
        t = int(lens.max())
        mask = torch.arange(t)[None, :] < lens[:, None]
        ks, vs = [], []
        w = self.weights
        for layer in range(len(w.layers)):
            k = torch.zeros(b, t, w.num_kv_heads, w.head_dim, dtype=w.dtype)
            v = torch.zeros_like(k)
            for i, s in enumerate(states):
                k[i, : s.length] = s._k[layer]
                v[i, : s.length] = s._v[layer]
            ks.append(k)
            vs.append(v)
        hidden = self._block(ks, vs, mask, a, lens)
        base = hidden @ self.weights.lm_head.T
        return self._sample(hidden, base, a, temperature, _per_request_seeds(seed, b))

    # ---- forward ------------------------------------------------------------------------
    @torch.inference_mode()
    @_placed
    def forward_block(
        self, context: TensorLike, anchors: TensorLike, start: PerRequestInt = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Backbone only: ``(hidden [B,K,H] post-final-norm, base_logits [B,K,V_d])``.

        ``context [B,T,L*H_t]`` covers positions ``start..start+T-1``; anchor ``i`` sits at
        ``start[i]+T``. Base logits are ``lm_head(hidden)``, before the Markov bias and before
        ``logit_scale``.
        """
        ctx = self._features(context, 3, "context_hidden_states")
        b, t = ctx.shape[:2]
        a = self._anchors(anchors, b)
        starts = _per_request(start, b, "start_positions", hi=LIMITS["MAX_POSITION"])
        pos = starts[:, None] + torch.arange(t)[None, :]
        ks, vs = self._context_kv(ctx, pos)
        hidden = self._block(ks, vs, None, a, starts + t)
        return hidden, hidden @ self.weights.lm_head.T

    def _anchors(self, anchors: TensorLike, b: int) -> torch.Tensor:
        return _per_request_ids(anchors, b, "anchors", self.weights.target_vocab_size)

    def _flush(self, states: Sequence[TorchDraftState]) -> None:
        """Compute the queued context features of ``states`` in one batched pass."""
        todo = [s for s in states if s._pending]
        if not todo:
            return
        feats = [torch.cat(s._pending) for s in todo]
        t = max(int(f.shape[0]) for f in feats)
        batch = torch.zeros(len(todo), t, feats[0].shape[1], dtype=self.weights.dtype)
        for i, f in enumerate(feats):
            batch[i, : f.shape[0]] = f
        starts = torch.tensor([s._computed for s in todo])
        ks, vs = self._context_kv(batch, starts[:, None] + torch.arange(t)[None, :])
        for i, (s, f) in enumerate(zip(todo, feats, strict=True)):
            n = int(f.shape[0])
            s._k = [torch.cat([old, k[i, :n]]) for old, k in zip(s._k, ks, strict=True)]
            s._v = [torch.cat([old, v[i, :n]]) for old, v in zip(s._v, vs, strict=True)]
            s._pending = []

    def _features(self, x: TensorLike, ndim: int, name: str) -> torch.Tensor:
        t = _as_tensor(x, name)
        if not (t.is_floating_point() or t.dtype in (torch.int32, torch.int64)):
            raise_error(InputError, "unsupported-dtype", f"{name}: {t.dtype} is not supported")
        t = t.to(device=self.device, dtype=self.weights.dtype)
        width = len(self.weights.target_layer_ids) * self.weights.target_hidden_size
        if t.ndim != ndim or t.shape[-1] != width:
            raise_error(
                InputError,
                "bad-shape",
                f"{name}: expected {ndim} dims with last dim {width} "
                f"({len(self.weights.target_layer_ids)} layers x {self.weights.target_hidden_size})"
                f", got {tuple(t.shape)}",
            )
        return t

    def _context_kv(
        self, feats: torch.Tensor, pos: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer context keys (k_norm + RoPE) and values of ``feats [B,T,L*H_t]``."""
        w = self.weights
        ctx = rms_norm(feats @ w.fc.T, w.hidden_norm, w.eps)
        b, t = ctx.shape[:2]
        ks, vs = [], []
        for lw in w.layers:
            k = (ctx @ lw["k_proj"].T).view(b, t, w.num_kv_heads, w.head_dim)
            k = w.rope.apply(rms_norm(k, lw["k_norm"], w.eps), pos)
            ks.append(k)
            vs.append((ctx @ lw["v_proj"].T).view(b, t, w.num_kv_heads, w.head_dim))
        return ks, vs

    def _block(
        self,
        ks: list[torch.Tensor],
        vs: list[torch.Tensor],
        ctx_mask: torch.Tensor | None,
        anchors: torch.Tensor,
        anchor_pos: torch.Tensor,
    ) -> torch.Tensor:
        """Run the block at ``anchor_pos..``; returns the K prediction slots' hidden states."""
        w = self.weights
        v_t = w.target_vocab_size
        if bool(((anchors < 0) | (anchors >= v_t)).any()):
            raise_error(InputError, "token-out-of-range", f"anchors: ids must be in [0, {v_t})")
        k_out = w.block_size
        q_len = k_out if w.sample_from_anchor else k_out + 1
        b = anchors.numel()
        ids = torch.full((b, q_len), w.noise_token_id, dtype=torch.int64)
        ids[:, 0] = anchors
        h = w.embed[ids]
        pos = anchor_pos[:, None] + torch.arange(q_len)[None, :]
        mask = None
        if ctx_mask is not None:
            mask = torch.cat([ctx_mask, torch.ones(b, q_len, dtype=torch.bool)], dim=1)
        for lw, k_ctx, v_ctx in zip(w.layers, ks, vs, strict=True):
            x = rms_norm(h, lw["input_layernorm"], w.eps)
            q = (x @ lw["q_proj"].T).view(b, q_len, w.num_heads, w.head_dim)
            q = w.rope.apply(rms_norm(q, lw["q_norm"], w.eps), pos)
            k = (x @ lw["k_proj"].T).view(b, q_len, w.num_kv_heads, w.head_dim)
            k = w.rope.apply(rms_norm(k, lw["k_norm"], w.eps), pos)
            v = (x @ lw["v_proj"].T).view(b, q_len, w.num_kv_heads, w.head_dim)
            att = attend(q, torch.cat([k_ctx, k], 1), torch.cat([v_ctx, v], 1), mask)
            h = h + att @ lw["o_proj"].T
            x = rms_norm(h, lw["post_attention_layernorm"], w.eps)
            h = h + mlp(x, lw["gate_proj"], lw["up_proj"], lw["down_proj"])
        h = rms_norm(h, w.norm, w.eps)
        return h if w.sample_from_anchor else h[:, 1:]

    # ---- Markov head, sampling, id map, confidence ---------------------------------------
    def _sample(
        self,
        hidden: torch.Tensor,
        base: torch.Tensor,
        anchors: torch.Tensor,
        temperature: float,
        seeds: torch.Tensor,
    ) -> DraftProposal:
        w = self.weights
        temperature = as_float(temperature, "temperature")
        if not temperature >= 0.0:
            raise_error(InputError, "invalid-argument", f"temperature {temperature}: must be >= 0")
        b, k_out, v_d = base.shape
        v_t = w.target_vocab_size
        to_target = w.draft_to_target  # [V_d] target id of each draft id, -1 when masked
        tokens = torch.empty(b, k_out, dtype=torch.int64)
        q = torch.full((b, k_out, v_t), float("-inf"))
        conf = torch.empty(b, k_out) if w.conf_w is not None else None
        rows = torch.arange(b)
        prev = anchors
        for k in range(k_out):
            e = w.markov_w1[prev] if w.markov_w1 is not None else None
            logits = base[:, k].to(torch.float32)
            if e is not None and w.markov_w2 is not None:
                logits = logits + e @ w.markov_w2.T
            logits = (w.logit_scale * logits).masked_fill(to_target[None, :] < 0, float("-inf"))
            if temperature < GREEDY_BELOW:
                d = logits.argmax(dim=-1)
                x = to_target[d]
                q[rows, k, x] = 0.0
            else:
                scaled = logits / temperature
                gumbel = -torch.log(-torch.log(counter_uniforms(seeds, k, v_d)))
                d = (scaled.to(torch.float64) + gumbel).argmax(dim=-1)
                x = to_target[d]
                live = to_target >= 0
                q[:, k, to_target[live]] = scaled[:, live]
            if conf is not None and w.conf_w is not None:
                feat = (
                    hidden[:, k]
                    if e is None or not w.conf_with_markov
                    else torch.cat([hidden[:, k], e], dim=-1)
                )
                conf[:, k] = torch.sigmoid(feat.to(torch.float32) @ w.conf_w + w.conf_b)
            tokens[:, k] = x
            prev = x
        return DraftProposal(tokens=tokens, draft_logits=q, confidence=conf)


if TYPE_CHECKING:
    # The contracts, checked by the type checker: every drafter class implements them.
    def _is_a_drafter(drafter: TorchDrafter) -> DrafterProtocol[TorchDraftState]:
        return drafter

    def _is_a_state(state: TorchDraftState) -> DraftStateProtocol:
        return state
