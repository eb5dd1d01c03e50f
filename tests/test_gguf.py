"""A native target from one GGUF file (llama.cpp's format), written here by an independent
writer (``gguf_writer``): ``NativeTarget.from_pretrained("model.gguf")`` computes what the
checkpoint directory computes (bit for bit in f32; Q8_0 kept as blocks), the tokenizer, config
and chat template come from the file, the pair loads and decodes with speculative greedy equal to
target-only greedy, ``dspark inspect`` names the quantized tensors, ``dspark serve --target
model.gguf`` answers, and bad files are ``CheckpointError`` ``bad-gguf`` naming file and tensor.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf_writer import F32, Q8_0, convert

import dspark
from dspark._native import gguf_side_files
from dspark.bundled import bundled_dir
from dspark.pair import load_native_pair, target_tokenizer

ROOT = bundled_dir()
PROMPT = [[5, 17, 99, 3, 250, 7], [1200, 8, 41]]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("gguf")
    return {
        "f32": convert(ROOT / "target", tmp / "target-f32.gguf", F32),
        "q8_0": convert(ROOT / "target", tmp / "target-q8_0.gguf", Q8_0),
    }


def test_a_float_file_computes_what_its_directory_computes(files: dict[str, Path]) -> None:
    wide = dspark.NativeTarget.from_pretrained(ROOT / "target")
    g = dspark.NativeTarget.from_pretrained(files["f32"])
    assert g.vocab_size == wide.vocab_size
    assert g.config_dict()["hidden_size"] == wide.config_dict()["hidden_size"]
    ids = [5, 17, 99, 3, 250, 7]
    np.testing.assert_array_equal(g.logits(ids), wide.logits(ids))


def test_a_q8_0_file_keeps_its_blocks_and_greedy_output_exact(files: dict[str, Path]) -> None:
    t = dspark.NativeTarget.from_pretrained(files["q8_0"])
    wide = dspark.NativeTarget.from_pretrained(ROOT / "target")
    ids = [5, 17, 99, 3, 250, 7]
    got, want = t.logits(ids), wide.logits(ids)
    assert 0 < np.abs(got - want).max() <= 0.08 * np.abs(want).max()
    if t.weight_dtype != "float32":  # the host kernels (not the device-generic path)
        assert t.weight_dtype == "q8_0"
        assert t.weight_bytes_per_step < 0.3 * wide.weight_bytes_per_step
    d = dspark.Drafter.from_pretrained(ROOT / "drafter", t)
    s = dspark.Speculator(t, d, verify="full")
    assert s.generate(PROMPT, 16).tokens == s.generate_target_only(PROMPT, 16).tokens


def test_the_tokenizer_config_and_template_come_from_the_file(files: dict[str, Path]) -> None:
    side = gguf_side_files(files["q8_0"])
    assert side["config"]["model_type"] == "qwen3"
    assert side["tokenizer_error"] is None
    assert "chat_template" in side["tokenizer_config"]
    assert side["generation_config"]["eos_token_id"] == 0
    ours = target_tokenizer(files["q8_0"])
    theirs = target_tokenizer(ROOT / "target")
    for text in ["Hello world, 123 tokens.", "  two  spaces\nand naïve café"]:
        assert ours.encode(text).ids == theirs.encode(text).ids
    pair = load_native_pair(files["q8_0"], ROOT / "drafter")
    assert pair.stop_ids == [0]
    prompt = pair.encode("The quick brown fox")
    assert pair.decode(prompt) == "The quick brown fox"


def test_inspect_names_the_quantized_tensors(files: dict[str, Path]) -> None:
    report = dspark.inspect(ROOT / "drafter", files["q8_0"]).to_dict()
    assert report["errors"] == []
    notes = [w["message"] for w in report["warnings"] if w["code"] == "gguf-target"]
    assert len(notes) == 1
    assert "Q8_0:" in notes[0] and "blk.N.attn_q.weight" in notes[0], notes


def test_generate_runs_on_a_gguf_target(files: dict[str, Path]) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dspark",
            "generate",
            "--target",
            str(files["q8_0"]),
            "--drafter",
            str(ROOT / "drafter"),
            "--prompt",
            "Once upon a time",
            "--max-new-tokens",
            "12",
            "--quiet",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["new_tokens"] > 0


def test_bad_files_are_bad_gguf_errors_naming_file_and_tensor(
    files: dict[str, Path], tmp_path: Path
) -> None:
    raw = files["q8_0"].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(raw[: len(raw) * 2 // 3])
    with pytest.raises(dspark.CheckpointError) as e:
        dspark.NativeTarget.from_pretrained(cut)
    assert e.value.code in ("bad-gguf", "multiple")
    assert "cut.gguf" in str(e.value) and "truncated" in str(e.value)
    assert "blk." in str(e.value) or "output" in str(e.value)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(dspark.CheckpointError) as e:
        dspark.NativeTarget.from_pretrained(junk)
    assert e.value.code == "bad-gguf"
    with pytest.raises(dspark.InputError) as e2:
        dspark.NativeTarget.from_pretrained(files["q8_0"], dtype="q3_k")
    assert e2.value.code == "invalid-argument" and "q4_k" in str(e2.value)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_serve_answers_on_a_gguf_target(files: dict[str, Path]) -> None:
    from test_serve import Server

    s = Server("--target", str(files["q8_0"]), "--drafter", str(ROOT / "drafter"))
    try:
        body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
        status, raw = s.post("/v1/completions", body)
        assert status == 200, raw
        assert json.loads(raw)["usage"]["completion_tokens"] > 0
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        status, raw = s.post("/v1/chat/completions", chat)
        assert status == 200, raw
    finally:
        assert s.stop() == 0
