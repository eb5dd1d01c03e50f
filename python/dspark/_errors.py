"""Raise dspark's typed exceptions from Python code, with the engine's ``.code`` conventions."""

from __future__ import annotations

from typing import NoReturn

from dspark._native import (
    BackendError,
    CheckpointError,
    ConfigError,
    DSparkError,
    InputError,
    InternalError,
    VocabError,
)

__all__ = ["error_class", "raise_error", "raise_report_errors"]

_CONFIG = {"bad-config", "no-noise-token", "noise-token-out-of-range"}
_VOCAB = {"missing-d2t", "d2t-wrong-length", "d2t-out-of-range", "d2t-duplicate"}
_INPUT = {
    "bad-shape",
    "unsupported-dtype",
    "non-finite",
    "token-out-of-range",
    "invalid-argument",
    "too-large",
    "device-unavailable",
    "device-mismatch",
}


def error_class(code: str) -> type[DSparkError]:
    """The exception class the engine maps ``code`` to (checkpoint problems by default)."""
    if code in _CONFIG:
        return ConfigError
    if code in _VOCAB:
        return VocabError
    if code in _INPUT:
        return InputError
    if code == "internal":
        return InternalError
    if code in ("backend", "out-of-memory"):
        return BackendError
    return CheckpointError


def make_error(cls: type[DSparkError], code: str, message: str) -> DSparkError:
    """An instance of ``cls`` carrying ``.code`` and ``.problems`` like the native exceptions."""
    err = cls(message)
    err.code = code
    err.problems = [(code, message)]
    return err


def raise_error(cls: type[DSparkError], code: str, message: str) -> NoReturn:
    """Raise ``cls(message)`` with ``.code = code`` (and ``.problems``, as native errors do)."""
    raise make_error(cls, code, message)


def raise_report_errors(errors: list[dict[str, str]]) -> None:
    """Raise the problems of an ``inspect`` report (no-op when there are none).

    One problem raises its own class and code; several raise the first one's class with code
    ``multiple`` and every problem in ``.problems``.
    """
    if not errors:
        return
    if len(errors) == 1:
        raise_error(error_class(errors[0]["code"]), errors[0]["code"], errors[0]["message"])
    problems = [(e["code"], e["message"]) for e in errors]
    text = "; ".join(f"[{c}] {m}" for c, m in problems)
    err = make_error(
        error_class(errors[0]["code"]), "multiple", f"{len(problems)} problems: {text}"
    )
    err.problems = problems
    raise err
