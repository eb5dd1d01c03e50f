"""Benchmark the device path on a CUDA GPU (run by ``scripts/gpu_check.sh``).

Rows, each against peers measured in the same run on the same device:

- ``verify``: ``dspark.verify`` at B in {1, 8, 64}, K = 7, V = 151936, f32 and bf16 (sampled,
  T = 1, with draft logits) against the torch-ops reference of the same algorithm
  (``tests/torch_reference.py``) and against the HBM read floor (the logits' bytes over the
  device's measured read bandwidth).
- ``sample_block``: ``dspark.sample_block`` (T = 1, rank 64) at the same shapes against the
  torch-ops reference.
- ``speculator``: the bundled native pair (``NativeTarget`` + ``Drafter``, greedy, full
  verification) with weights on the device against the same pair on the CPU fast path, at
  B = 1 and B = 8: tokens/s and the greedy tokens' agreement (they must be equal).

Targets (issue 10): verify within 3x of the floor at B = 64 and 5x faster than torch;
block sampling 3x faster than torch.

    python benches/bench_cuda.py --out results.json          # on a GPU
    python benches/bench_cuda.py --device cpu --quick        # a smoke run of the script
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

import dspark

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from torch_reference import markov_block as torch_block
from torch_reference import verify as torch_verify


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timeit(fn: Callable[[], object], device: torch.device, *, runs: int, warmup: int = 2) -> float:
    """Median seconds per call (the device synchronized around each call)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def read_bandwidth(device: torch.device, mib: int) -> float:
    """Bytes per second of a full read: best of 5 sums over a ``mib`` MiB float32 tensor."""
    x = torch.ones(mib * 2**20 // 4, device=device)
    best = min(timeit(lambda: x.sum(), device, runs=3, warmup=1) for _ in range(5))
    return x.numel() * 4 / best


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
            rows.append(
                {
                    "kernel": "verify",
                    "dtype": str(dtype).removeprefix("torch."),
                    "B": b,
                    "K": args.k,
                    "V": args.vocab,
                    "dspark_ms": t_ours * 1e3,
                    "torch_ms": t_ref * 1e3,
                    "floor_ms": floor * 1e3,
                    "speedup_vs_torch": t_ref / t_ours,
                    "x_floor": t_ours / floor,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
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
            rows.append(
                {
                    "kernel": "sample_block",
                    "dtype": str(dtype).removeprefix("torch."),
                    "B": b,
                    "K": args.k,
                    "V": args.vocab,
                    "rank": rank,
                    "dspark_ms": t_ours * 1e3,
                    "torch_ms": t_ref * 1e3,
                    "speedup_vs_torch": t_ref / t_ours,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def speculator_rows(args: argparse.Namespace, device: torch.device) -> list[dict]:
    from dspark.demo import bundled_dir

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
        rows.append(
            {
                "kernel": "speculator",
                "B": b,
                "new_tokens": new,
                "device_tokens_per_s": tokens / secs[str(device)],
                "cpu_tokens_per_s": tokens / secs["cpu"],
                "speedup_vs_cpu": secs["cpu"] / secs[str(device)],
                "greedy_equal": out["cpu"] == out[str(device)],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small shapes: a smoke run")
    ap.add_argument("--out", type=Path, help="write the results here as JSON")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    args.k = 7
    args.vocab = 4096 if args.quick else 151936
    args.batches = [1, 4] if args.quick else [1, 8, 64]
    args.runs = 3 if args.quick else 20
    torch.manual_seed(0)
    bw = read_bandwidth(device, 64 if args.quick else 2048)
    print(f"read bandwidth on {device}: {bw / 1e9:.0f} GB/s", flush=True)
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "build_info": dspark.build_info(),
        "read_bandwidth_gbps": bw / 1e9,
        "rows": verify_rows(args, device, bw)
        + block_rows(args, device)
        + speculator_rows(args, device),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
