"""Never slower: the default policy against target-only and full verification, as a new user
runs it (issue 47).

    python benches/bench_never_slower.py [--pair DIR] [--backend native|hf] [--batches 1 4 16] \\
        [--dtype q4_k] [--prompt-tokens 96] \\
        [--tokens 64] [--repeats 3] [--busy 0] [--out benches/results/never_slower.json]

Each run builds a new :class:`dspark.Speculator` over the loaded pair and times its first
call: whatever the first call pays (the machine's speed, measured once and cached; anything
the policy measures) is counted, as it is for a user who calls ``generate`` once. The machine
cache starts empty in a fresh directory (``DSPARK_CACHE_DIR``), so the first run of the
process also pays the measurement of the machine.

Prompts are the first ``--prompt-tokens`` tokens of the bundled pair's held-out
standard-library files (never trained on), ``--tokens`` new tokens, greedy; N of them run as
one batch, each repeat the next N (repeat ``r`` starts at prompt ``r·N``, wrapping), so that
N = 1 is not one prompt's measurement. Modes, interleaved within each repeat (their order
reversed on odd repeats): ``target-only`` (``generate_target_only``), ``default`` (``verify``
left at its default), ``full``. Reports tokens/s end to end (prefill included) and decode
only, the ratio of ``default`` to target-only and to the better of full and target-only (per
repeat, then the median), plain rounds, and whether greedy output equals target-only's.

``--busy K`` starts K processes that spin on a core each for the whole run (the issue's "two
busy processes" case) and stops them at the end. ``--pair DIR`` runs another pair (its
``target/`` and ``drafter/``, e.g. ``dspark make-example DIR --memory-bound``); ``--backend hf``
runs the target through transformers (needs torch). ``--dtype`` loads the native target in
another dtype (``q8_0`` or ``q4_k`` quantizes it in place, as ``dspark generate --dtype`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("target-only", "default", "full")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def isa() -> str:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    if "avx512_bf16" in flags:
        return "AVX-512 + BF16"
    if "avx512f" in flags:
        return "AVX-512"
    return "AVX2" if "avx2" in flags else "baseline"


def run_mode(pair: Any, mode: str, prompts: list[list[int]], tokens: int) -> dict[str, Any]:
    import dspark

    kw: dict[str, Any] = {"temperature": 0.0}
    if mode == "full":
        kw["verify"] = "full"
    t0 = time.perf_counter()
    sp = dspark.Speculator(pair.target, pair.drafter, **kw)
    if mode == "target-only":
        res = sp.generate_target_only(prompts, tokens)
    else:
        res = sp.generate(prompts, tokens)
    secs = time.perf_counter() - t0
    st = res.stats
    new = sum(len(t) for t in res.tokens)
    prefill = float(getattr(st, "prefill_seconds", 0.0))
    decode = max(secs - prefill, 1e-9)
    return {
        "mode": mode,
        "batch": len(prompts),
        "tokens": new,
        "seconds": secs,
        "prefill_seconds": prefill,
        "tokens_per_s": new / secs,
        "decode_tokens_per_s": new / decode,
        "rounds": int(st.rounds),
        "plain_rounds": int(st.plain_rounds),
        "acceptance_length": float(st.acceptance_length),
        "outputs": [[int(x) for x in t] for t in res.tokens],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pair", type=Path, default=None)
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--busy", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--backend", choices=("native", "hf"), default="native")
    ap.add_argument("--dtype", default=None, help="native target's dtype (e.g. q4_k, q8_0)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    os.environ["DSPARK_CACHE_DIR"] = tempfile.mkdtemp(prefix="dspark-cache-")
    from dspark.bundled import heldout_texts, load_pair

    if args.dtype is not None:
        from dspark.bundled import bundled_dir
        from dspark.pair import load_native_pair

        if args.backend != "native":
            ap.error("--dtype needs --backend native")
        root = args.pair or bundled_dir()
        pair = load_native_pair(
            root / "target", root / "drafter", dtype=args.dtype, threads=args.threads
        )
    else:
        pair = load_pair(args.pair, threads=args.threads, backend=args.backend)
    texts = heldout_texts(args.pair)
    prompts = [pair.tokenizer.encode(t).ids[: args.prompt_tokens] for _, t in texts]
    prompts = [p for p in prompts if len(p) == args.prompt_tokens]
    need = max(args.batches)
    while len(prompts) < need:  # more requests than files: the same prompts again
        prompts += prompts[: need - len(prompts)]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    runs: list[dict[str, Any]] = []
    try:
        for rep in range(args.repeats):
            for n in args.batches:
                order = MODES if rep % 2 == 0 else tuple(reversed(MODES))
                # Each repeat its own window of prompts (N = 1 is otherwise one prompt's
                # measurement); the modes of a repeat share it.
                start = (rep * n) % len(prompts)
                batch = (prompts + prompts)[start : start + n]
                for mode in order:
                    r = run_mode(pair, mode, batch, args.tokens)
                    r["repeat"] = rep
                    runs.append(r)
                    print(
                        f"[rep {rep}] N={n:<3} {mode:<12} {r['tokens_per_s']:8.1f} tok/s "
                        f"(decode {r['decode_tokens_per_s']:8.1f}) τ {r['acceptance_length']:.2f} "
                        f"plain {r['plain_rounds']}/{r['rounds']}",
                        flush=True,
                    )
    finally:
        for p in busy:
            p.kill()
            p.wait()

    summary: dict[str, Any] = {}
    for n in args.batches:
        per: dict[str, list[float]] = {
            "x_target_only": [],
            "x_best": [],
            "x_target_only_decode": [],
        }
        equal = True
        for rep in range(args.repeats):
            row = {r["mode"]: r for r in runs if r["repeat"] == rep and r["batch"] == n}
            ref, full, dflt = row["target-only"], row["full"], row["default"]
            per["x_target_only"].append(dflt["tokens_per_s"] / ref["tokens_per_s"])
            per["x_target_only_decode"].append(
                dflt["decode_tokens_per_s"] / ref["decode_tokens_per_s"]
            )
            per["x_best"].append(
                dflt["tokens_per_s"] / max(ref["tokens_per_s"], full["tokens_per_s"])
            )
            equal &= dflt["outputs"] == ref["outputs"] == full["outputs"]
        med = {
            mode: statistics.median(
                r["tokens_per_s"] for r in runs if r["batch"] == n and r["mode"] == mode
            )
            for mode in MODES
        }
        summary[str(n)] = {
            "tokens_per_s": med,
            "default_x_target_only": round(statistics.median(per["x_target_only"]), 3),
            "default_x_target_only_range": [
                round(min(per["x_target_only"]), 3),
                round(max(per["x_target_only"]), 3),
            ],
            "default_x_target_only_decode": round(
                statistics.median(per["x_target_only_decode"]), 3
            ),
            "full_x_target_only": round(med["full"] / med["target-only"], 3),
            "default_x_best_of_full_and_target_only": round(statistics.median(per["x_best"]), 3),
            "greedy_equal": equal,
        }
        print(f"N={n}: {json.dumps(summary[str(n)])}")
    for r in runs:
        del r["outputs"]
    result = {
        "bench": "never_slower",
        "pair": str(args.pair) if args.pair else "bundled",
        "target_backend": args.backend,
        "target_dtype": args.dtype or "checkpoint",
        "cpu": cpu_name(),
        "isa": isa(),
        "threads": args.threads or os.cpu_count(),
        "busy_processes": args.busy,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.tokens,
        "repeats": args.repeats,
        "first_call_counted": True,
        "summary": summary,
        "runs": runs,
    }
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
