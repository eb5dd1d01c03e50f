"""``dspark make-example``: write a small random, loadable target + DSpark drafter pair.

The pair (:func:`dspark.example.write_example`) is ``DIR/target`` (an HF ``Qwen3ForCausalLM``
with weights, ``tokenizer.json`` and generation config) and ``DIR/drafter`` (a DSpark checkpoint
in the chosen vocabulary layout). Its weights are random: it loads and decodes losslessly, and
its acceptance length is about 1.

To add an option: declare it in :func:`add_arguments` and act on it in :func:`main`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dspark.cli.errors import EXIT_OK

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "main"]

HELP = "write a small random, loadable target + DSpark drafter pair to a directory"
DESCRIPTION: str | None = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``dspark make-example`` options."""
    p.add_argument("dir", type=Path, help="output directory (created)")
    p.add_argument(
        "--layout",
        choices=["padded", "full", "reduced"],
        default="padded",
        help="draft vocabulary layout (default: padded)",
    )
    p.add_argument("--seed", type=int, default=0, help="weight seed")


def main(args: argparse.Namespace) -> int:
    """Write the pair and say how to try it."""
    from dspark.example import write_example

    root = write_example(args.dir, args.layout, args.seed)
    print(
        f"wrote {root / 'drafter'} and {root / 'target'} ({args.layout} vocabulary, random "
        f"weights; try: dspark generate --target {root / 'target'} --drafter "
        f"{root / 'drafter'} --prompt 'def f(x):')"
    )
    return EXIT_OK
