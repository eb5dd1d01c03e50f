"""The command line and the files it touches, tried adversarially.

Every numeric option is bounded at parse time (a usage error, exit code 2, one line, before
anything loads); ``--threads`` is capped at the CPUs this process may use; input files are read
with a size limit and must be regular files; outputs are checked before the work and written
so that nothing partial is left (a temporary sibling renamed into place); ``calibrate``
replaces a stale or broken ``sts.json``, and ``sts=False`` / ``sts=[...]`` never read it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dspark
from dspark import _files
from dspark._threads import available_cpus
from dspark.bundled import bundled_dir


def run(*args: str | Path, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dspark", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _usage(res: subprocess.CompletedProcess[str]) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error [usage]: "), res.stderr


TARGET = str(bundled_dir() / "target")
DRAFTER = str(bundled_dir() / "drafter")
PAIR = ("--target", TARGET, "--drafter", DRAFTER)
TOO_MANY_THREADS = str(available_cpus() + 1)


@pytest.mark.parametrize(
    "args",
    [
        ("generate", *PAIR, "--prompt", "x", "--max-new-tokens", "0"),
        ("generate", *PAIR, "--prompt", "x", "--max-new-tokens", str(2**40)),
        ("generate", *PAIR, "--prompt", "x", "--max-new-tokens", "1e3"),
        ("generate", *PAIR, "--prompt", "x", "--threads", TOO_MANY_THREADS),
        ("generate", *PAIR, "--prompt", "x", "--threads", "0"),
        ("generate", *PAIR, "--prompt", "x", "--temperature", "1e30"),
        ("generate", *PAIR, "--prompt", "x", "--temperature", "nan"),
        ("generate", *PAIR, "--prompt", "x", "--temperature", "-0.5"),
        ("generate", *PAIR, "--prompt", "x", "--top-p", "1.5"),
        ("generate", *PAIR, "--prompt", "x", "--top-p", "0"),
        ("generate", *PAIR, "--prompt", "x", "--seed", "-1"),
        ("generate", *PAIR, "--prompt", "x", "--seed", str(2**64)),
        ("generate", *PAIR, "--prompt", "x", "--verify", "1.5"),
        ("demo", "--threads", TOO_MANY_THREADS),
        ("demo", "--prompts", str(2**40)),
        ("demo", "--prompt-tokens", str(2**40)),
        ("calibrate", *PAIR, "--rounds", str(2**40)),
        ("calibrate", *PAIR, "--max-new-tokens", "-3"),
        ("calibrate", *PAIR, "--stride", str(2**40)),
        ("calibrate", *PAIR, "--prompts", "/dev/zero"),
        ("make-example", "/tmp/never-made-by-dspark", "--seed", "-1"),
        ("make-example", "/tmp/never-made-by-dspark", "--seed", str(2**63)),
        ("make-example", "/tmp/never-made-by-dspark", "--seed", "1.5"),
    ],
)
def test_out_of_range_options_are_usage_errors(args: tuple[str, ...]) -> None:
    _usage(run(*args))


def test_calibrate_refuses_to_decode_past_the_targets_positions() -> None:
    """The bundled target has 4,096 positions: a first window plus --max-new-tokens beyond them
    is refused before anything decodes, as `generate` and `demo` refuse it."""
    res = run("calibrate", *PAIR, "--max-new-tokens", "5000", "--rounds", "2", "--json")
    assert res.returncode == 1, res.stderr
    assert "[invalid-argument]" in res.stderr and "max_position_embeddings" in res.stderr


def test_make_example_bad_seed_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "ex"
    _usage(run("make-example", out, "--seed", "-1"))
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_make_example_refuses_a_non_empty_dir_untouched(tmp_path: Path) -> None:
    out = tmp_path / "ex"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    res = run("make-example", out)
    assert res.returncode == 1 and "[invalid-argument]" in res.stderr, res.stderr
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["ex"]


def test_write_example_failing_midway_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dspark import example

    def broken(*args: object, **kw: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(example, "save_file", broken)
    with pytest.raises(OSError):
        example.write_example(tmp_path / "ex")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        ({"seed": -1}, "invalid-argument"),
        ({"seed": 2**63}, "too-large"),
        ({"seed": 1.0}, "invalid-argument"),
        ({"layout": "weird"}, "invalid-argument"),
    ],
)
def test_write_example_arguments_are_typed(
    tmp_path: Path, kw: dict[str, object], code: str
) -> None:
    from dspark.example import write_example

    with pytest.raises(dspark.InputError) as e:
        write_example(tmp_path / "ex", **kw)  # type: ignore[arg-type]
    assert e.value.code == code
    assert list(tmp_path.iterdir()) == []


# -- files -----------------------------------------------------------------------------------


def test_read_bytes_limits_and_refuses_non_regular_files(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(1000)  # sparse: no disk used
    assert len(_files.read_bytes(big, 1000, "file")) == 1000
    with pytest.raises(dspark.InputError) as e:
        _files.read_bytes(big, 999, "file")
    assert e.value.code == "too-large"
    with pytest.raises(dspark.InputError) as e:
        _files.read_bytes(tmp_path, 10, "file")
    assert e.value.code == "invalid-argument"
    with pytest.raises(dspark.CheckpointError) as e:
        _files.read_bytes(tmp_path / "nope", 10, "file")
    assert e.value.code == "missing-file"
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        with pytest.raises(dspark.InputError) as e:  # refused, never blocks on the open
            _files.read_bytes(fifo, 10, "file")
        assert e.value.code == "invalid-argument"
    with pytest.raises(dspark.InputError) as e:
        _files.read_bytes(Path("/dev/zero"), 10, "file")
    assert e.value.code == "invalid-argument"


def test_read_text_and_json_are_typed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(dspark.InputError) as e:
        _files.read_text(bad, 100, "text")
    assert e.value.code == "invalid-argument"
    notjson = tmp_path / "x.json"
    notjson.write_text("[1, 2")
    with pytest.raises(dspark.ConfigError) as ce:
        _files.read_json(notjson, "config")
    assert ce.value.code == "bad-config"
    with pytest.raises(dspark.InputError) as e:
        _files.read_json(notjson, "prompts", config=False)
    assert e.value.code == "invalid-argument"


def test_write_atomic_never_leaves_a_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "out.json"
    _files.write_atomic(dest, "old")
    assert dest.read_text() == "old"

    def broken(src: object, dst: object) -> None:
        raise OSError("rename failed")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        _files.write_atomic(dest, "new" * 1000)
    monkeypatch.undo()
    assert dest.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    _files.write_atomic(dest, b"new")
    assert dest.read_bytes() == b"new"


def test_output_paths_are_checked_first(tmp_path: Path) -> None:
    with pytest.raises(dspark.InputError):
        _files.check_output_file(tmp_path / "missing" / "x.json", "--out")
    with pytest.raises(dspark.InputError):
        _files.check_output_file(tmp_path, "--out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(dspark.InputError):
        _files.check_output_dir(tmp_path / "full", "DIR")
    assert _files.check_output_dir(tmp_path / "new" / "deeper", "DIR")


def test_calibrate_refuses_a_huge_prompts_file_before_reading_it(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    with open(prompts, "wb") as f:
        f.truncate(_files.MAX_TEXT_BYTES + 1)  # sparse
    res = run("calibrate", *PAIR, "--prompts", prompts, "--out", tmp_path / "sts.json")
    assert res.returncode == 1 and "[too-large]" in res.stderr, res.stderr
    assert not (tmp_path / "sts.json").exists()


# -- the calibration file --------------------------------------------------------------------


@pytest.fixture()
def stale_drafter(tmp_path: Path) -> Path:
    """A copy of the bundled drafter whose ``sts.json`` does not fit its block."""
    d = tmp_path / "drafter"
    shutil.copytree(DRAFTER, d)
    (d / "sts.json").write_text(json.dumps({"temperatures": [1.0]}))
    return d


def test_sts_false_or_a_table_skip_a_stale_file(stale_drafter: Path) -> None:
    target = dspark.NativeTarget.from_pretrained(TARGET)
    with pytest.raises(dspark.DSparkError):
        dspark.Drafter.from_pretrained(stale_drafter, target)
    off = dspark.Drafter.from_pretrained(stale_drafter, target, sts=False)
    assert off.sts_temperatures is None
    k = off.block_size
    table = dspark.Drafter.from_pretrained(stale_drafter, target, sts=[1.5] * k)
    assert table.sts_temperatures == pytest.approx([1.5] * k)
    assert not dspark.inspect(stale_drafter, target=TARGET).to_dict()["ok"]
    assert dspark.inspect(stale_drafter, target=TARGET, sts=False).to_dict()["ok"]
    # Broken JSON is skipped the same way.
    (stale_drafter / "sts.json").write_text("{not json")
    assert dspark.Drafter.from_pretrained(stale_drafter, target, sts=False).sts_temperatures is None


def test_calibrate_replaces_a_stale_file(stale_drafter: Path) -> None:
    res = run(
        "calibrate",
        "--target",
        TARGET,
        "--drafter",
        stale_drafter,
        "--rounds",
        "12",
        "--max-new-tokens",
        "16",
        "--quiet",
    )
    assert res.returncode == 0, res.stderr
    temps = json.loads((stale_drafter / "sts.json").read_text())["temperatures"]
    target = dspark.NativeTarget.from_pretrained(TARGET)
    drafter = dspark.Drafter.from_pretrained(stale_drafter, target)
    assert len(temps) == drafter.block_size
    assert drafter.sts_temperatures == pytest.approx(temps, rel=1e-6)
    assert sorted(p.name for p in stale_drafter.iterdir() if p.name.startswith(".")) == []
