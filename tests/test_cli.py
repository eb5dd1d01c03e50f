"""The `dspark` CLI: exit codes, stable JSON, no tracebacks for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import example_pair


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dspark", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_make_example_then_inspect(tmp_path: Path) -> None:
    made = run("make-example", tmp_path / "ex", "--layout", "reduced")
    assert made.returncode == 0, made.stderr
    res = run("inspect", tmp_path / "ex" / "drafter", "--target", tmp_path / "ex" / "target")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK: will load" in res.stdout
    assert "reduced" in res.stdout and "offset-table" in res.stdout


def test_json_output_is_one_object(tmp_path: Path) -> None:
    drafter, target = example_pair(tmp_path)
    res = run("inspect", drafter, "--target", target / "config.json", "--json")
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["ok"] is True and report["vocab"]["layout"] == "padded"


def test_will_not_load_exits_1_without_traceback(tmp_path: Path) -> None:
    drafter, target = example_pair(tmp_path, "full")
    (drafter / "config.json").write_text("[1, 2")
    res = run("inspect", drafter, "--target", target)
    assert res.returncode == 1
    assert "Traceback" not in res.stdout + res.stderr
    assert "bad-config" in res.stdout
    res = run("inspect", drafter, "--target", target, "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["ok"] is False


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("inspect",),
        ("inspect", "/definitely/not/here"),
        ("frobnicate",),
        ("inspect", ".", "--bogus"),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    res = run(*args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr


def test_console_script_matches_module(tmp_path: Path) -> None:
    import shutil

    exe = shutil.which("dspark")
    if exe is None:
        pytest.skip("console script not on PATH")
    drafter, target = example_pair(tmp_path)
    res = subprocess.run(
        [exe, "inspect", str(drafter), "--target", str(target), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and json.loads(res.stdout)["ok"]
