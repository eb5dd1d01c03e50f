"""Files in and out of the Python front, each one way.

In: :func:`read_bytes` / :func:`read_text` / :func:`read_json` read a regular file with a size
limit (a FIFO, a device such as ``/dev/zero`` or a file larger than the limit is refused
before it is read past the limit: ``too-large`` / ``invalid-argument``), as the engine's
``files`` module does for its small files. :func:`check_input_file` checks a file handed to a
library that reads it itself (tokenizers, safetensors).

Out: an output path is checked before any work (:func:`check_output_file`,
:func:`check_output_dir`), and written so that nothing partial is ever left behind: a file
through a temporary file in the same folder renamed over it (:func:`write_atomic`), a
directory built as a temporary sibling renamed into place (:func:`staged_dir`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from dspark._args import LIMITS
from dspark._errors import raise_error
from dspark._native import CheckpointError, ConfigError, InputError

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_TEXT_BYTES",
    "MAX_TOKENIZER_BYTES",
    "MAX_WEIGHTS_BYTES",
    "check_input_file",
    "check_output_dir",
    "check_output_file",
    "read_bytes",
    "read_json",
    "read_text",
    "staged_dir",
    "write_atomic",
]

#: The largest JSON file the front reads (configs, held-out texts, shard indexes): the
#: engine's limit for index files.
MAX_JSON_BYTES = int(LIMITS["MAX_INDEX_BYTES"])
#: The largest text file the front reads (prompts, prompt lists).
MAX_TEXT_BYTES = 64 * 2**20
#: The largest ``tokenizer.json`` (real ones are tens of MB).
MAX_TOKENIZER_BYTES = 256 * 2**20
#: The largest weights file the front reads whole itself (a small pair's ``model.safetensors``).
MAX_WEIGHTS_BYTES = 2**30


def _check_regular(path: Path, what: str, info: os.stat_result, limit: int) -> None:
    """``invalid-argument`` unless ``info`` is a regular file's; ``too-large`` over ``limit``."""
    if not stat.S_ISREG(info.st_mode):
        raise_error(InputError, "invalid-argument", f"{path}: the {what} is not a regular file")
    if info.st_size > limit:
        raise_error(
            InputError,
            "too-large",
            f"{path}: the {what} is {info.st_size} bytes, over the limit of {limit}",
        )


def _missing(path: Path, what: str) -> NoReturn:
    raise_error(CheckpointError, "missing-file", f"{path}: no such file ({what})")


def read_bytes(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them: a larger file is
    ``too-large``, a missing one ``missing-file``, anything but a regular file (a directory, a
    FIFO, a device) or an unreadable one ``invalid-argument``. Never reads past ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        _missing(path, what)
    except OSError as exc:
        raise_error(InputError, "invalid-argument", f"{path}: cannot read the {what}: {exc}")
    try:
        # Checked on the descriptor before any read: a directory, FIFO or device never is.
        _check_regular(path, what, os.fstat(fd), limit)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise_error(InputError, "invalid-argument", f"{path}: cannot read the {what}: {exc}")
    if len(data) > limit:  # grew while read
        raise_error(InputError, "too-large", f"{path}: the {what} is over {limit} bytes")
    return data


def read_text(path: Path, limit: int, what: str) -> str:
    """:func:`read_bytes` as UTF-8 text (``invalid-argument`` if it is not UTF-8)."""
    data = read_bytes(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise_error(
            InputError,
            "invalid-argument",
            f"{path}: the {what} is not valid UTF-8 (byte {exc.start}: {exc.reason})",
        )


def read_json(path: Path, what: str, limit: int = MAX_JSON_BYTES, *, config: bool = True) -> Any:
    """The JSON value in ``path``, read with a limit; not JSON: ``bad-config`` for a
    ``config`` file, else ``invalid-argument``."""
    text = read_text(path, limit, what)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        message = f"{path}: the {what} is not JSON ({exc})"
        if config:
            raise_error(ConfigError, "bad-config", message)
        raise_error(InputError, "invalid-argument", message)


def check_input_file(path: Path, limit: int, what: str) -> Path:
    """``path`` when it is a regular file of at most ``limit`` bytes (for a library that reads
    it itself); the errors of :func:`read_bytes`."""
    try:
        info = path.stat()
    except FileNotFoundError:
        _missing(path, what)
    except OSError as exc:
        raise_error(InputError, "invalid-argument", f"{path}: cannot read the {what}: {exc}")
    _check_regular(path, what, info, limit)
    return path


def _check_parent(path: Path, name: str) -> Path:
    parent = path.absolute().parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise_error(InputError, "invalid-argument", f"{name} {path}: {parent} {why}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise_error(InputError, "invalid-argument", f"{name} {path}: {parent} is not writable")
    return parent


def check_output_file(path: Path, name: str) -> Path:
    """Refuse, before any work, an output file that cannot be written: its folder missing or
    not writable, or the path a directory (``invalid-argument`` naming ``name``)."""
    _check_parent(path, name)
    if path.is_dir() or (path.exists() and not path.is_file()):
        raise_error(InputError, "invalid-argument", f"{name} {path}: not a regular file")
    return path


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder renamed over it:
    ``path`` holds the old content or the new one, never a part."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; this is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_output_dir(path: Path, name: str) -> Path:
    """Refuse, before any work, an output directory that exists and is not empty, or whose
    parent cannot hold it (``invalid-argument`` naming ``name``)."""
    if path.exists() and not path.is_dir():
        raise_error(
            InputError, "invalid-argument", f"{name} {path} is a file: give a new directory"
        )
    if path.exists() and any(path.iterdir()):
        raise_error(
            InputError,
            "invalid-argument",
            f"{name} {path} already exists and is not empty: give a new directory "
            "(nothing is overwritten)",
        )
    parent = path.absolute().parent
    if parent.exists():
        _check_parent(path, name)
    else:
        # Created when the work is done; its nearest existing ancestor must take it.
        ancestor = parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
            raise_error(
                InputError, "invalid-argument", f"{name} {path}: {ancestor} is not writable"
            )
    return path


@contextlib.contextmanager
def staged_dir(path: Path, name: str) -> Iterator[Path]:
    """Build the directory ``path`` in a temporary sibling, yielded; renamed to ``path`` when
    the block ends normally, removed (with everything in it) when it raises, Ctrl-C included.
    ``path`` is checked first (:func:`check_output_dir`)."""
    check_output_dir(path, name)
    parent = path.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary directory
    try:
        yield tmp
        if path.exists():
            path.rmdir()  # empty (checked above)
        tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
