"""The training corpus: CPython's standard-library sources, split into train / held-out by file.

The Python standard library is redistributable under the PSF license (see ``NOTICE``) and is
present on every machine that runs Python, so the corpus never needs a download.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Corpus", "default_stdlib_dir", "load_corpus"]

SEPARATOR = "<|endoftext|>"


def default_stdlib_dir() -> Path:
    """Directory holding the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


@dataclass(frozen=True)
class Corpus:
    """Train and held-out documents (one source file each) and the files they came from."""

    train: list[str]
    heldout: list[str]
    train_files: list[str]
    heldout_files: list[str]


def _is_heldout(name: str, heldout_percent: int, seed: int) -> bool:
    """Deterministic split by file name (independent of file order and of the machine)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:4], "little") % 100 < heldout_percent


def load_corpus(
    root: Path | None = None,
    *,
    heldout_percent: int = 8,
    seed: int = 0,
    max_files: int | None = None,
    max_chars_per_file: int = 200_000,
) -> Corpus:
    """Top-level ``*.py`` files of ``root`` (default: the stdlib), sorted by name, split by file.

    ``max_files`` keeps the first files only (smoke runs). Files that are not UTF-8 are skipped.
    """
    base = root if root is not None else default_stdlib_dir()
    files = sorted(p for p in base.glob("*.py") if p.is_file())
    if max_files is not None:
        files = files[:max_files]
    train: list[str] = []
    heldout: list[str] = []
    train_files: list[str] = []
    heldout_files: list[str] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")[:max_chars_per_file]
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        if _is_heldout(path.name, heldout_percent, seed):
            heldout.append(text)
            heldout_files.append(path.name)
        else:
            train.append(text)
            train_files.append(path.name)
    if not train or not heldout:
        raise ValueError(
            f"{base}: corpus split is empty (train {len(train)}, held-out {len(heldout)})"
        )
    return Corpus(train, heldout, train_files, heldout_files)
