"""The candle DSpark drafter: ``dspark.Drafter`` (Python front over ``dspark._native.Drafter``).

Contract (the same member names on every drafter class, see also ``TargetModel`` users)::

    drafter = dspark.Drafter.from_pretrained(path, target)  # an HF model, or a dict
    drafter = dspark.Drafter.from_pretrained(
        path, {"config": dict, "embed_tokens": t, "lm_head": t})

    drafter.block_size            # K: draft tokens per proposal (the 1+K layout feeds K + 1 slots)
    drafter.num_draft_tokens      # K as well (explicit alias)
    drafter.noise_token_id
    drafter.vocab_size            # V_in
    drafter.draft_vocab_size      # V_d
    drafter.target_vocab_size     # V_t
    drafter.draft_id_to_target_id # None (identity) or int64 offsets [V_d] (torch, else numpy)
    drafter.has_own_embed_tokens, drafter.has_own_lm_head
    drafter.target_layer_ids      # DeepSpec semantics: HF hidden_states[i + 1]
    drafter.capture_layer_ids     # input of layer j (= i + 1)
    drafter.sample_from_anchor, drafter.has_confidence_head

    # stateless: context covers positions start..start+T-1, the anchor sits at start+T
    block = drafter.propose(context_hidden_states,  # [B, T, L*H_t]; returns a DraftProposal
                            anchors,                # [B] target ids
                            start_positions=0, temperature=0.0, seed=0)
    block.tokens        # [B, K] int64 target ids
    block.draft_logits  # [B, K, V_t] float32: softmax(row) is exactly the drafted distribution q
    block.confidence    # [B, K] float32 or None

    # cached path (what the speculator uses): one pass over the block per round
    state = drafter.new_state()
    state.extend(features, start_position)   # features [T, L*H_t]; held positions are skipped
    block = drafter.propose_states([state, ...], anchors, temperature=0.0, seed=0)
    state.truncate(n)                        # roll back to the accepted prefix
    state.length, state.start, state.end     # anchor of the next round sits at state.end

The context features are the target's hidden states at ``target_layer_ids`` (HF
``hidden_states[i + 1]``, ``-1`` = ``hidden_states[0]``) concatenated on the last dimension.
Tensors may be torch (CPU or CUDA; moved to CPU float32 here) or numpy; outputs are torch
tensors when torch is importable and the input was a torch tensor, numpy arrays otherwise.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

import numpy as np

from dspark import _native
from dspark._args import dtype_name, is_torch, torch_view
from dspark._errors import raise_error
from dspark._native import ConfigError, InputError
from dspark.protocols import DraftProposal

if TYPE_CHECKING:
    from dspark._typing import IdArray, PerRequestInt, TensorLike, TorchTensor
    from dspark.native_target import NativeTarget
    from dspark.protocols import DrafterProtocol, DraftStateProtocol

#: A host result of the engine (numpy), kept as its own array type.
_ArrayT = TypeVar("_ArrayT", bound="np.ndarray")

__all__ = ["DraftState", "Drafter"]


def _cpu(x: object, name: str) -> object:
    """A CPU, C-contiguous view (torch: detached, lazy neg/conj bits resolved, moved to the CPU;
    bf16/f16 kept, the engine widens). Meta, sparse and nested tensors raise ``InputError``."""
    if is_torch(x):
        t = torch_view(x, name)
        if t.device.type != "cpu":
            t = t.cpu()
        return t.contiguous()
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x)
    return x


def _ids(x: object, name: str) -> object:
    """Ids for the native layer: a flat CPU tensor or array, or a list (checked natively)."""
    if is_torch(x):
        return torch_view(x, name).cpu().contiguous().reshape(-1)
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x).reshape(-1)
    if isinstance(x, (list, tuple)):
        return list(x)
    return [x]  # one id; the native layer refuses anything that is not an int


def _seed(seed: object) -> object:
    """``None``, an int, or one seed per request as a list (values checked natively)."""
    if seed is None or isinstance(seed, int):
        return seed
    if isinstance(seed, np.integer):
        return seed.item()
    if is_torch(seed) or isinstance(seed, np.ndarray):
        return np.asarray(_cpu(seed, "seed")).reshape(-1).tolist()
    if isinstance(seed, (list, tuple)):
        return list(seed)
    return seed


@overload
def _out(torch_out: bool, arr: _ArrayT) -> TorchTensor | _ArrayT: ...
@overload
def _out(torch_out: bool, arr: None) -> None: ...
def _out(torch_out: bool, arr: _ArrayT | None) -> TorchTensor | _ArrayT | None:
    """``arr`` as a torch tensor (zero-copy) when ``torch_out``."""
    if arr is None or not torch_out:
        return arr
    import torch

    return torch.from_numpy(arr)


def _target_parts(
    target: object,
) -> tuple[dict[str, Any], Callable[[], object], Callable[[], object]]:
    """``(config dict, embed getter, lm_head getter)`` of an HF model or a weights dict."""
    if isinstance(target, dict):
        config: object = target.get("config")
        to_dict = getattr(config, "to_dict", None)
        if callable(to_dict):
            config = to_dict()
        if not isinstance(config, dict):
            raise_error(InputError, "invalid-argument", "target dict needs a 'config' dict")
        return config, lambda: target.get("embed_tokens"), lambda: target.get("lm_head")
    config = getattr(target, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise_error(
            InputError,
            "invalid-argument",
            "target must be an HF transformers model (with .config) or a dict "
            "{'config': dict, 'embed_tokens': tensor, 'lm_head': tensor}",
        )

    def weight(getter: str) -> object:
        module = getattr(target, getter)()
        return None if module is None else module.weight

    return (
        config.to_dict(),
        lambda: weight("get_input_embeddings"),
        lambda: weight("get_output_embeddings"),
    )


def _default_device(target: object) -> str:
    """The device of a torch target (an HF model or a weights dict) when this build can run
    there (the CUDA build with a usable device), else ``"cpu"``."""
    dev = getattr(target, "device", None)
    if isinstance(target, dict):
        dev = getattr(target.get("embed_tokens"), "device", None)
    name = str(dev) if dev is not None else "cpu"
    if name.startswith("cuda") and _native.build_info()["cuda_devices"] > 0:
        return name
    return "cpu"


class DraftState:
    """One request's drafter context KV cache. Make it with :meth:`Drafter.new_state`."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.DraftState) -> None:
        self._native = native

    def extend(self, features: TensorLike, start_position: int) -> None:
        """Append target features ``[T, L*H_t]`` at absolute positions ``start_position..``.

        Only new positions are computed: rows of positions already held are skipped (use
        :meth:`truncate` first to replace them); a gap after the cache raises ``InputError``.
        """
        if is_torch(features) or isinstance(features, np.ndarray):
            if features.ndim == 3 and features.shape[0] == 1:
                features = features[0]
        self._native.extend(_cpu(features, "features"), start_position)

    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` cached positions (roll back to the accepted prefix)."""
        self._native.truncate(n)

    def clear(self) -> None:
        """Drop everything."""
        self._native.clear()

    @property
    def length(self) -> int:
        """Number of cached context positions."""
        return self._native.length

    @property
    def start(self) -> int:
        """Absolute position of the first cached row."""
        return self._native.start

    @property
    def end(self) -> int:
        """One past the last cached position: the next anchor's position."""
        return self._native.end

    def __len__(self) -> int:
        return self._native.length


class Drafter:
    """The Qwen3-shaped DSpark (or DFlash) drafter, run by the Rust engine on candle (CPU)."""

    def __init__(self, native: _native.Drafter) -> None:
        self._native = native

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        target: NativeTarget | object,
        *,
        sts: str | os.PathLike[str] | Sequence[float] | bool | None = None,
        device: str | None = None,
        dtype: str | object | None = None,
    ) -> Drafter:
        """Load the drafter at ``path`` (``config.json`` + safetensors) for ``target``.

        ``target`` is a :class:`dspark.NativeTarget` (its embedding / lm_head are shared with
        no copy and no torch), an HF transformers causal LM or a dict ``{"config": dict,
        "embed_tokens": tensor, "lm_head": tensor}``. The target's embedding / lm_head are read
        only when the checkpoint lacks its own (the load plan says shared).

        ``sts``: the confidence head's per-position temperature calibration. ``None`` (default)
        uses ``sts.json`` next to the checkpoint when present (written by ``dspark
        calibrate``), ``False`` turns calibration off, a path reads that JSON, a list of floats
        is the table itself.

        ``device``: where the drafter runs, ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (a CUDA
        device needs the CUDA wheel, ``docs/gpu.md``). ``None`` (default): the target's
        device (a native target's weights are shared, so its drafter always runs there); for a
        torch target on a GPU with the CPU wheel, the CPU (its logits cross to the host).

        ``dtype``: the dtype its weight matrices are kept in (``"float32"``, ``"bfloat16"``,
        ``"float16"`` or a ``torch.dtype``); ``None`` (default) keeps each one's own (the
        checkpoint's, and the native target's for the weights it shares).
        """
        dtype = dtype_name(dtype)
        if device is not None and not isinstance(device, str):
            raise_error(
                InputError,
                "invalid-argument",
                f"device: expected a str such as 'cpu' or 'cuda:0', got {type(device).__name__}",
            )
        native_target = getattr(target, "_native_target", None)
        if isinstance(native_target, _native.NativeTarget):
            if not isinstance(path, (str, bytes, os.PathLike)):
                raise_error(
                    InputError,
                    "invalid-argument",
                    f"path: expected a path (str or os.PathLike), got {type(path).__name__}",
                )
            return cls(
                _native.Drafter.load_native(os.fspath(path), native_target, sts, device, dtype)
            )
        config, embed, lm_head = _target_parts(target)
        try:
            text = json.dumps(config, default=str, allow_nan=False)
        except ValueError as e:  # NaN / infinity, or a cycle
            raise_error(ConfigError, "bad-config", f"<target config>: not plain JSON ({e})")
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise_error(
                InputError,
                "invalid-argument",
                f"path: expected a path (str or os.PathLike), got {type(path).__name__}",
            )
        path = os.fspath(path)
        share_embed, share_head = _native.Drafter.plan_sharing(path, text)
        embed_w = _cpu(embed(), "embed_tokens") if share_embed else None
        head_w = _cpu(lm_head(), "lm_head") if share_head else None
        device = device or _default_device(target)
        return cls(_native.Drafter.load(path, text, embed_w, head_w, sts, device, dtype))

    # -- contract members ------------------------------------------------------------------
    @property
    def device(self) -> str:
        """Where the drafter runs: ``"cpu"`` or ``"cuda:N"``."""
        return self._native.device

    @property
    def sts_temperatures(self) -> list[float] | None:
        """The confidence calibration in use (per-position temperatures), or ``None``."""
        return self._native.sts_temperatures

    @property
    def block_size(self) -> int:
        """``K``: draft tokens per proposal (the 1+K layout feeds ``K + 1`` input slots)."""
        return self._native.block_size

    @property
    def num_draft_tokens(self) -> int:
        """``K`` (same as :attr:`block_size`)."""
        return self._native.num_draft_tokens

    @property
    def noise_token_id(self) -> int:
        """The noise (mask) token."""
        return self._native.noise_token_id

    @property
    def vocab_size(self) -> int:
        """``V_in``: draft input vocabulary."""
        return self._native.vocab_size

    @property
    def draft_vocab_size(self) -> int:
        """``V_d``: draft output vocabulary."""
        return self._native.draft_vocab_size

    @property
    def target_vocab_size(self) -> int:
        """``V_t``: target vocabulary."""
        return self._native.target_vocab_size

    @property
    def draft_id_to_target_id(self) -> TorchTensor | IdArray | None:
        """``None`` for the identity map, else int64 offsets ``[V_d]`` (torch if available)."""
        offsets = self._native.draft_id_to_target_id
        if offsets is None:
            return None
        try:
            import torch
        except ImportError:
            return offsets
        return torch.from_numpy(offsets)

    @property
    def has_own_embed_tokens(self) -> bool:
        """Whether the checkpoint ships ``embed_tokens`` (else the target's is used)."""
        return self._native.has_own_embed_tokens

    @property
    def has_own_lm_head(self) -> bool:
        """Whether the checkpoint ships ``lm_head`` (else the target's is used)."""
        return self._native.has_own_lm_head

    @property
    def target_layer_ids(self) -> list[int]:
        """Feature layers, DeepSpec semantics (HF ``hidden_states[i + 1]``)."""
        return self._native.target_layer_ids

    @property
    def capture_layer_ids(self) -> list[int]:
        """Feature layers, capture semantics (input of layer ``j``)."""
        return self._native.capture_layer_ids

    @property
    def sample_from_anchor(self) -> bool:
        """DeepSpec layout (``True``) or the 1+K layout."""
        return self._native.sample_from_anchor

    @property
    def has_confidence_head(self) -> bool:
        """Whether proposals carry confidences."""
        return self._native.has_confidence_head

    @property
    def markov_rank(self) -> int:
        """Markov head rank (0 = DFlash)."""
        return self._native.markov_rank

    @property
    def context_width(self) -> int:
        """Width of one feature row, ``L * H_t``."""
        return self._native.context_width

    @property
    def warnings(self) -> list[tuple[str, str]]:
        """``(code, message)`` of non-fatal findings from the config and the load plan."""
        return self._native.warnings

    # -- drafting --------------------------------------------------------------------------

    def propose(
        self,
        context_hidden_states: TensorLike,
        anchors: TensorLike,
        *,
        start_positions: PerRequestInt = 0,
        temperature: float = 0.0,
        seed: PerRequestInt | None = 0,
        top_k: int | None = None,
    ) -> DraftProposal:
        """Stateless drafting over a whole context ``[B, T, L*H_t]`` (see the module doc).

        A CUDA torch context given to a drafter on that device is read in place (DLPack) and
        the draft logits stay there (a CUDA tensor); tokens and confidences come to the host.
        """
        torch_out = is_torch(context_hidden_states)
        if torch_out and self._on_cuda(context_hidden_states):
            # Read in place; the draft logits stay on the device.
            name = "context_hidden_states"
            ctx: object = torch_view(cast("TorchTensor", context_hidden_states), name).contiguous()
        else:
            ctx = _cpu(context_hidden_states, "context_hidden_states")
        t, d, c = self._native.propose(
            ctx,
            _ids(anchors, "anchors"),
            start_positions=_seed(start_positions),
            temperature=temperature,
            seed=_seed(seed),
            top_k=top_k,
        )
        if isinstance(d, np.ndarray):
            return DraftProposal(_out(torch_out, t), _out(torch_out, d), _out(torch_out, c))
        from torch.utils.dlpack import from_dlpack

        return DraftProposal(_out(True, t), from_dlpack(d), _out(True, c))

    def _on_cuda(self, context: object) -> bool:
        """Whether ``context`` is a CUDA tensor and this drafter runs on CUDA (the device path)."""
        dev = getattr(context, "device", None)
        return getattr(dev, "type", None) == "cuda" and self._native.device.startswith("cuda")

    def new_state(self) -> DraftState:
        """An empty per-request context cache."""
        return DraftState(self._native.new_state())

    def propose_states(
        self,
        states: Sequence[DraftState],
        anchors: TensorLike,
        *,
        temperature: float = 0.0,
        seed: PerRequestInt | None = 0,
        top_k: int | None = None,
        torch_output: bool | None = None,
    ) -> DraftProposal:
        """Draft one block per state; request ``b``'s anchor sits at ``states[b].end``.

        ``torch_output`` defaults to ``True`` when torch is importable.
        """
        if torch_output is None:
            try:
                import torch  # noqa: F401

                torch_output = True
            except ImportError:
                torch_output = False
        if not isinstance(states, (list, tuple)):
            raise_error(
                InputError,
                "invalid-argument",
                f"states: expected a list of DraftState, got {type(states).__name__}",
            )
        t, d, c = self._native.propose_states(
            [s._native if isinstance(s, DraftState) else s for s in states],
            _ids(anchors, "anchors"),
            temperature=temperature,
            seed=_seed(seed),
            top_k=top_k,
        )
        return DraftProposal(_out(torch_output, t), _out(torch_output, d), _out(torch_output, c))

    def __repr__(self) -> str:
        return (
            f"Drafter(block_size={self.block_size}, vocab=({self.vocab_size}, "
            f"{self.draft_vocab_size}, {self.target_vocab_size}), markov_rank={self.markov_rank}, "
            f"confidence={self.has_confidence_head})"
        )


if TYPE_CHECKING:
    # The contracts, checked by the type checker: every drafter class implements them.
    def _is_a_drafter(drafter: Drafter) -> DrafterProtocol[DraftState]:
        return drafter

    def _is_a_state(state: DraftState) -> DraftStateProtocol:
        return state
