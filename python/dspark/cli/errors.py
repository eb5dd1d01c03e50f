"""Exit codes and the one-line error format of the ``dspark`` command line."""

from __future__ import annotations

import sys

__all__ = ["EXIT_FAIL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "error_line", "fail"]

#: The command succeeded (``inspect``: the drafter will load).
EXIT_OK = 0
#: It did not: a drafter that will not load, a model that failed to load, refused input.
EXIT_FAIL = 1
#: A usage error (bad command line).
EXIT_USAGE = 2
#: Interrupted (Ctrl-C).
EXIT_INTERRUPTED = 130


def error_line(code: str, message: object) -> str:
    """``dspark: error [CODE]: MESSAGE`` on one line (newlines in the message folded)."""
    text = " ".join(str(message).split()) or "(no message)"
    return f"dspark: error [{code}]: {text}\n"


def fail(code: str, message: object, exit_code: int = EXIT_FAIL) -> int:
    """Write :func:`error_line` to stderr; returns ``exit_code``."""
    sys.stderr.write(error_line(code, message))
    sys.stderr.flush()
    return exit_code
