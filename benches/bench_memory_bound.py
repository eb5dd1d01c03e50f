"""The memory-bound pair: dspark against HF transformers, llama.cpp and mistral.rs on the same
weights at B = 1, and dspark's own modes at N = 4 and 16 concurrent requests.

    python benches/bench_memory_bound.py /var/tmp/mb --gguf-dir /var/tmp/mb/gguf \\
        [--dtypes bf16 f32] [--tokens 64] [--prompts 2] [--batches 1 4 16] [--repeats 2] \\
        [--threads 2] [--budget-s 1200] [--out benches/results/memory_bound_<machine>.json]
    python benches/bench_memory_bound.py /var/tmp/mb --gguf-dir /var/tmp/mb/gguf --dtypes bf16 \
        --contexts 96 1500 3000 [--kv-dtypes float16 float32]   # by context length

``PAIRS`` holds ``{dtype}/target`` and ``{dtype}/drafter`` (``dspark make-example DIR
--memory-bound --dtype ...``); ``--gguf-dir`` holds ``target-{dtype}.gguf`` and
``drafter-{dtype}.gguf`` made by llama.cpp's own converter from those directories
(``benches/peers/convert.py``); the peers come from ``benches/peers/setup.sh``
(``$DSPARK_PEERS_DIR/peers.json``, default ``/var/tmp/dspark-peers``). A peer that is missing
is skipped with a line saying so.

Greedy, held-out prompts (their first 48 tokens), ``--tokens`` new tokens, ``--threads``
threads for every engine. Runs are interleaved (repeat → dtype → engine, the engines in reverse
order on odd repeats), so a change in the machine's load hits every engine alike; the JSON keeps
every run and the medians, and ratios are against dspark's native target-only decoding of the
same dtype in the same run (the sampled rows against sampled target-only). On a shared machine
one engine's run can be 20-40% off its neighbour's, so ``paired`` also gives, per engine, the
ratio within each repeat (against the same repeat's reference) as median, min and max over
the repeats, and ``paired_targets`` the same for the issue's engine-against-engine targets
(dspark speculative and scheduled against llama.cpp's ``draft-dspark``, target-only against
``llama-bench``):

* ``dspark target-only`` / ``dspark speculative`` (full verification) / ``dspark scheduled``:
  the native engine in this process, the pair loaded in its checkpoint dtype. tokens/s are
  end to end (prefill included) and decode-only (``committed / (total - prefill)``). The
  scheduled speculator's first drafting call (its target profile, for the largest N) is paid
  before the runs and reported as ``scheduled_first_call_s``;
* ``sampled target-only`` / ``sampled speculative`` / ``sampled scheduled`` (B = 1): the same
  three modes sampling at temperature ``SAMPLED_T`` = 0.7 (seed 0 per call; no target: the
  bundled drafter was trained toward greedy decoding, so acceptance is lower);
* ``llama-bench``: llama.cpp target-only, end to end from a prompt of the held-out prompts'
  length (``-pg 48,TOKENS``: its time, prefill included, per generated token) and decode only
  (``-n TOKENS`` from an empty context); ``llama-bench-1t`` the same on one thread (on a
  shared machine llama.cpp's spinning thread pool collapses at 2 threads when another process
  holds a core);
* ``llama.cpp draft-dspark``: ``llama-speculative-simple --spec-type draft-dspark`` with our
  drafter, end to end (its prompt's time plus its decoding's, as it prints them) and decode
  only;
* ``mistral.rs F32``: the ``mistralrs`` wheel, ``Which.Plain`` on the HF target directory,
  target-only (its Python API runs no DSpark drafter), end to end and decode only from the
  times its usage reports;
* ``hf target-only`` / ``hf speculative``: transformers' ``Qwen3ForCausalLM`` on the target
  directory (in its dtype, ``--threads`` torch threads), decoded one KV-cached forward per token
  (:func:`dspark.measure.target_only`), and the same model behind ``dspark.Speculator`` with
  the native drafter (full verification), end to end only; ``greedy_equal`` of the HF rows
  compares with HF's own target-only tokens.

Every row's ``tokens_per_s`` is end to end (prefill included) and, where the engine reports
it, ``decode_tokens_per_s`` decode only; the medians give both ratios, ``x_target_only`` end to
end against end to end and ``x_target_only_decode`` decode against decode, never one kind
against the other.

``--batches``: at B = 1 every engine decodes ``--prompts`` prompts one after another (one
call per prompt); at each larger N, dspark's native target-only, full and scheduled modes run
N held-out prompts as one batch (N concurrent requests), and tokens/s count every request's
tokens. Each row of the JSON says its ``batch``; the medians are per dtype, per N, per engine.
A plot (tokens/s per engine against N, one panel per dtype) goes beside the JSON when
matplotlib is installed.

The floor: weight bytes per step (as the engine keeps them) ÷ the read bandwidth with
``--threads`` threads, measured before and after the runs (the faster of the two: load from
other processes only ever slows a read), against dspark target-only's decode-only rate. The
run stops starting new engine runs once ``--budget-s`` has passed. The machine this runs on may
be shared: say so next to the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from peer_runs import (
    PEERS,
    cpu_isa,
    cpu_kernel,
    llama_bench_rates,
    read_bandwidth,
    run_command,
    speculative_simple_rates,
    timed_calls,
)

PROMPT_TOKENS = 48

# The temperature of the sampled rows.
SAMPLED_T = 0.7

_MISTRALRS = """
import json, sys, time, mistralrs as m
r = m.Runner(which=m.Which.Plain(model_id=sys.argv[1], arch=m.Architecture.Qwen3,
                                 dtype=getattr(m.ModelDType, sys.argv[4])))
res = r.send_completion_request(m.CompletionRequest(
    model="target", prompt=sys.argv[2], max_tokens=int(sys.argv[3]), temperature=0.0, top_k=1))
u = res.usage
wall = u.total_prompt_time_sec + u.total_completion_time_sec
print(json.dumps({"tokens_per_s": u.completion_tokens / wall,
                  "decode_tokens_per_s": u.avg_compl_tok_per_sec}))
"""


class Dspark:
    """The native pair of one dtype, loaded once."""

    def __init__(self, pair: Path, tokens: int) -> None:
        from dspark.drafter import Drafter
        from dspark.native_target import NativeTarget
        from dspark.speculator import Speculator

        self.target = NativeTarget.from_pretrained(pair / "target")
        drafter = Drafter.from_pretrained(pair / "drafter", self.target)
        self.full = Speculator(self.target, drafter, seed=0)
        self.scheduled = Speculator(self.target, drafter, seed=0, verify="scheduled")
        t = SAMPLED_T
        self.sampled_full = Speculator(self.target, drafter, seed=0, temperature=t)
        self.sampled_scheduled = Speculator(
            self.target, drafter, seed=0, temperature=t, verify="scheduled"
        )
        self.tokens = tokens
        self.reference: dict[int, list[list[int]]] = {}

    def warm_scheduled(self, prompts: list[list[int]]) -> float:
        """Seconds of the scheduled speculator's first call with drafting rounds for
        ``len(prompts)`` requests, where it profiles the target (once, up to the largest batch
        it will verify), paid here so that its rows are warm."""
        t0 = time.perf_counter()
        self.scheduled.generate(prompts, 4)
        took = time.perf_counter() - t0
        self.sampled_scheduled.warm_up(1)
        return took

    def run(self, mode: str, prompts: list[list[int]], batch: int) -> dict[str, Any]:
        """``prompts`` as one call of ``batch`` requests, or one call per prompt at 1."""
        sampled = mode.startswith("sampled ")
        mode = mode.removeprefix("sampled ")
        if sampled:
            spec = self.sampled_scheduled if mode == "scheduled" else self.sampled_full
        else:
            spec = self.scheduled if mode == "scheduled" else self.full
        call = spec.generate_target_only if mode == "target-only" else spec.generate
        calls = [[p] for p in prompts] if batch == 1 else [prompts]
        rates, got = timed_calls(call, calls, self.tokens)
        out: dict[str, Any] = {k: rates[k] for k in ("tokens_per_s", "decode_tokens_per_s")}
        if mode == "target-only" and not sampled:
            self.reference[batch] = got
        elif sampled:
            if mode != "target-only":
                out["tau"] = rates["tau"]
        else:
            out["tau"] = rates["tau"]
            out["greedy_equal"] = got == self.reference.get(batch)
            out["outside_share"] = rates["outside_share"]
        return out


class Hf:
    """transformers' model of the target directory, alone and behind dspark (B = 1)."""

    def __init__(self, pair: Path, dtype: str, tokens: int, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from dspark.drafter import Drafter
        from dspark.speculator import Speculator

        torch.set_num_threads(threads)
        torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(pair / "target", dtype=torch_dtype)
        self.model.eval()
        drafter = Drafter.from_pretrained(pair / "drafter", self.model)
        self.spec = Speculator(self.model, drafter, seed=0)
        self.tokens = tokens
        self.reference: list[list[int]] | None = None

    def run(self, mode: str, prompts: list[list[int]]) -> dict[str, Any]:
        from dspark.measure import target_only

        if mode == "target-only":
            outs, secs = [], 0.0
            for p in prompts:
                o, s = target_only(self.model, p, self.tokens)
                outs.append(o)
                secs += s
            self.reference = outs
            return {"tokens_per_s": sum(map(len, outs)) / secs}
        got: list[list[int]] = []
        committed, wall, rounds = 0, 0.0, 0.0
        for p in prompts:
            t0 = time.perf_counter()
            res = self.spec.generate([p], self.tokens)
            wall += time.perf_counter() - t0
            committed += res.stats.committed_tokens
            rounds += res.stats.committed_tokens / max(res.stats.acceptance_length, 1e-9)
            got += [list(t) for t in res.tokens]
        return {
            "tokens_per_s": committed / wall,
            "tau": committed / max(rounds, 1e-9),
            "greedy_equal": got == self.reference,
        }


#: Engine-against-engine ratios reported per repeat (``paired_targets``): (name, engine, against).
PAIRED_TARGETS = (
    ("speculative / draft-dspark", "dspark speculative", "draft-dspark"),
    ("scheduled / draft-dspark", "dspark scheduled", "draft-dspark"),
    ("target-only / llama-bench", "dspark target-only", "llama-bench"),
)


def reference(engine: str) -> str:
    """The row ``engine``'s ratios are against: sampled target-only for the sampled rows (the
    same sampling, the same run), native target-only for every other."""
    if engine.startswith("dspark sampled "):
        return "dspark sampled target-only"
    return "dspark target-only"


def paired_ratios(rows: list[dict[str, Any]], engine: str, against: str) -> dict[str, Any] | None:
    """End-to-end tokens/s of ``engine`` over ``against``'s within each repeat of ``rows`` (one
    dtype, one N): median, min and max over the repeats that ran both, or ``None``."""
    by = {(x["engine"], x["repeat"]): x["tokens_per_s"] for x in rows}
    ratios = [
        by[engine, r] / by[against, r]
        for r in sorted({x["repeat"] for x in rows})
        if (engine, r) in by and by.get((against, r))
    ]
    if not ratios:
        return None
    return {
        "median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "repeats": len(ratios),
    }


def median_rates(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Median end-to-end (and, where every run has it, decode-only) tokens/s of ``runs``."""
    out = {"tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs)}
    if all("decode_tokens_per_s" in x for x in runs):
        out["decode_tokens_per_s"] = statistics.median(x["decode_tokens_per_s"] for x in runs)
    return out


def plot(results: dict[str, Any], path: Path) -> str:
    """Tokens/s per engine against N, one panel per dtype (medians); a line saying why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    dtypes = list(results["median"])
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4.5), squeeze=False)
    for ax, dt in zip(axes[0], dtypes, strict=True):
        by_engine: dict[str, list[tuple[int, float]]] = {}
        for n, row in results["median"][dt].items():
            for engine, v in row.items():
                if isinstance(v, dict):
                    by_engine.setdefault(engine, []).append((int(n), v["tokens_per_s"]))
        for engine, pts in by_engine.items():
            pts.sort()
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            ax.plot(xs, ys, marker="o", linestyle="-" if len(pts) > 1 else "none", label=engine)
        floor = results["floor"][dt]["tokens_per_s"]
        ax.axhline(floor, color="grey", linestyle=":", label="read floor (B = 1)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent requests N")
        ax.set_ylabel("tokens/s (end to end)")
        ax.set_title(f"memory-bound pair, {dt} ({results['machine']['threads']} threads)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", type=Path)
    ap.add_argument("--gguf-dir", type=Path, required=True)
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "f32"], choices=["bf16", "f32"])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=1200.0)
    ap.add_argument(
        "--engines",
        nargs="+",
        default=[
            "target-only",
            "speculative",
            "scheduled",
            "sampled target-only",
            "sampled speculative",
            "sampled scheduled",
            "llama-bench",
            "draft-dspark",
            "mistralrs",
            "hf target-only",
            "hf speculative",
        ],
    )
    ap.add_argument(
        "--contexts",
        nargs="+",
        type=int,
        default=None,
        help="instead of the runs above: speed and tau by context length (bench_contexts.py)",
    )
    ap.add_argument(
        "--kv-dtypes",
        nargs="+",
        default=["float16", "float32"],
        help="with --contexts: the target's KV cache dtypes to run",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results file (default benches/results/memory_bound.json, contexts.json with "
        "--contexts); the committed ones are named by machine (memory_bound_xeon.json)",
    )
    args = ap.parse_args(argv)
    th = str(args.threads)
    os.environ["RAYON_NUM_THREADS"] = th
    if args.contexts:
        from bench_contexts import run

        args.out = args.out or Path("benches/results/contexts.json")
        return run(args)
    args.out = args.out or Path("benches/results/memory_bound.json")
    start = time.perf_counter()

    from tokenizers import Tokenizer

    from dspark.memory_bound import bundled_tiny_dir

    peers: dict[str, Any] = {}
    if (PEERS / "peers.json").is_file():
        peers = json.loads((PEERS / "peers.json").read_text())
    else:
        print(
            f"skipping llama.cpp and mistral.rs: no {PEERS / 'peers.json'} (benches/peers/setup.sh)"
        )
    bins = Path(peers.get("bin", "/nonexistent"))
    texts = json.loads((bundled_tiny_dir() / "heldout_prompts.json").read_text())["texts"]
    bw = read_bandwidth(args.threads)
    print(f"read bandwidth ({args.threads} threads): {bw / 1e9:.1f} GB/s")
    results: dict[str, Any] = {
        "machine": {
            "isa": cpu_isa(),
            "cpu_kernel": cpu_kernel(),
            "cpus": os.cpu_count(),
            "threads": args.threads,
            "platform": platform.platform(),
            "read_bandwidth_bytes_per_s": bw,
            "note": "shared machine: other processes ran during the measurements",
        },
        "tokens": args.tokens,
        "prompts": args.prompts,
        "runs": [],
    }
    pairs: dict[str, Dspark] = {}
    hfs: dict[str, Hf | None] = {}
    prompt_text: dict[str, str] = {}
    # Prompts per dtype and N: the first --prompts held-out texts at B = 1, the first N (cycled
    # if the file holds fewer) at each larger N.
    batch_prompts: dict[tuple[str, int], list[list[int]]] = {}
    for dt in args.dtypes:
        tok = Tokenizer.from_file(str(args.pairs / dt / "target" / "tokenizer.json"))
        ids = [tok.encode(t).ids[:PROMPT_TOKENS] for t in texts]
        for n in args.batches:
            k = args.prompts if n == 1 else n
            batch_prompts[dt, n] = [ids[i % len(ids)] for i in range(k)]
        prompt_text[dt] = tok.decode(ids[0])
        pairs[dt] = Dspark(args.pairs / dt, args.tokens)
        wb = pairs[dt].target.weight_bytes_per_step
        results.setdefault("floor", {})[dt] = {
            "weight_dtype": pairs[dt].target.weight_dtype,
            "weight_bytes_per_step": wb,
            "tokens_per_s": bw / wb,
        }
        if "scheduled" in args.engines:
            warm = pairs[dt].warm_scheduled(batch_prompts[dt, max(args.batches)])
            results.setdefault("scheduled_first_call_s", {})[dt] = warm
            print(f"[{dt}] scheduled: first call (its profile) {warm:.1f} s, paid before the runs")
        print(f"[{dt}] weights kept as {pairs[dt].target.weight_dtype}: {wb / 1e9:.2f} GB/step,"
              f" floor {bw / wb:.2f} tok/s")  # fmt: skip

    def hf(dt: str) -> Hf | None:
        if dt not in hfs:
            try:
                hfs[dt] = Hf(args.pairs / dt, dt, args.tokens, args.threads)
            except ImportError as e:
                print(f"skipping the HF rows: {e}")
                hfs[dt] = None
        return hfs[dt]

    def peer(dt: str, engine: str) -> dict[str, Any] | None:
        gguf = args.gguf_dir / f"target-{dt}.gguf"
        n = str(args.tokens)
        if engine in ("llama-bench", "llama-bench-1t"):
            # One thread for -1t: llama.cpp's spinning pool collapses when another process
            # holds a core.
            t = th if engine == "llama-bench" else "1"
            out = run_command([str(bins / "llama-bench"), "-m", str(gguf), "-p", "0", "-n", n,
                        "-pg", f"{PROMPT_TOKENS},{n}", "-t", t, "-r", "1", "-o", "json"],
                       600)  # fmt: skip
            if out:
                return llama_bench_rates(json.loads(out[: out.rindex("]") + 1]))
        elif engine == "draft-dspark":
            out = run_command([str(bins / "llama-speculative-simple"), "-m", str(gguf), "-md",
                        str(args.gguf_dir / f"drafter-{dt}.gguf"), "--spec-type", "draft-dspark",
                        "--spec-draft-n-max", "8", "-p", prompt_text[dt], "-n", n, "--temp", "0",
                        "--top-k", "1", "-t", th, "-td", th, "-c", "1024"], 600)  # fmt: skip
            if out:
                return speculative_simple_rates(out)
        elif engine == "mistralrs":
            out = run_command([peers["python"], "-c", _MISTRALRS, str(args.pairs / dt / "target"),
                        prompt_text[dt], n, "F32"], 900)  # fmt: skip
            if out:
                line = next(ln for ln in out.splitlines() if ln.startswith("{"))
                return dict(json.loads(line))
        return None

    native = ("target-only", "speculative", "scheduled")
    for r in range(args.repeats):
        for n in args.batches:
            for dt in args.dtypes:
                order = args.engines if r % 2 == 0 else args.engines[::-1]
                for engine in order if n == 1 else [e for e in order if e in native]:
                    if time.perf_counter() - start > args.budget_s:
                        print(f"budget of {args.budget_s:.0f} s spent: stopping")
                        break
                    got: dict[str, Any] | None = None
                    if engine in native or engine.startswith("sampled "):
                        got = pairs[dt].run(engine, batch_prompts[dt, n], n)
                        name = f"dspark {engine}"
                    elif engine.startswith("hf "):
                        model = hf(dt)
                        if model is not None:
                            got = model.run(engine[3:], batch_prompts[dt, n])
                        name = engine
                    elif peers:
                        got, name = peer(dt, engine), engine
                    if got is None:
                        continue
                    got.update({"repeat": r, "batch": n, "dtype": dt, "engine": name})
                    results["runs"].append(got)
                    tau = f"  tau {got['tau']:.2f}" if "tau" in got else ""
                    speed = f"{got['tokens_per_s']:7.2f} tok/s{tau}"
                    print(f"[{r}] N={n:<2d} {dt:4s} {name:24s} {speed}", flush=True)

    # The read measured again after the runs: a shared machine's load at the start
    # understates the floor (an upper bound on decode speed), so the floor uses the faster.
    bw_end = read_bandwidth(args.threads)
    results["machine"]["read_bandwidth_start_bytes_per_s"] = bw
    results["machine"]["read_bandwidth_end_bytes_per_s"] = bw_end
    print(f"read bandwidth at the end: {bw_end / 1e9:.1f} GB/s")
    if bw_end > bw:
        results["machine"]["read_bandwidth_bytes_per_s"] = bw_end
        for f in results["floor"].values():
            f["tokens_per_s"] = bw_end / f["weight_bytes_per_step"]
    summary: dict[str, Any] = {}
    for dt in args.dtypes:
        summary[dt] = {}
        for n in args.batches:
            rows = [x for x in results["runs"] if x["dtype"] == dt and x["batch"] == n]
            med = {
                e: median_rates([x for x in rows if x["engine"] == e])
                for e in dict.fromkeys(x["engine"] for x in rows)
            }
            # Sampled rows against sampled target-only (the same sampling, the same run).
            row: dict[str, Any] = {}
            for e, v in med.items():
                ref = med.get(reference(e), {})
                row[e] = dict(v)
                for key, ratio in (("tokens_per_s", "x_target_only"),
                                   ("decode_tokens_per_s", "x_target_only_decode")):  # fmt: skip
                    if key in v:
                        row[e][ratio] = v[key] / ref[key] if ref.get(key) else None
            row["paired"] = {e: paired_ratios(rows, e, reference(e)) for e in med}
            targets = {name: paired_ratios(rows, e, a) for name, e, a in PAIRED_TARGETS}
            row["paired_targets"] = {k: v for k, v in targets.items() if v is not None}
            # The floor is a decode step's: against the decode-only rate.
            base = med.get("dspark target-only", {}).get("decode_tokens_per_s")
            if base and n == 1:
                floor = results["floor"][dt]["tokens_per_s"]
                row["floor_fraction_target_only_decode"] = base / floor
            summary[dt][str(n)] = row
    results["median"] = summary
    results["seconds"] = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")
    print(plot(results, args.out.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
