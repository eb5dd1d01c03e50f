"""The ``dspark`` command line: one module per command, this one assembles and runs them.

Commands (each module holds ``HELP``, ``DESCRIPTION``, ``add_arguments(parser)`` and
``main(args) -> exit code``):

* ``inspect`` (:mod:`dspark.cli.inspect`): will a drafter checkpoint load against a target;
* ``make-example`` (:mod:`dspark.cli.make_example`): write a small random pair;
* ``demo`` (:mod:`dspark.cli.demo`): the bundled pair against target-only decoding;
* ``generate`` (:mod:`dspark.cli.generate`): your own HF target and DSpark drafter;
* ``calibrate`` (:mod:`dspark.cli.calibrate`): fit the confidence head's temperatures (STS);
* ``serve`` (:mod:`dspark.cli.serve`): the OpenAI-compatible HTTP server (its options are
  parsed by the Rust server itself).

Exit codes: 0 when the command succeeded (for ``inspect``: the drafter will load), 1 when it
did not (the drafter will not load, a model failed to load, the input was refused), 2 on a usage
error. Bad input never prints a traceback: every error is one line on stderr,
``dspark: error [CODE]: MESSAGE``, where CODE is the ``.code`` of the dspark error (``usage`` for
usage errors, ``missing-dependency`` when torch or transformers are not installed, ``internal``
for anything unexpected; set ``DSPARK_TRACEBACK=1`` to see its traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, Protocol, cast

from dspark._native import DSparkError
from dspark.cli.errors import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_USAGE, error_line, fail

__all__ = ["COMMANDS", "build_parser", "main"]

#: Command name -> the module that implements it, in the order ``dspark --help`` lists them.
COMMANDS: dict[str, str] = {
    "inspect": "dspark.cli.inspect",
    "make-example": "dspark.cli.make_example",
    "demo": "dspark.cli.demo",
    "generate": "dspark.cli.generate",
    "calibrate": "dspark.cli.calibrate",
    "serve": "dspark.cli.serve",
}


class Command(Protocol):
    """What a command module provides."""

    HELP: str
    DESCRIPTION: str | None

    def add_arguments(self, p: argparse.ArgumentParser) -> None: ...

    def main(self, args: argparse.Namespace) -> int: ...


def _command(name: str) -> Command:
    return cast(Command, importlib.import_module(COMMANDS[name]))


class _Parser(argparse.ArgumentParser):
    """argparse that exits with code 2 and a one-line message (never a traceback)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(error_line("usage", f"{message} (see: {self.prog} --help)"))
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    """The ``dspark`` parser with every command of :data:`COMMANDS`."""
    parser = _Parser(prog="dspark", description="DSpark speculative decoding core.")
    parser.add_argument(
        "-V",
        "--version",
        action="version",
        version=_version(),
        help="print dspark's version and build (CPU or CUDA) and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        command = _command(name)
        p = sub.add_parser(name, help=command.HELP, description=command.DESCRIPTION)
        command.add_arguments(p)
    return parser


def _version() -> str:
    """``dspark 0.1.0 (the CPU build, AVX2 kernels)``-style: the version and what was built."""
    from dspark import __version__, build_info

    info = build_info()
    build = "CUDA" if info.get("cuda") else "CPU"
    return f"dspark {__version__} ({build} build, {info.get('cpu_kernel', '?')} CPU kernels)"


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; returns its exit code."""
    name = str(args.command)
    if name not in COMMANDS:
        return fail("usage", f"unknown command {name!r}", EXIT_USAGE)
    return _command(name).main(args)


def _safe_streams() -> None:
    """Never die on text the terminal cannot encode: replace what it cannot show."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure: Callable[..., object] | None = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError, TypeError):
                pass


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dspark`` console script; returns the exit code (130 on Ctrl-C,
    whenever it comes: one line on stderr, no traceback)."""
    _safe_streams()
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["serve"]:
        # The Rust server parses its own options (one --help text with the binary).
        from dspark.cli.serve import run

        return run(given[1:])
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help exits 0, errors exit 2
        return int(exc.code or 0)
    except KeyboardInterrupt:
        return fail("interrupted", "interrupted", EXIT_INTERRUPTED)
    try:
        return _run(args)
    except DSparkError as exc:
        return fail(getattr(exc, "code", None) or "error", exc)
    except ImportError as exc:
        return fail(
            "missing-dependency",
            f"{exc} (dspark {args.command} needs torch, transformers and tokenizers: "
            "pip install 'dspark[torch]')",
        )
    except KeyboardInterrupt:
        return fail("interrupted", "interrupted", EXIT_INTERRUPTED)
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
        return fail("io", exc)
    except Exception as exc:
        if os.environ.get("DSPARK_TRACEBACK"):
            raise
        return fail(
            "internal",
            f"{type(exc).__name__}: {exc} (a bug in dspark; DSPARK_TRACEBACK=1 shows where)",
        )
