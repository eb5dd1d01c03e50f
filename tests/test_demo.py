"""``dspark demo`` on the bundled pair: lossless greedy output, real acceptance, inspect passes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import dspark
from dspark.cli import main as cli_main
from dspark.demo import bundled_dir

pytestmark = pytest.mark.torch

BUNDLE = bundled_dir()
if not (BUNDLE / "target" / "config.json").is_file():
    pytest.skip(
        f"no bundled model pair at {BUNDLE} (train it with scripts/train_tiny.py)",
        allow_module_level=True,
    )


def _demo(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    rc = cli_main(["demo", "--max-new-tokens", "40", "--json", "--quiet", "--threads", "1", *extra])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0, out
    return json.loads(out[-1])


def test_bundled_pair_passes_inspect(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["inspect", str(BUNDLE / "drafter"), "--target", str(BUNDLE / "target")]) == 0
    report = dspark.inspect(BUNDLE / "drafter", BUNDLE / "target").to_dict()
    assert report["ok"] and report["vocab"]["layout"] == "padded"
    assert report["draft"]["confidence_head"] and report["draft"]["markov_rank"] > 0
    size = sum(p.stat().st_size for p in BUNDLE.rglob("*") if p.is_file())
    assert size <= 25 * 2**20, f"bundle is {size / 2**20:.1f} MiB"


def test_demo_greedy_is_lossless_and_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    s = _demo(capsys)
    assert s["greedy_matches_target"] is True
    assert s["acceptance_length"] > 1.0
    assert s["new_tokens"] == 40
    for key in ("speedup_vs_target_only", "tokens_per_second", "per_position_acceptance"):
        assert key in s


@pytest.mark.parametrize("mode", ["threshold", "scheduled"])
def test_demo_confidence_verify_modes_stay_lossless(
    capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    s = _demo(capsys, "--verify", mode, "--prompt", "class Queue:\n    def __init__(self")
    assert s["greedy_matches_target"] is True and s["verify"] == mode


def test_demo_sampling_reports_no_greedy_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    s = _demo(capsys, "--temperature", "0.7", "--top-p", "0.9", "--seed", "3")
    assert s["greedy_matches_target"] is None and s["new_tokens"] >= 1


def test_python_m_dspark_demo_streams_text() -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "dspark",
            "demo",
            "--max-new-tokens",
            "12",
            "--threads",
            "1",
            "--prompt",
            "def main():\n",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("def main():\n") and "acceptance length" in res.stdout


def test_demo_bad_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["demo", "--max-new-tokens", "0"]) == 2
    assert "max-new-tokens" in capsys.readouterr().err
