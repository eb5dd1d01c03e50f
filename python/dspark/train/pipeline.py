"""``python -m dspark.train``: run the stages (tokenizer, target, drafter, confidence,
assistant) into one directory.

Layout written: ``OUT/target/`` (HF Qwen3 checkpoint + ``tokenizer.json``), ``OUT/drafter/``
(DeepSpec-format DSpark checkpoint), ``OUT/heldout_prompts.json`` (the first 2000 characters of
every held-out file) and ``OUT/heldout_chunks.json`` (all of them, in 2000-character pieces, for
``dspark calibrate --prompts``; see :func:`dspark.train.corpus.heldout_chunks`). ``--smoke`` runs
every stage for a few steps on a tiny slice (used by the test suite so the scripts cannot rot).

The ``extend`` stage continues both models on windows of mixed length up to 4,096 tokens
(:mod:`dspark.train.extend`); the whole pipeline (``all``) extends the target right after its
stage and the drafter after the drafter stage, so the drafter learns the extended target. The
``confidence`` stage refits the confidence head of ``OUT/drafter`` alone (every other tensor
stays as it is) on the label greedy serving sees, on text neither model was trained on
(:mod:`dspark.train.confidence`). ``--confidence-label`` picks the ``drafter`` stage's label in
the joint objective (default ``t1``, the original recipe).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from dspark.train.objective import CONFIDENCE_LABELS

__all__ = ["main"]


def _log_to(path: Path | None):  # type: ignore[no-untyped-def]
    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        if path is not None:
            with path.open("a") as f:
                f.write(line + "\n")

    return log


def _share(text: str) -> float:
    """An argparse type: a float in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not in [0, 1]")
    return value


def _positive(text: str) -> float:
    """An argparse type: a float above 0."""
    value = float(text)
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dspark.train", description=__doc__)
    p.add_argument("out", type=Path, help="output directory")
    p.add_argument(
        "--stage",
        choices=["all", "target", "drafter", "extend", "confidence", "assistant"],
        default="all",
        help="all = target, its long-context extension, drafter, its long-context extension, "
        "confidence (refit the drafter's confidence head alone for greedy serving), then the "
        "assistant (HF assisted-generation baseline); extend = both extensions",
    )
    p.add_argument("--smoke", action="store_true", help="a few steps on a tiny slice")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--vocab-size", type=int, default=3000, help="BPE vocabulary (logical)")
    p.add_argument("--target-steps", type=int, default=None)
    p.add_argument("--target-layers", type=int, default=None, help="target decoder layers")
    p.add_argument("--drafter-steps", type=int, default=None)
    p.add_argument(
        "--extend-steps",
        type=int,
        nargs=2,
        default=None,
        metavar=("TARGET", "DRAFTER"),
        help="long-context stage: target and drafter steps (0 skips that model)",
    )
    p.add_argument(
        "--extend-short-share",
        type=_share,
        default=None,
        help="long-context stage: share of drafter steps on the first stage's short windows",
    )
    p.add_argument(
        "--extend-drafter-lr",
        type=_positive,
        default=None,
        help="long-context stage: the drafter's peak learning rate (a second run continues "
        "from the first one's drafter on a fresh cosine)",
    )
    p.add_argument(
        "--confidence-label",
        choices=list(CONFIDENCE_LABELS),
        default="t1",
        help="the drafter stage's confidence label (joint objective): t1 = 1 - TV(q, p_t), the "
        "acceptance probability at T = 1 (default, the original recipe); greedy = accepted by "
        "greedy verification, on the slots it reaches. The confidence stage always fits greedy",
    )
    p.add_argument(
        "--confidence-sequences",
        type=int,
        default=None,
        help="greedy continuations the confidence stage fits on (default 1024)",
    )
    p.add_argument("--assistant-steps", type=int, default=None)
    p.add_argument("--stdlib", type=Path, default=None, help="corpus root (default: stdlib)")
    return p


def _prepare(args: argparse.Namespace, log) -> tuple:  # type: ignore[no-untyped-def]
    from dspark.train.corpus import heldout_chunks, load_corpus
    from dspark.train.tokenizer import encode_documents, train_tokenizer

    corpus = load_corpus(
        args.stdlib,
        seed=args.seed,
        max_files=30 if args.smoke else None,
        max_chars_per_file=20_000 if args.smoke else 200_000,
        heldout_percent=20 if args.smoke else 8,
    )
    log(f"corpus: {len(corpus.train)} train files, {len(corpus.heldout)} held-out files")
    target_dir = args.out / "target"
    tok = train_tokenizer(corpus.train, 400 if args.smoke else args.vocab_size, target_dir)
    train_ids = encode_documents(tok, corpus.train)
    heldout_ids = encode_documents(tok, corpus.heldout)
    log(f"tokenizer: {tok.get_vocab_size()} tokens; {len(train_ids)} train ids")  # type: ignore[attr-defined]
    prompts = [t[:2000] for t in corpus.heldout]
    (args.out / "heldout_prompts.json").write_text(
        json.dumps({"files": corpus.heldout_files, "texts": prompts}, indent=0)
    )
    (args.out / "heldout_chunks.json").write_text(
        json.dumps({"files": corpus.heldout_files, "texts": heldout_chunks(corpus.heldout)})
    )
    return tok, train_ids, heldout_ids


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    import torch

    args = _parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    log = _log_to(args.out / "train.log")
    tok, train_ids, heldout_ids = _prepare(args, log)
    from dspark.train.corpus import SEPARATOR

    eos = tok.token_to_id(SEPARATOR)
    vocab = tok.get_vocab_size()
    if args.stage in ("all", "target"):
        from dspark.train.target import TargetTrainConfig, train_target

        cfg = TargetTrainConfig(seed=args.seed)
        if args.smoke:
            cfg = replace(
                cfg,
                hidden_size=64,
                num_layers=4,
                num_heads=2,
                head_dim=32,
                intermediate_size=128,
                seq_len=64,
                batch_size=4,
                steps=3,
                warmup=1,
            )
        if args.target_steps is not None:
            cfg = replace(cfg, steps=args.target_steps)
        if args.target_layers is not None:
            cfg = replace(cfg, num_layers=args.target_layers)
        train_target(train_ids, heldout_ids, vocab, eos, cfg, args.out / "target", log)
    from dspark.train.extend import run_extend_stage

    if args.stage == "all":  # the target reaches long contexts before the drafter learns it
        run_extend_stage(args, train_ids, heldout_ids, log, parts=("target",))
    if args.stage in ("all", "drafter"):
        from dspark.train.drafter import run_drafter_stage

        run_drafter_stage(args, train_ids, heldout_ids, vocab, log)
    if args.stage in ("all", "extend"):
        parts = ("drafter",) if args.stage == "all" else ("target", "drafter")
        run_extend_stage(args, train_ids, heldout_ids, log, parts=parts)
    if args.stage in ("all", "confidence"):
        from dspark.train.confidence import run_confidence_stage

        run_confidence_stage(args, tok, log)
    if args.stage in ("all", "assistant"):
        from dspark.train.target import assistant_config, train_target

        cfg = assistant_config(args.seed, smoke=args.smoke)
        if args.assistant_steps is not None:
            cfg = replace(cfg, steps=args.assistant_steps)
        out = args.out / "assistant"
        train_target(train_ids, heldout_ids, vocab, eos, cfg, out, log, "assistant")
    return 0


if __name__ == "__main__":
    sys.exit(main())
