"""Long-context stage: extend a trained pair from 256-token windows to ``max_position_embeddings``.

Both models of the first stages see 256-token windows only; past that the target is out of
distribution and the drafter's acceptance collapses (τ 3.9 at 96 tokens of context, 1.4 at
1,500). This stage continues training both on windows of mixed length up to 4,096 tokens, as
large models get their long contexts (a short pre-training, then a long-context phase):

1. **Target** (:func:`extend_target`): next-token CE on batches of a fixed token budget, each
   batch one window length drawn from ``lengths`` (so rope and positions are exercised over the
   whole range). A window is a slice of the token stream of whole files joined by
   ``<|endoftext|>``: whole source files and concatenations of files. Lower learning rate than
   the first stage, from the first stage's weights.
2. **Drafter** (:func:`extend_drafter`): the drafter objective of :mod:`dspark.train.objective`
   on the extended target's own continuations of long prompts (a corpus prefix of ``L - gen``
   tokens, then ``gen`` tokens of the target, greedy and sampled), anchors in the last
   ``tail`` positions: where a served round starts after a long prompt. A ``short_share`` of
   the steps repeats the first stage's recipe (256-token windows, mostly the target's own
   continuations of 64-token prompts), so short contexts keep their acceptance.

Run with ``python -m dspark.train OUT --stage extend`` on a directory the first stages wrote;
then ``--stage confidence`` and ``dspark calibrate`` as before.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from dspark.train.drafter import DrafterTrainConfig, evaluate, save_drafter, train_step
from dspark.train.drafter_model import TrainableDrafter
from dspark.train.objective import LossWeights
from dspark.train.selfgen import generate_sequences
from dspark.train.target import lr_at, sample_windows

__all__ = [
    "ExtendConfig",
    "extend_drafter",
    "extend_target",
    "heldout_loss_by_depth",
    "run_extend_stage",
    "window_length",
]


@dataclass(frozen=True)
class ExtendConfig:
    """Schedule of the long-context stage."""

    lengths: tuple[int, ...] = (256, 512, 1024, 2048, 3072, 4096)
    tokens_per_batch: int = 8192  # target: every batch holds this many tokens
    target_steps: int = 300
    target_lr: float = 1e-3
    drafter_steps: int = 800
    drafter_lr: float = 5e-4
    drafter_tokens_per_batch: int = 8192
    warmup: int = 20
    short_share: float = 0.5  # drafter steps that repeat the first stage's recipe
    generated_per_length: int = 96  # long continuations per window length (drafter)
    generated_short: int = 1024  # short continuations (the first stage's recipe)
    gen_tokens: int = 192  # generated tokens at the end of every long window
    tail: int = 256  # long windows: anchors in the last `tail` positions
    short_len: int = 256  # the first stage's window (the short steps)
    seed: int = 0


def window_length(lengths: Sequence[int], gen: torch.Generator) -> int:
    """The window length of one batch, drawn uniformly from ``lengths``."""
    return int(lengths[int(torch.randint(0, len(lengths), (1,), generator=gen))])


def heldout_loss_by_depth(
    model: torch.nn.Module, stream: np.ndarray, seq_len: int, n: int = 4
) -> dict[str, float]:
    """Mean next-token CE on ``n`` fixed held-out windows of ``seq_len``, split by position:
    the first 256 positions and every later quarter of the window."""
    gen = torch.Generator().manual_seed(1234)
    ids = sample_windows(stream, n, seq_len, gen)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1].float()  # type: ignore[operator]
        ce = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none"
        ).view(n, seq_len - 1)
    model.train()
    out = {"0-256": float(ce[:, :256].mean())}
    edges = [256, *(seq_len * q // 4 for q in (1, 2, 3, 4))]
    for lo, hi in itertools.pairwise(edges):
        if hi > lo:
            out[f"{lo}-{hi}"] = float(ce[:, lo : hi - 1].mean())
    return {k: round(v, 3) for k, v in out.items()}


def extend_target(
    target: torch.nn.Module,
    train_ids: np.ndarray,
    heldout_ids: np.ndarray,
    cfg: ExtendConfig,
    log: Callable[[str], None] = print,
) -> None:
    """Continue training ``target`` (in place) on mixed-length windows."""
    torch.manual_seed(cfg.seed)
    longest = max(cfg.lengths)
    before = heldout_loss_by_depth(target, heldout_ids, longest)
    log(f"extend target: before, held-out CE by depth {before}")
    decay = [p for p in target.parameters() if p.ndim >= 2]
    no_decay = [p for p in target.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0}],
        lr=cfg.target_lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(cfg.seed + 7)
    target.train()
    t0 = time.time()
    for step in range(cfg.target_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.target_steps, cfg.warmup, cfg.target_lr)
        length = window_length(cfg.lengths, gen)
        ids = sample_windows(train_ids, max(1, cfg.tokens_per_batch // length), length, gen)
        loss = target(input_ids=ids, labels=ids).loss  # type: ignore[operator]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == cfg.target_steps - 1:
            took = time.time() - t0
            lv = float(loss.detach())
            log(f"extend target step {step} len {length} loss {lv:.3f} ({took:.0f}s)")
    target.eval()
    after = heldout_loss_by_depth(target, heldout_ids, longest)
    log(f"extend target: after, held-out CE by depth {after}")


def _long_pools(
    target: torch.nn.Module, train_ids: np.ndarray, cfg: ExtendConfig, log: Callable[[str], None]
) -> dict[int, torch.Tensor]:
    """Per window length ``L`` of ``lengths``: ``[generated_per_length, L]`` corpus prefixes of
    ``L - gen_tokens`` continued by the target (half greedy, half sampled)."""
    pools: dict[int, torch.Tensor] = {}
    t0 = time.time()
    for length in cfg.lengths:
        if length <= cfg.gen_tokens:
            raise ValueError(f"window length {length} leaves no prompt before {cfg.gen_tokens}")
        prompt = length - cfg.gen_tokens
        batch = max(1, min(16, 16384 // length))
        pools[length] = generate_sequences(
            target,
            train_ids,
            cfg.generated_per_length,
            prompt,
            length,
            batch=batch,
            seed=cfg.seed + length,
        )
        took = time.time() - t0
        n = cfg.generated_per_length
        log(f"extend drafter: {n} continuations of {prompt}-token prompts ({took:.0f}s)")
    return pools


def extend_drafter(
    model: TrainableDrafter,
    target: torch.nn.Module,
    train_ids: np.ndarray,
    heldout_ids: np.ndarray,
    cfg: ExtendConfig,
    save: Callable[[TrainableDrafter], None],
    log: Callable[[str], None] = print,
) -> None:
    """Continue training ``model`` (in place) on long windows and, for ``short_share`` of the
    steps, on the first stage's short ones; ``save`` is called at every evaluation."""
    short = DrafterTrainConfig(seed=cfg.seed, seq_len=cfg.short_len, prompt_len=cfg.short_len // 4)
    w = LossWeights(conf_label=short.confidence_label)
    torch.manual_seed(cfg.seed)
    target.eval()
    t0 = time.time()
    short_pool = generate_sequences(
        target, train_ids, cfg.generated_short, short.prompt_len, short.seq_len, seed=cfg.seed
    )
    log(f"extend drafter: {cfg.generated_short} short continuations ({time.time() - t0:.0f}s)")
    pools = _long_pools(target, train_ids, cfg, log)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.drafter_lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed + 11)
    long_lengths = sorted(pools)
    for step in range(cfg.drafter_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.drafter_steps, cfg.warmup, cfg.drafter_lr)
        if not long_lengths or float(torch.rand(1, generator=gen)) < cfg.short_share:
            ids = sample_windows(train_ids, short.batch_size, short.seq_len, gen)
            n_gen = round(short.batch_size * short.generated_share)
            pick = torch.randint(0, short_pool.shape[0], (n_gen,), generator=gen)
            ids[:n_gen] = short_pool[pick]
            first = 1
        else:
            length = window_length(long_lengths, gen)
            rows = max(1, cfg.drafter_tokens_per_batch // length)
            pool = pools[length]
            pick = torch.randint(0, pool.shape[0], (rows,), generator=gen)
            ids = pool[pick]
            first = max(1, length - cfg.tail)
        lv, parts = train_step(model, target, ids, opt, short, gen, w, first=first)
        if step % 25 == 0 or step == cfg.drafter_steps - 1:
            msg = " ".join(f"{k} {v:.3f}" for k, v in parts.items())
            took = time.time() - t0
            log(f"extend drafter step {step} len {ids.shape[1]} loss {lv:.3f} {msg} ({took:.0f}s)")
        if step % 250 == 0 or step == cfg.drafter_steps - 1:
            log(f"extend drafter held-out (256) {evaluate(model, target, heldout_ids, short, w)}")
            save(model)


def run_extend_stage(
    args: argparse.Namespace,
    train_ids: np.ndarray,
    heldout_ids: np.ndarray,
    log: Callable[[str], None],
    parts: Sequence[str] = ("target", "drafter"),
) -> None:
    """Extend ``OUT/target`` then ``OUT/drafter`` in place (each saved when its part ends);
    ``parts`` names which of the two run (the whole pipeline extends the target before the
    drafter stage, and the drafter after it: the drafter learns the extended target)."""
    from transformers import Qwen3ForCausalLM

    from dspark.train.drafter import load_drafter

    cfg = ExtendConfig(seed=args.seed)
    if args.smoke:
        cfg = replace(
            cfg,
            lengths=(32, 48, 64),
            tokens_per_batch=128,
            drafter_tokens_per_batch=128,
            target_steps=2,
            drafter_steps=6,
            warmup=1,
            generated_per_length=2,
            generated_short=2,
            gen_tokens=16,
            tail=24,
            short_len=32,
        )
    if args.extend_steps is not None:
        cfg = replace(cfg, target_steps=args.extend_steps[0], drafter_steps=args.extend_steps[1])
    if args.extend_short_share is not None:
        cfg = replace(cfg, short_share=args.extend_short_share)
    if args.extend_drafter_lr is not None:
        cfg = replace(cfg, drafter_lr=args.extend_drafter_lr)
    log(f"extend config {asdict(cfg)}")
    target_dir, drafter_dir = args.out / "target", args.out / "drafter"
    target = Qwen3ForCausalLM.from_pretrained(target_dir, torch_dtype=torch.float32)
    t0 = time.time()
    if "target" in parts and cfg.target_steps > 0:
        extend_target(target, train_ids, heldout_ids, cfg, log)
        target.save_pretrained(target_dir, safe_serialization=True)
        log(f"extend target: {time.time() - t0:.0f}s")
    if "drafter" in parts and cfg.drafter_steps > 0:
        model = load_drafter(drafter_dir, target)
        model.embed_tokens.weight.requires_grad_(False)
        model.lm_head.weight.requires_grad_(False)
        conf = json.loads((drafter_dir / "config.json").read_text())
        dcfg = DrafterTrainConfig(
            num_layers=model.shape.num_layers,
            block_size=model.shape.block_size,
            markov_rank=model.shape.markov_rank,
            num_anchors=int(conf.get("num_anchors", DrafterTrainConfig.num_anchors)),
        )
        t1 = time.time()
        extend_drafter(
            model,
            target,
            train_ids,
            heldout_ids,
            cfg,
            lambda m: save_drafter(m, target, dcfg, drafter_dir),
            log,
        )
        save_drafter(model, target, dcfg, drafter_dir)
        log(f"extend drafter: {time.time() - t1:.0f}s")
