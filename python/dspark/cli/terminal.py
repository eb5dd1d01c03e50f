"""Terminal output shared by ``dspark demo`` and ``dspark generate``.

* :class:`TokenPrinter` streams a continuation round by round and shows which tokens were
  accepted drafts and which the target produced itself (colour on a TTY, plain markers, or
  nothing);
* :class:`Progress` is a small progress bar on stderr;
* :func:`distinct_ngram_ratio` measures how repetitive a continuation is.

Which tokens of a round were drafts: :meth:`dspark.Speculator.generate` reports, per round, the
committed tokens ``[accepted drafts ..., one token of the target]`` (the correction after a
rejected draft, or the bonus token after a fully accepted block), and the prefill commits one
target token. A round that ends on a stop token commits drafts and then the stop token (a
draft or the target's correction); the stop token is not shown, and every token before it was an
accepted draft either way. The marking is therefore exact.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Literal, TextIO

__all__ = [
    "Progress",
    "Stage",
    "TokenPrinter",
    "distinct_ngram_ratio",
    "distinct_ngrams",
    "is_tty",
    "legend",
    "std_streams",
]

Style = Literal["color", "markers", "plain"]

DRAFT_COLOR = "\x1b[32m"  # green: accepted drafts
DIM = "\x1b[2m"
RESET = "\x1b[0m"


def std_streams(out: TextIO | None, err: TextIO | None) -> tuple[TextIO, TextIO]:
    """``(out, err)``, each the standard stream where it is ``None`` (read at the call, so a
    redirected ``sys.stdout`` applies)."""
    return (out if out is not None else sys.stdout, err if err is not None else sys.stderr)


def is_tty(stream: object) -> bool:
    """Whether ``stream`` is an interactive terminal (false for anything without ``isatty``)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return callable(isatty) and bool(isatty())
    except (ValueError, OSError):
        return False


def _can_encode(stream: object, text: str) -> bool:
    enc = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(enc)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def markers(stream: object) -> tuple[str, str]:
    """The plain-text brackets around accepted drafts: ``«»``, or ``<<>>`` if not encodable."""
    return ("«", "»") if _can_encode(stream, "«»") else ("<<", ">>")


def legend(style: Style, stream: object) -> str:
    """One line explaining the marking of ``style``."""
    if style == "color":
        return (
            f"{DIM}dim{RESET}: prompt; {DRAFT_COLOR}green{RESET}: accepted drafts of the drafter; "
            "plain: the target's own tokens"
        )
    if style == "markers":
        a, b = markers(stream)
        end = "‖" if a == "«" else "||"
        return (
            f"{a}text{b}: accepted drafts of the drafter; unmarked: the target's own tokens; "
            f"{end}: end of the prompt"
        )
    return ""


def distinct_ngrams(tokens: Sequence[int], n: int = 4) -> tuple[int, int]:
    """``(distinct, total)`` n-grams of ``tokens``."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)), len(grams)


def distinct_ngram_ratio(tokens: Sequence[int], n: int = 4) -> float | None:
    """Distinct n-grams / n-grams (1.0: nothing repeats; a loop drives it towards 0).

    ``None`` when the sequence is shorter than ``n``.
    """
    distinct, total = distinct_ngrams(tokens, n)
    return distinct / total if total else None


class TokenPrinter:
    """Streams one continuation: call :meth:`round` with each round's committed tokens."""

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        out: TextIO,
        style: Style,
        stop_ids: Sequence[int] = (),
    ) -> None:
        self.decode = decode
        self.out = out
        self.style = style
        self.stop_ids = set(stop_ids)
        self.ids: list[int] = []
        self.shown = ""  # text already written (no trailing partial character)
        self.open, self.close = markers(out) if style == "markers" else ("", "")
        self.draft_tokens = 0
        self.target_tokens = 0

    def _text(self) -> str:
        # A byte-level token can end inside a UTF-8 character: hold the partial character
        # (decoded as U+FFFD) back until the next token completes it.
        return self.decode(self.ids).rstrip("\ufffd")

    def _piece(self, new: list[int]) -> str:
        if not new:
            return ""
        self.ids.extend(new)
        text = self._text()
        # Byte-level decoding only ever appends (the held-back partial character aside).
        piece = text[len(self.shown) :]
        if len(text) > len(self.shown):
            self.shown = text
        return piece

    def round(self, new: Sequence[int]) -> None:
        """Show one round's committed tokens (the first call: the prefill's token)."""
        new = [int(t) for t in new]
        if not new:
            return
        if new[-1] in self.stop_ids:
            # The stop token ends the text and is not shown; what precedes it was drafted.
            drafts, own = new[:-1], []
        else:
            drafts, own = new[:-1], new[-1:]
        self.draft_tokens += len(drafts)
        self.target_tokens += len(own)
        draft_text = self._piece(drafts)
        own_text = self._piece(own)
        if draft_text:
            if self.style == "color":
                self.out.write(f"{DRAFT_COLOR}{draft_text}{RESET}")
            else:
                self.out.write(f"{self.open}{draft_text}{self.close}")
        self.out.write(own_text)
        self.out.flush()


class Stage:
    """One slow step said on ``stream`` (stderr) while it runs, when that is a terminal:
    ``label ...``, then its time when it ends, so a long load or write is never silent::

        with Stage("loading the pair", err):
            pair = load_pair(...)

    A step that fails clears its line, so the error line stands alone. Off a terminal (a log
    file, a pipe) it writes nothing: the output stays what scripts parse.
    """

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = is_tty(self.stream)
        self._t0 = 0.0

    def __enter__(self) -> None:
        self._t0 = time.perf_counter()
        if self.tty:
            self.stream.write(f"{self.label} ...")
            self.stream.flush()

    def __exit__(self, kind: object, value: object, trace: object) -> None:
        if not self.tty:
            return
        if kind is None:
            self.stream.write(f" done ({time.perf_counter() - self._t0:.1f} s)\n")
        else:
            self.stream.write("\r\x1b[K")
        self.stream.flush()


class Progress:
    """A progress bar on ``stream`` (stderr): redrawn in place on a TTY, one line otherwise.

    The time spent drawing is accumulated in :attr:`overhead` so callers can keep it out of
    their measurements.
    """

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = max(1, int(total))
        self.stream = stream if stream is not None else sys.stderr
        self.tty = is_tty(self.stream)
        self.done = 0
        self.overhead = 0.0
        self._last = 0.0
        self._t0 = time.perf_counter()
        if self.tty:
            self._draw()

    def _draw(self) -> None:
        width = 30
        filled = min(width, self.done * width // self.total)
        self.stream.write(
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
        )
        self.stream.flush()

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more units done; redraw at most ten times a second."""
        t = time.perf_counter()
        self.done += n
        if self.tty and (t - self._last >= 0.1 or self.done >= self.total):
            self._last = t
            self._draw()
        self.overhead += time.perf_counter() - t

    def finish(self, note: str = "") -> None:
        """Close the bar (TTY: final state and a newline; otherwise one summary line)."""
        secs = time.perf_counter() - self._t0
        if self.tty:
            self._draw()
            self.stream.write(f" {note}\n" if note else "\n")
        else:
            self.stream.write(
                f"{self.label}: {self.done}/{self.total} done in {secs:.1f} s"
                + (f" {note}" if note else "")
                + "\n"
            )
        self.stream.flush()
