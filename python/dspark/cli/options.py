"""Option types and shared options of the ``dspark`` commands.

Every numeric option is bounded at parse time: each type raises ``argparse.ArgumentTypeError``
outside its range, which argparse turns into a one-line usage error (exit code 2), before
anything loads. :func:`read_prompt` raises typed dspark errors (exit code 1).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from dspark._args import LIMITS
from dspark._errors import raise_error
from dspark._files import read_bytes
from dspark._native import InputError
from dspark._threads import available_cpus

__all__ = [
    "MAX_COUNT",
    "MAX_PROMPT_BYTES",
    "MAX_TEMPERATURE",
    "MAX_TOKENS",
    "add_pair_arguments",
    "add_sampling_arguments",
    "bounded_int",
    "existing_file",
    "positive_int",
    "prompt_text",
    "read_prompt",
    "seed_int",
    "temperature",
    "thread_count",
    "threshold",
    "token_count",
    "top_p",
    "verify_mode",
]

#: The most tokens a count of tokens may name (``--max-new-tokens``, ``--prompt-tokens``,
#: ``--stride``): the engine's largest position.
MAX_TOKENS = int(LIMITS["MAX_POSITION"])
#: The most anything else a command counts (prompts, rounds, samples, a batch).
MAX_COUNT = int(LIMITS["MAX_BATCH"])
#: The highest sampling temperature (far past the point where sampling is uniform in all but
#: name; above float32's range the engine could not even hold it).
MAX_TEMPERATURE = 1e4

# -- option types --------------------------------------------------------------------------


def bounded_int(lo: int, hi: int) -> Callable[[str], int]:
    """An option type: an integer in ``[lo, hi]`` (decimal; ``_`` separators allowed)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer in [{lo}, {hi}], got {text!r}"
            ) from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}], got {text}")
        return value

    parse.__name__ = f"integer in [{lo}, {hi}]"
    return parse


def positive_int(text: str) -> int:
    """A count: an integer in ``[1, MAX_COUNT]``."""
    return bounded_int(1, MAX_COUNT)(text)


def token_count(text: str) -> int:
    """A number of tokens: an integer in ``[1, MAX_TOKENS]``."""
    return bounded_int(1, MAX_TOKENS)(text)


def thread_count(text: str) -> int:
    """A thread count: an integer in ``[1, CPUs this process may use]``."""
    return bounded_int(1, available_cpus())(text)


def seed_int(text: str) -> int:
    """A seed in ``[0, 2**63)``."""
    return bounded_int(0, 2**63 - 1)(text)


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def temperature(text: str) -> float:
    """A temperature in ``[0, MAX_TEMPERATURE]`` (0 = greedy)."""
    value = _float(text)
    if not 0.0 <= value <= MAX_TEMPERATURE:
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_TEMPERATURE:g}], got {text}")
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
    return _in_unit_interval(value)


def threshold(text: str) -> float:
    """A confidence threshold in ``[0, 1]``."""
    return _in_unit_interval(_float(text))


def _in_unit_interval(value: float) -> float:
    """``value``, checked to be a threshold in ``[0, 1]``."""
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


def add_pair_arguments(p: argparse.ArgumentParser, target_help: str, drafter_help: str) -> None:
    """The required ``--target DIR|FILE`` and ``--drafter DIR``: shared by ``generate`` and
    ``calibrate``."""
    p.add_argument("--target", type=Path, required=True, metavar="DIR|FILE", help=target_help)
    p.add_argument("--drafter", type=Path, required=True, metavar="DIR", help=drafter_help)


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
    """The UTF-8 text of ``path`` (``InputError`` ``invalid-argument`` if it is not UTF-8 or not
    a regular file, ``too-large`` above :data:`MAX_PROMPT_BYTES`; nothing larger is read)."""
    data = read_bytes(path, MAX_PROMPT_BYTES, "prompt file")
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
