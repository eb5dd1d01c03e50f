"""Benchmark ``dspark.verify`` against peers measured in the same process.

Peers: the plain torch-ops reference of the same algorithm (``tests/torch_reference.py``:
softmax, gather, multinomial) at every shape, and HF transformers' ``_speculative_sampling``
at B = 1. The floor is the machine's memory-read bandwidth, measured in the same run: every
row reports its effective GB/s (logits bytes read / time) and that as a % of the bandwidth.

    python benches/bench_verify.py                 # the full table (B 1/8/32, V 32000/151936)
    python benches/bench_verify.py --quick         # a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "2")  # match torch.set_num_threads(2)

import numpy as np
import torch

import dspark

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from torch_reference import verify as torch_verify


def timeit(fn: Callable[[], object], *, min_time: float = 0.3, min_runs: int = 5) -> float:
    """Median seconds per call, after one warm-up call."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 200:
            break
    return statistics.median(times)


def read_bandwidth(mb: int = 512, runs: int = 5) -> dict[str, float]:
    """Memory-read bandwidth in GB/s: best of ``runs`` sums over a ``mb`` MB float32 array.

    ``numpy`` sums on one thread; ``torch`` sums with the configured threads. The larger is
    the floor the kernels are compared against.
    """
    a = np.ones(mb * 2**20 // 4, dtype=np.float32)
    t = torch.from_numpy(a)
    out = {}
    for name, fn in (("numpy", lambda: a.sum()), ("torch", lambda: t.sum())):
        fn()
        best = min(_once(fn) for _ in range(runs))
        out[name] = a.nbytes / best / 1e9
    return out


def _once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def hf_speculative_sampling() -> Callable | None:
    """transformers' ``_speculative_sampling`` (its module moved between versions)."""
    for mod in ("transformers.generation.utils", "transformers.generation.candidate_generator"):
        try:
            module = __import__(mod, fromlist=["_speculative_sampling"])
            return module._speculative_sampling
        except (ImportError, AttributeError):
            continue
    return None


def case(batch: int, slots: int, vocab: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, slots + 1, vocab, generator=g).to(dtype)
    draft = (target[:, :slots].float() + 0.5 * torch.randn(batch, slots, vocab, generator=g)).to(
        dtype
    )
    tokens = torch.multinomial(torch.softmax(draft.float().reshape(-1, vocab), -1), 1, generator=g)
    return target, draft, tokens.reshape(batch, slots)


def row(batch, slots, vocab, dname, dtype, mode, args, hf, floor) -> None:
    """Time one shape and mode for dspark and the peers and print its table row.

    Modes: ``q`` (sampled target, sampled draft with its logits: the residual path),
    ``onehot`` (sampled target, ``draft_logits=None``), ``greedy`` (T = 0).
    """
    target, draft, tokens = case(batch, slots, vocab, dtype)
    t = 0.0 if mode == "greedy" else args.temperature
    q = draft if mode == "q" else None
    ours = timeit(
        lambda: dspark.verify(target, tokens, q, temperature=t, seed=1),
        min_time=args.min_time,
    )
    gen = torch.Generator().manual_seed(1)
    ref = timeit(
        lambda: torch_verify(target, tokens, q, temperature=t, generator=gen),
        min_time=args.min_time,
    )
    hf_t = float("nan")
    if hf is not None and batch == 1 and mode == "q":
        ids = torch.cat([torch.zeros(1, 5, dtype=torch.int64), tokens], dim=1)
        hf_t = timeit(lambda: hf(ids, draft / t, slots, target / t), min_time=args.min_time)
    nbytes = (target.numel() + (0 if q is None else q.numel())) * target.element_size()
    gbs = nbytes / ours / 1e9
    print(
        f"{batch:>3} {vocab:>7} {dname:>5} {mode:>6} | {ours * 1e3:>9.3f} {ref * 1e3:>9.3f} "
        f"{hf_t * 1e3:>8.3f} | {ref / ours:>7.1f} {hf_t / ours:>6.1f} | "
        f"{gbs:>6.1f} {100 * gbs / floor:>5.0f}"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--vocabs", default="32000,151936")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--slots", type=int, default=7)
    ap.add_argument("--modes", default="q,onehot,greedy", help="q, onehot, greedy")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--quick", action="store_true", help="B=1,8; V=32000; f32 only")
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.vocabs, args.dtypes, args.min_time = "1,8", "32000", "f32", 0.1
    torch.set_num_threads(args.threads)
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}
    hf = hf_speculative_sampling()
    bw = read_bandwidth()
    floor = max(bw.values())
    print(f"load average before the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(
        f"read bandwidth: numpy 1 thread {bw['numpy']:.1f} GB/s, torch {args.threads} threads "
        f"{bw['torch']:.1f} GB/s -> floor {floor:.1f} GB/s"
    )
    print(
        f"verify, K={args.slots}, T={args.temperature}, threads={args.threads}, "
        f"dspark {dspark.__version__}, torch {torch.__version__}"
    )
    head = (
        f"{'B':>3} {'V':>7} {'dtype':>5} {'mode':>6} | "
        f"{'dspark ms':>9} {'torch ms':>9} {'HF ms':>8} | "
        f"{'x torch':>7} {'x HF':>6} | {'GB/s':>6} {'% bw':>5}"
    )
    print(head)
    print("-" * len(head))
    for vocab in map(int, args.vocabs.split(",")):
        for dname in args.dtypes.split(","):
            for mode in args.modes.split(","):
                for batch in map(int, args.batches.split(",")):
                    row(batch, args.slots, vocab, dname, dtypes[dname], mode, args, hf, floor)
    print(
        "x torch / x HF: how many times faster dspark is than the peer (HF: B=1, mode q).\n"
        "GB/s: nominal logits bytes (target, plus draft in mode q) / dspark time. Verification "
        "stops reading a request at its first rejection, so greedy rows and B=1 rows can read "
        "fewer bytes than nominal and exceed 100%."
    )


if __name__ == "__main__":
    main()
