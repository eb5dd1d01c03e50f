"""``dspark serve``: the OpenAI-compatible HTTP server (the Rust ``dspark-server`` crate).

One implementation: the extension runs the Rust server on this thread with the GIL released,
so ``dspark serve --help`` and ``cargo run --release -p dspark-server -- --help`` print the same
text (the options are parsed in Rust, never by argparse). Without ``--target`` and
``--drafter`` it serves the bundled pair. SIGTERM or Ctrl-C stop it gracefully (exit 0).
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence

from dspark import _native
from dspark.bundled import bundled_dir

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "main", "run"]

HELP = "serve the pair over an OpenAI-compatible HTTP API (dspark serve --help for options)"
DESCRIPTION = None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every argument goes to the Rust server as given (``dspark serve --help`` lists them)."""
    p.add_argument("args", nargs=argparse.REMAINDER, help="the server's options")


def run(argv: Sequence[str]) -> int:
    """Serve with ``argv`` (the arguments after ``serve``) until stopped; the exit code.

    While the server runs, Ctrl-C belongs to it (Python's SIGINT handler is set aside, so the
    server's graceful shutdown, not ``KeyboardInterrupt``, answers it) and is restored after.
    """
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL) if main_thread else None
    try:
        return _native.serve(list(argv), str(bundled_dir()))
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def main(args: argparse.Namespace) -> int:
    """``dspark serve`` parsed by argparse (normally :func:`dspark.cli.main` calls :func:`run`
    directly, so that ``--help`` reaches the server)."""
    return run(list(args.args))
