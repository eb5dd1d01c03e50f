"""Benchmark the device path on a CUDA GPU (run by ``scripts/gpu_check.sh``).

Rows, each against peers measured in the same run on the same device:

- ``verify``: ``dspark.verify`` at B in {1, 8, 64}, K = 7, V = 151936, f32 and bf16 (sampled,
  T = 1, with draft logits) against the torch-ops reference (``tests/torch_reference.py``)
  and the HBM read floor (the logits' bytes over the measured read bandwidth). ``path``:
  ``fused`` (the default for CUDA tensors, ``kernels/fused_verify.cu``) or ``tensor`` (candle
  ops, in a child process with ``DSPARK_KERNEL_PATH=tensor``); fused rows carry
  ``speedup_vs_tensor_path``.
- ``sample_block``: ``dspark.sample_block`` (T = 1, rank 64) likewise, fused and tensor path.
- ``drafter_propose``: ``dspark.Drafter.propose`` of a Qwen3-4B-shaped drafter (5 layers, hidden
  2560, V = 151936; random weights, embed / lm_head shared) against ``dspark.TorchDrafter``
  on the same device, at B in {1, 8, 64}, in float32 and bfloat16 (2 bytes on both sides).
- ``speculator``: the bundled native pair (greedy, full verification) on the device against
  the same pair on the CPU fast path, at B = 1 and 8: tokens/s and greedy agreement.
- ``profile_verify`` / ``profile_sample_block`` (GPU only): one B = 1 f32 call under the CUDA
  profiler, per path: wall time, kernel launches and their summed time, copies each way, the
  longest kernels. The draft ids are on the device, so a fused call has no host-to-device copy.
- ``memory_bound_pair``: the memory-bound pair (``make-example --memory-bound``) in bf16 on
  the device at B = 1: the native target alone and speculative, and transformers' model of
  the same target alone and behind ``dspark.Speculator`` with the dspark drafter; tokens/s,
  the three ratios and greedy agreement with the native target alone.
- ``targets``: the targets checked on the rows (verify at least 5x torch ops at every B and
  dtype and within 3x the read floor at B = 64; block sampling at least 3x torch ops; no
  host-to-device copy in the fused profile rows; drafter propose at least 1x TorchDrafter at
  every B and dtype; the bundled pair's speculator faster on the device than on the CPU;
  memory-bound pair: native target-only at least HF target-only, speculative at least 2x
  target-only for both targets, greedy tokens equal).

Each section's rows are written to ``--out`` as it ends; a section that raises is reported
(``errors`` in the JSON, exit status 1) and the others still run.

    python benches/bench_cuda.py --out results.json          # on a GPU
    python benches/bench_cuda.py --device cpu --quick        # a smoke run of the script
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

import dspark
from dspark.example import _qwen3_layer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from device_timing import emit, read_bandwidth, sync, timeit, versus
from torch_reference import markov_block as torch_block
from torch_reference import verify as torch_verify

DEVICE_TYPE = "cuda"  # set by main: on the CPU (a smoke run) the host path is what runs


def kernel_path() -> str:
    """Which kernels this process's tensors take: on CUDA, ``tensor`` when forced, else fused;
    on the CPU, the host path ``build_info`` names."""
    path = dspark.build_info()["kernel_path"]
    if DEVICE_TYPE != "cuda":
        return path
    return "tensor" if path == "tensor" else "fused"


def verify_rows(args: argparse.Namespace, device: torch.device, bw: float) -> list[dict]:
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for b in args.batches:
            g = torch.Generator(device=device).manual_seed(b)
            target = (torch.randn(b, args.k + 1, args.vocab, device=device, generator=g) * 3).to(
                dtype
            )
            head = target[:, : args.k].float()
            draft = (head + torch.randn_like(head)).to(dtype)
            q = torch.softmax(draft.float(), -1).reshape(-1, args.vocab)
            drafts = torch.multinomial(q, 1, generator=g).reshape(b, args.k)
            seeds = list(range(b))

            ours = partial(dspark.verify, target, drafts, draft, temperature=1.0, seed=seeds)
            ref = partial(torch_verify, target, drafts, draft, temperature=1.0, generator=g)

            t_ours = timeit(ours, device, runs=args.runs)
            t_ref = timeit(ref, device, runs=args.runs)
            floor = (target.numel() + draft.numel()) * target.element_size() / bw
            emit(
                rows,
                {
                    "kernel": "verify",
                    "path": kernel_path(),
                    "dtype": str(dtype).removeprefix("torch."),
                    "B": b,
                    "K": args.k,
                    "V": args.vocab,
                    "dspark_ms": t_ours * 1e3,
                    "torch_ms": t_ref * 1e3,
                    "floor_ms": floor * 1e3,
                    "speedup_vs_torch": t_ref / t_ours,
                    "x_floor": t_ours / floor,
                },
            )
    return rows


def block_rows(args: argparse.Namespace, device: torch.device) -> list[dict]:
    rows = []
    rank = 64
    for dtype in (torch.float32, torch.bfloat16):
        for b in args.batches:
            g = torch.Generator(device=device).manual_seed(100 + b)
            base = (torch.randn(b, args.k, args.vocab, device=device, generator=g) * 2).to(dtype)
            w1 = (torch.randn(args.vocab, rank, device=device, generator=g) * 0.3).to(dtype)
            w2 = (torch.randn(args.vocab, rank, device=device, generator=g) * 0.3).to(dtype)
            anchors = torch.randint(0, args.vocab, (b,), device=device, generator=g)
            seeds = list(range(b))

            ours = partial(dspark.sample_block, base, w1, w2, anchors, temperature=1.0, seed=seeds)
            ref = partial(torch_block, base, w1, w2, anchors, temperature=1.0, generator=g)

            t_ours = timeit(ours, device, runs=args.runs)
            t_ref = timeit(ref, device, runs=args.runs)
            emit(
                rows,
                {
                    "kernel": "sample_block",
                    "path": kernel_path(),
                    "dtype": str(dtype).removeprefix("torch."),
                    "B": b,
                    "K": args.k,
                    "V": args.vocab,
                    "rank": rank,
                    **versus(t_ours, t_ref, "torch"),
                },
            )
    return rows


def drafter_checkpoint(
    root: Path, dims: dict, device: torch.device, dtype: torch.dtype = torch.float32
) -> dict:
    """Write a random DSpark drafter of ``dims`` to ``root`` (its matrices in ``dtype``);
    return its target dict (config plus the embedding and lm_head the drafter shares, on
    ``device`` in ``dtype``)."""
    from safetensors.torch import save_file

    h, v, ffn = dims["hidden"], dims["vocab"], dims["intermediate"]
    heads, kvh, hd, layers = dims["heads"], dims["kv_heads"], dims["head_dim"], dims["layers"]
    ids, rank, block = [1, 17, 33], 64, 8
    g = torch.Generator(device=device).manual_seed(7)

    def w(*shape: int, scale: float = 0.02) -> torch.Tensor:
        t = torch.randn(*shape, device=device, generator=g) * scale
        return (t.to(dtype) if len(shape) == 2 else t).cpu()

    target_cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": v,
        "hidden_size": h,
        "intermediate_size": ffn,
        "num_hidden_layers": 36,
        "num_attention_heads": heads,
        "num_key_value_heads": kvh,
        "head_dim": hd,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    }
    cfg = dict(target_cfg)
    cfg.update(
        {
            "architectures": ["Qwen3DSparkModel"],
            "num_hidden_layers": layers,
            "num_target_layers": 36,
            "block_size": block,
            "mask_token_id": v - 1,
            "target_layer_ids": ids,
            "num_anchors": 16,
            "markov_rank": rank,
            "markov_head_type": "vanilla",
            "enable_confidence_head": True,
            "confidence_head_with_markov": True,
            "layer_types": ["full_attention"] * layers,
        }
    )
    t = {
        "fc.weight": w(h, len(ids) * h),
        "hidden_norm.weight": torch.ones(h),
        "norm.weight": torch.ones(h),
        "markov_head.markov_w1.weight": w(v, rank),
        "markov_head.markov_w2.weight": w(v, rank),
        "confidence_head.proj.weight": w(1, h + rank),
        "confidence_head.proj.bias": torch.zeros(1),
    }
    for i in range(layers):
        t.update(
            _qwen3_layer(
                f"layers.{i}.",
                w,
                torch.ones,
                hidden=h,
                heads=heads,
                kv_heads=kvh,
                head_dim=hd,
                intermediate=ffn,
            )
        )
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg))
    save_file(t, root / "model.safetensors")
    embed = (torch.randn(v, h, device=device, generator=g) * 0.02).to(dtype)
    lm_head = (torch.randn(v, h, device=device, generator=g) * 0.02).to(dtype)
    return {"config": target_cfg, "embed_tokens": embed, "lm_head": lm_head}


def drafter_rows(args: argparse.Namespace, device: torch.device) -> list[dict]:
    dims = (
        {"hidden": 256, "vocab": 4096, "intermediate": 512, "heads": 4, "kv_heads": 2}
        | {"head_dim": 64, "layers": 2}
        if args.quick
        else {"hidden": 2560, "vocab": 151936, "intermediate": 9728, "heads": 32, "kv_heads": 8}
        | {"head_dim": 128, "layers": 5}
    )
    rows = []
    batches = (1, 4) if args.quick else (1, 8, 64)
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "drafter"
            target = drafter_checkpoint(path, dims, device, dtype)
            ours = dspark.Drafter.from_pretrained(path, target, device=str(device))
            ref = dspark.TorchDrafter.from_pretrained(path, target, dtype=dtype).to(device)
            width = 3 * dims["hidden"]
            for b in batches:
                g = torch.Generator(device=device).manual_seed(b)
                context = torch.randn(b, 64, width, device=device, generator=g).to(dtype)
                anchors = torch.randint(0, dims["vocab"] - 1, (b,), device=device, generator=g)
                t_ours = timeit(partial(ours.propose, context, anchors), device, runs=args.runs)
                t_ref = timeit(partial(ref.propose, context, anchors), device, runs=args.runs)
                emit(
                    rows,
                    {
                        "kernel": "drafter_propose",
                        "dtype": name,
                        "B": b,
                        "context": 64,
                        "dims": dims,
                        **versus(t_ours, t_ref, "torch_drafter"),
                    },
                )
    return rows


def memory_bound_rows(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """The memory-bound pair in bf16 on the device at B = 1: the native target alone and
    speculative, transformers' model of the same target alone (``dspark.measure.target_only``)
    and behind ``dspark.Speculator`` with the dspark drafter. Greedy, 64 new tokens."""
    from transformers import AutoModelForCausalLM

    from dspark.measure import target_only
    from dspark.memory_bound import Shape, write_memory_bound

    shape = Shape(hidden=256, heads=4, kv_heads=2, head_dim=128, intermediate=1024, layers=10)
    new = 16 if args.quick else 64
    prompts = [[(11 * i + 5 * j + 2) % 2900 for j in range(48)] for i in range(3)]
    with tempfile.TemporaryDirectory() as tmp:
        pair = Path(tmp) / "pair"
        kw = {"shape": shape, "draft_layers": 2} if args.quick else {}
        write_memory_bound(pair, dtype="bfloat16", **kw)
        native = dspark.NativeTarget.from_pretrained(pair / "target", device=str(device))
        spec = dspark.Speculator(
            native, dspark.Drafter.from_pretrained(pair / "drafter", native), seed=0
        )
        hf = AutoModelForCausalLM.from_pretrained(pair / "target", dtype=torch.bfloat16)
        hf = hf.to(device).eval()
        hf_drafter = dspark.Drafter.from_pretrained(pair / "drafter", hf)
        hf_spec = dspark.Speculator(hf, hf_drafter, seed=0)
        spec.generate([prompts[0]], 4)  # warm-up
        hf_spec.generate([prompts[0]], 4)
        target_only(hf, prompts[0], 4)

        def rate(call: Callable[[list[int]], list[int]]) -> tuple[float, list[list[int]]]:
            outs, secs = [], 0.0
            for p in prompts:
                sync(device)
                t0 = time.perf_counter()
                outs.append(call(p))
                sync(device)
                secs += time.perf_counter() - t0
            return sum(map(len, outs)) / secs, outs

        def alone(p: list[int]) -> list[int]:
            return list(spec.generate_target_only([p], new).tokens[0])

        runs = {
            "native_target_only": rate(alone),
            "native_speculative": rate(lambda p: list(spec.generate([p], new).tokens[0])),
            "hf_target_only": rate(lambda p: target_only(hf, p, new)[0]),
            "hf_speculative": rate(lambda p: list(hf_spec.generate([p], new).tokens[0])),
        }
    # Each target's speculative tokens against its own greedy decoding (the two targets round
    # differently in bf16: transformers keeps bf16 activations, the native target f32).
    row = {
        "kernel": "memory_bound_pair",
        "dtype": "bfloat16",
        "B": 1,
        "new_tokens": new,
        **{f"{k}_tokens_per_s": v[0] for k, v in runs.items()},
        "greedy_equal": {
            "native": runs["native_speculative"][1] == runs["native_target_only"][1],
            "hf": runs["hf_speculative"][1] == runs["hf_target_only"][1],
        },
        "native_equals_hf": runs["native_target_only"][1] == runs["hf_target_only"][1],
    }
    tps = {k: v[0] for k, v in runs.items()}
    row["native_target_only_vs_hf"] = tps["native_target_only"] / tps["hf_target_only"]
    row["native_speculative_vs_target_only"] = tps["native_speculative"] / tps["native_target_only"]
    row["hf_speculative_vs_hf_target_only"] = tps["hf_speculative"] / tps["hf_target_only"]
    print(json.dumps(row), flush=True)
    return [row]


def profile_rows(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Where one call's time goes (the CUDA profiler, B = 1, f32): wall time, the number of
    kernels and their summed time, the copies each way, and the five longest kernels. A call
    far above its kernels' sum is bound by launches and host round trips, not by the GPU."""
    if device.type != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator(device=device).manual_seed(5)
    target = torch.randn(1, args.k + 1, args.vocab, device=device, generator=g) * 3
    draft = target[:, : args.k] + torch.randn(1, args.k, args.vocab, device=device, generator=g)
    drafts = torch.randint(0, args.vocab, (1, args.k), device=device, generator=g)
    w1 = torch.randn(args.vocab, 64, device=device, generator=g) * 0.3
    w2 = torch.randn(args.vocab, 64, device=device, generator=g) * 0.3
    anchors = torch.randint(0, args.vocab, (1,), device=device, generator=g)
    calls = {
        "verify": partial(dspark.verify, target, drafts, draft, temperature=1.0, seed=[1]),
        "sample_block": partial(
            dspark.sample_block, draft, w1, w2, anchors, temperature=1.0, seed=[1]
        ),
    }
    rows = []
    for name, fn in calls.items():
        fn()
        sync(device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            fn()
            sync(device)
            wall = time.perf_counter() - t0
        kernels: dict[str, list[float]] = {}
        copies = {"DtoH": 0, "HtoD": 0, "DtoD": 0}
        on_gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        for e in on_gpu:
            key = str(e.name)
            kind = next((k for k in copies if k in key), None)
            if kind is not None:
                copies[kind] += 1
            elif "Memset" not in key:
                kernels.setdefault(key[:60], []).append(e.device_time_total)
        total_us = sum(sum(v) for v in kernels.values())
        top = sorted(kernels.items(), key=lambda kv: sum(kv[1]), reverse=True)[:5]
        emit(
            rows,
            {
                "kernel": f"profile_{name}",
                "path": kernel_path(),
                "wall_ms": wall * 1e3,
                "kernel_launches": sum(len(v) for v in kernels.values()),
                "kernel_ms": total_us / 1e3,
                "copies": copies,
                "longest": {k: round(sum(v) / 1e3, 4) for k, v in top},
            },
        )
    return rows


def speculator_rows(args: argparse.Namespace, device: torch.device) -> list[dict]:
    from dspark.bundled import bundled_dir

    root = bundled_dir()
    pairs = {}
    for where in ("cpu", str(device)):
        target = dspark.NativeTarget.from_pretrained(root / "target", device=where)
        pairs[where] = dspark.Speculator(
            target, dspark.Drafter.from_pretrained(root / "drafter", target), seed=0
        )
    rows = []
    new = 16 if args.quick else 64
    for b in (1, 8):
        prompts = [[(13 * i + 7 * j + 3) % 2900 for j in range(32 + 5 * i)] for i in range(b)]
        out, secs = {}, {}
        for where, spec in pairs.items():
            spec.generate(prompts, 4)  # warm-up (kernels loaded, caches sized)
            t0 = time.perf_counter()
            out[where] = spec.generate(prompts, new).tokens
            secs[where] = time.perf_counter() - t0
        tokens = sum(len(t) for t in out["cpu"])
        emit(
            rows,
            {
                "kernel": "speculator",
                "B": b,
                "new_tokens": new,
                "device_tokens_per_s": tokens / secs[str(device)],
                "cpu_tokens_per_s": tokens / secs["cpu"],
                "speedup_vs_cpu": secs["cpu"] / secs[str(device)],
                "greedy_equal": out["cpu"] == out[str(device)],
            },
        )
    return rows


def tensor_path_rows(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """The kernel sections again on the tensor path: this script in a child process with
    ``DSPARK_KERNEL_PATH=tensor``, bounded in time."""
    import os
    import subprocess

    if dspark.build_info()["kernel_path"] == "tensor":
        return []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "tensor.json"
        cmd = [sys.executable, __file__, "--device", str(device), "--out", str(out)]
        cmd += ["--sections", "verify,sample_block,profile"] + (["--quick"] if args.quick else [])
        env = {**os.environ, "DSPARK_KERNEL_PATH": "tensor"}
        subprocess.run(cmd, env=env, check=True, timeout=args.child_timeout)
        return json.loads(out.read_text())["rows"]


def compare_paths(rows: list[dict]) -> None:
    """Add ``speedup_vs_tensor_path`` to each fused kernel row that has a tensor-path twin."""
    key = lambda r: (r["kernel"], r.get("dtype"), r.get("B"))  # noqa: E731
    tensor = {key(r): r for r in rows if r.get("path") == "tensor" and "dspark_ms" in r}
    for r in rows:
        twin = tensor.get(key(r))
        if r.get("path") == "fused" and twin is not None:
            r["speedup_vs_tensor_path"] = twin["dspark_ms"] / r["dspark_ms"]


def targets(rows: list[dict]) -> dict:
    """The fused kernels' targets, each with the rows' worst value and whether it is met."""
    fused = [r for r in rows if r.get("path") == "fused"]
    verify = [r for r in fused if r["kernel"] == "verify"]
    block = [r for r in fused if r["kernel"] == "sample_block"]
    profiles = [r for r in fused if r["kernel"].startswith("profile_")]
    out: dict = {}
    if verify:
        worst = min(r["speedup_vs_torch"] for r in verify)
        out["verify_vs_torch_min"] = {"value": worst, "target": 5.0, "met": worst >= 5.0}
        at64 = [r["x_floor"] for r in verify if r["B"] == 64]
        if at64:
            out["verify_x_floor_at_64_max"] = {
                "value": max(at64),
                "target": 3.0,
                "met": max(at64) <= 3.0,
            }
    if block:
        worst = min(r["speedup_vs_torch"] for r in block)
        out["sample_block_vs_torch_min"] = {"value": worst, "target": 3.0, "met": worst >= 3.0}
    if profiles:
        htod = max(r["copies"]["HtoD"] for r in profiles)
        out["fused_htod_copies_per_call"] = {"value": htod, "target": 0, "met": htod == 0}
    drafter = [r for r in rows if r["kernel"] == "drafter_propose"]
    if drafter:
        worst = min(r["speedup_vs_torch_drafter"] for r in drafter)
        out["drafter_vs_torch_drafter_min"] = {"value": worst, "target": 1.0, "met": worst >= 1.0}
    spec = [r for r in rows if r["kernel"] == "speculator"]
    if spec:
        worst = min(r["speedup_vs_cpu"] for r in spec)
        out["speculator_vs_cpu_min"] = {"value": worst, "target": 1.0, "met": worst > 1.0}
    for r in rows:
        if r["kernel"] != "memory_bound_pair":
            continue
        for key, want in (
            ("native_target_only_vs_hf", 1.0),
            ("native_speculative_vs_target_only", 2.0),
            ("hf_speculative_vs_hf_target_only", 2.0),
        ):
            out[f"memory_bound_{key}"] = {"value": r[key], "target": want, "met": r[key] >= want}
        equal = all(r["greedy_equal"].values())
        out["memory_bound_greedy_equal"] = {"value": equal, "target": True, "met": equal}
    return out


SECTIONS = ("verify", "sample_block", "profile", "speculator", "drafter", "memory_bound")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small shapes: a smoke run")
    ap.add_argument("--out", type=Path, help="write the results here as JSON")
    ap.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {', '.join(SECTIONS)}",
    )
    ap.add_argument(
        "--child-timeout",
        type=float,
        default=150.0,
        help="seconds for the tensor-path child run (0: skip it)",
    )
    args = ap.parse_args(argv)
    chosen = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    device = torch.device(args.device)
    global DEVICE_TYPE
    DEVICE_TYPE = device.type
    args.k = 7
    args.vocab = 4096 if args.quick else 151936
    args.batches = [1, 4] if args.quick else [1, 8, 64]
    args.runs = 3 if args.quick else 20
    torch.manual_seed(0)
    bw = read_bandwidth(device, 64 if args.quick else 2048)
    print(f"read bandwidth on {device}: {bw / 1e9:.0f} GB/s", flush=True)
    result: dict = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "build_info": dspark.build_info(),
        "path": kernel_path(),
        "read_bandwidth_gbps": bw / 1e9,
        "rows": [],
    }
    # Each section's rows are written as soon as it ends, so a run stopped by its time limit
    # (the device check bounds it) still leaves what it measured.
    by_name = {
        "verify": partial(verify_rows, args, device, bw),
        "sample_block": partial(block_rows, args, device),
        "profile": partial(profile_rows, args, device),
        "speculator": partial(speculator_rows, args, device),
        "drafter": partial(drafter_rows, args, device),
        "memory_bound": partial(memory_bound_rows, args, device),
    }
    sections = [by_name[n] for n in SECTIONS if n in chosen]
    if args.child_timeout > 0 and {"verify", "sample_block"} & set(chosen):
        # The tensor path right after the kernels it is compared with.
        at = sum(n in chosen for n in ("verify", "sample_block"))
        sections.insert(at, partial(tensor_path_rows, args, device))
    failed = []
    for section in sections:
        name = section.func.__name__
        try:
            result["rows"] += section()
        except Exception as e:  # one broken section must not hide the others
            traceback.print_exc()
            failed.append(name)
            result.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
        compare_paths(result["rows"])
        result["targets"] = targets(result["rows"])
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({"targets": result["targets"]}, indent=2), flush=True)
    if failed:
        sys.exit(f"bench_cuda: these sections failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
