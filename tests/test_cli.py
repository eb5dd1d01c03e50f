"""The `dspark` CLI: exit codes, stable JSON, no tracebacks for bad input."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

import dspark
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
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error [usage]: "), res.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("demo", "--threads", "-1"),
        ("demo", "--max-new-tokens", "0"),
        ("generate", "--target", ".", "--drafter", "."),
        ("generate", "--target", ".", "--drafter", ".", "--prompt", "x", "--verify", "2"),
        ("make-example", "/tmp/x", "--layout", "weird"),
    ],
)
def test_option_errors_are_one_usage_line(args: tuple[str, ...]) -> None:
    res = run(*args)
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dspark: error [usage]: "), res.stderr


def _raising(exc: BaseException):  # type: ignore[no-untyped-def]
    def fail(_args: object) -> int:
        raise exc

    return fail


@pytest.mark.parametrize(
    ("exc", "code", "rc"),
    [
        (RuntimeError("boom"), "internal", 1),
        (ImportError("No module named 'torch'"), "missing-dependency", 1),
        (OSError("disk full"), "io", 1),
        (KeyboardInterrupt(), "interrupted", 130),
    ],
)
def test_unexpected_errors_are_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    exc: BaseException,
    code: str,
    rc: int,
) -> None:
    from dspark import cli

    monkeypatch.delenv("DSPARK_TRACEBACK", raising=False)
    monkeypatch.setattr(cli, "_run", _raising(exc))
    assert cli.main(["make-example", str(tmp_path / "x")]) == rc
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"dspark: error [{code}]: "), err


def test_dspark_errors_keep_their_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from dspark import cli
    from dspark._errors import make_error
    from dspark._native import ConfigError

    err = make_error(ConfigError, "no-noise-token", "no noise token\nin config.json")
    monkeypatch.setattr(cli, "_run", _raising(err))
    assert cli.main(["make-example", str(tmp_path / "x")]) == 1
    assert (
        capsys.readouterr().err == "dspark: error [no-noise-token]: no noise token in config.json\n"
    )


def test_traceback_on_request(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from dspark import cli

    monkeypatch.setenv("DSPARK_TRACEBACK", "1")
    monkeypatch.setattr(cli, "_run", _raising(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["make-example", str(tmp_path / "x")])


def test_make_example_writes_a_loadable_target(tmp_path: Path) -> None:
    """Weights with HF Qwen3 names and shapes, and a byte-level tokenizer over the whole vocab."""
    from dspark.example import EOS_ID, TARGET_VOCAB, target_config, write_example

    root = write_example(tmp_path / "ex")
    target = root / "target"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (target / name).is_file(), name
    cfg = json.loads((target / "config.json").read_text())
    assert cfg == target_config() and cfg["eos_token_id"] == EOS_ID
    header_len = int.from_bytes((target / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((target / "model.safetensors").read_bytes()[8 : 8 + header_len])
    assert header["model.embed_tokens.weight"]["shape"] == [TARGET_VOCAB, cfg["hidden_size"]]
    assert header["lm_head.weight"]["shape"] == [TARGET_VOCAB, cfg["hidden_size"]]
    layers = {k.split(".")[2] for k in header if k.startswith("model.layers.")}
    assert len(layers) == cfg["num_hidden_layers"]
    tok = json.loads((target / "tokenizer.json").read_text())
    ids = sorted(tok["model"]["vocab"].values())
    assert ids == list(range(TARGET_VOCAB))  # every id decodes to something
    tokenizers = pytest.importorskip("tokenizers")
    t = tokenizers.Tokenizer.from_file(str(target / "tokenizer.json"))
    text = "def f(x):\n    return x  # café ✓"
    assert t.decode(t.encode(text).ids) == text
    assert t.token_to_id("<|endoftext|>") == EOS_ID


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


def test_distinct_ngram_ratio() -> None:
    from dspark.cli.terminal import distinct_ngram_ratio, distinct_ngrams

    assert distinct_ngrams([1, 2, 3, 4, 1, 2, 3, 4, 1]) == (4, 6)
    assert distinct_ngram_ratio(list(range(10))) == 1.0
    assert distinct_ngram_ratio([7] * 10) == pytest.approx(1 / 7)
    assert distinct_ngram_ratio([1, 2, 3]) is None


def test_token_printer_marks_drafts_exactly() -> None:
    """Per round: every token but the last is an accepted draft; the last is the target's;
    a stop token is not shown; a split UTF-8 character is held back until complete."""
    import io

    from dspark.cli.terminal import TokenPrinter

    table = {1: b"a", 2: b"b", 3: b"c", 4: b"\xc3", 5: b"\xa9", 9: b""}

    def decode(ids: list[int]) -> str:
        return b"".join(table[i] for i in ids).decode("utf-8", errors="replace")

    out = io.StringIO()
    p = TokenPrinter(decode, out, "markers", stop_ids=[9])
    p.round([1])  # prefill: the target's token
    p.round([2, 3, 1])  # two accepted drafts, then the target's correction
    p.round([4, 5, 2])  # a draft that splits "é" over two tokens
    p.round([])  # a request with nothing new this round
    p.round([3, 9])  # a draft, then the stop token
    assert out.getvalue() == "a«bc»a«é»b«c»"
    tty = io.StringIO()
    q = TokenPrinter(decode, tty, "color")
    q.round([1, 2])
    assert tty.getvalue() == "\x1b[32ma\x1b[0mb"
    plain = io.StringIO()
    TokenPrinter(decode, plain, "plain").round([1, 2, 3])
    assert plain.getvalue() == "abc"


def test_progress_bar_tty_and_pipe() -> None:
    import io

    from dspark.cli.terminal import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    bar = Progress("baseline", 4, tty)
    for _ in range(4):
        bar.advance()
    bar.finish()
    text = tty.getvalue()
    assert text.startswith("\rbaseline [") and "4/4" in text and text.endswith("\n")
    pipe = io.StringIO()
    bar = Progress("baseline", 2, pipe)
    bar.advance(2)
    bar.finish()
    assert pipe.getvalue().startswith("baseline: 2/2 done in ") and "\r" not in pipe.getvalue()


def test_a_slow_stage_is_said_on_a_terminal_and_silent_in_a_pipe() -> None:
    import io

    from dspark.cli.terminal import Stage

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    with Stage("loading the pair", tty):
        pass
    text = tty.getvalue()
    assert text.startswith("loading the pair ...") and " done (" in text and text.endswith(" s)\n")
    # A failure clears its line: the error line that follows stands alone.
    tty = Tty()
    try:
        with Stage("loading the pair", tty):
            raise ValueError("boom")
    except ValueError:
        pass
    assert tty.getvalue() == "loading the pair ...\r\x1b[K"
    pipe = io.StringIO()
    with Stage("loading the pair", pipe):
        pass
    assert pipe.getvalue() == ""


def test_version_says_the_version_and_the_build() -> None:
    for flag in ("--version", "-V"):
        res = run(flag)
        assert res.returncode == 0, res.stderr
        line = res.stdout.strip()
        assert line.startswith(f"dspark {dspark.__version__} ("), line
        assert ("CUDA build" if dspark.build_info()["cuda"] else "CPU build") in line


def test_every_option_has_help() -> None:
    """Each command's ``--help`` documents every option it takes (the first user's question:
    what does ``--max-new-tokens`` default to?)."""
    from dspark.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"dspark {name} {action.option_strings[0]} has no help"


def test_an_existing_output_folder_is_a_plain_refusal(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    res = run("make-example", tmp_path)
    assert res.returncode != 0
    assert "already exists and is not empty" in res.stderr, res.stderr
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_the_project_pairs_ship_the_chat_template(tmp_path: Path) -> None:
    """Chat out of the box: the bundled pair and ``make-example`` carry the same template."""
    from dspark._chat_template import CHAT_TEMPLATE
    from dspark.bundled import bundled_dir
    from dspark.example import write_example

    for target in (bundled_dir() / "target", write_example(tmp_path / "pair") / "target"):
        doc = json.loads((target / "tokenizer_config.json").read_text())
        assert doc["chat_template"] == CHAT_TEMPLATE, target
        assert doc["eos_token"] == "<|endoftext|>", target


def test_a_busy_machine_is_said(tmp_path: Path) -> None:
    """The demo's load check reads /proc/stat: a window where others kept the CPUs busy gives
    a warning line; a quiet one, or an unreadable file, none."""
    from dspark.cli.load import BUSY_SHARE, _cpu_times, busy_share, busy_warning

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    assert _cpu_times(stat) == (200, 1000)
    assert busy_warning(0.9, 2) is not None and "90%" in str(busy_warning(0.9, 2))
    assert busy_warning(BUSY_SHARE / 2, 2) is None
    assert busy_warning(None, 2) is None
    assert busy_share(0.0, tmp_path / "missing") is None
    stat.write_text("not a stat file\n")
    assert busy_share(0.0, stat) is None
    share = busy_share(0.05)  # this machine's, whatever it is
    assert share is None or 0.0 <= share <= 1.0
