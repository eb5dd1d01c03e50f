"""Confidence stage: refit a trained drafter's confidence head, alone, for greedy serving.

The confidence head's ``c_k`` is meant to be P(slot k accepted | slots < k accepted), the number
the threshold policy and the scheduler act on. The joint objective's default label (``t1``,
``1 - TV(q, p_t)``) is that probability for sampling at T = 1; under greedy verification a
slot is accepted iff its argmax is the target's, far more often (0.7-0.8 against raw
confidences of ~0.35 on the bundled pair), a bias no per-position temperature (STS) can remove.
This stage refits the head on the greedy label instead, every other weight frozen, so drafts
and acceptance stay bit for bit the same:

1. Text no model was trained on (:func:`dspark.train.corpus.load_calibration_texts`: standard
   library packages; the pair trains on top-level modules), cut into ``chunk_chars`` pieces.
2. Prompts as ``dspark calibrate`` makes them
   (:func:`dspark.confidence_records.prompt_windows`: each piece's first ``prompt_tokens``
   tokens, then every ``stride`` further), ``sequences`` of them drawn at random, each
   continued greedily by the target: what greedy speculative decoding commits, token for token.
3. On each continuation, the rounds a greedy serving loop generating ``new_tokens`` runs and
   the slots it verifies (:func:`dspark.train.objective.greedy_walk_samples`, which reproduces
   the engine's confidence records exactly): ``(head input, accepted, slot)``. Where rounds
   start matters: a round starts right after the drafter's own miss, and the prompt's length
   and kind (file start or middle) move acceptance by 0.1 and more, so no drawn anchors.
4. The head is a logistic regression on its input: fitted by full-batch L-BFGS from zero (the
   BCE is convex in its weights, so this is the optimum on these samples, deterministically) on
   all but every ``validation_every``-th sequence; by-slot ECE on those is logged.
5. The head's two tensors are written into ``DRAFTER/model.safetensors``; every other tensor is
   copied from the file as it was.

Per-position temperatures (``dspark calibrate``) are fitted afterwards on served rounds.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from dspark.train.drafter_model import TrainableDrafter
from dspark.train.objective import confidence_loss, greedy_walk_samples

__all__ = [
    "CONFIDENCE_TENSORS",
    "ConfidenceTrainConfig",
    "calibration_by_slot",
    "collect_greedy_rounds",
    "fit_confidence_head",
    "run_confidence_stage",
    "save_confidence_head",
    "train_confidence",
]

#: The checkpoint tensors this stage writes (every other tensor is left as it is).
CONFIDENCE_TENSORS = ("confidence_head.proj.weight", "confidence_head.proj.bias")

SlotRow = tuple[int, float, float, float]


@dataclass(frozen=True)
class ConfidenceTrainConfig:
    """Data and fit of the confidence stage."""

    sequences: int = 1024  # prompts (greedy continuations) drawn from the calibration text
    chunk_chars: int = 2000  # pieces of each file (as heldout_prompts.json holds 2000 chars)
    prompt_tokens: int = 96  # dspark calibrate's defaults
    stride: int = 64
    new_tokens: int = 64
    batch_size: int = 8  # sequences per forward
    validation_every: int = 10  # every n-th sequence is kept out of the fit (logged); 0: none
    seed: int = 0
    balance_positions: bool = False  # weight every slot index equally (else every sample)
    max_iter: int = 500  # L-BFGS iterations
    l2: float = 0.0  # ridge on the head's weight


def calibration_prompts(
    tok: object, texts: list[str], cfg: ConfidenceTrainConfig, max_len: int | None = None
) -> list[list[int]]:
    """``cfg.sequences`` prompts (token ids) drawn with ``cfg.seed`` from the windows of the
    ``cfg.chunk_chars`` pieces of ``texts``, none longer than ``max_len``; in window order."""
    from dspark.confidence_records import prompt_windows

    pieces = [t[i : i + cfg.chunk_chars] for t in texts for i in range(0, len(t), cfg.chunk_chars)]
    pieces = [p for p in pieces if p.strip()]
    windows: list[list[int]] = []
    for enc in tok.encode_batch(pieces):  # type: ignore[attr-defined]
        windows.extend(prompt_windows(list(enc.ids), cfg.prompt_tokens, cfg.stride, max_len))
    pick = np.random.default_rng(cfg.seed).permutation(len(windows))[: cfg.sequences]
    return [windows[i] for i in sorted(pick)]


def collect_greedy_rounds(
    target: torch.nn.Module,
    model: TrainableDrafter,
    sequences: list[torch.Tensor],
    prompt_lens: list[int],
    new_tokens: int,
    batch_size: int,
    log: Callable[[str], None] = print,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, slot, seq)``: :func:`greedy_walk_samples` of every sequence (a prompt of
    ``prompt_lens[i]`` tokens continued greedily; sequences of equal length run batched) for a
    loop generating ``new_tokens``, and the index of each sample's sequence."""
    from dspark.train.drafter import target_features

    groups: dict[tuple[int, int], list[int]] = {}
    for i, (seq, p) in enumerate(zip(sequences, prompt_lens, strict=True)):
        groups.setdefault((p, int(seq.shape[0])), []).append(i)
    xs, ys, slots, seqs = [], [], [], []
    t0 = time.time()
    done = 0
    for (p, _), idx in sorted(groups.items()):
        for j in range(0, len(idx), batch_size):
            part = idx[j : j + batch_size]
            ids = torch.stack([sequences[i] for i in part])
            feats, logits = target_features(target, ids, model.shape.target_layer_ids)
            x, y, slot, row = greedy_walk_samples(model, feats, logits, ids, p, p + new_tokens - 2)
            xs.append(x)
            ys.append(y)
            slots.append(slot)
            seqs.append(torch.tensor(part)[row])
            done += len(part)
        n = sum(len(v) for v in ys)
        log(f"confidence: {done} sequences, {n} samples ({time.time() - t0:.0f}s)")
    return torch.cat(xs), torch.cat(ys), torch.cat(slots), torch.cat(seqs)


def fit_confidence_head(
    model: TrainableDrafter,
    x: torch.Tensor,
    y: torch.Tensor,
    slot: torch.Tensor,
    cfg: ConfidenceTrainConfig,
) -> dict[str, float]:
    """Fit ``model.confidence_head`` (a logistic regression on ``x``) from zero by full-batch
    L-BFGS; only its two tensors change. ``cfg.balance_positions`` weights every slot index
    equally. Returns the (weighted) BCE at zero and after."""
    head = model.confidence_head.proj
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
    weight = None
    if cfg.balance_positions:
        counts = torch.bincount(slot, minlength=model.shape.block_size).float()
        weight = (1.0 / counts.clamp_min(1.0))[slot]
    params = list(head.parameters())
    for p in params:
        p.requires_grad_(True)
    with torch.no_grad():
        before = float(confidence_loss(model, x, y, weight))
    opt = torch.optim.LBFGS(
        params,
        lr=1.0,
        max_iter=cfg.max_iter,
        history_size=20,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = confidence_loss(model, x, y, weight)
        if cfg.l2 > 0:
            loss = loss + cfg.l2 * head.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    for p in params:
        p.requires_grad_(False)
    with torch.no_grad():
        after = float(confidence_loss(model, x, y, weight))
    return {"bce_before": before, "bce_after": after}


def calibration_by_slot(
    model: TrainableDrafter, x: torch.Tensor, y: torch.Tensor, slot: torch.Tensor
) -> list[SlotRow]:
    """Per slot index: ``(samples, acceptance, mean confidence, ECE)`` of the head on these
    samples (10 equal-width bins, as ``dspark calibrate``)."""
    from dspark.sts import ece

    with torch.no_grad():
        c = torch.sigmoid(model.confidence_head.proj(x).squeeze(-1)).double().numpy()
    yy = y.double().numpy()
    rows: list[SlotRow] = []
    for k in range(model.shape.block_size):
        m = (slot == k).numpy()
        if not m.any():
            rows.append((0, float("nan"), float("nan"), float("nan")))
        else:
            rows.append((int(m.sum()), float(yy[m].mean()), float(c[m].mean()), ece(c[m], yy[m])))
    return rows


def format_slots(rows: list[SlotRow]) -> str:
    """One log line: ``pos: n, acceptance, mean confidence, ECE`` per slot (1-based)."""
    return " | ".join(
        f"{k + 1}: n {n} acc {a:.3f} c {c:.3f} ece {e:.3f}" for k, (n, a, c, e) in enumerate(rows)
    )


def save_confidence_head(model: TrainableDrafter, drafter_dir: Path) -> None:
    """Rewrite ``drafter_dir/model.safetensors`` with the model's confidence head tensors and
    every other tensor exactly as the file held it (``config.json`` is not touched)."""
    from safetensors.torch import load_file, save_file

    path = drafter_dir / "model.safetensors"
    tensors = load_file(str(path))
    own = model.state_dict()
    for name in CONFIDENCE_TENSORS:
        if name not in tensors or tensors[name].shape != own[name].shape:
            raise ValueError(f"{path}: no {name} of shape {tuple(own[name].shape)}")
        tensors[name] = own[name].detach().to(tensors[name].dtype).contiguous().clone()
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(path)


def train_confidence(
    target: torch.nn.Module,
    model: TrainableDrafter,
    prompts: list[list[int]],
    cfg: ConfidenceTrainConfig,
    out: Path | None,
    log: Callable[[str], None] = print,
) -> TrainableDrafter:
    """Refit ``model.confidence_head`` alone (see the module docstring) on greedy
    continuations of ``prompts``; with ``out``, write it into ``out/model.safetensors``."""
    from dspark.train.selfgen import greedy_continuations

    torch.manual_seed(cfg.seed)
    target.eval()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    t0 = time.time()
    k = model.shape.block_size
    # K more tokens than the loop generates: the last rounds' blocks have all their labels
    sequences = greedy_continuations(target, prompts, cfg.new_tokens + k)
    log(f"confidence: {len(sequences)} greedy continuations ({time.time() - t0:.0f}s)")
    x, y, slot, seq = collect_greedy_rounds(
        target, model, sequences, [len(q) for q in prompts], cfg.new_tokens, cfg.batch_size, log
    )
    n = cfg.validation_every
    val = seq % n == 0 if n > 0 else torch.zeros_like(seq, dtype=torch.bool)
    fit = ~val
    res = fit_confidence_head(model, x[fit], y[fit], slot[fit], cfg)
    log(
        f"confidence fit: {int(fit.sum())} samples, bce {res['bce_before']:.4f} -> "
        f"{res['bce_after']:.4f} ({time.time() - t0:.0f}s)"
    )
    rows = calibration_by_slot(model, x[fit], y[fit], slot[fit])
    log(f"confidence fit by slot: {format_slots(rows)}")
    if bool(val.any()):
        rows = calibration_by_slot(model, x[val], y[val], slot[val])
        log(f"confidence validation ({int(val.sum())} samples) by slot: {format_slots(rows)}")
    if out is not None:
        save_confidence_head(model, out)
    return model


def run_confidence_stage(args: argparse.Namespace, tok: object, log: Callable[[str], None]) -> None:
    """Load ``OUT/target`` and ``OUT/drafter``, refit the confidence head, rewrite it."""
    from transformers import Qwen3ForCausalLM

    from dspark.train.corpus import load_calibration_texts
    from dspark.train.drafter import load_drafter

    target = Qwen3ForCausalLM.from_pretrained(args.out / "target", torch_dtype=torch.float32)
    model = load_drafter(args.out / "drafter", target)
    cfg = ConfidenceTrainConfig(seed=args.seed)
    texts = load_calibration_texts(args.stdlib)
    if args.smoke:
        texts = texts[:4]
        cfg = replace(
            cfg,
            sequences=6,
            prompt_tokens=16,
            stride=16,
            new_tokens=12,
            chunk_chars=300,
            max_iter=20,
        )
    if args.confidence_sequences is not None:
        cfg = replace(cfg, sequences=args.confidence_sequences)
    max_pos = int(target.config.max_position_embeddings)
    max_len = max_pos - cfg.new_tokens - model.shape.block_size
    prompts = calibration_prompts(tok, texts, cfg, max_len)
    log(f"confidence config {asdict(cfg)}; {len(texts)} calibration files, {len(prompts)} prompts")
    train_confidence(target, model, prompts, cfg, args.out / "drafter", log)
