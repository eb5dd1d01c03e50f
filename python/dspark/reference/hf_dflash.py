"""A dspark drafter's DFlash backbone as an HF transformers DFlash assistant.

HF transformers drafts with ``generate(..., assistant_model=A, speculation_type="dflash")``: its
``DFlashTokenCandidateGenerator`` feeds ``A`` the target's hidden states at
``A.config.target_layer_ids`` (``hidden_states[i + 1]``, the DeepSpec id semantics), embeds the
block ``[anchor, mask x (block_size - 1)]`` with the target's input embedding, and drafts
``block_size - 1`` tokens with the target's lm_head from ``A(...).last_hidden_state[:, 1:]``. Its
assistant class ``MuseGlimmerAssistantModel`` computes the same backbone as a Qwen3 DSpark drafter
(``fc`` + RMSNorm context projection, pre-norm layers with context keys/values that skip
``input_layernorm``, q/k norms, RoPE on both, non-causal block, final norm).

:func:`to_hf_dflash` loads the backbone weights into that class. What HF's path cannot run is left
out: the Markov head (every slot drafts from the base logits) and the confidence head. Two
mappings keep the computation identical to :meth:`dspark.TorchDrafter.forward_block`:

* the mask embedding: HF looks it up in the target's embedding table; a drafter whose mask token
  is a padded row above the target's vocabulary (the bundled one) has it only in its own table,
  so the assistant puts that row into the mask slots itself;
* the DeepSpec layout (``sample_from_anchor``: slot k predicts position n+k+1, the anchor slot
  included) is read by HF as the 1+K layout (slot k predicts n+k). The assistant returns its
  hidden states shifted one slot right, so HF drafts slots ``0..block_size-2`` at the right
  positions: ``block_size - 1`` tokens, the last slot's prediction is not used.

Drafters HF's class cannot express (own embed/lm_head rows that differ from the target's, a
reduced vocabulary, a drafter width other than the target's, attention biases, logit scaling,
partial RoPE, a target with a non-plain input embedding) raise a typed error saying why.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import torch

from dspark._errors import raise_error
from dspark._native import BackendError, CheckpointError, ConfigError, DraftSpec
from dspark.reference.torch_loading import _LAYER_NAMES, load_weights

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["to_hf_dflash"]

_CLASS: type[Any] | None = None


def _assistant_class() -> type[Any]:
    """``MuseGlimmerAssistantModel`` with dspark's mask-embedding and layout mappings."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    try:
        from transformers import MuseGlimmerAssistantModel
        from transformers.generation.candidate_generator import (  # noqa: F401
            DFlashTokenCandidateGenerator,
        )
    except ImportError as exc:
        import transformers

        raise_error(
            BackendError,
            "backend",
            f"transformers {transformers.__version__} has no DFlash assisted generation "
            f"(MuseGlimmerAssistantModel / DFlashTokenCandidateGenerator): {exc}",
        )

    class DSparkDFlashAssistant(MuseGlimmerAssistantModel):
        """HF's DFlash assistant running a dspark backbone (see this module)."""

        dspark_mask_embedding: torch.Tensor | None = None
        dspark_sample_from_anchor: bool = False

        def backbone(self, noise_embeds: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            """HF's forward on the block as dspark sees it: slot k = dspark slot k."""
            if self.dspark_mask_embedding is not None:
                mask = self.dspark_mask_embedding.to(noise_embeds.device, noise_embeds.dtype)
                noise_embeds = torch.cat(
                    [noise_embeds[:, :1], mask.expand(*noise_embeds[:, 1:].shape)], dim=1
                )
            return super().forward(noise_embeds, *args, **kwargs)

        def forward(self, noise_embeds: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            """:meth:`backbone`, shifted one slot right for the DeepSpec layout."""
            out = self.backbone(noise_embeds, *args, **kwargs)
            if self.dspark_sample_from_anchor:
                h = out.last_hidden_state
                out.last_hidden_state = torch.cat([h[:, :1], h[:, :-1]], dim=1)
            return out

    _CLASS = DSparkDFlashAssistant
    return _CLASS


def _unsupported(root: Path, why: str) -> NoReturn:
    raise_error(
        ConfigError, "bad-config", f"{root}: HF's DFlash assistant cannot express it: {why}"
    )


def _same_rows(own: torch.Tensor, target: torch.Tensor, rows: int) -> bool:
    return target.shape[0] >= rows and torch.equal(own[:rows], target[:rows].to(own.dtype))


def to_hf_dflash(path: str | os.PathLike[str], target: Any) -> PreTrainedModel:
    """HF DFlash assistant (eval, on the target's device and dtype) from a drafter checkpoint.

    ``path``: a dspark/DeepSpec drafter directory; ``target``: the HF causal LM it drafts for
    (its embedding and lm_head are the ones HF drafts with). Use it as
    ``target.generate(ids, assistant_model=a, speculation_type="dflash", ...)``. The Markov and
    confidence heads are not carried over; see the module docstring for the mappings and errors.
    """
    cls = _assistant_class()
    from transformers import MuseGlimmerAssistantConfig

    root = Path(path)
    param = next(target.parameters())
    spec = DraftSpec.from_pretrained(root).to_dict()
    w = load_weights(root, target, dtype=param.dtype)  # engine checks: config, shapes, fit
    hidden = int(spec["hidden_size"])
    if spec.get("attention_bias"):
        _unsupported(root, "attention_bias = true (its projections have no bias)")
    if w.target_hidden_size != hidden:
        _unsupported(
            root,
            f"hidden_size {hidden} != target hidden size {w.target_hidden_size} (its context "
            "projection fc maps len(target_layer_ids) * hidden_size -> hidden_size)",
        )
    if w.logit_scale != 1.0 or spec.get("final_logit_softcapping") is not None:
        _unsupported(root, "logit_scale / final_logit_softcapping (it drafts with plain lm_head)")
    if float(spec["rope"].get("partial_rotary_factor") or 1.0) != 1.0:
        _unsupported(root, "partial_rotary_factor != 1 (its RoPE rotates the whole head)")
    embed_mod, head_mod = target.get_input_embeddings(), target.get_output_embeddings()
    if type(embed_mod) is not torch.nn.Embedding or head_mod is None:
        _unsupported(
            root,
            f"target input embedding {type(embed_mod).__name__} (HF embeds the anchor through "
            "it, dspark uses the raw rows) or no output embedding",
        )
    v_t = w.target_vocab_size
    if w.d2t is not None:
        raise_error(
            CheckpointError,
            "target-mismatch",
            f"{root}: reduced draft vocabulary (d2t): HF's DFlash drafts over the target's "
            "whole vocabulary with the target's lm_head",
        )
    t_embed, t_head = embed_mod.weight.detach(), head_mod.weight.detach()
    for what, own, tgt in (("embed_tokens", w.embed, t_embed), ("lm_head", w.lm_head, t_head)):
        if not _same_rows(own, tgt, v_t):
            raise_error(
                CheckpointError,
                "target-mismatch",
                f"{root}: the drafter's {what} rows [0, {v_t}) differ from the target's, but "
                f"HF's DFlash path uses the target's {what}",
            )
    mask_id = w.noise_token_id
    mask_in_target = mask_id < t_embed.shape[0] and torch.equal(
        w.embed[mask_id], t_embed[mask_id].to(w.embed.dtype)
    )
    q_len = w.block_size if w.sample_from_anchor else w.block_size + 1
    rope = spec["rope"]
    rope_parameters: dict[str, Any] = {"rope_type": rope["rope_type"], "rope_theta": rope["theta"]}
    if rope["rope_type"] == "linear":
        rope_parameters["factor"] = rope["factor"]
    n_layers = len(w.layers)
    config = MuseGlimmerAssistantConfig(
        hidden_size=hidden,
        intermediate_size=int(spec["intermediate_size"]),
        num_hidden_layers=n_layers,
        num_attention_heads=w.num_heads,
        num_key_value_heads=w.num_kv_heads,
        head_dim=w.head_dim,
        rms_norm_eps=w.eps,
        rope_parameters=rope_parameters,
        max_position_embeddings=int(spec["max_position_embeddings"]),
        layer_types=["full_attention"] * n_layers,
        hidden_act="silu",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        block_size=q_len,
        # A placeholder id when the mask row is not in the target's table (replaced in forward).
        mask_token_id=mask_id if mask_in_target else 0,
        target_layer_ids=list(w.target_layer_ids),
    )
    model = cls(config)
    state = {"encoder.fc.weight": w.fc, "encoder.output_norm_enc.weight": w.hidden_norm}
    state["norm.weight"] = w.norm
    for i, layer in enumerate(w.layers):
        state.update({f"layers.{i}.{_LAYER_NAMES[k]}": t for k, t in layer.items()})
    model.load_state_dict(state, strict=True)
    model.dspark_mask_embedding = None if mask_in_target else w.embed[mask_id].clone()
    model.dspark_sample_from_anchor = w.sample_from_anchor
    assistant: PreTrainedModel = model.to(device=param.device, dtype=param.dtype).eval()
    return assistant
