"""Sequential Temperature Scaling (STS): fitting and judging a drafter's confidence calibration.

Expected calibration error (:func:`ece`, and the :func:`ece_noise_floor` finite samples alone
give), one temperature per draft position (:func:`fit_temperature`, :func:`apply_sts`: the
engine's ``sts.json`` format, ``sigmoid(logit(c) / T_k)``) and, as a diagnostic, per-position
Platt scaling (:func:`fit_platt`); :func:`fit_positions` does all of it per position.

Pure numpy functions; :mod:`dspark.confidence_records` collects the samples and ``dspark
calibrate`` (:mod:`dspark.cli.calibrate`) reports with them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import SupportsFloat, SupportsIndex

import numpy as np
import numpy.typing as npt

from dspark._errors import raise_error
from dspark._native import InputError

__all__ = [
    "DEFAULT_MIN_SAMPLES",
    "EPS",
    "T_MAX",
    "T_MIN",
    "PositionReport",
    "apply_platt",
    "apply_sts",
    "ece",
    "ece_noise_floor",
    "fit_platt",
    "fit_positions",
    "fit_temperature",
]

#: Bounds of the temperature search.
T_MIN = 1e-2
T_MAX = 1e2
#: Confidences are clipped to ``[EPS, 1 - EPS]`` before taking logits.
EPS = 1e-6
#: Fit samples a position needs before its temperature is fitted (else T = 1).
DEFAULT_MIN_SAMPLES = 20

_FloatArray = npt.NDArray[np.float64]


# -- pure functions ------------------------------------------------------------------------


def _as_vector(values: npt.ArrayLike, name: str, kind: str) -> _FloatArray:
    """``values`` as a 1-D float64 array (typed errors: not ``kind``, or not 1-D)."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise_error(InputError, "invalid-argument", f"{name}: not {kind} ({exc})")
    if arr.ndim != 1:
        raise_error(InputError, "bad-shape", f"{name}: expected a 1-D sequence, got {arr.shape}")
    return arr


def _as_conf(conf: npt.ArrayLike, name: str = "conf") -> _FloatArray:
    """A 1-D float64 array of confidences in [0, 1] (typed errors)."""
    arr = _as_vector(conf, name, "numbers")
    if not np.all(np.isfinite(arr)):
        raise_error(InputError, "non-finite", f"{name}: contains NaN or infinity")
    if arr.size and (arr.min() < 0.0 or arr.max() > 1.0):
        raise_error(InputError, "invalid-argument", f"{name}: confidences must lie in [0, 1]")
    return arr


def _as_outcomes(accepted: npt.ArrayLike, n: int) -> _FloatArray:
    """A 1-D float64 array of 0/1 outcomes of length ``n`` (typed errors)."""
    arr = _as_vector(accepted, "accepted", "booleans")
    if arr.shape[0] != n:
        raise_error(InputError, "bad-shape", f"accepted has {arr.shape[0]} entries, conf has {n}")
    if arr.size and not np.all((arr == 0.0) | (arr == 1.0)):
        raise_error(InputError, "invalid-argument", "accepted: every entry must be 0/1 or a bool")
    return arr


def _pair(conf: npt.ArrayLike, accepted: npt.ArrayLike) -> tuple[_FloatArray, _FloatArray]:
    c = _as_conf(conf)
    return c, _as_outcomes(accepted, c.shape[0])


def _as_temperature(temperature: object) -> float:
    """A finite temperature > 0 (``InputError`` otherwise)."""
    try:
        if not isinstance(temperature, (SupportsFloat, SupportsIndex, str)):
            raise TypeError(temperature)
        t = float(temperature)
    except (TypeError, ValueError):
        raise_error(InputError, "invalid-argument", f"temperature {temperature!r}: not a number")
    if not (math.isfinite(t) and t > 0.0):
        raise_error(InputError, "invalid-argument", f"temperature {t}: must be finite and > 0")
    return t


def _logit(c: _FloatArray) -> _FloatArray:
    c = np.clip(c, EPS, 1.0 - EPS)
    return np.log(c) - np.log1p(-c)


def _sigmoid(z: _FloatArray) -> _FloatArray:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * z)), dtype=np.float64)


def apply_sts(conf: npt.ArrayLike, temperature: float) -> _FloatArray:
    """``sigmoid(logit(c) / T)`` of every confidence (clipped to ``[1e-6, 1 - 1e-6]`` first):
    what the engine's STS does to position k's confidence with ``T = T_k``."""
    c = _as_conf(conf)
    return _sigmoid(_logit(c) / _as_temperature(temperature))


def _as_bins(bins: object) -> int:
    """A bin count: an integer >= 1, not a bool (``InputError`` otherwise)."""
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise_error(InputError, "invalid-argument", f"bins {bins!r}: must be an integer >= 1")
    return int(bins)


def ece(conf: npt.ArrayLike, accepted: npt.ArrayLike, bins: int = 10) -> float:
    """Expected calibration error: ``sum_b (n_b / n) |mean(accepted_b) - mean(conf_b)|`` over
    ``bins`` equal-width bins of ``[0, 1]`` (a confidence of exactly 1 falls in the last bin).

    No samples: ``nan`` (nothing to estimate). ``InputError`` for mismatched lengths
    (``bad-shape``), NaN / infinity (``non-finite``), confidences outside ``[0, 1]``, outcomes
    other than 0/1 or ``bins < 1`` (``invalid-argument``).
    """
    bins = _as_bins(bins)
    c, y = _pair(conf, accepted)
    n = c.shape[0]
    if n == 0:
        return float("nan")
    idx = np.minimum((c * bins).astype(np.int64), bins - 1)
    sum_c = np.bincount(idx, weights=c, minlength=bins)
    sum_y = np.bincount(idx, weights=y, minlength=bins)
    return float(np.sum(np.abs(sum_y - sum_c)) / n)


def _nll(z: _FloatArray, sign: _FloatArray, log_t: float) -> float:
    """Mean binary NLL of ``sigmoid(z / T)`` against the outcomes (``sign`` = 2y - 1)."""
    return float(np.mean(np.logaddexp(0.0, -sign * z * math.exp(-log_t))))


def fit_temperature(
    conf: npt.ArrayLike,
    accepted: npt.ArrayLike,
    *,
    lo: float = T_MIN,
    hi: float = T_MAX,
    tol: float = 1e-7,
) -> float:
    """The temperature T in ``[lo, hi]`` minimizing the binary NLL of ``sigmoid(logit(c) / T)``
    against ``accepted`` (golden-section search over ``log T``; the NLL is convex in ``1 / T``,
    so unimodal in ``log T``).

    Defined on every valid input: no samples, or only confidences of exactly 0.5 (no signal),
    give 1.0. One outcome only (all accepted or all rejected) still has a minimizer, often at a
    bound (all accepted with every c > 0.5: ``lo``); :func:`fit_positions` keeps T = 1 for such
    positions instead. Bad input raises ``InputError`` as :func:`ece` does.
    """
    lo, hi = _as_temperature(lo), _as_temperature(hi)
    if not lo < hi:
        raise_error(InputError, "invalid-argument", f"bounds [{lo}, {hi}]: need lo < hi")
    c, y = _pair(conf, accepted)
    z = _logit(c)
    if z.size == 0 or not np.any(np.abs(z) > 1e-12):
        return 1.0
    sign = 2.0 * y - 1.0
    a, b = math.log(lo), math.log(hi)
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    x1 = b - ratio * (b - a)
    x2 = a + ratio * (b - a)
    f1, f2 = _nll(z, sign, x1), _nll(z, sign, x2)
    while b - a > tol:
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - ratio * (b - a)
            f1 = _nll(z, sign, x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + ratio * (b - a)
            f2 = _nll(z, sign, x2)
    best = (a + b) / 2.0
    # The ends are candidates too (a minimizer at a bound).
    candidates = [(_nll(z, sign, best), best), (_nll(z, sign, a), a), (_nll(z, sign, b), b)]
    return float(min(max(math.exp(min(candidates)[1]), lo), hi))


def fit_platt(
    conf: npt.ArrayLike, accepted: npt.ArrayLike, *, ridge: float = 1e-4
) -> tuple[float, float]:
    """``(scale, bias)`` minimizing the NLL of ``sigmoid(scale * logit(c) + bias)`` (Newton,
    a small ridge on both so one-class data stays finite). ``(1.0, 0.0)`` with no samples.

    Not expressible in the engine's STS format (temperatures only: ``scale = 1 / T``,
    ``bias = 0``); ``dspark calibrate`` reports it as a diagnostic of what a bias would add.
    """
    c, y = _pair(conf, accepted)
    if c.size == 0:
        return 1.0, 0.0
    z = _logit(c)
    x = np.stack([z, np.ones_like(z)], axis=1)
    w = np.array([1.0, 0.0])
    n = float(c.size)
    for _ in range(100):
        p = _sigmoid(x @ w)
        grad = x.T @ (p - y) / n + ridge * (w - np.array([1.0, 0.0]))
        hess = (x * (p * (1.0 - p))[:, None]).T @ x / n + ridge * np.eye(2)
        step = np.linalg.solve(hess, grad)
        w = w - step
        if float(np.max(np.abs(step))) < 1e-10:
            break
    return float(w[0]), float(w[1])


def apply_platt(conf: npt.ArrayLike, scale: float, bias: float) -> _FloatArray:
    """``sigmoid(scale * logit(c) + bias)`` (confidences clipped as in :func:`apply_sts`)."""
    return _sigmoid(float(scale) * _logit(_as_conf(conf)) + float(bias))


def ece_noise_floor(conf: npt.ArrayLike, bins: int = 10, draws: int = 200, seed: int = 0) -> float:
    """Mean ECE of a *perfectly calibrated* predictor on these confidences: outcomes drawn as
    ``Bernoulli(c)``, ``draws`` times. What finite samples alone add to a measured ECE."""
    c = _as_conf(conf)
    if c.size == 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    vals = [ece(c, (rng.random(c.shape[0]) < c).astype(np.float64), bins) for _ in range(draws)]
    return float(np.mean(vals))


# -- per-position fit ----------------------------------------------------------------------


@dataclass
class PositionReport:
    """One draft position's numbers (ECE figures on the held-out half unless named ``fit``)."""

    position: int
    fit_samples: int
    samples: int
    acceptance: float
    mean_confidence: float
    ece_before: float
    ece_after: float
    temperature: float
    note: str = ""
    ece_fit_before: float = float("nan")
    ece_fit_after: float = float("nan")
    ece_noise_floor: float = float("nan")
    platt: tuple[float, float] = (1.0, 0.0)
    ece_after_platt: float = float("nan")


Records = Sequence[tuple[int, float, bool]]


def _by_position(records: Records, k: int) -> list[tuple[_FloatArray, _FloatArray]]:
    conf: list[list[float]] = [[] for _ in range(k)]
    acc: list[list[float]] = [[] for _ in range(k)]
    for pos, c, a in records:
        if not 0 <= int(pos) < k:
            raise_error(InputError, "invalid-argument", f"record position {pos}: block is {k}")
        conf[int(pos)].append(float(c))
        acc[int(pos)].append(1.0 if a else 0.0)
    return [(np.asarray(c), np.asarray(a)) for c, a in zip(conf, acc, strict=True)]


def fit_positions(
    fit_records: Records,
    eval_records: Records,
    block_size: int,
    *,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    bins: int = 10,
) -> list[PositionReport]:
    """Fit T_k on ``fit_records`` and evaluate on ``eval_records`` (``(position, confidence,
    accepted)`` triples), one :class:`PositionReport` per position ``0..block_size-1``."""
    fit = _by_position(fit_records, block_size)
    held = _by_position(eval_records, block_size)
    out = []
    for k in range(block_size):
        (fc, fy), (hc, hy) = fit[k], held[k]
        note = ""
        if fc.size < min_samples:
            t, note = 1.0, f"{fc.size} fit samples < {min_samples}: T = 1"
        elif fy.min() == fy.max():
            t, note = 1.0, "one outcome only in the fit half: T = 1"
        else:
            t = fit_temperature(fc, fy)
            if t <= T_MIN * 1.001 or t >= T_MAX * 0.999:
                note = f"T at the search bound {t:g}"
        scale, bias = fit_platt(fc, fy) if fc.size >= min_samples else (1.0, 0.0)
        out.append(
            PositionReport(
                position=k,
                fit_samples=int(fc.size),
                samples=int(hc.size),
                acceptance=float(hy.mean()) if hy.size else float("nan"),
                mean_confidence=float(hc.mean()) if hc.size else float("nan"),
                ece_before=ece(hc, hy, bins),
                ece_after=ece(apply_sts(hc, t), hy, bins),
                temperature=t,
                note=note,
                ece_fit_before=ece(fc, fy, bins),
                ece_fit_after=ece(apply_sts(fc, t), fy, bins),
                ece_noise_floor=ece_noise_floor(apply_sts(hc, t), bins),
                platt=(scale, bias),
                ece_after_platt=ece(apply_platt(hc, scale, bias), hy, bins),
            )
        )
    return out
