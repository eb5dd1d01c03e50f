"""The two contracts the speculator is written against: a drafter and a target model.

Every drafter class the package provides (``dspark.Drafter`` on candle, ``dspark.TorchDrafter``
in plain torch) implements :class:`DrafterProtocol`, with the same member names and meanings;
``tests/test_drafter_contract.py`` checks each class against this list. A target is any HF
transformers causal LM (wrapped by :class:`dspark.target.HFTarget`) or any object implementing
:class:`TargetModel`.

Positions: a drafter context holds target features of positions ``0..length-1``; the anchor (the
last token the target committed) sits at position ``length``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from dspark._typing import (
        DLPackTensor,
        FloatArray,
        IdArray,
        PerRequestInt,
        TensorLike,
        TorchTensor,
    )

__all__ = [
    "DRAFTER_MEMBERS",
    "DraftProposal",
    "DraftStateProtocol",
    "DrafterProtocol",
    "TargetModel",
    "TargetOutput",
]

#: A drafter's per-request context state (what ``new_state`` makes).
StateT = TypeVar("StateT")
#: A target's cache (opaque to the speculator; what ``new_cache`` makes).
CacheT = TypeVar("CacheT")

#: Every member of the drafter contract (attributes and methods), for contract checks.
DRAFTER_MEMBERS: tuple[str, ...] = (
    "block_size",
    "noise_token_id",
    "vocab_size",
    "draft_vocab_size",
    "target_vocab_size",
    "draft_id_to_target_id",
    "has_own_embed_tokens",
    "has_own_lm_head",
    "target_layer_ids",
    "capture_layer_ids",
    "sample_from_anchor",
    "has_confidence_head",
    "propose",
    "new_state",
    "propose_states",
)


@dataclass(frozen=True)
class DraftProposal:
    """A drafted block (what :meth:`DrafterProtocol.propose` returns).

    Attributes:
        tokens: ``[B, K]`` int64 target-vocabulary ids.
        draft_logits: ``[B, K, V_t]`` float32; ``softmax`` of row k is exactly the distribution
            token k was drawn from (greedy: ``0`` at the token, ``-inf`` elsewhere).
        confidence: ``[B, K]`` float32 in ``(0, 1)``, or ``None`` without a confidence head.
    """

    tokens: TorchTensor | IdArray
    draft_logits: TorchTensor | FloatArray
    confidence: TorchTensor | FloatArray | None


@runtime_checkable
class DraftStateProtocol(Protocol):
    """Per-request drafter context (a KV cache over target features)."""

    @property
    def length(self) -> int:
        """Number of context positions held (the anchor sits at this position)."""
        ...

    def extend(self, features: TensorLike, start_position: int) -> None:
        """Add target features ``[T, L*H_t]`` of positions ``start_position..+T-1``.

        Positions already held are skipped; ``start_position > length`` is an error.
        """
        ...

    def truncate(self, length: int) -> None:
        """Roll back to the first ``length`` positions."""
        ...


@runtime_checkable
class DrafterProtocol(Protocol[StateT]):
    """The drafter contract: the same members on every backend (``StateT``: its context
    state, a :class:`DraftStateProtocol`)."""

    @property
    def block_size(self) -> int:
        """Number of draft tokens one proposal holds (K)."""
        ...

    @property
    def noise_token_id(self) -> int:
        """The mask/noise token filling the block after the anchor."""
        ...

    @property
    def vocab_size(self) -> int:
        """``V_in``: draft input vocabulary (embedding rows, Markov W1 rows)."""
        ...

    @property
    def draft_vocab_size(self) -> int:
        """``V_d``: draft output vocabulary (lm_head rows)."""
        ...

    @property
    def target_vocab_size(self) -> int:
        """``V_t``: the target's logical vocabulary; drafted ids are always below it."""
        ...

    @property
    def draft_id_to_target_id(self) -> TorchTensor | IdArray | None:
        """``None`` for the identity map, else the int64 ``d2t`` offset table ``[V_d]``."""
        ...

    @property
    def has_own_embed_tokens(self) -> bool:
        """Whether the checkpoint ships its embedding (else it is the target's)."""
        ...

    @property
    def has_own_lm_head(self) -> bool:
        """Whether the checkpoint ships its lm_head (else it is the target's)."""
        ...

    @property
    def target_layer_ids(self) -> list[int]:
        """DeepSpec ids: id ``i`` is the output of target layer ``i`` (``-1``: embeddings)."""
        ...

    @property
    def capture_layer_ids(self) -> list[int]:
        """The same layers as HF ``hidden_states`` indices (``target_layer_ids + 1``)."""
        ...

    @property
    def sample_from_anchor(self) -> bool:
        """``True``: slot k of ``[anchor, M, ...]`` predicts position ``n+k+1`` (DeepSpec)."""
        ...

    @property
    def has_confidence_head(self) -> bool:
        """Whether proposals carry per-slot confidences."""
        ...

    def propose(
        self,
        context_hidden_states: TensorLike,
        anchors: TensorLike,
        *,
        start_positions: int | Sequence[int] = 0,
        temperature: float = 0.0,
        seed: PerRequestInt = 0,
    ) -> DraftProposal:
        """Stateless proposal from context features ``[B, T, L*H_t]`` (positions
        ``start..start+T-1``) and anchors ``[B]`` (at position ``start+T``)."""
        ...

    def new_state(self) -> StateT:
        """An empty per-request context."""
        ...

    def propose_states(
        self,
        states: Sequence[StateT],
        anchors: TensorLike,
        *,
        temperature: float = 0.0,
        seed: PerRequestInt = 0,
    ) -> DraftProposal:
        """One pass over the block for each state (anchor ``i`` at ``states[i].length``)."""
        ...


@dataclass(frozen=True)
class TargetOutput:
    """What a target forward returns.

    Attributes:
        logits: ``[B, S, V]`` float logits of every input position (``V >= V_t``).
        hidden_states: ``[B, S, L*H]``: the requested capture layers (HF ``hidden_states``
            indices) concatenated in order along the last axis.
    """

    logits: DLPackTensor
    hidden_states: DLPackTensor


@runtime_checkable
class TargetModel(Protocol[CacheT]):
    """A target the speculator can drive: forward on new tokens with a cache, and crop.

    The cache (``CacheT``) is opaque to the speculator; it holds ``B`` requests, each with its
    own length. ``input_ids`` is a torch tensor when torch is installed, else a numpy array.
    An optional ``device`` attribute (``"cuda:0"``...) says where the outputs live; with the
    CUDA build, CUDA logits and hidden states are read in place whether or not it is set.

    Optional, for continuous batching (:class:`dspark.Engine`): ``grow(cache, n)`` appends
    ``n`` empty rows and ``retain(cache, keep)`` keeps the rows ``i`` with ``keep[i]`` (both
    leave the other rows' contents alone); a ``ragged = True`` attribute says a forward costs
    its tokens rather than rows x its widest row (then a joining request's prefill rides the
    running requests' forward).

    Optional, for the scheduler's cost model (``verify="scheduled"``, the default): a
    ``forward_cost`` mapping with ``weight_bytes`` (bytes of weights one forward reads),
    ``flops_per_token`` (floating-point operations per token through them) and ``dtype``
    (``"float32"``, ``"bfloat16"`` or ``"float16"``), and optionally ``layer_seconds`` (what a
    layer costs whatever its tokens; default 1e-4, a torch eager layer). Without it the cost is
    estimated from the layers, hidden size and vocabulary; either way each round's timings
    refine it.
    """

    @property
    def num_hidden_layers(self) -> int:
        """Number of decoder layers (capture ids run ``0..num_hidden_layers-1``)."""
        ...

    @property
    def hidden_size(self) -> int:
        """Width of one captured hidden state."""
        ...

    @property
    def vocab_size(self) -> int:
        """Logical vocabulary ``V_t``."""
        ...

    def new_cache(self, batch_size: int) -> CacheT:
        """An empty cache for ``batch_size`` requests."""
        ...

    def forward(
        self,
        cache: CacheT,
        input_ids: TorchTensor | IdArray,
        num_tokens: Sequence[int],
        capture_layer_ids: Sequence[int],
    ) -> TargetOutput:
        """Run ``input_ids[i, :num_tokens[i]]`` (``[B, S]`` int64, right-padded) after what row
        ``i`` of the cache holds, at the positions that follow it; each row grows by
        ``num_tokens[i]``. Outputs at padded entries are unspecified and padding never
        influences other positions."""
        ...

    def crop(self, cache: CacheT, lengths: Sequence[int]) -> None:
        """Roll row ``i`` of the cache back to its first ``lengths[i]`` tokens."""
        ...
