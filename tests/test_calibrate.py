"""``dspark calibrate``: the pure fitting functions on known cases, and the CLI end to end."""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dspark
from dspark._native import InputError
from dspark.confidence_records import load_texts
from dspark.sts import (
    T_MAX,
    T_MIN,
    apply_platt,
    apply_sts,
    ece,
    ece_noise_floor,
    fit_platt,
    fit_positions,
    fit_temperature,
)


def _synthetic(n: int, true_t: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Confidences ``sigmoid(z)`` whose outcomes follow ``sigmoid(z / true_t)``."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, n)
    conf = 1.0 / (1.0 + np.exp(-z))
    p = 1.0 / (1.0 + np.exp(-z / true_t))
    return conf, (rng.random(n) < p).astype(np.float64)


# -- apply_sts -----------------------------------------------------------------------------


def test_apply_sts_is_the_engine_formula() -> None:
    c = np.array([0.1, 0.5, 0.9, 0.99])
    t = 2.0
    z = np.log(c / (1 - c))
    np.testing.assert_allclose(apply_sts(c, t), 1 / (1 + np.exp(-z / t)), rtol=1e-12)
    np.testing.assert_allclose(apply_sts(c, 1.0), c, rtol=1e-12)
    assert apply_sts([0.5], 0.01)[0] == pytest.approx(0.5)
    # 0 and 1 are clipped to [1e-6, 1 - 1e-6] before the logit: finite, order kept.
    out = apply_sts([0.0, 1.0], 3.0)
    assert np.all(np.isfinite(out)) and 0.0 < out[0] < 0.5 < out[1] < 1.0


@pytest.mark.parametrize("t", [0.0, -1.0, float("nan"), float("inf"), "x", None])
def test_apply_sts_refuses_bad_temperatures(t: object) -> None:
    with pytest.raises(InputError) as e:
        apply_sts([0.5], t)  # type: ignore[arg-type]
    assert e.value.code == "invalid-argument"


# -- ece -----------------------------------------------------------------------------------


def test_ece_known_values() -> None:
    assert ece([0.8] * 4, [1, 0, 1, 0]) == pytest.approx(0.3)
    assert ece([0.25, 0.75], [0, 1]) == pytest.approx(0.25)
    # Ten bins: every sample alone, (0.9 + 0.2 + 0.1 + 0) / 4; two bins:
    # |0.5 - 0.15| * 2/4 + |1.0 - 0.95| * 2/4.
    assert ece([0.1, 0.2, 0.9, 1.0], [1, 0, 1, 1]) == pytest.approx(0.3)
    assert ece([0.1, 0.2, 0.9, 1.0], [1, 0, 1, 1], bins=2) == pytest.approx(0.2)
    # A confidence of exactly 1 lands in the last bin; bins=1 is the global gap.
    assert ece([1.0, 1.0], [True, True]) == 0.0
    assert ece([0.2, 0.6], [1, 1], bins=1) == pytest.approx(0.6)


def test_ece_of_calibrated_data_is_near_zero() -> None:
    conf, acc = _synthetic(40_000, 1.0, seed=1)
    assert ece(conf, acc) < 0.015


def test_ece_degenerate_inputs() -> None:
    assert math.isnan(ece([], []))
    assert ece([0.3] * 10, [0] * 10) == pytest.approx(0.3)
    assert ece([0.3] * 10, [1] * 10) == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("conf", "acc", "bins", "code"),
    [
        ([0.5, 0.5], [1], 10, "bad-shape"),
        ([[0.5]], [[1]], 10, "bad-shape"),
        ([0.5, float("nan")], [1, 0], 10, "non-finite"),
        ([1.5], [1], 10, "invalid-argument"),
        ([-0.1], [1], 10, "invalid-argument"),
        ([0.5], [2], 10, "invalid-argument"),
        ([0.5], [0.5], 10, "invalid-argument"),
        (["a"], [1], 10, "invalid-argument"),
        ([0.5], [1], 0, "invalid-argument"),
        ([0.5], [1], True, "invalid-argument"),
    ],
)
def test_ece_typed_errors(conf: object, acc: object, bins: object, code: str) -> None:
    with pytest.raises(InputError) as e:
        ece(conf, acc, bins)  # type: ignore[arg-type]
    assert e.value.code == code


# -- fit_temperature -----------------------------------------------------------------------


def test_calibrated_data_fits_t_near_one() -> None:
    conf, acc = _synthetic(40_000, 1.0, seed=2)
    assert fit_temperature(conf, acc) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("true_t", [0.5, 2.5, 4.0])
def test_known_temperature_is_recovered(true_t: float) -> None:
    conf, acc = _synthetic(40_000, true_t, seed=3)
    t = fit_temperature(conf, acc)
    assert t == pytest.approx(true_t, rel=0.08)
    assert ece(conf, acc) > 0.05  # miscalibrated before...
    assert ece(apply_sts(conf, t), acc) < 0.02  # ...and not after


def test_fit_minimizes_the_nll() -> None:
    conf, acc = _synthetic(5_000, 2.0, seed=4)
    t = fit_temperature(conf, acc)

    def nll(temp: float) -> float:
        p = np.clip(apply_sts(conf, temp), 1e-12, 1 - 1e-12)
        return float(-np.mean(acc * np.log(p) + (1 - acc) * np.log(1 - p)))

    assert all(nll(t) <= nll(t * f) + 1e-12 for f in (0.9, 0.99, 1.01, 1.1))


def test_fit_degenerate_inputs() -> None:
    assert fit_temperature([], []) == 1.0
    assert fit_temperature([0.5, 0.5], [1, 0]) == 1.0  # no signal
    # One outcome only: the NLL keeps falling towards a bound, which is where the fit stops.
    assert fit_temperature([0.9, 0.8], [1, 1]) == pytest.approx(T_MIN)
    assert fit_temperature([0.9, 0.8], [0, 0]) == pytest.approx(T_MAX)
    assert fit_temperature([0.2, 0.3], [0, 0]) == pytest.approx(T_MIN)
    t = fit_temperature([0.9, 0.8], [1, 1], lo=0.5, hi=2.0)
    assert t == pytest.approx(0.5)


def test_fit_typed_errors() -> None:
    with pytest.raises(InputError) as e:
        fit_temperature([0.5, 0.6], [1])
    assert e.value.code == "bad-shape"
    with pytest.raises(InputError) as e:
        fit_temperature([0.5], [1], lo=2.0, hi=1.0)
    assert e.value.code == "invalid-argument"
    with pytest.raises(InputError) as e:
        fit_temperature([float("inf")], [1])
    assert e.value.code == "non-finite"


# -- the diagnostics and the per-position fit ----------------------------------------------


def test_platt_recovers_scale_and_bias() -> None:
    rng = np.random.default_rng(5)
    z = rng.normal(0.0, 2.0, 40_000)
    conf = 1 / (1 + np.exp(-z))
    acc = (rng.random(z.size) < 1 / (1 + np.exp(-(0.5 * z - 1.0)))).astype(np.float64)
    scale, bias = fit_platt(conf, acc)
    assert scale == pytest.approx(0.5, abs=0.05) and bias == pytest.approx(-1.0, abs=0.08)
    assert ece(apply_platt(conf, scale, bias), acc) < 0.02
    assert fit_platt([], []) == (1.0, 0.0)
    s1, b1 = fit_platt([0.9, 0.8, 0.7], [1, 1, 1])
    assert math.isfinite(s1) and math.isfinite(b1)


def test_noise_floor_shrinks_with_samples() -> None:
    conf, _ = _synthetic(2_000, 1.0, seed=6)
    small = ece_noise_floor(conf[:50], draws=100)
    large = ece_noise_floor(conf, draws=50)
    assert small > large > 0.0
    assert math.isnan(ece_noise_floor([]))


def test_fit_positions_reports_sparse_and_one_class_positions() -> None:
    conf, acc = _synthetic(2_000, 2.0, seed=7)
    fit = [(0, float(c), bool(a)) for c, a in zip(conf[:1000], acc[:1000], strict=True)]
    held = [(0, float(c), bool(a)) for c, a in zip(conf[1000:], acc[1000:], strict=True)]
    fit += [(1, 0.9, True)] * 30 + [(2, 0.7, True)] * 5
    held += [(1, 0.9, True)] * 3
    reps = fit_positions(fit, held, 4, min_samples=20)
    assert [r.position for r in reps] == [0, 1, 2, 3]
    assert reps[0].temperature == pytest.approx(2.0, rel=0.15) and not reps[0].note
    assert reps[0].ece_after < reps[0].ece_before
    assert reps[1].temperature == 1.0 and "one outcome" in reps[1].note
    assert reps[2].temperature == 1.0 and "5 fit samples" in reps[2].note
    assert reps[3].samples == 0 and math.isnan(reps[3].ece_before)
    with pytest.raises(InputError):
        fit_positions([(4, 0.5, True)], [], 4)


def test_prompt_windows() -> None:
    from dspark.confidence_records import prompt_windows as _windows

    ids = list(range(10))
    assert _windows(ids, 4, 3) == [ids[:4], ids[:7], ids[:10]]
    assert _windows(ids, 12, 3) == [ids]
    assert _windows(ids, 4, 3, limit=6) == [ids[:4]]
    assert _windows([], 4, 3) == []


def test_load_texts_formats(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(["x = 1", "y = 2"]))
    (tmp_path / "b.json").write_text(json.dumps({"texts": ["a", "b", "c"], "files": []}))
    (tmp_path / "c.txt").write_text("first prompt\n\nsecond prompt\n")
    assert load_texts(tmp_path / "a.json") == ["x = 1", "y = 2"]
    assert load_texts(tmp_path / "b.json") == ["a", "b", "c"]
    assert load_texts(tmp_path / "c.txt") == ["first prompt", "second prompt"]
    (tmp_path / "d.json").write_text(json.dumps({"texts": [1, 2]}))
    (tmp_path / "e.txt").write_text("only one\n")
    for bad in ("d.json", "e.txt"):
        with pytest.raises(InputError) as e:
            load_texts(tmp_path / bad)
        assert e.value.code == "invalid-argument"


# -- the command ---------------------------------------------------------------------------


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dspark", "calibrate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_calibrates_the_bundled_pair(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    from dspark.bundled import bundled_dir

    root = bundled_dir()
    out = tmp_path / "sts.json"
    res = _cli(
        "--target",
        root / "target",
        "--drafter",
        root / "drafter",
        "--rounds",
        "40",
        "--max-new-tokens",
        "32",
        "--out",
        out,
    )
    assert res.returncode == 0, res.stderr
    assert "HELD OUT" in res.stdout and f"wrote {out}" in res.stdout
    doc = json.loads(out.read_text())
    k = json.loads((root / "drafter" / "config.json").read_text())["block_size"]
    temps = doc["temperatures"]
    assert len(temps) == k and all(math.isfinite(t) and t > 0 for t in temps)
    for key in ("ece_before", "ece_after", "samples"):
        assert len(doc[key]) == k
    assert doc["source"]["target_backend"] == "native"
    assert sum(doc["source"]["request_rounds"].values()) >= 40
    assert doc["samples"][0] > 0 and doc["fit_samples"][0] > 0
    # The file is what the engine reads: an STS table it accepts.
    from dspark._native import confidence

    h = np.zeros((1, k, 4), np.float32)
    assert confidence(h, None, np.ones(4, np.float32), 0.0, sts=str(out)).shape == (1, k)
    if "sts" in inspect.signature(dspark.Drafter.from_pretrained).parameters:
        target = dspark.NativeTarget.from_pretrained(root / "target")
        drafter = dspark.Drafter.from_pretrained(root / "drafter", target, sts=out)
        assert drafter.sts_temperatures == pytest.approx(temps, rel=1e-6)


def test_cli_json_and_refusals(tmp_path: Path) -> None:
    from dspark.bundled import bundled_dir

    root = bundled_dir()
    res = _cli("--target", root / "target", "--drafter", tmp_path / "nope", "--out", tmp_path / "x")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith("dspark: error [missing-file]:")
    res = _cli("--target", root / "target", "--drafter", root / "drafter", "--rounds", "0")
    assert res.returncode == 2 and res.stderr.startswith("dspark: error [usage]:")
    res = _cli(
        "--target",
        root / "target",
        "--drafter",
        root / "drafter",
        "--out",
        tmp_path / "missing-dir" / "sts.json",
    )
    assert res.returncode == 1 and "[invalid-argument]" in res.stderr
