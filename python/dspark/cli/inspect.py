"""``dspark inspect``: will a drafter checkpoint load against a target, and how.

Reads ``config.json`` files and safetensors headers only (never tensor data except the small
``d2t`` map), through :func:`dspark.inspect`, and prints the report as a short table or, with
``--json``, as the stable JSON object (``docs/cli.md``). Exit code 0: the drafter will load;
1: it will not.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from dspark._native import inspect
from dspark.cli.errors import EXIT_FAIL, EXIT_OK, EXIT_USAGE, fail

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "format_report", "main"]

HELP = "check whether a drafter checkpoint will load against a target, and how"
DESCRIPTION = (
    "Reads config.json files and safetensors headers only (never tensor data, except d2t)."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``dspark inspect`` options."""
    p.add_argument("draft", type=Path, help="drafter directory (or its config.json)")
    p.add_argument(
        "--target",
        type=Path,
        default=None,
        help="target directory with config.json, the file, or a Qwen3 GGUF file (default: the"
        " drafter's own config,"
        " as for DeepSeek-V4 in-checkpoint drafters)",
    )
    p.add_argument("--json", action="store_true", help="print the stable JSON report")


def _fmt(value: object) -> str:
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


def main(args: argparse.Namespace) -> int:
    """Run ``dspark inspect``; exit code 0 when the drafter will load, 1 when not."""
    for path in (args.draft, args.target):
        if path is not None and not path.exists():
            return fail("usage", f"{path}: no such file or directory", EXIT_USAGE)
    report = inspect(args.draft, args.target).to_dict()
    if args.json:
        print(json.dumps(report, sort_keys=False))
    else:
        print(format_report(report))
    return EXIT_OK if report["ok"] else EXIT_FAIL
