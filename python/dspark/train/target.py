"""The bundled target: a small Qwen3 causal LM trained from scratch (next-token cross-entropy)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "TargetTrainConfig",
    "assistant_config",
    "make_target_config",
    "sample_windows",
    "train_target",
]


@dataclass(frozen=True)
class TargetTrainConfig:
    """Shape and schedule of the target run."""

    hidden_size: int = 192
    num_layers: int = 8
    num_heads: int = 3
    num_kv_heads: int = 1
    head_dim: int = 64
    intermediate_size: int = 512
    seq_len: int = 256
    batch_size: int = 16
    steps: int = 800
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.1
    seed: int = 0


def assistant_config(seed: int = 0, *, smoke: bool = False) -> TargetTrainConfig:
    """The small draft LM of the HF assisted-generation baseline: trained exactly like the
    target (same corpus, tokenizer and objective), 2 layers of width 128 (≈ 0.8 M params)."""
    if smoke:
        return TargetTrainConfig(
            hidden_size=32,
            num_layers=1,
            num_heads=1,
            head_dim=32,
            intermediate_size=64,
            seq_len=64,
            batch_size=4,
            steps=2,
            warmup=1,
            seed=seed,
        )
    return TargetTrainConfig(
        hidden_size=128, num_layers=2, num_heads=2, intermediate_size=384, steps=600, seed=seed
    )


def make_target_config(vocab_size: int, cfg: TargetTrainConfig, eos_id: int) -> object:
    """A ``transformers.Qwen3Config`` of the given shape (tied embeddings, full attention)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        use_cache=True,
    )


def sample_windows(
    stream: np.ndarray, batch: int, seq_len: int, gen: torch.Generator
) -> torch.Tensor:
    """``[batch, seq_len]`` random windows of ``stream`` (int64), drawn from ``gen``."""
    hi = len(stream) - seq_len
    if hi <= 0:
        raise ValueError(f"token stream of {len(stream)} ids is shorter than seq_len {seq_len}")
    starts = torch.randint(0, hi, (batch,), generator=gen).tolist()
    return torch.stack([torch.from_numpy(stream[s : s + seq_len].astype(np.int64)) for s in starts])


def lr_at(step: int, cfg_steps: int, warmup: int, lr: float) -> float:
    """Linear warmup, then cosine decay to 10% of ``lr``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, cfg_steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, frac))))


def heldout_loss(model: torch.nn.Module, stream: np.ndarray, seq_len: int, n: int = 8) -> float:
    """Mean next-token CE over ``n`` fixed windows of the held-out stream."""
    gen = torch.Generator().manual_seed(1234)
    ids = sample_windows(stream, n, seq_len, gen)
    model.eval()
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss
    model.train()
    return float(loss)


def train_target(
    train_ids: np.ndarray,
    heldout_ids: np.ndarray,
    vocab_size: int,
    eos_id: int,
    cfg: TargetTrainConfig,
    out: Path,
    log: Callable[[str], None] = print,
    name: str = "target",
) -> torch.nn.Module:
    """Train from scratch; saves ``out`` with ``save_pretrained`` (safetensors) and returns it.

    ``name`` labels the log lines (``target`` or ``assistant``)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(cfg.seed)
    model = Qwen3ForCausalLM(make_target_config(vocab_size, cfg, eos_id))
    params = sum(p.numel() for p in model.parameters())
    log(f"{name}: {params / 1e6:.2f}M params, {cfg.steps} steps of {cfg.batch_size}x{cfg.seq_len}")
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    model.train()
    t0 = time.time()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.warmup, cfg.lr)
        ids = sample_windows(train_ids, cfg.batch_size, cfg.seq_len, gen)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == cfg.steps - 1:
            msg = f"{name} step {step} loss {float(loss.detach()):.3f} ({time.time() - t0:.0f}s)"
            if step % 250 == 0 or step == cfg.steps - 1:
                msg += f" held-out {heldout_loss(model, heldout_ids, cfg.seq_len):.3f}"
            log(msg)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    return model
