"""HF transformers causal LMs as speculator targets (:class:`HFTarget`).

One batched ``DynamicCache`` holds every request. Requests advance by different numbers of
tokens per round, so each row keeps a validity mask over the cache columns: a column a row did
not fill (padding) or rolled back (a rejected draft) becomes a *hole* that the 2D attention mask
hides, and the row's positions continue from its own committed length. Trailing columns that no
row uses any more are dropped with ``DynamicCache.crop``; when holes make up a quarter of the
columns, :meth:`HFTarget.compact` gathers every row's committed columns to the right end of a
narrower cache (keys keep the RoPE of their own positions, so moving a column changes nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from dspark._args import LIMITS, as_int
from dspark._errors import raise_error
from dspark._hf_cache import cache_kwarg
from dspark._native import CheckpointError, InputError
from dspark.protocols import TargetModel, TargetOutput

if TYPE_CHECKING:
    from transformers import DynamicCache


__all__ = ["HFTarget", "as_target"]


class HFCache:
    """Batched KV cache with per-row holes.

    Attributes:
        kv: the HF ``DynamicCache`` (columns shared by all rows).
        valid: ``[B, C]`` bool: column ``c`` of row ``b`` holds a committed token.
        token_pos: ``[B, C]`` int64 position of the token in each column (``-1`` for holes).
        lengths: ``[B]`` int64 number of tokens each row holds (its next position).

    While every row holds exactly the columns ``0..C-1`` (one request, or equal-length rows that
    advanced together) the cache is *dense*: ``valid`` and ``token_pos`` are implied (all true,
    ``0..C-1``) and only built when read or when the rows part ways, so the common single-request
    round does no mask bookkeeping at all.
    """

    def __init__(self, kv: DynamicCache, batch: int, device: torch.device) -> None:
        self.kv = kv
        self.batch = batch
        self.device = device
        self.width = 0  # columns C
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self._valid: torch.Tensor | None = None  # None while dense
        self._token_pos: torch.Tensor | None = None

    @property
    def dense(self) -> bool:
        """Every row holds exactly columns ``0..C-1``."""
        return self._valid is None

    @property
    def valid(self) -> torch.Tensor:
        if self._valid is None:
            return torch.ones(self.batch, self.width, dtype=torch.bool, device=self.device)
        return self._valid

    @valid.setter
    def valid(self, value: torch.Tensor) -> None:
        self._leave_dense()
        self._valid = value
        self.width = int(value.shape[1])

    @property
    def token_pos(self) -> torch.Tensor:
        if self._token_pos is None:
            cols = torch.arange(self.width, device=self.device)
            return cols[None, :].expand(self.batch, -1).clone()
        return self._token_pos

    @token_pos.setter
    def token_pos(self, value: torch.Tensor) -> None:
        self._leave_dense()
        self._token_pos = value

    def _leave_dense(self) -> None:
        """Store both views explicitly (the dense ones) before one of them is replaced."""
        if self._valid is None:
            self._valid, self._token_pos = self.valid, self.token_pos


def _text_config(config: Any) -> Any:
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else getattr(config, "text_config", config)


def _size(value: object, key: str, limit: str) -> int:
    """A size of the target's config: an int in ``[1, LIMITS[limit]]`` (typed errors naming
    ``target.config.<key>``)."""
    return as_int(value, f"target.config.{key}", lo=1, hi=LIMITS[limit])


class HFTarget:
    """A transformers ``*ForCausalLM`` implementing :class:`dspark.protocols.TargetModel`."""

    def __init__(self, model: Any) -> None:
        """Wrap ``model`` (eval mode); its config must give layers, hidden and vocab sizes."""
        config = getattr(model, "config", None)
        if config is None or not callable(model):
            raise_error(InputError, "invalid-argument", "target: expected an HF causal LM")
        text = _text_config(config)
        missing = [
            k for k in ("num_hidden_layers", "hidden_size", "vocab_size") if not hasattr(text, k)
        ]
        if missing:
            raise_error(
                CheckpointError,
                "target-mismatch",
                f"target config lacks {' / '.join(missing)}",
            )
        self._layers = _size(text.num_hidden_layers, "num_hidden_layers", "MAX_LAYERS")
        self._hidden = _size(text.hidden_size, "hidden_size", "MAX_HIDDEN")
        self._vocab = _size(text.vocab_size, "vocab_size", "MAX_VOCAB")
        self.model = model.eval()
        self._cache_kwarg = cache_kwarg(model)

    @property
    def num_hidden_layers(self) -> int:
        """Number of decoder layers."""
        return self._layers

    @property
    def hidden_size(self) -> int:
        """Hidden width."""
        return self._hidden

    @property
    def vocab_size(self) -> int:
        """Logical vocabulary (config ``vocab_size``)."""
        return self._vocab

    @property
    def device(self) -> str:
        """Where the model runs (``"cpu"``, ``"cuda:0"``...): its logits and hidden states stay
        there, and the engine reads them in place when this build has CUDA."""
        return str(self._device())

    @property
    def forward_cost(self) -> dict[str, object]:
        """What one forward costs by shape (see :class:`dspark.protocols.TargetModel`): the
        bytes of every parameter a forward reads (the input embedding is looked up, not read,
        unless the output head shares it), two operations per weight and token, and the
        dtype that holds most of the bytes."""
        embed = self.model.get_input_embeddings()
        head = self.model.get_output_embeddings()
        skip = set()
        if embed is not None and (head is None or head.weight is not embed.weight):
            skip.add(id(embed.weight))
        total = 0
        weights = 0
        by_dtype: dict[str, int] = {}
        for p in self.model.parameters():
            if id(p) in skip:
                continue
            size = p.numel() * p.element_size()
            total += size
            if p.dim() >= 2:
                weights += p.numel()
            name = str(p.dtype).removeprefix("torch.")
            by_dtype[name] = by_dtype.get(name, 0) + size
        dtype = max(by_dtype, key=lambda k: by_dtype[k]) if by_dtype else "float32"
        if dtype not in ("float32", "bfloat16", "float16"):
            dtype = "float32"
        return {
            "weight_bytes": float(max(total, 1)),
            "flops_per_token": float(2 * max(weights, 1)),
            "dtype": dtype,
        }

    def config_dict(self) -> dict[str, Any]:
        """The (text) config as a plain dict, for ``dspark.inspect``-style checks."""
        return dict(_text_config(self.model.config).to_dict())

    def _device(self) -> torch.device:
        device: torch.device = next(self.model.parameters()).device
        return device

    def new_cache(self, batch_size: int) -> HFCache:
        """An empty cache for ``batch_size`` requests."""
        from transformers import DynamicCache

        try:
            kv = DynamicCache(config=self.model.config)
        except TypeError:
            kv = DynamicCache()
        batch = as_int(batch_size, "batch_size", hi=LIMITS["MAX_BATCH"])
        return HFCache(kv, batch, self._device())

    @torch.inference_mode()
    def forward(
        self,
        cache: HFCache,
        input_ids: torch.Tensor | npt.NDArray[np.int64],
        num_tokens: Sequence[int],
        capture_layer_ids: Sequence[int],
    ) -> TargetOutput:
        """Append ``input_ids[i, :num_tokens[i]]`` to row ``i``; see :class:`TargetModel`."""
        dev = self._device()
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=dev)
        b, s = ids.shape
        counts = [as_int(x, "num_tokens") for x in num_tokens]
        if b != cache.batch or len(counts) != b:
            raise_error(InputError, "bad-shape", f"input_ids: batch {b} does not match the cache")
        if any(c < 0 or c > s for c in counts):
            raise_error(InputError, "invalid-argument", f"num_tokens: each must be in [0, {s}]")
        if cache.dense and all(c == s for c in counts):
            # Every row holds columns 0..C-1 and appends all s tokens: the model's own positions
            # (C..C+s-1) and causal mask are exact, and the cache stays dense.
            out = self._run(ids, None, None, cache)
            cache.width += s
            cache.lengths = cache.lengths + s
            return self._output(out, capture_layer_ids)
        n = torch.as_tensor(counts, dtype=torch.long, device=dev)
        offs = torch.arange(s, device=dev)
        new_valid = offs[None, :] < n[:, None]
        positions = cache.lengths[:, None] + offs[None, :]
        valid = torch.cat([cache.valid, new_valid], dim=1)
        # A row with no committed token yet attends to its first (padding) column rather than
        # to nothing, so padded queries never produce NaN; real tokens never see it.
        if bool(valid.all()):
            # No holes anywhere: the model's own causal mask is exact, and its fast path
            # (no 4D mask materialized per layer) is what target-only decoding uses too.
            mask = None
        else:
            mask = valid.clone()
            empty = ~mask.any(dim=1)
            if bool(empty.any()):
                mask[empty, cache.valid.shape[1]] = True
            mask = mask.long()
        out = self._run(ids, mask, positions, cache)
        cache.valid = valid
        cache.token_pos = torch.cat(
            [cache.token_pos, torch.where(new_valid, positions, torch.full_like(positions, -1))],
            dim=1,
        )
        cache.lengths = cache.lengths + n
        return self._output(out, capture_layer_ids)

    def _run(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor | None,
        positions: torch.Tensor | None,
        cache: HFCache,
    ) -> Any:
        """The HF model's forward (its output: a ``CausalLMOutputWithPast``)."""
        return self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            output_hidden_states=True,
            **{self._cache_kwarg: cache.kv},
        )

    def _output(self, out: Any, capture_layer_ids: Sequence[int]) -> TargetOutput:
        hidden = getattr(out, "hidden_states", None)
        if hidden is None:
            raise_error(
                InputError,
                "invalid-argument",
                "target returned no hidden states (output_hidden_states=True is ignored)",
            )
        if max(capture_layer_ids, default=0) >= len(hidden):
            raise_error(
                CheckpointError,
                "target-mismatch",
                f"capture layer {max(capture_layer_ids)} requested but the target returned "
                f"{len(hidden)} hidden states",
            )
        if capture_layer_ids:
            feats = torch.cat([hidden[c] for c in capture_layer_ids], dim=-1)
        else:  # nothing captured (target-only decoding, profiling): [B, S, 0]
            feats = hidden[0][..., :0]
        return TargetOutput(logits=out.logits, hidden_states=feats)

    def crop(self, cache: HFCache, lengths: Sequence[int]) -> None:
        """Roll row ``i`` back to its first ``lengths[i]`` tokens (later columns become holes)."""
        wanted = [as_int(x, "lengths") for x in lengths]
        if len(wanted) != cache.batch or any(x < 0 for x in wanted):
            raise_error(InputError, "invalid-argument", "lengths: one non-negative value per row")
        if cache.dense:
            # Dense rows all hold `width` tokens: cropping them alike keeps the cache dense.
            if any(x > cache.width for x in wanted):
                raise_error(InputError, "invalid-argument", "lengths: cannot crop a row forward")
            if all(x == wanted[0] for x in wanted):
                if wanted[0] < cache.width:
                    cache.kv.crop(wanted[0] - cache.width)
                cache.width = wanted[0]
                cache.lengths = torch.full_like(cache.lengths, wanted[0])
                return
        keep = torch.as_tensor(wanted, dtype=torch.long, device=cache.lengths.device)
        if bool((keep > cache.lengths).any()):
            raise_error(InputError, "invalid-argument", "lengths: cannot crop a row forward")
        cache.valid = cache.valid & (cache.token_pos < keep[:, None])
        cache.token_pos = torch.where(cache.valid, cache.token_pos, -1)
        cache.lengths = keep
        used = cache.valid.any(dim=0).nonzero()
        cols = int(used.max()) + 1 if used.numel() else 0
        if cols < cache.valid.shape[1]:
            # A negative count removes that many trailing columns in every transformers version
            # (newer ones reject the positive "final length" form).
            cache.kv.crop(cols - cache.valid.shape[1])
            cache.valid = cache.valid[:, :cols]
            cache.token_pos = cache.token_pos[:, :cols]
        width = cache.valid.shape[1]
        if width >= _COMPACT_MIN_COLUMNS and int(cache.valid.sum(dim=1).max()) * 4 <= 3 * width:
            self.compact(cache)
        _restore_dense(cache)

    def grow(self, cache: HFCache, n: int) -> None:
        """Append ``n`` empty rows (requests joining a running batch): every existing column is
        a hole for them, and the other rows are untouched."""
        n = int(n)
        if n < 0:
            raise_error(InputError, "invalid-argument", f"grow: {n} rows")
        if n == 0:
            return
        if cache.width > 0:
            for ref in _row_refs(cache, "grow", "add"):
                t = _get(ref)
                pad = t.new_zeros((n, *t.shape[1:]))
                _put(ref, torch.cat([t, pad], dim=0))
            valid, token_pos = cache.valid, cache.token_pos
            cache.valid = torch.cat(
                [valid, torch.zeros(n, cache.width, dtype=torch.bool, device=cache.device)]
            )
            cache.token_pos = torch.cat(
                [token_pos, torch.full((n, cache.width), -1, dtype=torch.long, device=cache.device)]
            )
        cache.lengths = torch.cat(
            [cache.lengths, torch.zeros(n, dtype=torch.long, device=cache.device)]
        )
        cache.batch += n

    def retain(self, cache: HFCache, keep: Sequence[bool]) -> None:
        """Keep the rows ``i`` with ``keep[i]``, in order (finished requests leave); columns no
        kept row uses any more are dropped."""
        flags = [bool(k) for k in keep]
        if len(flags) != cache.batch:
            raise_error(
                InputError, "bad-shape", f"keep: {len(flags)} values for {cache.batch} rows"
            )
        idx = torch.tensor([i for i, k in enumerate(flags) if k], dtype=torch.long)
        if cache.width > 0:
            for ref in _row_refs(cache, "retain", "drop"):
                t = _get(ref)
                _put(ref, t.index_select(0, idx.to(t.device)))
            if not cache.dense:
                valid = cache.valid.index_select(0, idx.to(cache.device))
                token_pos = cache.token_pos.index_select(0, idx.to(cache.device))
                cache._valid, cache._token_pos = valid, token_pos
        cache.lengths = cache.lengths.index_select(0, idx.to(cache.device))
        cache.batch = len(idx)
        if cache.width > 0 and not cache.dense:
            # Columns no kept row holds any more go (a crop to every row's own length).
            self.crop(cache, [int(x) for x in cache.lengths.tolist()])

    def compact(self, cache: HFCache) -> bool:
        """Drop the holes: each row's committed columns, in order, right-aligned in a cache as
        wide as the fullest row. Returns False (cache untouched) when the transformers cache
        keeps its tensors somewhere this version does not know."""
        refs = _kv_refs(cache.kv)
        if refs is None:
            return False
        count = cache.valid.sum(dim=1)
        width = int(count.max()) if count.numel() else 0
        # Column order per row: holes first (stable), then the committed columns in order.
        order = torch.argsort(cache.valid.to(torch.int8), dim=1, stable=True)
        keep = order[:, order.shape[1] - width :]
        for ref in refs:
            t = _get(ref)
            idx = keep[:, None, :, None].expand(t.shape[0], t.shape[1], width, t.shape[3])
            _put(ref, torch.gather(t, 2, idx.to(t.device)))
        cache.valid = torch.gather(cache.valid, 1, keep)
        cache.token_pos = torch.gather(cache.token_pos, 1, keep)
        return True


_COMPACT_MIN_COLUMNS = 32


def _restore_dense(cache: HFCache) -> None:
    """Drop the explicit masks once every row holds exactly columns ``0..C-1`` again."""
    if cache.dense:
        return
    cols = torch.arange(cache.width, device=cache.device)
    if bool(cache.valid.all()) and bool((cache.token_pos == cols).all()):
        cache._valid = None
        cache._token_pos = None


def _row_refs(cache: HFCache, op: str, verb: str) -> list[tuple[Any, str | int]]:
    """The cache's KV tensor slots, for ``op`` to ``verb`` rows (``invalid-argument`` when
    this transformers cache keeps them where dspark cannot)."""
    refs = _kv_refs(cache.kv)
    if refs is None:
        raise_error(
            InputError,
            "invalid-argument",
            f"{op}: this transformers cache keeps its tensors where dspark cannot {verb} rows",
        )
    return refs


def _kv_refs(kv: Any) -> list[tuple[Any, str | int]] | None:
    """``(container, attribute or index)`` of every ``[B, H, C, D]`` key / value tensor of an HF
    cache, or None when this transformers version keeps them elsewhere."""
    layers = getattr(kv, "layers", None)
    if layers is not None:  # transformers >= 4.56: one object per layer
        refs: list[tuple[Any, str | int]] = [(ly, n) for ly in layers for n in ("keys", "values")]
    else:
        keys, values = getattr(kv, "key_cache", None), getattr(kv, "value_cache", None)
        if keys is None or values is None:
            return None
        refs = [(store, i) for store in (keys, values) for i in range(len(store))]
    ok = all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in map(_get, refs))
    return refs if ok else None


def _get(ref: tuple[Any, str | int]) -> Any:
    obj, key = ref
    return getattr(obj, key, None) if isinstance(key, str) else obj[key]


def _put(ref: tuple[Any, str | int], value: torch.Tensor) -> None:
    obj, key = ref
    if isinstance(key, str):
        setattr(obj, key, value)
    else:
        obj[key] = value


#: The members every protocol target has (``dspark.protocols.TargetModel``).
TARGET_MEMBERS = ("vocab_size", "hidden_size", "num_hidden_layers", "new_cache", "forward", "crop")


def as_target(target: object) -> TargetModel[Any]:
    """``target`` itself when it implements the protocol, an :class:`HFTarget` for HF models."""
    # The protocol's members, checked by presence; an HF model (it has `generate`) is wrapped.
    if isinstance(target, TargetModel) and not hasattr(target, "generate"):
        return target
    if hasattr(target, "config") and callable(target):
        return HFTarget(target)
    # Name what is missing, so a half-built user target learns which member to add.
    missing = [m for m in TARGET_MEMBERS if not hasattr(target, m)]
    lacks = f" (it lacks target.{', target.'.join(missing)})" if missing else ""
    raise_error(
        InputError,
        "invalid-argument",
        f"target: {type(target).__name__} is neither an HF causal LM nor a TargetModel{lacks}",
    )


if TYPE_CHECKING:
    # The contract, checked by the type checker.
    def _is_a_target(target: HFTarget) -> TargetModel[HFCache]:
        return target
