"""Tiny random models for the speculator tests (no downloads).

* :func:`make_target`: a seeded random ``Qwen3ForCausalLM`` from a ``transformers.Qwen3Config``.
* :func:`write_drafter`: a tiny random DeepSpec-format drafter checkpoint for that target, in
  one of several vocabulary layouts, written with ``dspark._safetensors.save_file``.
* :class:`OracleDrafter`: a test drafter implementing the drafter contract that proposes the
  target's own greedy continuation, corrupted at random slots, so that rounds accept partial
  blocks (random drafters almost never get accepted).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from dspark._safetensors import save_file
from dspark.example import _qwen3_layer
from dspark.protocols import DraftProposal

VOCAB = 256
HIDDEN = 64
LAYERS = 4
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 128
TARGET_LAYER_IDS = [0, 2]  # DeepSpec ids: outputs of layers 0 and 2 (capture ids 1, 3)
BLOCK = 4
RANK = 8
DRAFT_LAYERS = 2

#: Layouts: (V_in, V_d, own embed, own lm_head, reduced with d2t)
LAYOUTS: dict[str, tuple[int, int, bool, bool, bool]] = {
    "shared": (VOCAB, VOCAB, False, False, False),
    "own": (VOCAB, VOCAB, True, True, False),
    "reduced": (VOCAB, 96, False, True, True),
    "padded": (320, 320, True, True, False),
}


def qwen3_config(**overrides: Any) -> Any:
    """The tiny target's ``Qwen3Config``."""
    from transformers import Qwen3Config

    kw: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.2,
        "attn_implementation": "eager",
    }
    kw.update(overrides)
    return Qwen3Config(**kw)


def make_target(seed: int = 0, **overrides: Any) -> Any:
    """A seeded random tiny ``Qwen3ForCausalLM`` in eval mode (f32)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(qwen3_config(**overrides)).eval()
    return model


def draft_config(target: Any, layout: str, **overrides: Any) -> dict[str, Any]:
    """DeepSpec config of a drafter for ``target`` (the target config + DSpark fields)."""
    v_in, v_d, _, _, reduced = LAYOUTS[layout]
    cfg = dict(target.config.to_dict())
    cfg.update(
        {
            "architectures": ["Qwen3DSparkModel"],
            "model_type": "qwen3",
            "num_hidden_layers": DRAFT_LAYERS,
            "num_target_layers": target.config.num_hidden_layers,
            "vocab_size": v_in,
            "block_size": BLOCK,
            "mask_token_id": v_in - 1,
            "target_layer_ids": TARGET_LAYER_IDS,
            "num_anchors": 16,
            "markov_rank": RANK,
            "markov_head_type": "vanilla",
            "enable_confidence_head": True,
            "confidence_head_with_markov": True,
            "tie_word_embeddings": False,
            "layer_types": ["full_attention"] * DRAFT_LAYERS,
        }
    )
    if reduced:
        cfg["draft_vocab_size"] = v_d
    cfg.update(overrides)
    return {k: v for k, v in cfg.items() if not k.startswith("_") and k != "dtype"}


def draft_tensors(
    layout: str, seed: int = 0, *, rank: int = RANK, confidence: bool = True, scale: float = 0.3
) -> dict[str, np.ndarray]:
    """Random drafter weights with DeepSpec names for ``layout``."""
    v_in, v_d, own_embed, own_lm, reduced = LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    h, n_ctx = HIDDEN, len(TARGET_LAYER_IDS)

    def w(*shape: int, s: float = scale) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t: dict[str, np.ndarray] = {
        "fc.weight": w(h, n_ctx * h, s=0.1),
        "hidden_norm.weight": norm(h),
        "norm.weight": norm(h),
    }
    if rank > 0:
        t["markov_head.markov_w1.weight"] = w(v_in, rank)
        t["markov_head.markov_w2.weight"] = w(v_d, rank)
    if confidence:
        t["confidence_head.proj.weight"] = w(1, h + rank)
        t["confidence_head.proj.bias"] = w(1)
    for i in range(DRAFT_LAYERS):
        # Drawn in the builder's fixed order: the projections and norms as the layer lists them.
        t.update(
            _qwen3_layer(
                f"layers.{i}.",
                w,
                norm,
                hidden=h,
                heads=HEADS,
                kv_heads=KV_HEADS,
                head_dim=HEAD_DIM,
                intermediate=INTERMEDIATE,
            )
        )
    if own_embed:
        t["embed_tokens.weight"] = w(v_in, h)
    if own_lm:
        t["lm_head.weight"] = w(v_d, h)
    if reduced:
        used = np.sort(rng.choice(VOCAB, size=v_d, replace=False))
        t["d2t"] = (used - np.arange(v_d)).astype(np.int64)
        t["t2d"] = np.isin(np.arange(VOCAB), used)
    return t


def write_drafter(
    root: Path,
    target: Any,
    layout: str = "shared",
    seed: int = 0,
    *,
    rank: int = RANK,
    confidence: bool = True,
    config_overrides: dict[str, Any] | None = None,
) -> Path:
    """Write ``root/config.json`` + ``root/model.safetensors``; returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    overrides = dict(config_overrides or {})
    if rank == 0:
        overrides.setdefault("markov_rank", 0)
        overrides.setdefault("confidence_head_with_markov", False)
    if not confidence:
        overrides.setdefault("enable_confidence_head", False)
    cfg = draft_config(target, layout, **overrides)
    (root / "config.json").write_text(json.dumps(cfg, default=str))
    save_file(
        draft_tensors(layout, seed, rank=rank, confidence=confidence), root / "model.safetensors"
    )
    return root


@torch.inference_mode()
def greedy_reference(target: Any, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Target-only greedy decoding (own loop, HF ``DynamicCache``, argmax of f32 logits)."""
    from transformers import DynamicCache

    from dspark._hf_cache import cache_kwarg

    cache = DynamicCache(config=target.config)
    kw = cache_kwarg(target)  # `cache` or `past_key_values`, by transformers version
    device = next(target.parameters()).device
    ids = torch.tensor([list(prompt)], device=device)
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits = target(input_ids=ids, use_cache=True, **{kw: cache}).logits
        nxt = int(logits[0, -1].float().argmax())
        out.append(nxt)
        ids = torch.tensor([[nxt]], device=device)
    return out


class _OracleState:
    def __init__(self) -> None:
        self.features: list[torch.Tensor] = []

    @property
    def length(self) -> int:
        return len(self.features)

    def extend(self, features: Any, start_position: int) -> None:
        feats = torch.as_tensor(features)
        assert 0 <= start_position <= self.length
        for j in range(self.length - start_position, feats.shape[0]):
            self.features.append(feats[j])

    def truncate(self, length: int) -> None:
        del self.features[length:]


class OracleDrafter:
    """Proposes the target's true greedy continuation of ``prefix + anchor``, with each slot
    replaced by a wrong token with probability ``corrupt`` (seeded). Greedy only.

    It needs the committed prefix, which the contract does not pass. Greedy verification is
    lossless, so a request's committed tokens are its prompt's greedy continuation: the oracle
    starts from the prompts (one state per prompt, in order), reads the prefix off that
    continuation at the state's length, and checks that the anchor the engine passes is the
    continuation's next token. That holds across plain rounds (the engine verifies one token
    and calls no drafter), which a bookkeeping of accepted drafts would miss.
    """

    def __init__(
        self,
        target: Any,
        prompts: Sequence[Sequence[int]],
        corrupt: float,
        seed: int = 0,
        confidence: float | None = None,
    ):
        self.target = target
        self.corrupt = corrupt
        # a constant confidence per slot, for the policies that need a confidence head
        self.confidence = confidence
        self.has_confidence_head = confidence is not None
        self.rng = np.random.default_rng(seed)
        self.prompts = [list(p) for p in prompts]
        self._continuations: list[list[int]] = [[] for _ in prompts]
        self._states: list[_OracleState] = []

    block_size = BLOCK
    noise_token_id = VOCAB - 1
    vocab_size = VOCAB
    draft_vocab_size = VOCAB
    target_vocab_size = VOCAB
    draft_id_to_target_id = None
    has_own_embed_tokens = False
    has_own_lm_head = False
    target_layer_ids: ClassVar[list[int]] = list(TARGET_LAYER_IDS)
    capture_layer_ids: ClassVar[list[int]] = [i + 1 for i in TARGET_LAYER_IDS]
    sample_from_anchor = True

    def new_state(self) -> _OracleState:
        state = _OracleState()
        state.request = len(self._states)  # type: ignore[attr-defined]
        self._states.append(state)
        return state

    def propose(self, *args: Any, **kwargs: Any) -> DraftProposal:
        raise NotImplementedError("the oracle drafter is stateful only")

    def continuation(self, request: int, count: int) -> list[int]:
        """At least ``count`` greedy tokens after the request's prompt (computed once, grown
        by doubling)."""
        got = self._continuations[request]
        if len(got) < count:
            got = greedy_reference(self.target, self.prompts[request], max(count, 2 * len(got)))
            self._continuations[request] = got
        return got

    def propose_states(
        self,
        states: Sequence[_OracleState],
        anchors: Any,
        *,
        temperature: float = 0.0,
        seed: Any = 0,
    ) -> DraftProposal:
        tokens = torch.zeros(len(states), BLOCK, dtype=torch.long)
        for j, (s, a) in enumerate(zip(states, torch.as_tensor(anchors).tolist(), strict=True)):
            request: int = s.request  # type: ignore[attr-defined]
            done = s.length - len(self.prompts[request])  # generated tokens in the state
            assert done >= 0, "a state shorter than its prompt"
            cont = self.continuation(request, done + 1 + BLOCK)
            assert int(a) == cont[done], (
                f"request {request}: anchor {int(a)} at generated position {done}, "
                f"greedy decoding gives {cont[done]}"
            )
            for k, t in enumerate(cont[done + 1 : done + 1 + BLOCK]):
                wrong = self.rng.random() < self.corrupt
                tokens[j, k] = (t + 1 + int(self.rng.integers(VOCAB - 1))) % VOCAB if wrong else t
        q = torch.full((len(states), BLOCK, VOCAB), float("-inf"))
        q.scatter_(2, tokens[..., None], 0.0)
        conf = None
        if self.confidence is not None:
            conf = torch.full((len(states), BLOCK), self.confidence)
        return DraftProposal(tokens=tokens, draft_logits=q, confidence=conf)
