"""The ``dspark`` command line.

Exit codes: 0 when the command succeeded (for ``inspect``: the drafter will load), 1 when it
did not (the drafter will not load), 2 on a usage error. Bad input never prints a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dspark._native import DSparkError, inspect

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that exits with code 2 and a one-line message (never a traceback)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dspark", description="DSpark speculative decoding core.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser(
        "inspect",
        help="check whether a drafter checkpoint will load against a target, and how",
        description=(
            "Reads config.json files and safetensors headers only (never tensor data, except d2t)."
        ),
    )
    p.add_argument("draft", type=Path, help="drafter directory (or its config.json)")
    p.add_argument(
        "--target",
        type=Path,
        default=None,
        help="target directory with config.json, or the file (default: the drafter's own config,"
        " as for DeepSeek-V4 in-checkpoint drafters)",
    )
    p.add_argument("--json", action="store_true", help="print the stable JSON report")
    e = sub.add_parser(
        "make-example",
        help="write a small random DSpark drafter + target config to a directory",
    )
    e.add_argument("dir", type=Path, help="output directory (created)")
    e.add_argument(
        "--layout",
        choices=["padded", "full", "reduced"],
        default="padded",
        help="draft vocabulary layout (default: padded)",
    )
    e.add_argument("--seed", type=int, default=0, help="weight seed")
    from dspark.demo import add_arguments as add_demo_arguments

    d = sub.add_parser(
        "demo",
        help="speculative decoding with the bundled tiny model pair (needs torch, transformers)",
        description="Streams speculative generation with the bundled target + DSpark drafter, "
        "then reports acceptance and tokens/s against target-only decoding in the same run.",
    )
    add_demo_arguments(d)
    return parser


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def format_report(report: dict[str, Any]) -> str:
    """The human form of an inspect report: a short table, then errors and warnings."""
    draft = report.get("draft") or {}
    vocab = report.get("vocab") or {}
    noise = report.get("noise_token") or {}
    shares = report.get("shares_target") or {}
    rows: list[tuple[str, str]] = [
        ("status", "OK: will load" if report["ok"] else "FAIL: will not load"),
        ("format", _fmt(draft.get("format"))),
        ("architecture", _fmt(draft.get("architecture"))),
        ("block size", _fmt(draft.get("block_size"))),
        ("markov rank", _fmt(draft.get("markov_rank"))),
        ("confidence head", _fmt(draft.get("confidence_head"))),
    ]
    if vocab:
        rows.append(
            (
                "vocab (in/draft/target)",
                f"{vocab['input']} / {vocab['draft']} / {vocab['target']} ({vocab['layout']}"
                + (", expanded input" if vocab["expanded_input"] else "")
                + ")",
            )
        )
    else:
        rows.append(("vocab (in/draft/target)", "-"))
    rows += [
        ("id map", _fmt(report.get("id_map"))),
        (
            "noise token",
            f"{noise['id']} (from {noise['source']})" if noise else "-",
        ),
        ("target layers", _fmt(report.get("target_layer_ids"))),
        ("capture layers", _fmt(report.get("capture_layer_ids"))),
        (
            "shares from target",
            ", ".join(k for k in ("embed_tokens", "lm_head") if shares.get(k)) or "nothing"
            if shares
            else "-",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    for title, key in (("errors", "errors"), ("warnings", "warnings")):
        items = report.get(key) or []
        if items:
            lines.append(f"{title}:")
            lines.extend(f"  [{it['code']}] {it['message']}" for it in items)
    return "\n".join(lines)


def _cmd_inspect(args: argparse.Namespace) -> int:
    if not args.draft.exists():
        sys.stderr.write(f"dspark inspect: error: {args.draft}: no such file or directory\n")
        return EXIT_USAGE
    if args.target is not None and not args.target.exists():
        sys.stderr.write(f"dspark inspect: error: {args.target}: no such file or directory\n")
        return EXIT_USAGE
    report = inspect(args.draft, args.target).to_dict()
    if args.json:
        print(json.dumps(report, sort_keys=False))
    else:
        print(format_report(report))
    return EXIT_OK if report["ok"] else EXIT_FAIL


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dspark`` console script; returns the exit code."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help exits 0, errors exit 2
        return int(exc.code or 0)
    try:
        if args.command == "inspect":
            return _cmd_inspect(args)
        if args.command == "make-example":
            from dspark.example import write_example

            root = write_example(args.dir, args.layout, args.seed)
            print(f"wrote {root / 'drafter'} and {root / 'target'} ({args.layout} vocabulary)")
            return EXIT_OK
        if args.command == "demo":
            from dspark.demo import run

            run(args)
            return EXIT_OK
    except ImportError as exc:
        sys.stderr.write(f"dspark: error: {exc} (dspark demo needs torch, transformers)\n")
        return EXIT_FAIL
    except ValueError as exc:
        sys.stderr.write(f"dspark: error: {exc}\n")
        return EXIT_USAGE
    except DSparkError as exc:
        sys.stderr.write(f"dspark: error [{getattr(exc, 'code', '?')}]: {exc}\n")
        return EXIT_FAIL
    except OSError as exc:
        sys.stderr.write(f"dspark: error: {exc}\n")
        return EXIT_FAIL
    parser.print_usage(sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
