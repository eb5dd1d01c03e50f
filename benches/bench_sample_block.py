"""Benchmark ``dspark.sample_block`` (the Markov block sampler) against peers in one process.

Peer: the plain torch reference of the same algorithm (``tests/torch_reference.py``). Floor:
reading W2 (``[V, r]``) once per slot at the machine's read bandwidth, measured in the same
run — the sampler cannot do better, since every slot's bias ``W2 @ W1[x_{k-1}]`` depends on
the token drafted just before it.

    python benches/bench_sample_block.py           # B=8, K=7, V=151936, r=256
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "2")  # match torch.set_num_threads(2)

import torch

import dspark

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_verify import read_bandwidth, timeit
from torch_reference import markov_block


def rows(dname: str, dt: torch.dtype, args: argparse.Namespace, floor: float) -> None:
    """Time greedy and sampled drafting for one dtype and print the table rows."""
    b, k, v, r = args.batch, args.slots, args.vocab, args.rank
    g = torch.Generator().manual_seed(0)
    base = torch.randn(b, k, v, generator=g).to(dt)
    w1 = (0.1 * torch.randn(v, r, generator=g)).to(dt)
    w2 = (0.1 * torch.randn(v, r, generator=g)).to(dt)
    anchors = torch.randint(0, v, (b,), generator=g)
    # The floor: W2 read once per slot, plus the base logits once.
    floor_s = (k * w2.numel() + base.numel()) * w2.element_size() / (floor * 1e9)
    for t in (0.0, 1.0):
        ours = timeit(
            lambda t=t: dspark.sample_block(base, w1, w2, anchors, temperature=t, seed=1),
            min_time=args.min_time,
        )
        ref = timeit(
            lambda t=t: markov_block(base, w1, w2, anchors, temperature=t, generator=g),
            min_time=args.min_time,
        )
        print(
            f"{dname:>5} {t:>4.1f} | {ours * 1e3:>9.2f} {ref * 1e3:>9.2f} {ref / ours:>7.1f} | "
            f"{floor_s * 1e3:>10.2f} {ours / floor_s:>7.2f}"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--slots", type=int, default=7)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--rank", type=int, default=256)
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true", help="V=32000, f32, short timing")
    args = ap.parse_args(argv)
    if args.quick:
        args.vocab, args.dtypes, args.min_time = 32_000, "f32", 0.1
    torch.set_num_threads(args.threads)
    bw = read_bandwidth()
    floor = max(bw.values())
    print(f"load average before the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"read bandwidth: numpy {bw['numpy']:.1f} GB/s, torch {bw['torch']:.1f} GB/s")
    b, k, v, r = args.batch, args.slots, args.vocab, args.rank
    print(f"sample_block B={b} K={k} V={v} r={r} threads={args.threads}")
    head = (
        f"{'dtype':>5} {'T':>4} | {'dspark ms':>9} {'torch ms':>9} {'x torch':>7} | "
        f"{'W2/slot ms':>10} {'x floor':>7}"
    )
    print(head)
    print("-" * len(head))
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}
    for dname in args.dtypes.split(","):
        rows(dname, dtypes[dname], args, floor)
    print(
        "x torch: times faster than the torch reference. x floor: dspark time / time to read "
        "W2 once per slot (+ base logits) at the measured bandwidth (target: <= 2)."
    )


if __name__ == "__main__":
    main()
