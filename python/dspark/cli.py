"""The ``dspark`` command line.

Exit codes: 0 when the command succeeded (for ``inspect``: the drafter will load), 1 when it
did not (the drafter will not load, a model failed to load, the input was refused), 2 on a usage
error. Bad input never prints a traceback: every error is one line on stderr,
``dspark: error [CODE]: MESSAGE``, where CODE is the ``.code`` of the dspark error (``usage`` for
usage errors, ``missing-dependency`` when torch or transformers are not installed, ``internal``
for anything unexpected; set ``DSPARK_TRACEBACK=1`` to see its traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dspark._native import DSparkError, inspect

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _error_line(code: str, message: object) -> str:
    text = " ".join(str(message).split()) or "(no message)"
    return f"dspark: error [{code}]: {text}\n"


def _fail(code: str, message: object, exit_code: int = EXIT_FAIL) -> int:
    sys.stderr.write(_error_line(code, message))
    sys.stderr.flush()
    return exit_code


class _Parser(argparse.ArgumentParser):
    """argparse that exits with code 2 and a one-line message (never a traceback)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(_error_line("usage", f"{message} (see: {self.prog} --help)"))
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
        help="write a small random, loadable target + DSpark drafter pair to a directory (or,"
        " with --memory-bound, the bundled pair's function at a 0.6 B model's cost)",
    )
    e.add_argument("dir", type=Path, help="output directory (created)")
    e.add_argument(
        "--layout",
        choices=["padded", "full", "reduced"],
        default=None,
        help="draft vocabulary layout (default: padded)",
    )
    e.add_argument("--seed", type=int, default=None, help="weight seed (default: 0)")
    from dspark.memory_bound import MAX_JITTER, jitter_arg

    e.add_argument(
        "--memory-bound",
        action="store_true",
        help="instead, the bundled pair's exact function at a 0.6 B model's cost (a Qwen3 target"
        " with Qwen3-0.6B's widths, 0.62 B parameters, and its DSpark drafter; a few GB)",
    )
    e.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="with --memory-bound: weight dtype (default: float32)",
    )
    e.add_argument(
        "--jitter",
        type=jitter_arg,
        default=None,
        metavar="EPS",
        help="with --memory-bound: replace every zero weight by a value of size EPS in "
        f"(0, {MAX_JITTER:g}] (same speed, same greedy tokens)",
    )
    from dspark.demo import add_arguments as add_demo_arguments

    d = sub.add_parser(
        "demo",
        help="speculative decoding with the bundled tiny model pair (needs torch, transformers)",
        description="Continues held-out prompts (by default the first 8: code the bundled pair "
        "never trained on) with the bundled target + DSpark drafter, streaming each "
        "continuation with the accepted drafts marked, then decodes them again with the target "
        "alone and reports the aggregate acceptance length, per-position acceptance, tokens/s "
        "of both and the speed-up, all measured in this run.",
    )
    add_demo_arguments(d)
    from dspark.generate import add_arguments as add_generate_arguments

    g = sub.add_parser(
        "generate",
        help="speculative decoding with your own HF target + DSpark drafter (needs torch)",
        description="Checks the pair as dspark inspect does, loads it through the Python API "
        "(transformers target, dspark.Drafter, dspark.Speculator), streams the continuation to "
        "stdout and reports acceptance length and tokens/s on stderr.",
    )
    add_generate_arguments(g)
    from dspark.calibrate import add_arguments as add_calibrate_arguments

    c = sub.add_parser(
        "calibrate",
        help="fit per-position confidence temperatures (STS) for a drafter, judged on held-out "
        "prompts",
        description="Runs full-verification speculative decoding over held-out prompt windows "
        "with confidence recording, fits one temperature per draft position on half of the "
        "texts (binary NLL of sigmoid(logit(c)/T)) and reports ECE before and after on the "
        "other half. Writes a JSON {temperatures: [...], ...} (the engine's STS format) to --out "
        "(default DRAFTER/sts.json).",
    )
    add_calibrate_arguments(c)
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
    for path in (args.draft, args.target):
        if path is not None and not path.exists():
            return _fail("usage", f"{path}: no such file or directory", EXIT_USAGE)
    report = inspect(args.draft, args.target).to_dict()
    if args.json:
        print(json.dumps(report, sort_keys=False))
    else:
        print(format_report(report))
    return EXIT_OK if report["ok"] else EXIT_FAIL


def _run(args: argparse.Namespace) -> int:
    if args.command == "inspect":
        return _cmd_inspect(args)
    if args.command == "make-example" and args.memory_bound:
        from dspark import memory_bound

        if args.layout is not None or args.seed is not None:
            return _fail("usage", "--layout and --seed do not apply to --memory-bound", EXIT_USAGE)
        memory_bound.check_output_dir(args.dir)
        pair = memory_bound.write_memory_bound(
            args.dir, dtype=args.dtype or "float32", jitter=args.jitter
        )
        print(memory_bound.describe(pair))
        return EXIT_OK
    if args.command == "make-example":
        from dspark.example import write_example

        if args.dtype is not None or args.jitter is not None:
            return _fail("usage", "--dtype and --jitter need --memory-bound", EXIT_USAGE)
        args.layout = args.layout or "padded"
        root = write_example(args.dir, args.layout, args.seed or 0)
        print(
            f"wrote {root / 'drafter'} and {root / 'target'} ({args.layout} vocabulary, random "
            f"weights; try: dspark generate --target {root / 'target'} --drafter "
            f"{root / 'drafter'} --prompt 'def f(x):')"
        )
        return EXIT_OK
    if args.command == "demo":
        from dspark.demo import run

        run(args)
        return EXIT_OK
    if args.command == "calibrate":
        from dspark.calibrate import run as run_calibrate

        return run_calibrate(args)
    if args.command == "generate":
        from dspark.generate import run as run_generate

        run_generate(args)
        return EXIT_OK
    return _fail("usage", f"unknown command {args.command!r}", EXIT_USAGE)


def _safe_streams() -> None:
    """Never die on text the terminal cannot encode: replace what it cannot show."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError, TypeError):
                pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dspark`` console script; returns the exit code."""
    _safe_streams()
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help exits 0, errors exit 2
        return int(exc.code or 0)
    try:
        return _run(args)
    except DSparkError as exc:
        return _fail(getattr(exc, "code", None) or "error", exc)
    except ImportError as exc:
        return _fail(
            "missing-dependency",
            f"{exc} (dspark {args.command} needs torch, transformers and tokenizers: "
            "pip install 'dspark[torch]')",
        )
    except KeyboardInterrupt:
        return _fail("interrupted", "interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        # The reader went away (`dspark demo | head`): stop quietly.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return EXIT_FAIL
    except OSError as exc:
        return _fail("io", exc)
    except Exception as exc:
        if os.environ.get("DSPARK_TRACEBACK"):
            raise
        return _fail(
            "internal",
            f"{type(exc).__name__}: {exc} (a bug in dspark; DSPARK_TRACEBACK=1 shows where)",
        )


if __name__ == "__main__":
    sys.exit(main())
