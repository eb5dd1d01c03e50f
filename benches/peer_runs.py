"""What the peer benchmarks share: where the peers live, this machine's read bandwidth and ISA,
running a peer's command, reading llama.cpp's printouts, and timing dspark's calls.

``bench_memory_bound.py``, ``bench_contexts.py`` and ``bench_quant.py`` import it; it imports none
of them.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

PEERS = Path(os.environ.get("DSPARK_PEERS_DIR", "/var/tmp/dspark-peers"))


def read_bandwidth(threads: int, mib: int = 512, repeats: int = 5) -> float:
    """Bytes/s of a parallel read of ``mib`` MiB with ``threads`` threads (best of repeats)."""
    data = np.ones(mib << 18, dtype=np.float32)
    parts = np.array_split(data, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            # x · x: BLAS's dot reads each value once at vector speed (np.sum's pairwise sum
            # is slower than memory on some CPUs).
            list(pool.map(lambda x: float(np.dot(x, x)), parts))
            best = min(best, time.perf_counter() - t0)
    return data.nbytes / best


def cpu_kernel() -> str:
    """The register kernel dspark's packed products run on this CPU."""
    import dspark

    return str(dspark.build_info()["cpu_kernel"])


def cpu_isa() -> list[str]:
    """The AVX-512 / AVX2 / FMA / F16C flags of this CPU (Linux)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0].split()
    except (OSError, IndexError):
        return []
    keep = ("avx512", "avx2", "fma", "f16c")
    return sorted({f for f in flags if f.startswith(keep)})


def run_command(cmd: list[str], timeout: float) -> str | None:
    """``cmd``'s stdout and stderr, or ``None`` (said on stdout) when it fails or times out."""
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"    timed out after {timeout:.0f} s")
        return None
    if res.returncode != 0:
        print(f"    failed ({res.returncode}): {res.stderr[-400:]}")
        return None
    return res.stdout + "\n" + res.stderr


def llama_bench_rates(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """End-to-end and decode tokens/s from ``llama-bench -o json`` rows: the ``-pg`` row's
    generated tokens over its whole time (prompt included), the ``-n`` row's rate as is; either
    may be missing, ``None`` when both are."""
    got: dict[str, Any] = {}
    for r in rows:
        if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) > 0:
            got["tokens_per_s"] = r["n_gen"] / (r["avg_ns"] / 1e9)
        elif r.get("n_gen", 0) > 0:
            got["decode_tokens_per_s"] = r["avg_ts"]
    return got or None


def speculative_simple_rates(out: str) -> dict[str, Any] | None:
    """``llama-speculative-simple``'s printout: end to end (its prompt's time plus its
    decoding's, per decoded token), decode only, and its draft counts."""
    got: dict[str, Any] = {
        k: float(v) for k, v in re.findall(r"(n_drafted|n_accept)\s*=\s*([\d.]+)", out)
    }
    enc = re.search(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds", out)
    dec = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", out)
    if not (enc and dec) or float(dec.group(2)) <= 0:
        return None
    tokens, secs = int(dec.group(1)), float(dec.group(2))
    got["tokens_per_s"] = tokens / (secs + float(enc.group(1)))
    got["decode_tokens_per_s"] = tokens / secs
    return got


def timed_calls(
    call: Callable[[list[list[int]], int], Any], calls: list[list[list[int]]], tokens: int
) -> tuple[dict[str, float], list[list[int]]]:
    """Run ``call(chunk, tokens)`` for every chunk of ``calls``, timed: tokens/s end to end and
    decode only (``committed / (total - prefill)``), ``tau`` (committed over rounds) and
    ``outside_share`` (wall time outside the target's forwards and the drafter: sampling,
    scheduling, bookkeeping), with every request's tokens in order."""
    got: list[list[int]] = []
    committed, wall, decode, inside, rounds = 0, 0.0, 0.0, 0.0, 0.0
    for chunk in calls:
        t0 = time.perf_counter()
        res = call(chunk, tokens)
        wall += time.perf_counter() - t0
        st = res.stats
        committed += st.committed_tokens
        decode += st.total_seconds - st.prefill_seconds
        inside += st.target_seconds + st.drafter_seconds
        rounds += st.committed_tokens / max(st.acceptance_length, 1e-9)
        got += [list(t) for t in res.tokens]
    rates = {
        "tokens_per_s": committed / wall,
        "decode_tokens_per_s": committed / max(decode, 1e-9),
        "tau": committed / max(rounds, 1e-9),
        "outside_share": max(wall - inside, 0.0) / wall,
    }
    return rates, got
