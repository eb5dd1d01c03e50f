"""The speculative loop in the engine: native target vs HF target, B = 1 and B = 8, one run.

Rows, on the bundled pair and the first held-out prompts (greedy, full verification):
native target-only (``dspark.NativeTarget``, the engine decoding alone), native speculative
(``NativeTarget`` + ``dspark.Drafter``: no Python in the loop), the HF target through the engine
loop (``dspark.Speculator`` over transformers), and the same HF target through the Python loop of
the commit before the loop moved (``git show OLD:python/dspark/speculator.py``, loaded as a
module: same drafter, same kernels). B = 1 runs the prompts one at a time, B = 8 as one ragged
batch. Every greedy row must equal native target-only token for token.

Each row is the fastest of ``--repeats`` passes after a warm-up batch. Besides end-to-end
tokens/s (prefill included), each row reports the decode phase alone (tokens after each
request's first, over the call time after ``stats.prefill_seconds``) against native
target-only's. ``--load N`` adds the
same rows under N busy processes (pure-Python spinners, started here, killed when the rows are
done and in any case after ``--load-seconds``): the thread policy is judged there (see
``docs/python-api.md``, "Threads and memory").

    nice -n 19 python benches/bench_engine_loop.py [--prompts 8] [--new-tokens 64] [--load 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import dspark
from dspark.bundled import bundled_dir, load_pair

OLD_LOOP_COMMIT = "0932c8f"


def held_out(root: Path, tok: Any, n: int, prompt_tokens: int) -> list[list[int]]:
    data = json.loads((root / "heldout_prompts.json").read_text())
    return [tok.encode(t).ids[:prompt_tokens] for t in data["texts"][:n]]


def old_loop(commit: str) -> Any:
    """The Python ``Speculator`` of ``commit`` (None when git or the commit is missing)."""
    repo = Path(__file__).resolve().parent.parent
    try:
        src = subprocess.run(
            ["git", "show", f"{commit}:python/dspark/speculator.py"],
            cwd=repo,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp()) / "dspark_old_loop.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("dspark_old_loop", path)
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod.Speculator


REPEATS = 3


def timed(
    fn: Any, prompts: list[list[int]], batch: int, n: int, repeats: int = REPEATS
) -> dict[str, Any]:
    """Run ``fn(prompts, n) -> GenerationResult`` over the prompts in batches of ``batch``:
    one untimed warm-up batch, then the whole set ``repeats`` times; the fastest pass counts
    (the machine is shared: the minimum is the least disturbed)."""
    fn(prompts[:batch], n)
    best, decode = float("inf"), None
    for _ in range(max(1, repeats)):
        outs: list[list[int]] = []
        committed = rounds = 0
        phase: float | None = 0.0
        t0 = time.perf_counter()
        for i in range(0, len(prompts), batch):
            res = fn(prompts[i : i + batch], n)
            outs.extend(res.tokens)
            committed += res.stats.committed_tokens
            rounds += res.stats.request_rounds
            # The decode phase: after every request's first token (the old loop has no split).
            prefill = getattr(res.stats, "prefill_seconds", None)
            phase = (
                None
                if phase is None or prefill is None
                else (phase + res.stats.total_seconds - prefill)
            )
        secs = time.perf_counter() - t0
        if secs < best:
            best, decode = secs, phase
    toks = sum(len(o) for o in outs)
    after_first = toks - sum(1 for o in outs if o)
    return {
        "tokens_per_second": toks / best,
        "decode_tokens_per_second": after_first / decode if decode else None,
        "tau": committed / rounds if rounds else None,
        "outputs": outs,
    }


def rows(
    pair: Any, native: Any, ndrafter: Any, old: Any, prompts: Any, n: int, repeats: int
) -> dict:
    spec_native = dspark.Speculator(native, ndrafter, seed=0)
    spec_hf = dspark.Speculator(pair.target, pair.drafter, seed=0)
    out: dict[str, Any] = {}
    for b in (1, 8):
        r = {
            "native target-only": timed(spec_native.generate_target_only, prompts, b, n, repeats),
            "native speculative": timed(spec_native.generate, prompts, b, n, repeats),
            "HF speculative, engine loop": timed(spec_hf.generate, prompts, b, n, repeats),
        }
        if old is not None:
            r["HF speculative, old Python loop"] = timed(
                old(pair.target, pair.drafter, seed=0).generate, prompts, b, n, repeats
            )
        out[f"B={b}"] = r
    return out


def spinners(count: int, seconds: float) -> list[subprocess.Popen]:
    code = f"import time\nt = time.time() + {seconds}\nwhile time.time() < t:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]


def report(title: str, table: dict[str, Any]) -> dict[str, Any]:
    print(f"\n{title}")
    summary: dict[str, Any] = {}
    for batch, r in table.items():
        base = r["native target-only"]
        old = r.get("HF speculative, old Python loop")
        print(
            f"  {batch}: {'row':34s} {'tau':>5s} {'tok/s':>8s} {'vs native t-o':>14s}"
            f" {'vs old loop':>12s} {'decode vs t-o':>14s}  greedy==target"
        )
        for name, v in r.items():
            tau = "-" if v["tau"] is None else f"{v['tau']:.2f}"
            ratio = v["tokens_per_second"] / base["tokens_per_second"]
            vs_old = (
                "-" if old is None else f"{v['tokens_per_second'] / old['tokens_per_second']:.2f}x"
            )
            dec, dec_base = v["decode_tokens_per_second"], base["decode_tokens_per_second"]
            dec_ratio = dec / dec_base if dec and dec_base else None
            dec_txt = "-" if dec_ratio is None else f"{dec_ratio:.2f}x"
            same = v["outputs"] == base["outputs"]
            print(
                f"       {name:34s} {tau:>5s} {v['tokens_per_second']:8.1f} {ratio:13.2f}x"
                f" {vs_old:>12s} {dec_txt:>14s}  {same}"
            )
            summary.setdefault(batch, {})[name] = {
                "tokens_per_second": v["tokens_per_second"],
                "tau": v["tau"],
                "ratio_vs_native_target_only": ratio,
                "decode_tokens_per_second": dec,
                "decode_ratio_vs_native_target_only": dec_ratio,
                "greedy_matches_target": same,
            }
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--load", type=int, default=2, help="busy processes for the loaded rows")
    ap.add_argument("--load-seconds", type=float, default=600.0)
    ap.add_argument("--old-loop", default=OLD_LOOP_COMMIT, help="commit of the old Python loop")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="timed passes per row (fastest)")
    ap.add_argument("--out", type=Path, default=Path("bench_engine_loop.json"))
    args = ap.parse_args()
    root = bundled_dir()
    pair = load_pair(root, None)
    native = dspark.NativeTarget.from_pretrained(root / "target")
    ndrafter = dspark.Drafter.from_pretrained(root / "drafter", native)
    prompts = held_out(root, pair.tokenizer, args.prompts, args.prompt_tokens)
    old = old_loop(args.old_loop)
    if old is None:
        print(f"old loop: git show {args.old_loop} failed, its rows are skipped")
    n = args.new_tokens
    print(
        f"{len(prompts)} held-out prompts x {n} new tokens; torch threads "
        f"{torch.get_num_threads()}, RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS')}, "
        f"{os.cpu_count()} CPUs"
    )
    dspark.Speculator(native, ndrafter).generate(prompts[:1], 8)  # warm-up
    results = {
        "quiet": report(
            "quiet machine", rows(pair, native, ndrafter, old, prompts, n, args.repeats)
        )
    }
    if args.load > 0:
        procs = spinners(args.load, args.load_seconds)
        try:
            time.sleep(0.5)
            table = rows(pair, native, ndrafter, old, prompts, n, args.repeats)
        finally:
            for p in procs:
                p.kill()
        results[f"{args.load} busy"] = report(f"under load: {args.load} busy processes", table)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
