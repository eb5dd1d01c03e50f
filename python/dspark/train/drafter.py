"""Drafter stage: train a DSpark drafter on the bundled target's own hidden states, save it.

The drafter copies the target's layer shape (as DeepSpec does), owns an embedding and lm_head
padded to a multiple of 64 rows above the target's logical vocabulary (initialized from the
target's tied embedding and frozen, as DeepSpec freezes its copies; the first padded row is the
mask token), and starts its decoder layers and final norm from the target's last layers.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from dspark.train.drafter_model import DrafterShape, TrainableDrafter
from dspark.train.objective import LossWeights, anchor_hardness, dspark_loss, make_blocks
from dspark.train.selfgen import generate_sequences
from dspark.train.target import lr_at, sample_windows
from dspark.train.tokenizer import padded_vocab_size

__all__ = [
    "DrafterTrainConfig",
    "drafter_config_json",
    "load_drafter",
    "run_drafter_stage",
    "train_drafter",
    "train_step",
]


@dataclass(frozen=True)
class DrafterTrainConfig:
    """Shape and schedule of the drafter run."""

    num_layers: int = 2
    block_size: int = 8
    markov_rank: int = 32
    seq_len: int = 256
    batch_size: int = 8
    num_anchors: int = 32
    steps: int = 3500
    lr: float = 2e-3
    warmup: int = 30
    seed: int = 0
    generated: int = 3072  # target-generated sequences (see selfgen)
    generated_share: float = 0.75  # fraction of every batch drawn from them
    prompt_len: int = 64  # corpus prefix of each generated sequence
    hard_anchor_share: float = 0.5  # anchors drawn by target uncertainty (see anchor_hardness)
    confidence_label: str = "t1"  # see dspark.train.objective.confidence_targets


def feature_layers(num_target_layers: int) -> tuple[int, int, int]:
    """Three DeepSpec layer ids spread over ``[0, L-2]`` (never the last layer)."""
    last = num_target_layers - 2
    if last < 2:
        raise ValueError(
            f"target needs at least 4 layers for 3 feature layers, has {num_target_layers}"
        )
    return (0, max(1, last // 2), last)


def target_features(target: torch.nn.Module, ids: torch.Tensor, layer_ids: tuple[int, ...]):  # type: ignore[no-untyped-def]
    """``(features [B,T,L*H], logits [B,T,V])`` of the target on ``ids`` (no grad)."""
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
    return feats, out.logits


def make_shape(tcfg: object, cfg: DrafterTrainConfig) -> DrafterShape:
    """The drafter shape for target config ``tcfg`` (a ``Qwen3Config``)."""
    v_t = int(tcfg.vocab_size)  # type: ignore[attr-defined]
    return DrafterShape(
        hidden_size=int(tcfg.hidden_size),  # type: ignore[attr-defined]
        intermediate_size=int(tcfg.intermediate_size),  # type: ignore[attr-defined]
        num_heads=int(tcfg.num_attention_heads),  # type: ignore[attr-defined]
        num_kv_heads=int(tcfg.num_key_value_heads),  # type: ignore[attr-defined]
        head_dim=int(tcfg.head_dim),  # type: ignore[attr-defined]
        num_layers=cfg.num_layers,
        target_hidden_size=int(tcfg.hidden_size),  # type: ignore[attr-defined]
        num_target_layers=int(tcfg.num_hidden_layers),  # type: ignore[attr-defined]
        target_layer_ids=feature_layers(int(tcfg.num_hidden_layers)),  # type: ignore[attr-defined]
        vocab_size=padded_vocab_size(v_t),
        target_vocab_size=v_t,
        block_size=cfg.block_size,
        mask_token_id=v_t,
        markov_rank=cfg.markov_rank,
        rope_theta=float(getattr(tcfg, "rope_theta", None) or 10000.0),
        eps=float(tcfg.rms_norm_eps),  # type: ignore[attr-defined]
    )


def init_from_target(model: TrainableDrafter, target: torch.nn.Module) -> None:
    """Copy embed / lm_head rows (then freeze them), last layers and final norm from the target."""
    s = model.shape
    tsd = target.state_dict()
    with torch.no_grad():
        emb = tsd["model.embed_tokens.weight"]
        model.embed_tokens.weight[: s.target_vocab_size] = emb
        head = tsd.get("lm_head.weight", emb)
        model.lm_head.weight.zero_()
        model.lm_head.weight[: s.target_vocab_size] = head
        first = s.num_target_layers - s.num_layers
        own = model.state_dict()
        for i in range(s.num_layers):
            for key in own:
                if key.startswith(f"layers.{i}."):
                    src = f"model.layers.{first + i}." + key[len(f"layers.{i}.") :]
                    own[key].copy_(tsd[src])
        model.norm.weight.copy_(tsd["model.norm.weight"])
    model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)


def drafter_config_json(target_cfg: dict, s: DrafterShape, cfg: DrafterTrainConfig) -> dict:
    """DeepSpec-native ``Qwen3DSparkModel`` config: the target's, overridden."""
    out = {k: v for k, v in target_cfg.items() if not k.startswith("_")}
    out.pop("rope_theta", None)
    out.update(
        architectures=["Qwen3DSparkModel"],
        model_type="qwen3",
        num_hidden_layers=s.num_layers,
        num_target_layers=s.num_target_layers,
        layer_types=["full_attention"] * s.num_layers,
        block_size=s.block_size,
        mask_token_id=s.mask_token_id,
        target_layer_ids=list(s.target_layer_ids),
        num_anchors=cfg.num_anchors,
        markov_rank=s.markov_rank,
        markov_head_type="vanilla",
        enable_confidence_head=True,
        confidence_head_with_markov=True,
        tie_word_embeddings=False,
        vocab_size=s.vocab_size,
        rope_parameters={"rope_theta": s.rope_theta, "rope_type": "default"},
        dtype="float32",
    )
    return out


def train_step(
    model: TrainableDrafter,
    target: torch.nn.Module,
    ids: torch.Tensor,
    opt: torch.optim.Optimizer,
    cfg: DrafterTrainConfig,
    gen: torch.Generator,
    w: LossWeights,
    *,
    first: int = 1,
) -> tuple[float, dict[str, float]]:
    """One optimizer step of the drafter objective on the windows ``ids [B, T]``: the target's
    features, ``cfg.num_anchors`` anchors per window from position ``first`` on (a share of them
    hard), the loss, a gradient clipped to norm 1. Returns the loss and its parts."""
    s = model.shape
    feats, logits = target_features(target, ids, s.target_layer_ids)
    batch = make_blocks(
        ids,
        s.block_size,
        s.mask_token_id,
        cfg.num_anchors,
        gen,
        anchor_hardness(logits),
        cfg.hard_anchor_share,
        first=first,
    )
    loss, parts = dspark_loss(model, feats, logits, batch, w)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for group in opt.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return float(loss.detach()), parts


def train_drafter(
    target: torch.nn.Module,
    train_ids: np.ndarray,
    heldout_ids: np.ndarray,
    cfg: DrafterTrainConfig,
    out: Path,
    log: Callable[[str], None] = print,
    weights: LossWeights | None = None,
) -> TrainableDrafter:
    """Train and save ``out/config.json`` + ``out/model.safetensors`` (DeepSpec names)."""

    w = weights or LossWeights(conf_label=cfg.confidence_label)
    torch.manual_seed(cfg.seed)
    target.eval()
    s = make_shape(target.config, cfg)
    model = TrainableDrafter(s)
    init_from_target(model, target)
    params = [p for p in model.parameters() if p.requires_grad]
    log(f"drafter: {sum(p.numel() for p in params) / 1e6:.2f}M trainable params, shape {s}")
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    t0 = time.time()
    selfgen = None
    if cfg.generated > 0:
        selfgen = generate_sequences(
            target, train_ids, cfg.generated, cfg.prompt_len, cfg.seq_len, seed=cfg.seed
        )
        log(f"drafter: {selfgen.shape[0]} target-generated sequences ({time.time() - t0:.0f}s)")
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.warmup, cfg.lr)
        ids = sample_windows(train_ids, cfg.batch_size, cfg.seq_len, gen)
        if selfgen is not None:  # part of every batch: the target's own continuations
            n_gen = round(cfg.batch_size * cfg.generated_share)
            pick = torch.randint(0, selfgen.shape[0], (n_gen,), generator=gen)
            ids[:n_gen] = selfgen[pick]
        loss, parts = train_step(model, target, ids, opt, cfg, gen, w)
        if step % 25 == 0 or step == cfg.steps - 1:
            msg = " ".join(f"{k} {v:.3f}" for k, v in parts.items())
            took = time.time() - t0
            log(f"drafter step {step} loss {loss:.3f} {msg} ({took:.0f}s)")
        if step % 100 == 0 or step == cfg.steps - 1:
            log(f"drafter held-out {evaluate(model, target, heldout_ids, cfg, w)}")
            save_drafter(model, target, cfg, out)  # a usable checkpoint at every evaluation
    save_drafter(model, target, cfg, out)
    return model


def evaluate(
    model: TrainableDrafter,
    target: torch.nn.Module,
    ids: np.ndarray,
    cfg: DrafterTrainConfig,
    w: LossWeights,
) -> dict[str, float]:
    """Teacher-forced loss parts on fixed held-out windows."""
    gen = torch.Generator().manual_seed(4321)
    x = sample_windows(ids, 4, cfg.seq_len, gen)
    feats, logits = target_features(target, x, model.shape.target_layer_ids)
    batch = make_blocks(x, model.shape.block_size, model.shape.mask_token_id, cfg.num_anchors, gen)
    with torch.no_grad():
        _, parts = dspark_loss(model, feats, logits, batch, w)
    return {k: round(v, 3) for k, v in parts.items()}


def save_drafter(
    model: TrainableDrafter, target: torch.nn.Module, cfg: DrafterTrainConfig, out: Path
) -> None:
    """Write the DeepSpec-format checkpoint directory."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    conf = drafter_config_json(target.config.to_dict(), model.shape, cfg)  # type: ignore[attr-defined]
    (out / "config.json").write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n")


def load_drafter(drafter_dir: Path, target: torch.nn.Module) -> TrainableDrafter:
    """The trainable drafter of a checkpoint this stage wrote (``config.json`` +
    ``model.safetensors``), checked against ``target``'s shape; every tensor must load."""
    from safetensors.torch import load_file

    conf = json.loads((drafter_dir / "config.json").read_text())
    cfg = DrafterTrainConfig(
        num_layers=int(conf["num_hidden_layers"]),
        block_size=int(conf["block_size"]),
        markov_rank=int(conf["markov_rank"]),
    )
    s = make_shape(target.config, cfg)
    found = (list(conf["target_layer_ids"]), int(conf["mask_token_id"]), int(conf["vocab_size"]))
    want = (list(s.target_layer_ids), s.mask_token_id, s.vocab_size)
    if found != want:
        raise ValueError(
            f"{drafter_dir}/config.json: (target_layer_ids, mask_token_id, vocab_size) = {found},"
            f" the training recipe for this target gives {want}"
        )
    model = TrainableDrafter(s)
    model.load_state_dict(load_file(str(drafter_dir / "model.safetensors")), strict=True)
    return model


def run_drafter_stage(
    args: argparse.Namespace,
    train_ids: np.ndarray,
    heldout_ids: np.ndarray,
    vocab: int,
    log: Callable[[str], None],
) -> None:
    """Load ``OUT/target``, train, save ``OUT/drafter``."""
    from transformers import Qwen3ForCausalLM

    target = Qwen3ForCausalLM.from_pretrained(args.out / "target", torch_dtype=torch.float32)
    if int(target.config.vocab_size) != vocab:
        raise ValueError(f"target vocab {target.config.vocab_size} != tokenizer vocab {vocab}")
    cfg = DrafterTrainConfig(seed=args.seed)
    if args.smoke:
        cfg = replace(
            cfg,
            seq_len=64,
            batch_size=2,
            num_anchors=4,
            steps=3,
            warmup=1,
            block_size=4,
            generated=4,
            prompt_len=16,
        )
    if args.drafter_steps is not None:
        cfg = replace(cfg, steps=args.drafter_steps)
    cfg = replace(cfg, confidence_label=getattr(args, "confidence_label", "t1"))
    log(f"drafter config {asdict(cfg)}")
    train_drafter(target, train_ids, heldout_ids, cfg, args.out / "drafter", log)
