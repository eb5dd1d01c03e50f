"""The device path on a CUDA GPU against the CPU fast path (``pytest -m cuda``).

Run by ``scripts/gpu_check.sh`` on a GPU machine with the CUDA wheel; skipped elsewhere.
``DSPARK_CUDA_TEST_DEVICE=cpu`` runs the same tests with every "device" tensor on the CPU
(a dry run of the tests themselves, under whichever kernel path is selected).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import check_distribution, stable_seed  # noqa: E402

import dspark  # noqa: E402
from helpers import BUILD_INFO_KEYS  # noqa: E402

DEVICE = os.environ.get("DSPARK_CUDA_TEST_DEVICE", "cuda")
ON_GPU = DEVICE.startswith("cuda")
pytestmark = [pytest.mark.cuda, pytest.mark.torch]

B, K = 8, 7


def gen(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(stable_seed(*parts))


def on_device(*ts: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(DEVICE) for t in ts]


def agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of rows of ``a`` and ``b`` (host copies) that are identical."""
    a, b = a.cpu(), b.cpu()
    return float((a == b).all(dim=-1).float().mean())


def verify_inputs(vocab: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """Target logits, draft logits close to them and drafts sampled from the draft."""
    g = gen("verify", vocab, str(dtype), seed)
    target = torch.randn(B, K + 1, vocab, generator=g) * 3
    draft = target[:, :K] + torch.randn(B, K, vocab, generator=g)
    q = torch.softmax(draft, dim=-1).reshape(B * K, vocab)
    drafts = torch.multinomial(q, 1, generator=g).reshape(B, K)
    return target.to(dtype), drafts, draft.to(dtype)


def test_build_info_reports_the_build():
    info = dspark.build_info()
    assert set(info) == BUILD_INFO_KEYS
    assert info["kernel_path"] in ("fast", "tensor", "fused")
    assert info["cpu_kernel"] in ("amx-bf16", "avx512-bf16", "avx512", "avx2", "portable")
    if ON_GPU:
        assert info["cuda"] is True
        assert info["cuda_devices"] >= 1
        assert info["cuda_error"] is None


@pytest.mark.parametrize("vocab", [1000, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verify_matches_the_cpu_fast_path(vocab, dtype):
    target, drafts, draft = verify_inputs(vocab, dtype, 0)
    t_d, k_d, q_d = on_device(target, drafts, draft)
    greedy_cpu = dspark.verify(target, drafts, temperature=0.0)
    greedy_dev = dspark.verify(t_d, k_d, temperature=0.0)
    assert greedy_dev.tokens.device == t_d.device
    assert torch.equal(greedy_dev.tokens.cpu(), greedy_cpu.tokens)
    assert torch.equal(greedy_dev.num_accepted.cpu(), greedy_cpu.num_accepted)
    options = [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_k": 50},
        {"temperature": 1.3, "top_p": 0.9},
        {
            "temperature": [0.0, 1.0, 0.5, 2.0, 1.0, 0.0, 1.0, 0.9],
            "top_k": [None, 5, 1, None, 7, 3, None, 2],
        },
        {"temperature": 1.0, "num_draft": [0, 1, 2, 3, 4, 5, 6, 7], "stop_token_ids": [3, 17]},
    ]
    same = total = 0
    for i, opts in enumerate(options):
        for seed in range(25):
            cpu = dspark.verify(target, drafts, draft, seed=seed * 31 + i, **opts)
            dev = dspark.verify(t_d, k_d, q_d, seed=seed * 31 + i, **opts)
            same += int(agreement(dev.tokens, cpu.tokens) * B + 0.5)
            total += B
    assert same / total >= 0.99, f"{same}/{total} rows identical"


def block_inputs(dv: int, r: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = gen("block", dv, r, seed)
    base = torch.randn(B, K, dv, generator=g) * 2
    w1 = torch.randn(dv, r, generator=g) * 0.3
    w2 = torch.randn(dv, r, generator=g) * 0.3
    anchors = torch.randint(0, dv, (B,), generator=g)
    return base, w1, w2, anchors


@pytest.mark.parametrize("vocab", [1000, 151936])
def test_sample_block_matches_the_cpu_fast_path(vocab):
    base, w1, w2, anchors = block_inputs(vocab, 32, 0)
    dev = on_device(base, w1, w2, anchors)
    cpu = dspark.sample_block(base, w1, w2, anchors, temperature=0.0)
    got = dspark.sample_block(*dev, temperature=0.0)
    assert got.draft_logits.device == dev[0].device
    assert torch.equal(got.tokens.cpu(), cpu.tokens)
    q_cpu, q_dev = cpu.draft_logits, got.draft_logits.cpu()
    assert torch.equal(torch.isfinite(q_dev), torch.isfinite(q_cpu))
    torch.testing.assert_close(got.prev_embeddings.cpu(), cpu.prev_embeddings)
    same = total = 0
    for seed in range(20):
        for kw in ({"temperature": 1.0}, {"temperature": 0.6, "top_k": 40}):
            c = dspark.sample_block(base, w1, w2, anchors, seed=seed, **kw)
            d = dspark.sample_block(*dev, seed=seed, **kw)
            same += int(agreement(d.tokens, c.tokens) * B + 0.5)
            total += B
    assert same / total >= 0.99, f"{same}/{total} rows identical"


def test_sample_block_padded_vocabulary_never_emits_padding():
    base, w1, w2, anchors = block_inputs(640, 16, 1)
    base[..., 600:] = 50.0  # padded columns would win if they were not masked
    dev = on_device(base, w1, w2, anchors)
    for seed in range(5):
        got = dspark.sample_block(*dev, temperature=1.0, seed=seed, target_vocab_size=600)
        assert int(got.tokens.max()) < 600
        assert got.draft_logits.shape[-1] == 600


def test_confidence_matches_the_cpu_fast_path():
    g = gen("confidence")
    hidden = torch.randn(B, K, 256, generator=g)
    prev = torch.randn(B, K, 32, generator=g)
    weight = torch.randn(256 + 32, generator=g) * 0.05
    cpu = dspark.confidence(hidden, prev, weight, 0.1, sts=[1.0 + 0.1 * i for i in range(K)])
    sts = [1.0 + 0.1 * i for i in range(K)]
    dev = dspark.confidence(*on_device(hidden, prev, weight), 0.1, sts=sts)
    assert dev.device.type == torch.device(DEVICE).type
    torch.testing.assert_close(dev.cpu(), cpu, rtol=1e-5, atol=1e-6)


def test_verify_on_the_device_is_lossless():
    """The first emitted token of a row follows the target's slot-0 distribution exactly."""
    vocab, rows = 12, 6000
    g = gen("lossless")
    p_logits = torch.randn(vocab, generator=g) * 1.5
    q_logits = torch.randn(vocab, generator=g) * 1.5
    drafts = torch.multinomial(torch.softmax(q_logits, -1), rows, replacement=True, generator=g)
    target = p_logits.expand(rows, 2, vocab).contiguous()
    draft = q_logits.expand(rows, 1, vocab).contiguous()
    t_d, k_d, q_d = on_device(target, drafts[:, None], draft)
    out = dspark.verify(t_d, k_d, q_d, temperature=1.0, seed=list(range(rows)))
    first = out.tokens[:, 0].cpu().numpy()
    check_distribution(first, torch.softmax(p_logits, -1).double().numpy(), what="first token")


@pytest.mark.skipif(not ON_GPU, reason="needs two devices: cuda and cpu")
def test_mixed_devices_are_a_typed_error():
    target, drafts, draft = verify_inputs(100, torch.float32, 2)
    with pytest.raises(dspark.InputError) as e:
        dspark.verify(target.to(DEVICE), drafts, draft)  # draft logits left on the host
    assert e.value.code == "device-mismatch"
    assert "draft_logits" in str(e.value)


@pytest.mark.skipif(not ON_GPU, reason="counts CUDA copies")
def test_verify_reads_logits_on_the_device_without_host_copies():
    """Only ids and counts cross to the host: device-to-host copy time stays far below what
    copying the logits once would take."""
    from torch.profiler import ProfilerActivity, profile

    target, drafts, draft = verify_inputs(151936, torch.float32, 3)
    t_d, k_d, q_d = on_device(target, drafts, draft)
    dspark.verify(t_d, k_d, q_d, temperature=1.0)  # warm-up (module loads)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for seed in range(5):
            dspark.verify(t_d, k_d, q_d, temperature=1.0, seed=seed)
        torch.cuda.synchronize()
    dtoh_us = sum(e.device_time_total for e in prof.key_averages() if "DtoH" in e.key)
    logits_bytes = (t_d.numel() + q_d.numel()) * 4
    # 64 GB/s is above any host link: a single logits copy would take at least this long.
    one_copy_us = logits_bytes / 64e9 * 1e6
    assert dtoh_us < one_copy_us, f"{dtoh_us:.0f} us of device-to-host copies in 5 calls"


def test_speculator_with_a_device_target_equals_target_only_greedy(tmp_path):
    from tiny_models import greedy_reference, make_target, write_drafter

    target = make_target().to(DEVICE)
    path = write_drafter(tmp_path / "drafter", target.cpu(), "shared")
    target = target.to(DEVICE)
    drafter = dspark.Drafter.from_pretrained(path, target)
    prompts = [[(5 * i + 3 * j + 1) % 250 for j in range(3 + i)] for i in range(4)]
    want = [greedy_reference(target, p, 10) for p in prompts]
    got = dspark.Speculator(target, drafter).generate(prompts, 10)
    assert got.tokens == want


def _dtoh_copies(prof: object, trace: os.PathLike[str]) -> list[tuple[int, str]]:
    """The device-to-host copies of the profiled region (every framework in the process: torch
    and dspark alike), from the profiler's trace: ``(bytes, the GPU kernel that ran last before
    it)`` each, so a failure can say who copied."""
    import json

    prof.export_chrome_trace(os.fspath(trace))  # type: ignore[attr-defined]
    events = json.loads(open(trace).read())["traceEvents"]
    gpu = sorted(
        (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy") and "ts" in e),
        key=lambda e: float(e["ts"]),
    )
    copies, last_kernel = [], "(none)"
    for e in gpu:
        name = str(e.get("name", ""))
        if e.get("cat") == "kernel":
            last_kernel = name[:80]
        elif name.startswith("Memcpy DtoH"):
            copies.append((int(e["args"]["bytes"]), last_kernel))
    assert copies, "the profiler saw no device-to-host copy (the ids must cross)"
    return copies


def _copies_summary(copies: list[tuple[int, str]]) -> str:
    from collections import Counter

    count = Counter(copies)
    top = sorted(count.items(), key=lambda kv: kv[0][0] * kv[1], reverse=True)[:6]
    return "; ".join(f"{n} x {size} B after {kernel}" for (size, kernel), n in top)


@pytest.mark.skipif(not ON_GPU, reason="counts CUDA copies")
def test_speculator_keeps_an_hf_targets_logits_on_the_device(tmp_path):
    """An HF target on the GPU: its logits and hidden states are read in place; over a whole
    generation only ids and counts reach the host, less than one round's logits."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import Qwen3ForCausalLM

    from dspark.bundled import bundled_dir

    root = bundled_dir()
    model = Qwen3ForCausalLM.from_pretrained(root / "target", torch_dtype=torch.float32)
    model = model.to(DEVICE).eval()
    drafter = dspark.Drafter.from_pretrained(root / "drafter", model)
    assert drafter.device.startswith("cuda")
    spec = dspark.Speculator(model, drafter)
    prompts = [[(13 * i + 7 * j + 3) % 2900 for j in range(5 + 4 * i)] for i in range(4)]
    spec.generate(prompts, 4)  # warm-up: module loads, first allocations
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = spec.generate(prompts, 24)
        torch.cuda.synchronize()
    assert out.stats.rounds >= 2
    one_round = len(prompts) * (drafter.block_size + 1) * model.config.vocab_size * 4
    copies = _dtoh_copies(prof, tmp_path / "trace.json")
    copied = sum(size for size, _ in copies)
    assert copied < one_round, (
        f"{copied} bytes to the host; one round's logits: {one_round}. Largest: "
        + _copies_summary(copies)
    )
    want = spec.generate_target_only(prompts, 24).tokens
    assert out.tokens == want


def test_torch_drafter_on_the_device_equals_the_host(tmp_path):
    from tiny_models import make_target, write_drafter

    target = make_target()
    path = write_drafter(tmp_path / "drafter", target, "own")
    host = dspark.TorchDrafter.from_pretrained(path, target)
    dev = dspark.TorchDrafter.from_pretrained(path, target).to(DEVICE)
    assert dev.device.type == torch.device(DEVICE).type
    ctx = torch.randn(3, 6, dev.weights.fc.shape[1], generator=gen("torch drafter"))
    anchors = torch.tensor([5, 77, 200])
    want = host.propose(ctx, anchors, temperature=0.0)
    got = dev.propose(ctx.to(DEVICE), anchors.to(DEVICE), temperature=0.0)
    assert torch.equal(torch.as_tensor(got.tokens).cpu(), torch.as_tensor(want.tokens))
    sampled = [
        d.propose(c, anchors, temperature=1.0, seed=[1, 2, 3]).tokens
        for d, c in ((host, ctx), (dev, ctx.to(DEVICE)))
    ]
    assert agreement(torch.as_tensor(sampled[1]), torch.as_tensor(sampled[0])) >= 2 / 3


def test_native_pair_on_the_device_equals_the_cpu_fast_path():
    # NativeTarget + Drafter with their weights on the device: the round loop verifies on the
    # device and returns the CPU path's greedy tokens.
    from dspark.bundled import bundled_dir

    root = bundled_dir()
    target = dspark.NativeTarget.from_pretrained(root / "target", device=DEVICE)
    drafter = dspark.Drafter.from_pretrained(root / "drafter", target)
    assert target.device == drafter.device == ("cuda:0" if DEVICE == "cuda" else DEVICE)
    cpu_target = dspark.NativeTarget.from_pretrained(root / "target")
    cpu_drafter = dspark.Drafter.from_pretrained(root / "drafter", cpu_target)
    cpu = dspark.Speculator(cpu_target, cpu_drafter)
    prompts = [[(11 * i + 5 * j + 2) % 2900 for j in range(6 + 9 * i)] for i in range(3)]
    want = cpu.generate_target_only(prompts, 24).tokens
    assert dspark.Speculator(target, drafter).generate(prompts, 24).tokens == want
    assert cpu.generate(prompts, 24).tokens == want


def test_same_seed_same_draws_on_repeat():
    target, drafts, draft = verify_inputs(5000, torch.float32, 4)
    t_d, k_d, q_d = on_device(target, drafts, draft)
    a = dspark.verify(t_d, k_d, q_d, temperature=1.0, seed=[1, 2, 3, 4, 5, 6, 7, 8])
    b = dspark.verify(t_d, k_d, q_d, temperature=1.0, seed=[1, 2, 3, 4, 5, 6, 7, 8])
    assert torch.equal(a.tokens.cpu(), b.tokens.cpu())
    assert np.all(a.num_accepted.cpu().numpy() <= K)


# The CPU side of the comparison below: the fused kernels' Rust models, which the process runs
# on host tensors under DSPARK_KERNEL_PATH=fused (the variable is read once per process, hence
# a child process).
_MODEL_CHILD = """
import sys
import torch
import dspark

assert dspark.build_info()["kernel_path"] == "fused"
cases = torch.load(sys.argv[1])
out = []
for kind, args, kw in cases:
    if kind == "verify":
        v = dspark.verify(*args, **kw)
        out.append((v.tokens, v.num_accepted))
    else:
        b = dspark.sample_block(*args, **kw)
        out.append((b.tokens, b.draft_logits, b.prev_embeddings))
torch.save(out, sys.argv[2])
"""


def _fused_cases() -> list[tuple[str, tuple, dict]]:
    """Verify and block-sampler calls across dtypes, several 8192-wide chunks, truncations,
    greedy and sampled requests, stop ids, d2t tables and top-k drafting."""
    g = gen("fused models")
    b, k, v = 4, 5, 20_000
    cases: list[tuple[str, tuple, dict]] = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        target = (torch.randn(b, k + 1, v, generator=g) * 3).to(dtype)
        draft = (target[:, :k].float() + torch.randn(b, k, v, generator=g)).to(dtype)
        q = torch.softmax(draft.float(), dim=-1).reshape(b * k, v)
        drafts = torch.multinomial(q, 1, generator=g).reshape(b, k)
        for i, opts in enumerate(
            [
                {"temperature": 1.0},
                {"temperature": [0.0, 1.0, 0.7, 1.3], "top_k": [None, 40, None, 5]},
                {"temperature": 0.9, "top_p": [1.0, 0.9, 0.5, 0.95], "top_k": [None, None, 7, 20]},
                {"temperature": 1.0, "num_draft": [0, 2, 5, 3], "stop_token_ids": [3, 17]},
            ]
        ):
            for seed in range(3):
                kw = {**opts, "seed": [seed * 7 + r + 11 * i for r in range(b)]}
                cases.append(("verify", (target, drafts, draft), kw))
                cases.append(("verify", (target, drafts), kw))
    # Target and draft logits in different dtypes (the fast path takes them as they are).
    target = (torch.randn(b, k + 1, v, generator=g) * 3).to(torch.bfloat16)
    draft = target[:, :k].float() + torch.randn(b, k, v, generator=g)
    drafts = torch.randint(0, v, (b, k), generator=g)
    cases.append(("verify", (target, drafts, draft), {"temperature": 1.0, "seed": [1, 2, 3, 4]}))
    dv, r = 3_000, 32
    for dtype in (torch.float32, torch.bfloat16):
        base = (torch.randn(b, k, dv, generator=g) * 2).to(dtype)
        w1 = (torch.randn(dv, r, generator=g) * 0.3).to(dtype)
        w2 = (torch.randn(dv, r, generator=g) * 0.3).to(dtype)
        anchors = torch.randint(0, dv, (b,), generator=g)
        for kw in (
            {"temperature": 0.0},
            {"temperature": 1.0, "seed": [1, 2, 3, 4]},
            {"temperature": 0.8, "top_k": 30, "seed": [5, 6, 7, 8]},
            {"temperature": 1.0, "seed": [9, 1, 9, 1], "target_vocab_size": 2_900},
        ):
            cases.append(("block", (base, w1, w2, anchors), kw))
    return cases


def test_fused_kernels_equal_their_cpu_models(tmp_path):
    """On the device, the fused kernels (the default for CUDA tensors) return what their Rust
    models return on the CPU for the same inputs and seeds: the same tokens and counts, and the
    same draft logits and embeddings, bit for bit."""
    import subprocess
    import sys

    if not ON_GPU and dspark.build_info()["kernel_path"] != "fused":
        pytest.skip("on the CPU the comparison needs DSPARK_KERNEL_PATH=fused in this process too")
    cases = _fused_cases()
    inputs, results = tmp_path / "cases.pt", tmp_path / "model.pt"
    torch.save(cases, inputs)
    env = {**os.environ, "DSPARK_KERNEL_PATH": "fused"}
    child = subprocess.run(
        [sys.executable, "-c", _MODEL_CHILD, str(inputs), str(results)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    want = torch.load(results)
    for i, (kind, args, kw) in enumerate(cases):
        args = tuple(on_device(*args))
        if kind == "verify":
            got = dspark.verify(*args, **kw)
            got_parts = (got.tokens, got.num_accepted)
        else:
            blk = dspark.sample_block(*args, **kw)
            got_parts = (blk.tokens, blk.draft_logits, blk.prev_embeddings)
        for a, w in zip(got_parts, want[i], strict=True):
            a = torch.as_tensor(a).cpu()
            w = torch.as_tensor(w)
            if a.is_floating_point():
                a, w = a.view(torch.int32), w.view(torch.int32)  # bits, -inf included
            assert torch.equal(a, w), f"case {i} ({kind}, {kw})"


def test_fused_errors_match_the_fast_path():
    """Bad input gets the fast path's typed error, in its order, with the draft ids on the
    device (checked there): NaN and infinite rows, rows without a finite value, ids out of
    range, too many drafts."""
    target, drafts, draft = verify_inputs(300, torch.float32, 9)

    def edited(t_edit=None, d_edit=None, k_edit=None):
        t, d, k = target.clone(), draft.clone(), drafts.clone()
        if t_edit:
            t_edit(t)
        if d_edit:
            d_edit(d)
        if k_edit:
            k_edit(k)
        return t, k, d

    cases = [
        edited(t_edit=lambda t: t[1, 3].fill_(float("nan"))),
        edited(t_edit=lambda t: t[0, 2].fill_(float("-inf"))),
        edited(d_edit=lambda d: d[2, 1, 7].fill_(float("inf"))),
        edited(d_edit=lambda d: d[3, 0].fill_(float("-inf"))),
        edited(k_edit=lambda k: k[5, 2].fill_(300)),
        edited(k_edit=lambda k: k[4, 0].fill_(-1), t_edit=lambda t: t[1, 1].fill_(float("nan"))),
    ]
    for i, (t, k, d) in enumerate(cases):
        for temperature in (0.0, 1.0):
            for with_draft in (False, True):
                q = (d,) if with_draft else ()
                errors = []
                for args in ((t, k, *q), tuple(on_device(t, k, *q))):
                    try:
                        dspark.verify(*args, temperature=temperature, seed=list(range(B)))
                        errors.append(None)
                    except dspark.DSparkError as e:
                        errors.append((type(e).__name__, e.code, str(e)))
                # Both paths raise the same error, or none (a draft row without a finite value
                # only matters to a sampled round that reaches it; one left out, never).
                assert errors[1] == errors[0], f"case {i} T {temperature} draft {with_draft}"
    with pytest.raises(dspark.InputError) as e:
        dspark.verify(*on_device(target, drafts, draft), num_draft=[K + 1] * B)
    assert e.value.code == "invalid-argument"
