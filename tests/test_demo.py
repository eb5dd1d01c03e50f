"""``dspark demo`` on the bundled pair: held-out prompts, lossless greedy output, honest figures."""

from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import dspark
from dspark.bundled import bundled_dir, heldout_texts, load_pair
from dspark.cli import main as cli_main
from dspark.cli.demo import add_arguments, run
from dspark.speculator import Speculator

pytestmark = pytest.mark.torch

BUNDLE = bundled_dir()
if not (BUNDLE / "target" / "config.json").is_file():
    pytest.skip(
        f"no bundled model pair at {BUNDLE} (train it with scripts/train_tiny.py)",
        allow_module_level=True,
    )

DSPARK = [sys.executable, "-m", "dspark"]
SMALL = ["--prompts", "2", "--max-new-tokens", "16", "--threads", "1"]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def _demo(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    rc = cli_main(["demo", *SMALL, "--json", "--quiet", *extra])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out.strip().splitlines()[-1])


def test_bundled_pair_passes_inspect(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["inspect", str(BUNDLE / "drafter"), "--target", str(BUNDLE / "target")]) == 0
    report = dspark.inspect(BUNDLE / "drafter", BUNDLE / "target").to_dict()
    assert report["ok"] and report["vocab"]["layout"] == "padded"
    assert report["draft"]["confidence_head"] and report["draft"]["markov_rank"] > 0
    size = sum(p.stat().st_size for p in BUNDLE.rglob("*") if p.is_file())
    assert size <= 25 * 2**20, f"bundle is {size / 2**20:.1f} MiB"


def test_heldout_prompts_ship_with_the_package_in_stored_order() -> None:
    """The prompts are part of the package, and are the held-out files in name order (the
    trainer's hash split, sorted): nothing picked them, in particular not their output."""
    texts = heldout_texts()
    data = json.loads((BUNDLE / "heldout_prompts.json").read_text())
    assert [n for n, _ in texts] == data["files"] == sorted(data["files"])
    assert len(texts) >= 8 and all(t for _, t in texts)


def test_default_demo_runs_the_first_heldout_prompts(capsys: pytest.CaptureFixture[str]) -> None:
    s = _demo(capsys)
    assert s["prompts"] == 2 and s["held_out"] is True
    assert s["prompt_names"] == [n for n, _ in heldout_texts()[:2]]
    assert s["greedy_matches_target"] is True
    assert all(r["greedy_matches_target"] for r in s["per_prompt"])
    assert s["new_tokens"] == 32 and s["prompt_tokens"] == 2 * 96
    # The default policy drafts only where it pays: on a machine where the bundled target's
    # step is too cheap for any block to pay, every round after the first exploring one may be
    # plain (τ 1). Drafting itself is checked under --verify full below.
    assert s["acceptance_length"] >= 1.0
    assert s["plain_rounds"] <= s["rounds"]
    assert 0.0 < s["distinct_4gram_ratio"] <= 1.0
    fresh = [r for r in s["per_prompt"] if r["distinct_4gram_ratio"] >= 0.5]
    assert s["non_repeating"]["prompts"] == len(fresh)
    if 0 < len(fresh) < 2:
        assert s["non_repeating"]["acceptance_length"] == pytest.approx(
            fresh[0]["acceptance_length"], abs=1e-3
        )
    for key in ("speedup_vs_target_only", "tokens_per_second", "per_position_acceptance"):
        assert key in s
    assert s["speedup_vs_target_only"] == pytest.approx(
        s["tokens_per_second"] / s["target_only_tokens_per_second"], rel=0.01
    )


def test_aggregate_matches_a_direct_speculator_run(capsys: pytest.CaptureFixture[str]) -> None:
    """τ and per-position acceptance pool every prompt's rounds (as benches/bench_e2e.py).
    Full verification on both sides: the default policy's choices follow timings."""
    s = _demo(capsys, "--verify", "full")
    pair = load_pair(threads=1, backend="native")
    sp = Speculator(pair.target, pair.drafter, seed=0, verify="full")
    committed = rounds = 0
    att = [0] * pair.drafter.block_size
    acc = [0] * pair.drafter.block_size
    outs = []
    for _, text in heldout_texts()[:2]:
        res = sp.generate([pair.tokenizer.encode(text).ids[:96]], 16, [pair.eos_id])
        outs.append(res.tokens[0])
        committed += res.stats.committed_tokens
        rounds += res.stats.request_rounds
        for k, (a, b) in enumerate(
            zip(res.stats.position_attempts, res.stats.position_accepts, strict=True)
        ):
            att[k] += a
            acc[k] += b
    assert s["acceptance_length"] == pytest.approx(committed / rounds, abs=1e-4)
    want = [round(b / a, 4) for a, b in zip(att, acc, strict=True) if a]
    assert s["per_position_acceptance"] == want
    distinct = sum(len(set(zip(t, t[1:], t[2:], t[3:], strict=False))) for t in outs)
    total = sum(len(t) - 3 for t in outs)
    assert s["distinct_4gram_ratio"] == pytest.approx(distinct / total, abs=1e-4)


def test_stream_marks_accepted_drafts_without_a_tty() -> None:
    out, err = io.StringIO(), io.StringIO()
    # Full verification: the scheduled default's rounds depend on the machine's timings.
    s = run(_args(*SMALL, "--prompts", "1", "--verify", "full"), out, err)
    text = out.getvalue()
    assert "«" in text and "»" in text and "‖" in text and "\x1b[" not in text
    # Strip the markers: the prompt's tail, then exactly the decoded continuation.
    pair = load_pair(threads=1, backend="native")
    body = text.split("prompt tokens ──\n", 1)[1].split("\n   τ ", 1)[0]
    tail, cont = body.split("‖", 1)
    assert cont.count("«") == cont.count("»")
    clean = cont.replace("«", "").replace("»", "")
    name, full = heldout_texts()[0]
    ids = pair.tokenizer.encode(full).ids[:96]
    assert pair.tokenizer.decode(ids).endswith(tail.lstrip("…"))
    # Run it again (greedy: identically) and mark each round's drafts independently.
    rounds: list[list[int]] = []
    res = Speculator(pair.target, pair.drafter, seed=0, verify="full").generate(
        [ids], 16, [pair.eos_id], on_round=lambda new: rounds.append(new[0])
    )
    assert clean == pair.tokenizer.decode(res.tokens[0])
    want, done = "", []
    for new in rounds:
        if not new:
            continue
        drafts = pair.tokenizer.decode(done + new[:-1])[len(pair.tokenizer.decode(done)) :]
        own = pair.tokenizer.decode(done + new)[len(pair.tokenizer.decode(done + new[:-1])) :]
        want += (f"«{drafts}»" if drafts else "") + own
        done += new
    assert cont == want
    assert s["prompt_names"] == [name]
    # Drafted text is marked: at least one accepted draft run, and unmarked target tokens.
    assert re.search(r"«[^»]+»", cont) and s["acceptance_length"] > 1.0
    # The headline names what was measured and the aggregate figures.
    for needle in (
        "1 held-out prompt",
        "x up to 16 new tokens",
        "native target, 1 thread",
        "acceptance length τ",
        "per-position accept",
        "speedup",
        "greedy == target-only yes (1/1 prompts)",
        "distinct 4-grams",
    ):
        assert needle in text, needle


def test_colour_on_a_tty_and_progress_bar_on_stderr() -> None:
    out, err = _Tty(), _Tty()
    run(_args(*SMALL, "--prompts", "1", "--max-new-tokens", "8"), out, err)
    assert "\x1b[32m" in out.getvalue() and "«" not in out.getvalue()
    bar = err.getvalue()
    assert "target-only baseline 1/1 [" in bar and "\r" in bar and bar.endswith("\n")
    assert "8/8" in bar
    out2 = _Tty()
    run(_args(*SMALL, "--prompts", "1", "--max-new-tokens", "8", "--no-color"), out2, _Tty())
    assert "\x1b[" not in out2.getvalue() and "«" in out2.getvalue()


@pytest.mark.parametrize("mode", ["threshold", "0.5", "scheduled"])
def test_demo_confidence_verify_modes_stay_lossless(
    capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    s = _demo(capsys, "--verify", mode, "--prompts", "1")
    assert s["greedy_matches_target"] is True
    assert s["verify"] == (0.5 if mode == "0.5" else mode)


def test_demo_sampling_reports_no_greedy_comparison(capsys: pytest.CaptureFixture[str]) -> None:
    s = _demo(capsys, "--temperature", "0.7", "--top-p", "0.9", "--seed", "3")
    assert s["greedy_matches_target"] is None and s["new_tokens"] >= 2


def test_own_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(
        [
            "demo",
            "--prompt",
            "class Queue:\n    def __init__(self",
            "--json",
            "--quiet",
            "--max-new-tokens",
            "12",
            "--threads",
            "1",
        ]
    )
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    s = json.loads(cap.out.strip().splitlines()[-1])
    assert s["prompts"] == 1 and s["held_out"] is False and s["prompt_names"] == ["your prompt"]
    assert s["greedy_matches_target"] is True


def test_python_m_dspark_demo_streams_text() -> None:
    res = subprocess.run(
        [*DSPARK, "demo", "--prompts", "1", "--max-new-tokens", "8", "--threads", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "── [1/1]" in res.stdout and "acceptance length τ" in res.stdout
    last = json.loads(res.stdout.strip().splitlines()[-1])
    for key in (
        "acceptance_length",
        "speedup_vs_target_only",
        "greedy_matches_target",
        "tokens_per_second",
        "prompts",
        "distinct_4gram_ratio",
    ):
        assert key in last
    assert "Traceback" not in res.stderr and "target-only baseline" in res.stderr


def test_plot_draws_per_position_acceptance(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With matplotlib (a stand-in here) the bars are the reported per-position acceptance."""
    drawn: dict[str, object] = {}

    class _Axes:
        def bar(self, xs: list[int], ys: list[float], **_: object) -> None:
            drawn["bars"] = list(ys)

        def __getattr__(self, _name: str) -> object:
            return lambda *a, **k: None

    class _Fig:
        def tight_layout(self) -> None: ...

        def savefig(self, target: Path | io.BytesIO, **_: object) -> None:
            # The demo renders into memory, then writes the file atomically.
            if isinstance(target, io.BytesIO):
                target.write(b"\x89PNG")
            else:
                Path(target).write_bytes(b"\x89PNG")

    mpl = types.ModuleType("matplotlib")
    mpl.use = lambda *_a, **_k: None  # type: ignore[attr-defined]
    plt = types.ModuleType("matplotlib.pyplot")
    plt.subplots = lambda **_k: (_Fig(), _Axes())  # type: ignore[attr-defined]
    plt.close = lambda *_a: None  # type: ignore[attr-defined]
    mpl.pyplot = plt  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", plt)
    png = tmp_path / "acc.png"
    s = run(
        _args(*SMALL, "--prompts", "1", "--quiet", "--plot", str(png)), io.StringIO(), io.StringIO()
    )
    assert png.is_file()
    assert drawn["bars"] == pytest.approx(
        [a or 0.0 for a in s["per_position_acceptance"]], abs=1e-4
    )


def _one_error_line(err: str, code: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"dspark: error [{code}]: "), err


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-new-tokens", "0"],
        ["--threads", "-1"],
        ["--threads", "two"],
        ["--prompts", "0"],
        ["--prompts", "2", "--prompt", "x"],
        ["--prompt", ""],
        ["--temperature", "-0.5"],
        ["--top-p", "1.5"],
        ["--verify", "2"],
    ],
)
def test_demo_bad_option_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert cli_main(["demo", *argv]) == 2
    cap = capsys.readouterr()
    _one_error_line(cap.err, "usage")
    assert cap.out == ""


def test_demo_refusals_exit_1_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli_main(["demo", "--prompts", "99"]) == 1
    _one_error_line(capsys.readouterr().err, "invalid-argument")
    assert cli_main(["demo", "--prompts", "1", "--max-new-tokens", "5000"]) == 1
    err = capsys.readouterr().err
    _one_error_line(err, "invalid-argument")
    assert "max_position_embeddings" in err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    assert cli_main(["demo", "--plot", str(tmp_path / "a.png")]) == 1
    _one_error_line(capsys.readouterr().err, "invalid-argument")
    # A model directory without tokenizer.json: a typed error, not a traceback.
    pair = tmp_path / "pair"
    shutil.copytree(BUNDLE, pair)
    (pair / "target" / "tokenizer.json").unlink()
    assert cli_main(["demo", "--model-dir", str(pair), "--prompts", "1"]) == 1
    err = capsys.readouterr().err
    _one_error_line(err, "missing-file")
    assert "tokenizer.json" in err


def test_non_utf8_prompt_is_a_usage_error() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "dspark", "demo", "--prompt", b"\xff\xfe"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 2
    _one_error_line(res.stderr.decode(), "usage")


def test_a_speedup_below_one_is_explained() -> None:
    """A run where speculation does not pay says why (a round's cost in target steps against
    τ), and one where it pays says nothing more."""
    from dspark.cli.demo_report import PromptRun, Totals

    pair = load_pair(threads=1, backend="native")
    ids = pair.tokenizer.encode(heldout_texts()[0][1]).ids[:48]
    res = Speculator(pair.target, pair.drafter, seed=0, verify="full").generate([ids], 16)
    toks = list(res.tokens[0])
    for seconds, target_seconds, said in ((2.0, 1.0, True), (1.0, 2.0, False)):
        run_ = PromptRun("p", len(ids), toks, res.stats, seconds, toks, target_seconds)
        totals = Totals([run_], pair.drafter.block_size, greedy=True)
        lines = totals.lines("m", target_seconds / seconds)
        at = [i for i, line in enumerate(lines) if line.startswith("why below 1x")]
        assert bool(at) == said, lines
        if said:
            why = " ".join(lines[at[0] :])
            assert "target-only steps" in why and "commits τ" in why


def test_the_default_policy_is_scheduled_and_says_what_it_chose(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The demo runs ``verify="scheduled"`` unless told otherwise, and its report says how many
    rounds were plain target steps; greedy output still equals target-only."""
    rc = cli_main(["demo", *SMALL])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    text = cap.out + cap.err
    assert "verify scheduled" in text
    assert "policy                scheduled:" in text
    s = _demo(capsys)
    assert s["verify"] == "scheduled"
    assert 0 <= s["plain_rounds"] <= s["rounds"]
    assert s["greedy_matches_target"] is True
