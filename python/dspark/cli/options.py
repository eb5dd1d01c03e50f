"""Option types and shared options of the ``dspark`` commands.

Every type raises ``argparse.ArgumentTypeError``, which argparse turns into a one-line usage
error (exit code 2); :func:`read_prompt` raises typed dspark errors (exit code 1).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from dspark._errors import raise_error
from dspark._native import InputError

__all__ = [
    "MAX_PROMPT_BYTES",
    "add_sampling_arguments",
    "existing_file",
    "positive_int",
    "prompt_text",
    "read_prompt",
    "seed_int",
    "temperature",
    "threshold",
    "top_p",
    "verify_mode",
]

# -- option types --------------------------------------------------------------------------


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def seed_int(text: str) -> int:
    """A seed in ``[0, 2**63)``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**63), got {value}")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def temperature(text: str) -> float:
    """A finite temperature >= 0 (0 = greedy)."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def top_p(text: str) -> float:
    """A nucleus mass in ``(0, 1]``."""
    value = _float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def verify_mode(text: str) -> str | float:
    """``full``, ``scheduled``, or a confidence threshold in ``[0, 1]``."""
    if text in ("full", "scheduled"):
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'full', 'scheduled' or a confidence threshold in [0, 1], got {text!r}"
        ) from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a threshold must be in [0, 1], got {value}")
    return value


def threshold(text: str) -> float:
    """A confidence threshold in ``[0, 1]``."""
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a threshold must be in [0, 1], got {value}")
    return value


def prompt_text(text: str) -> str:
    """A non-empty prompt that is valid UTF-8 (argv bytes that are not arrive as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("the prompt is not valid UTF-8") from None
    if not text:
        raise argparse.ArgumentTypeError("the prompt is empty")
    return text


def existing_file(text: str) -> Path:
    """A path to an existing regular file."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return path


# -- shared options ------------------------------------------------------------------------


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """``--temperature``, ``--top-p`` and ``--seed``: shared by ``generate`` and ``demo``."""
    p.add_argument(
        "--temperature", type=temperature, default=0.0, metavar="T", help="0 = greedy (default)"
    )
    p.add_argument("--top-p", type=top_p, default=None, metavar="P", help="nucleus sampling mass")
    p.add_argument("--seed", type=seed_int, default=0, metavar="S", help="random seed (default 0)")


# -- prompt files --------------------------------------------------------------------------


#: The largest prompt file read (a prompt, not a corpus).
MAX_PROMPT_BYTES = 16 * 2**20


def read_prompt(path: Path) -> str:
    """The UTF-8 text of ``path`` (``InputError`` ``invalid-argument`` if it is not UTF-8,
    ``too-large`` above :data:`MAX_PROMPT_BYTES`; nothing larger is read)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PROMPT_BYTES + 1)
    except OSError as exc:
        raise_error(InputError, "invalid-argument", f"{path}: cannot read the prompt: {exc}")
    if len(data) > MAX_PROMPT_BYTES:
        raise_error(
            InputError, "too-large", f"{path}: the prompt file is over {MAX_PROMPT_BYTES} bytes"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise_error(
            InputError,
            "invalid-argument",
            f"{path}: the prompt is not valid UTF-8 (byte {exc.start}: {exc.reason})",
        )
    if not text:
        raise_error(InputError, "invalid-argument", f"{path}: the prompt file is empty")
    return text
