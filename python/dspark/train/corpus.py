"""The training corpus: CPython's standard-library sources, split into train / held-out by file.

The Python standard library is redistributable under the PSF license (see ``NOTICE``) and is
present on every machine that runs Python, so the corpus never needs a download.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CALIBRATION_PACKAGES",
    "Corpus",
    "default_stdlib_dir",
    "heldout_chunks",
    "load_calibration_texts",
    "load_corpus",
]

#: Standard-library packages whose sources make the *calibration* corpus: text that neither the
#: target nor the drafter was trained on (they see top-level modules only), as the prompts they
#: serve are. Test directories are left out.
CALIBRATION_PACKAGES = (
    "asyncio",
    "collections",
    "concurrent",
    "ctypes",
    "dbm",
    "email",
    "html",
    "http",
    "importlib",
    "json",
    "logging",
    "multiprocessing",
    "re",
    "sqlite3",
    "tomllib",
    "unittest",
    "urllib",
    "wsgiref",
    "xml",
    "xmlrpc",
    "zoneinfo",
)

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


def load_calibration_texts(
    root: Path | None = None,
    *,
    packages: tuple[str, ...] = CALIBRATION_PACKAGES,
    max_chars_per_file: int = 200_000,
) -> list[str]:
    """Sources of ``packages`` under ``root`` (default: the stdlib), every ``*.py`` file below
    them outside ``test``/``tests`` directories, sorted by path; not UTF-8 or empty: skipped.
    Disjoint from :func:`load_corpus` (top-level files only), so text no model was trained on."""
    base = root if root is not None else default_stdlib_dir()
    texts: list[str] = []
    for pkg in packages:
        for path in sorted((base / pkg).rglob("*.py")):
            rel = path.relative_to(base).parts
            if any(part in ("test", "tests") for part in rel) or not path.is_file():
                continue
            try:
                text = path.read_text(encoding="utf-8")[:max_chars_per_file]
            except (UnicodeDecodeError, OSError):
                continue
            if text.strip():
                texts.append(text)
    if not texts:
        raise ValueError(f"{base}: no calibration sources under {', '.join(packages)}")
    return texts


def heldout_chunks(texts: list[str], chunk_chars: int = 2000) -> list[str]:
    """Every ``chunk_chars`` piece of the held-out ``texts``, interleaved so that entry ``2i``
    comes from a file of even index and ``2i + 1`` from one of odd index (``dspark calibrate``
    fits on even entries and evaluates on odd ones: no file is on both sides); as many of each
    side as the smaller side has. A larger held-out prompt set than the files' first pieces
    (``heldout_prompts.json``), whose 9-against-9 text split dominates the ECE noise."""
    sides: list[list[str]] = [[], []]
    for i, t in enumerate(texts):
        pieces = (t[j : j + chunk_chars] for j in range(0, len(t), chunk_chars))
        sides[i % 2].extend(p for p in pieces if p.strip())
    out: list[str] = []
    for a, b in zip(sides[0], sides[1], strict=False):
        out += [a, b]
    return out
