"""``dspark make-example --memory-bound``: the bundled pair's function at a 0.6 B model's cost.

The full-size pair is written once per session (float32, and bfloat16 for the bf16 checks);
the exactness arithmetic is also checked on a small widening that costs milliseconds. The
llama.cpp converter and mistral.rs checks run only where ``benches/peers/setup.sh`` has made
the peers environment, and skip with the reason otherwise.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dspark
from dspark._spm import sentencepiece_model
from dspark.cli import main as cli_main
from dspark.memory_bound import (
    TARGET_SHAPE,
    MemoryBoundPair,
    Shape,
    bundled_tiny_dir,
    target_parameter_count,
    write_memory_bound,
)
from dspark.speculator import Speculator

BUNDLE = bundled_tiny_dir()
#: A widening that keeps every rule of the full one (head_dim 64 -> 128, GQA 3/1 -> 4/2, extra
#: layers) at a few MB, for the cheap tests.
SMALL_BIG = Shape(hidden=256, heads=4, kv_heads=2, head_dim=128, intermediate=1024, layers=10)
#: Held-out prompts and tokens for the end-to-end checks (a few, to bound the time).
N_PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 3, 48, 24
PEERS = Path(os.environ.get("DSPARK_PEERS_DIR", "/var/tmp/dspark-peers"))


def _prompts(n: int = N_PROMPTS, length: int = PROMPT_TOKENS) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(BUNDLE / "target" / "tokenizer.json"))
    texts = json.loads((BUNDLE / "heldout_prompts.json").read_text())["texts"]
    return [tok.encode(t).ids[:length] for t in texts[:n]]


def _pair(root: Path) -> tuple[Any, Any]:
    target = dspark.NativeTarget.from_pretrained(root / "target")
    return target, dspark.Drafter.from_pretrained(root / "drafter", target)


def _greedy(
    root: Path, prompts: list[list[int]], n: int
) -> tuple[list[list[int]], list[list[int]]]:
    """(target-only, speculative) greedy tokens of the pair at ``root``, native engine."""
    target, drafter = _pair(root)
    spec = Speculator(target, drafter, seed=0)
    return (
        spec.generate_target_only(prompts, n).tokens,
        spec.generate(prompts, n).tokens,
    )


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="session")
def small_pair(tmp_path_factory: pytest.TempPathFactory) -> MemoryBoundPair:
    return write_memory_bound(
        tmp_path_factory.mktemp("mb") / "small", shape=SMALL_BIG, draft_layers=3
    )


@pytest.fixture(scope="session")
def full_f32(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryBoundPair]:
    pair = write_memory_bound(tmp_path_factory.mktemp("mb") / "f32")
    yield pair
    shutil.rmtree(pair.root)  # 3 GB: not kept with pytest's last temporary directories


@pytest.fixture(scope="session")
def full_bf16(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryBoundPair]:
    pair = write_memory_bound(tmp_path_factory.mktemp("mb") / "bf16", dtype="bfloat16")
    yield pair
    shutil.rmtree(pair.root)


# -- shapes, arithmetic, files (no torch) -------------------------------------------------


def test_full_shape_is_a_0_6b_qwen3() -> None:
    s = TARGET_SHAPE
    assert s.layers >= 24 and s.hidden >= 1024 and s.head_dim == 128
    assert (s.heads, s.kv_heads) == (16, 8)
    n = target_parameter_count()
    assert 0.6e9 <= n < 0.7e9, n
    # Qwen3-0.6B's own widths give 0.44 B with this vocabulary: why the MLP is wider.
    assert target_parameter_count(Shape(1024, 16, 8, 128, 3072, 28)) < 0.45e9


def test_rope_pairs_keep_their_frequencies() -> None:
    # HF Qwen3 rotates (j, j + d/2) at theta^(-2j/d). The small head's dims go to 2i and
    # 64 + 2i: the same pairs at the same frequencies, so rotating then embedding equals
    # embedding then rotating, at every position.
    from dspark.memory_bound import _Embedding

    small = Shape.of(json.loads((BUNDLE / "target" / "config.json").read_text()))
    emb = _Embedding(small, TARGET_SHAPE)
    theta = 10000.0

    def rope(x: np.ndarray, pos: int) -> np.ndarray:
        d = x.shape[-1]
        inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
        ang = np.concatenate([inv, inv]) * pos
        rot = np.concatenate([-x[d // 2 :], x[: d // 2]])
        return np.asarray(x * np.cos(ang) + rot * np.sin(ang))

    rng = np.random.default_rng(0)
    x = rng.standard_normal(small.head_dim)
    for pos in (0, 1, 7, 513, 4095):
        big = np.zeros(TARGET_SHAPE.head_dim)
        big[emb.head_dims] = x
        np.testing.assert_allclose(rope(big, pos)[emb.head_dims], rope(x, pos), atol=1e-12)
        assert np.all(np.delete(rope(big, pos), emb.head_dims) == 0.0)


def test_norm_and_attention_scales_are_exact_in_real_arithmetic() -> None:
    from dspark.memory_bound import _Embedding

    small = Shape(192, 3, 1, 64, 512, 8)
    emb = _Embedding(small, TARGET_SHAPE)
    eps = 1e-6
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal(192) * 1e-3, rng.standard_normal(192)  # eps matters at 1e-3

    def rms(v: np.ndarray, weight: np.ndarray, e: float) -> np.ndarray:
        return np.asarray(v / np.sqrt(np.mean(v * v) + e) * weight)

    big_x, big_w = np.zeros(1024), np.zeros(1024)
    big_x[:192], big_w[:192] = x, w * emb.norm_scale
    np.testing.assert_allclose(rms(big_x, big_w, emb.eps(eps))[:192], rms(x, w, eps), rtol=1e-12)
    # q, k: raw rows scaled by qk_scale, k_norm by k_norm_scale; scores divide by sqrt(128).
    q, k, wq, wk = (rng.standard_normal(64) * 1e-3 for _ in range(4))
    bq, bk, bwq, bwk = (np.zeros(128) for _ in range(4))
    bq[emb.head_dims], bk[emb.head_dims] = q * emb.qk_scale, k * emb.qk_scale
    bwq[emb.head_dims], bwk[emb.head_dims] = wq, wk * emb.k_norm_scale
    small_score = rms(q, wq, eps) @ rms(k, wk, eps) / math.sqrt(64)
    big_score = rms(bq, bwq, emb.eps(eps)) @ rms(bk, bwk, emb.eps(eps)) / math.sqrt(128)
    assert big_score == pytest.approx(small_score, rel=1e-12)
    np.testing.assert_allclose(rms(bk, bwk, emb.eps(eps))[emb.head_dims], rms(k, wk, eps))


def test_files_configs_and_determinism(small_pair: MemoryBoundPair, tmp_path: Path) -> None:
    t = json.loads((small_pair.target / "config.json").read_text())
    d = json.loads((small_pair.drafter / "config.json").read_text())
    assert t["architectures"] == ["Qwen3ForCausalLM"] and t["num_hidden_layers"] == 10
    assert t["rope_theta"] == t["rope_parameters"]["rope_theta"] == 10000.0
    assert t["rms_norm_eps"] == pytest.approx(1e-6 * 192 / 256)
    assert d["architectures"] == ["Qwen3DSparkModel"] and d["num_target_layers"] == 10
    assert d["target_layer_ids"] == [0, 3, 6] and d["hidden_size"] == 256
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        assert (small_pair.target / name).is_file()
    assert (small_pair.drafter / "sts.json").is_file()
    again = write_memory_bound(tmp_path / "again", shape=SMALL_BIG, draft_layers=3)
    assert _digest(again.root) == _digest(small_pair.root)


def test_jitter_replaces_every_zero(small_pair: MemoryBoundPair, tmp_path: Path) -> None:
    from dspark.memory_bound import _read_safetensors

    jit = write_memory_bound(tmp_path / "j", shape=SMALL_BIG, draft_layers=3, jitter=1e-4)
    for sub in ("target", "drafter"):
        base = _read_safetensors(small_pair.root / sub / "model.safetensors")
        moved = _read_safetensors(jit.root / sub / "model.safetensors")
        for name, a in base.items():
            b = moved[name]
            assert np.all(b != 0), name
            assert np.array_equal(a[a != 0], b[a != 0]), name
            assert np.all(np.abs(b[a == 0]) <= 1e-4), name


_SPM_CHECK = """
import json, sys
import sentencepiece as spm
from tokenizers import Tokenizer
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
tok = Tokenizer.from_file(sys.argv[2])
n = tok.get_vocab_size()
assert sp.vocab_size() == n + 2 and sp.unk_id() == n and sp.IsControl(0), sp.vocab_size()
assert sp.IsByte(n + 1) and sp.IdToPiece(n + 1) == "<0x20>"
bad = [i for i in range(1, n) if tok.decode([i]) != sp.decode([i])]
assert not bad, bad[:10]
for text in json.load(open(sys.argv[3]))["texts"]:
    assert sp.decode(tok.encode(text).ids) == text
print("ok")
"""


def test_sentencepiece_file_holds_the_same_vocabulary(tmp_path: Path) -> None:
    doc = json.loads((BUNDLE / "target" / "tokenizer.json").read_text())
    raw = sentencepiece_model(doc)
    assert raw == sentencepiece_model(doc)  # deterministic
    # SentencePiece itself loads it and decodes every id and every held-out text's ids to the
    # same text as tokenizer.json (here, or in the peers venv, which has sentencepiece).
    python = sys.executable
    if subprocess.run([python, "-c", "import sentencepiece"], check=False).returncode:
        python = _peers()["python"]
    (tmp_path / "tokenizer.model").write_bytes(raw)
    files = [tmp_path / "tokenizer.model", BUNDLE / "target" / "tokenizer.json"]
    res = subprocess.run(
        [python, "-c", _SPM_CHECK, *map(str, files), str(BUNDLE / "heldout_prompts.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


def test_cli_refusals_leave_nothing_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    cases = [
        ([str(full), "--memory-bound"], 1, "[invalid-argument]"),
        ([str(tmp_path / "a"), "--memory-bound", "--jitter", "0"], 2, "[usage]"),
        ([str(tmp_path / "a"), "--memory-bound", "--jitter", "nan"], 2, "[usage]"),
        ([str(tmp_path / "a"), "--memory-bound", "--jitter", "0.01"], 2, "[usage]"),
        ([str(tmp_path / "a"), "--memory-bound", "--dtype", "float16"], 2, "[usage]"),
        ([str(tmp_path / "a"), "--memory-bound", "--layout", "full"], 2, "[usage]"),
        ([str(tmp_path / "a"), "--dtype", "bfloat16"], 2, "[usage]"),
    ]
    for argv, code, tag in cases:
        assert cli_main(["make-example", *argv]) == code, argv
        assert tag in capsys.readouterr().err, argv
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]
    # A source pair with a file missing is refused before any work.
    broken = tmp_path / "src"
    (broken / "target").mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (broken / "target" / name).write_bytes((BUNDLE / "target" / name).read_bytes())
    with pytest.raises(dspark.DSparkError) as err:
        write_memory_bound(tmp_path / "out", source=broken)
    assert err.value.code == "missing-file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full", "src"]


def test_a_failure_midway_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dspark.memory_bound as mb

    def boom(*_: object) -> None:
        raise RuntimeError("boom")

    # Both checkpoints are written by then; the tokenizer files come last.
    monkeypatch.setattr(mb, "write_converter_tokenizer", boom)
    with pytest.raises(RuntimeError, match="boom"):
        write_memory_bound(tmp_path / "out", shape=SMALL_BIG, draft_layers=3)
    assert list(tmp_path.iterdir()) == []


def test_small_widening_is_exact_natively(small_pair: MemoryBoundPair) -> None:
    prompts = _prompts(2, 32)
    # f32 caches: the same function up to f32 rounding. The default f16 cache rounds keys that
    # differ in their last f32 bits (the big model normalizes over more dimensions), so the two
    # may differ by an f16 rounding there.
    for kv, atol in (("float32", 1e-4), (None, 1e-3)):
        small = dspark.NativeTarget.from_pretrained(BUNDLE / "target", kv_dtype=kv)
        big = dspark.NativeTarget.from_pretrained(small_pair.target, kv_dtype=kv)
        for p in prompts:
            np.testing.assert_allclose(big.logits(p), small.logits(p), atol=atol, rtol=0)
    assert _greedy(small_pair.root, prompts, 12) == _greedy(BUNDLE, prompts, 12)


def test_jittered_copy_gives_the_same_greedy_tokens(tmp_path: Path) -> None:
    jit = write_memory_bound(tmp_path / "j", shape=SMALL_BIG, draft_layers=3, jitter=1e-4)
    prompts = _prompts(1, 32)
    small = dspark.NativeTarget.from_pretrained(BUNDLE / "target")
    big = dspark.NativeTarget.from_pretrained(jit.target)
    # The jitter moves the logits by about 10-20 * jitter (see dspark.memory_bound).
    np.testing.assert_allclose(big.logits(prompts[0]), small.logits(prompts[0]), atol=2e-3)
    assert _greedy(jit.root, prompts, 16) == _greedy(BUNDLE, prompts, 16)


# -- the full-size pair -------------------------------------------------------------------


@pytest.mark.slow
def test_full_pair_decodes_the_bundled_tokens(full_f32: MemoryBoundPair) -> None:
    assert full_f32.target_parameters == target_parameter_count() >= 0.6e9
    index = json.loads((full_f32.target / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2  # sharded
    prompts = _prompts()
    want_only, want_spec = _greedy(BUNDLE, prompts, NEW_TOKENS)
    assert want_only == want_spec
    got_only, got_spec = _greedy(full_f32.root, prompts, NEW_TOKENS)
    assert got_only == want_only
    assert got_spec == want_spec


@pytest.mark.slow
def test_full_pair_f32_logits_match_natively(full_f32: MemoryBoundPair) -> None:
    # f32 caches: the f32 function (see test_small_widening_is_exact_natively).
    small = dspark.NativeTarget.from_pretrained(BUNDLE / "target", kv_dtype="float32")
    big = dspark.NativeTarget.from_pretrained(full_f32.target, kv_dtype="float32")
    for p in _prompts(2):
        np.testing.assert_allclose(big.logits(p), small.logits(p), atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.torch
def test_transformers_loads_it_and_its_logits_match(full_f32: MemoryBoundPair) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ids = torch.tensor(_prompts(1))
    with torch.inference_mode():
        small = transformers.AutoModelForCausalLM.from_pretrained(BUNDLE / "target").eval()
        want = small(ids).logits
        del small
        big = transformers.AutoModelForCausalLM.from_pretrained(
            full_f32.target, dtype=torch.float32
        ).eval()
        assert sum(p.numel() for p in big.parameters()) == full_f32.target_parameters
        got = big(ids).logits
    assert float((got - want).abs().max()) < 1e-4


@pytest.mark.slow
def test_bf16_pair_is_lossless_and_close_to_the_bundled_function(
    full_bf16: MemoryBoundPair,
) -> None:
    # bfloat16 rounds the embedded (rescaled) weights: the bundled function to bf16 precision.
    # Speculative decoding stays lossless; the argmax agrees except at near-ties.
    prompts = _prompts()
    only, spec = _greedy(full_bf16.root, prompts, NEW_TOKENS)
    assert only == spec
    small = dspark.NativeTarget.from_pretrained(BUNDLE / "target")
    big = dspark.NativeTarget.from_pretrained(full_bf16.target)
    agree = total = 0
    for p in prompts:
        a, b = small.logits(p), big.logits(p)
        assert float(np.abs(a - b).max()) < 0.1
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += len(p)
    assert agree >= 0.95 * total


@pytest.mark.slow
def test_cli_writes_the_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pair"
    rc = cli_main(["make-example", str(out), "--memory-bound", "--dtype", "bfloat16"])
    assert rc == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert "0.62 B parameters" in said and "bfloat16" in said
    assert (out / "target" / "config.json").is_file() and (out / "drafter" / "sts.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["pair"]  # no temporary left
    shutil.rmtree(out)


# -- peers (benches/peers/setup.sh) -------------------------------------------------------


def _peers() -> dict[str, Any]:
    path = PEERS / "peers.json"
    if not path.is_file():
        pytest.skip(f"no peers environment ({path} missing: run bash benches/peers/setup.sh)")
    doc: dict[str, Any] = json.loads(path.read_text())
    if not Path(doc["python"]).is_file():
        pytest.skip(f"peers venv python {doc['python']} missing (rerun benches/peers/setup.sh)")
    return doc


def _peer_python(doc: dict[str, Any], code: str, *args: str, timeout: int = 900) -> str:
    res = subprocess.run(
        [doc["python"], "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return res.stdout


@pytest.mark.slow
def test_llama_cpp_converts_the_pair_and_decodes_the_same_tokens(
    full_bf16: MemoryBoundPair, tmp_path: Path
) -> None:
    doc = _peers()
    root = Path(__file__).resolve().parents[1]
    convert = [sys.executable, str(root / "benches" / "peers" / "convert.py")]
    args = ["--drafter", str(full_bf16.drafter), "--outdir", str(tmp_path), "--outtype", "bf16"]
    res = subprocess.run(
        [*convert, str(full_bf16.target), *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    target, drafter = tmp_path / "target-bf16.gguf", tmp_path / "drafter-bf16.gguf"
    assert target.is_file() and drafter.is_file()
    # Fed the same ids, llama.cpp decodes the same greedy tokens.
    prompts = _prompts(1)
    want = _greedy(full_bf16.root, prompts, 8)[0][0]
    code = (
        "import json, sys, llama_cpp\n"
        "m = llama_cpp.Llama(sys.argv[1], n_ctx=256, n_threads=1, verbose=False)\n"
        "out = []\n"
        "for t in m.generate(json.loads(sys.argv[2]), temp=0.0, top_k=1):\n"
        "    out.append(t)\n"
        "    if len(out) == 8: break\n"
        "print(json.dumps([out, m.detokenize(json.loads(sys.argv[2])).decode()]))\n"
    )
    out = _peer_python(doc, code, str(target), json.dumps(prompts[0])).splitlines()[-1]
    got, text = json.loads(out)
    assert got == want
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(BUNDLE / "target" / "tokenizer.json"))
    assert text == tok.decode(prompts[0])
    # llama.cpp's own DSpark mode runs the drafter GGUF.
    tool = Path(doc["bin"]) / "llama-speculative-simple"
    if tool.is_file():
        # One thread: llama.cpp's spinning pool collapses on a busy two-core machine.
        greedy = [
            "-p",
            "def f(x):",
            "-n",
            "8",
            "--temp",
            "0",
            "--top-k",
            "1",
            "-t",
            "1",
            "-td",
            "1",
        ]
        run = subprocess.run(
            [
                str(tool),
                "-m",
                str(target),
                "-md",
                str(drafter),
                "--spec-type",
                "draft-dspark",
                *greedy,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        assert "n_accept" in run.stderr + run.stdout
    for f in tmp_path.glob("*.gguf"):
        f.unlink()


@pytest.mark.slow
def test_mistralrs_loads_the_target_and_decodes_the_same_text(
    full_bf16: MemoryBoundPair,
) -> None:
    doc = _peers()
    code = (
        "import sys, mistralrs as m\n"
        "r = m.Runner(which=m.Which.Plain(model_id=sys.argv[1], arch=m.Architecture.Qwen3,"
        " dtype=m.ModelDType.F32))\n"
        "res = r.send_completion_request(m.CompletionRequest(model='t', prompt=sys.argv[2],"
        " max_tokens=8, temperature=0.0, top_k=1))\n"
        "print(repr(res.choices[0].text))\n"
    )
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(BUNDLE / "target" / "tokenizer.json"))
    prompts = _prompts(1)
    want = tok.decode(_greedy(full_bf16.root, prompts, 8)[0][0])
    out = _peer_python(doc, code, str(full_bf16.target), tok.decode(prompts[0]))
    assert out.strip().splitlines()[-1] == repr(want)
