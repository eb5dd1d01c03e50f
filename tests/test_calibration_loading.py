"""A drafter's confidence calibration: ``sts.json`` next to the checkpoint is loaded by
``Drafter.from_pretrained`` and reported by ``inspect``; ``sts=`` overrides it or turns it off."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import dspark
from dspark.example import write_example


def _load(drafter: Path, target: Path, **kw: object) -> dspark.Drafter:
    native = dspark.NativeTarget.from_pretrained(target)
    return dspark.Drafter.from_pretrained(drafter, native, **kw)


def _confidence(d: dspark.Drafter) -> np.ndarray:
    feats = np.random.default_rng(0).standard_normal((1, 6, d.context_width)).astype(np.float32)
    return np.asarray(d.propose(feats, [3]).confidence)


def test_sts_json_is_loaded_reported_and_overridable(tmp_path: Path) -> None:
    root = write_example(tmp_path, "padded")
    drafter, target = root / "drafter", root / "target"
    raw = _load(drafter, target)
    assert raw.sts_temperatures is None
    k = raw.block_size
    temps = [0.5 + 0.25 * i for i in range(k)]
    (drafter / "sts.json").write_text(json.dumps({"temperatures": temps, "note": "ignored"}))
    calibrated = _load(drafter, target)
    assert calibrated.sts_temperatures == pytest.approx(temps)
    report = dspark.inspect(drafter, target=target).to_dict()
    assert report["ok"] and report["calibration"]["temperatures"] == pytest.approx(temps)
    # sigmoid(logit(c) / T): the calibrated confidences follow from the raw ones exactly.
    c0, c1 = _confidence(raw), _confidence(calibrated)
    logit = np.log(c0) - np.log1p(-c0)
    want = 1.0 / (1.0 + np.exp(-logit / np.asarray(temps, np.float32)))
    np.testing.assert_allclose(c1, want, rtol=1e-4, atol=1e-6)
    off = _load(drafter, target, sts=False)
    assert off.sts_temperatures is None
    np.testing.assert_allclose(_confidence(off), c0, rtol=1e-6)
    other = _load(drafter, target, sts=[2.0] * k)
    assert other.sts_temperatures == pytest.approx([2.0] * k)


def test_bad_calibrations_are_typed(tmp_path: Path) -> None:
    root = write_example(tmp_path, "padded")
    drafter, target = root / "drafter", root / "target"
    k = _load(drafter, target).block_size
    with pytest.raises(dspark.InputError) as e:
        _load(drafter, target, sts=[1.0] * (k - 1))
    assert e.value.code == "invalid-argument"
    with pytest.raises(dspark.DSparkError) as e:
        _load(drafter, target, sts=True)
    assert e.value.code == "invalid-argument"
    (drafter / "sts.json").write_text(json.dumps({"temperatures": [1.0, -2.0]}))
    with pytest.raises(dspark.ConfigError) as e:
        _load(drafter, target)
    assert e.value.code == "bad-config"
    report = dspark.inspect(drafter, target=target).to_dict()
    assert not report["ok"] and report["calibration"] is None
    assert "bad-config" in {p["code"] for p in report["errors"]}
