"""Continuous batching against static batches under Poisson arrivals, and the engine's per-step
overhead at N = 16.

Requests arrive as a Poisson process (one seeded trace per rate, the same trace for both
servers): held-out prompts of the pair (the first ``--prompt-tokens`` tokens of the bundled
held-out texts, encoded with the pair's tokenizer), greedy, up to ``--new-tokens`` new tokens,
stopped by the tokenizer's end-of-text token.

* ``continuous``: one ``dspark.Engine``; a request joins at the first step after it arrives
  and leaves when it stops.
* ``static``: one ``dspark.Speculator``; whenever it is idle it takes every request that has
  arrived as one batch and runs it to the end (``generate``), the others waiting.

Rates are fractions of the pair's capacity, measured first: ``--requests`` requests as one
batch through the Speculator, requests per second. Per rate and server: throughput (generated
tokens over the time from the first arrival to the last finish), time to first token and time
per output token (mean and p90 over requests). The servers alternate within each rate, and
each (rate, server) runs ``--repeats`` times; the median run counts.

The overhead row runs ``--overhead-batch`` requests together through the Engine and splits
every decode step by ``Engine.last_step_timing()``: drafter, target forwards, kernels
(verification, commit) and the engine's own overhead (aborts, admission, planning, cache
edits), and the Python wall time of ``step()`` around it.

    nice -n 19 python benches/bench_arrivals.py [--pair DIR] [--requests 24] [--new-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dspark
from dspark.bundled import bundled_dir, heldout_texts


def load(pair: Path) -> tuple[Any, Any, list[list[int]], int | None]:
    from tokenizers import Tokenizer

    target = dspark.NativeTarget.from_pretrained(pair / "target")
    drafter = dspark.Drafter.from_pretrained(pair / "drafter", target)
    # The memory-bound pair computes the bundled pair's function and ships no tokenizer.json.
    tok_file = pair / "target" / "tokenizer.json"
    if not tok_file.is_file():
        tok_file = bundled_dir() / "target" / "tokenizer.json"
    tok = Tokenizer.from_file(str(tok_file))
    texts = [tok.encode(t).ids for _, t in heldout_texts()]
    eos = tok.token_to_id("<|endoftext|>")
    return target, drafter, texts, eos


def prompts_for(texts: list[list[int]], n: int, length: int) -> list[list[int]]:
    out = []
    for i in range(n):
        t = texts[i % len(texts)]
        start = (i // len(texts)) * 7
        out.append(t[start : start + length] or t[:length])
    return out


def trace(n: int, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def summarize(
    arrive: list[float], first: list[float], done: list[float], n_tok: list[int]
) -> dict[str, float]:
    ttft = [f - a for a, f in zip(arrive, first, strict=True)]
    tpot = [(d - f) / (k - 1) for f, d, k in zip(first, done, n_tok, strict=True) if k > 1]
    span = max(done) - min(arrive)

    def p90(x: list[float]) -> float:
        return sorted(x)[min(len(x) - 1, math.ceil(0.9 * len(x)) - 1)]

    return {
        "throughput_tokens_per_s": sum(n_tok) / span,
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p90_s": p90(ttft),
        "tpot_mean_s": statistics.fmean(tpot) if tpot else float("nan"),
        "tpot_p90_s": p90(tpot) if tpot else float("nan"),
        "makespan_s": span,
        "tokens": float(sum(n_tok)),
    }


@dataclass(frozen=True)
class Workload:
    """What both servers are given: the prompts, their arrival times (seconds from the start),
    the new-token budget of each request and the stop ids."""

    prompts: list[list[int]]
    arrive: list[float]
    new: int
    stops: list[int] | None


class Timeline:
    """One run's clock and, per request, the time of its first token, the time it finished and
    the tokens it generated (seconds since the run started; NaN until they happen)."""

    def __init__(self, n: int) -> None:
        self.first = [math.nan] * n
        self.done = [math.nan] * n
        self.count = [0] * n
        self.t0 = time.perf_counter()

    def now(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.t0

    def tokens(self, i: int, new_tokens: list[int], t: float) -> None:
        """Request ``i`` generated ``new_tokens`` by time ``t`` (its first token if it had none)."""
        if new_tokens and self.count[i] == 0:
            self.first[i] = t
        self.count[i] += len(new_tokens)


def run_continuous(target: Any, drafter: Any, work: Workload) -> dict[str, float]:
    eng = dspark.Engine(target, drafter)
    n = len(work.prompts)
    index: dict[int, int] = {}
    nxt = 0
    run = Timeline(n)
    while nxt < n or eng.has_work():
        now = run.now()
        while nxt < n and work.arrive[nxt] <= now:
            index[eng.add_request(work.prompts[nxt], work.new, stop_token_ids=work.stops)] = nxt
            nxt += 1
        if not eng.has_work():
            time.sleep(max(0.0, work.arrive[nxt] - run.now()))
            continue
        for u in eng.step():
            i = index[u.request_id]
            t = run.now()
            run.tokens(i, u.new_tokens, t)
            if u.finish_reason is not None:
                run.done[i] = t
    return summarize(work.arrive, run.first, run.done, run.count)


def run_static(target: Any, drafter: Any, work: Workload) -> dict[str, float]:
    spec = dspark.Speculator(target, drafter, seed=0)
    n = len(work.prompts)
    nxt = 0
    run = Timeline(n)
    while nxt < n:
        now = run.now()
        if work.arrive[nxt] > now:
            time.sleep(work.arrive[nxt] - now)
            now = run.now()
        batch = []
        while nxt < n and work.arrive[nxt] <= now:
            batch.append(nxt)
            nxt += 1

        def on_round(new_tokens: list[list[int]], batch: list[int] = batch) -> None:
            t = run.now()
            for j, toks in zip(batch, new_tokens, strict=True):
                run.tokens(j, toks, t)

        res = spec.generate(
            [work.prompts[i] for i in batch], work.new, stop_token_ids=work.stops, on_round=on_round
        )
        t = run.now()
        for j, toks in zip(batch, res.tokens, strict=True):
            run.done[j] = t
            run.count[j] = len(toks)
            if math.isnan(run.first[j]):
                run.first[j] = t
    return summarize(work.arrive, run.first, run.done, run.count)


def overhead(
    target: Any, drafter: Any, prompts: list[list[int]], new: int, batch: int
) -> dict[str, float]:
    eng = dspark.Engine(target, drafter)
    for p in prompts[:batch]:
        eng.add_request(p, new)
    parts = {"drafter": 0.0, "target": 0.0, "kernels": 0.0, "overhead": 0.0, "total": 0.0}
    wall = 0.0
    steps = 0
    eng.step()  # the prefill step
    while eng.has_work():
        if eng.num_running < batch:
            break  # count only full-batch rounds
        t = time.perf_counter()
        eng.step()
        wall += time.perf_counter() - t
        timing = eng.last_step_timing()
        for k in parts:
            parts[k] += float(timing[k])
        steps += 1
    out = {f"{k}_share": v / parts["total"] for k, v in parts.items() if k != "total"}
    out["step_ms"] = 1e3 * parts["total"] / max(steps, 1)
    out["python_boundary_share"] = (wall - parts["total"]) / wall if wall else 0.0
    out["steps"] = float(steps)
    out["batch"] = float(batch)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--pair", type=Path, default=bundled_dir(), help="a pair directory (target/, drafter/)"
    )
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument(
        "--loads",
        type=float,
        nargs="+",
        default=[0.25, 0.5, 1.0, 2.0],
        help="arrival rates as fractions of capacity",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--overhead-batch", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "arrivals.json")
    args = ap.parse_args()

    target, drafter, texts, eos = load(args.pair)
    prompts = prompts_for(texts, args.requests, args.prompt_tokens)
    spec = dspark.Speculator(target, drafter)
    spec.generate(prompts[:2], 4)  # warm-up
    t = time.perf_counter()
    spec.generate(prompts, args.new_tokens, stop_token_ids=[eos] if eos is not None else None)
    capacity = len(prompts) / (time.perf_counter() - t)
    print(f"capacity: {capacity:.2f} requests/s ({args.requests} as one batch)")

    rows = []
    for load_ in args.loads:
        rate = load_ * capacity
        arrive = trace(args.requests, rate, seed=int(1000 * load_))
        work = Workload(prompts, arrive, args.new_tokens, [eos] if eos is not None else None)
        runs: dict[str, list[dict[str, float]]] = {"continuous": [], "static": []}
        for r in range(args.repeats):
            order = ["continuous", "static"] if r % 2 == 0 else ["static", "continuous"]
            for name in order:
                fn = run_continuous if name == "continuous" else run_static
                runs[name].append(fn(target, drafter, work))
        for name, rs in runs.items():
            med = sorted(rs, key=lambda x: x["throughput_tokens_per_s"])[len(rs) // 2]
            rows.append({"load": load_, "rate_per_s": rate, "server": name, **med})
            print(
                f"load {load_:4.2f} ({rate:6.2f}/s) {name:10s} "
                f"{med['throughput_tokens_per_s']:8.1f} tok/s  "
                f"TTFT {1e3 * med['ttft_mean_s']:7.1f} ms (p90 {1e3 * med['ttft_p90_s']:7.1f})  "
                f"TPOT {1e3 * med['tpot_mean_s']:6.2f} ms"
            )
    ov = overhead(
        target,
        drafter,
        prompts_for(texts, args.overhead_batch, args.prompt_tokens),
        args.new_tokens,
        args.overhead_batch,
    )
    print(
        "overhead at N={batch:.0f}: engine {o:.1%} of a step ({ms:.2f} ms/step), "
        "target {t:.1%}, drafter {d:.1%}, "
        "kernels {k:.1%}; the Python call around step() {p:.1%}".format(
            batch=ov["batch"],
            o=ov["overhead_share"],
            ms=ov["step_ms"],
            t=ov["target_share"],
            d=ov["drafter_share"],
            k=ov["kernels_share"],
            p=ov["python_boundary_share"],
        )
    )
    isa = sorted(
        {
            f
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
            for f in line.split()
            if f.startswith(("avx2", "avx512f", "avx512_bf16"))
        }
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "pair": str(args.pair),
                "requests": args.requests,
                "new_tokens": args.new_tokens,
                "capacity_requests_per_s": capacity,
                "rows": rows,
                "overhead": ov,
                "machine": {
                    "cpu": platform.processor() or platform.machine(),
                    "isa": isa,
                    "threads": dspark.build_info().get("threads"),
                },
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
