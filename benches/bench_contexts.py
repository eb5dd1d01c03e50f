"""By context length: dspark's target-only and speculative decoding (the default policy) after
long prompts, per KV cache dtype, against llama.cpp at the same depths. Run through
``benches/bench_memory_bound.py PAIRS --gguf-dir G --contexts 96 1500 3000 [--kv-dtypes float16
float32] [--dtypes bf16] [--prompts 2] [--tokens 64] [--repeats 2]``.

Prompts: the held-out files of the bundled pair (``heldout_prompts.json`` names them; the
standard library holds them on every machine), tokenized whole and joined by
``<|endoftext|>``; prompt ``i`` of context ``C`` is the ``C`` tokens from the start of held-out
file ``i`` on (a long file alone, or a file and the ones after it). Greedy, ``--tokens`` new
tokens, B = 1, one call per prompt.

Rows per (dtype, context), interleaved per repeat (the order reversed on odd repeats):

* ``dspark target-only kv=K`` / ``dspark speculative kv=K``: the native engine with its KV
  cache in ``K``, the speculator with its default verification policy; end to end (prefill
  included) and decode only (``committed / (total - prefill)``), ``tau`` and ``greedy_equal``
  (speculative tokens equal target-only tokens with the same cache dtype);
* ``llama-bench``: decode at depth ``C`` (``-d C -n TOKENS``, its default f16 KV cache) and end
  to end (``-pg C,TOKENS``: its time, prefill included, per generated token);
* ``draft-dspark``: ``llama-speculative-simple --spec-type draft-dspark`` with our drafter on
  the first prompt's text, end to end and decode only.

The medians per (dtype, context, engine) and the ratios against dspark target-only with the
same cache dtype (``x_target_only``, end to end, and ``x_target_only_decode``) go to the JSON,
with ``tau_ratio_to_shortest`` (τ at each context over τ at the shortest).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from peer_runs import (
    PEERS,
    cpu_isa,
    llama_bench_rates,
    read_bandwidth,
    run_command,
    speculative_simple_rates,
    timed_calls,
)


def long_prompts(
    tokenizer_json: Path, contexts: list[int], count: int
) -> dict[int, list[list[int]]]:
    """``{C: [count prompts of C ids]}`` from the held-out files (see the module docs)."""
    from tokenizers import Tokenizer

    from dspark.memory_bound import bundled_tiny_dir
    from dspark.train.corpus import SEPARATOR, default_stdlib_dir

    tok = Tokenizer.from_file(str(tokenizer_json))
    files = json.loads((bundled_tiny_dir() / "heldout_prompts.json").read_text())["files"]
    eos = tok.token_to_id(SEPARATOR)
    stream: list[int] = []
    starts: list[int] = []
    for name in files:
        starts.append(len(stream))
        stream += tok.encode((default_stdlib_dir() / name).read_text(encoding="utf-8")).ids
        stream.append(eos)
    out: dict[int, list[list[int]]] = {}
    for c in contexts:
        fits = [s for s in starts if s + c <= len(stream)]
        if len(fits) < count:
            raise ValueError(f"the held-out files hold {len(fits)} prompts of {c} tokens")
        out[c] = [stream[s : s + c] for s in fits[:count]]
    return out


class Native:
    """The pair with the target's KV cache in one dtype: target-only and the default policy."""

    def __init__(self, pair: Path, kv_dtype: str, tokens: int) -> None:
        from dspark.drafter import Drafter
        from dspark.native_target import NativeTarget
        from dspark.speculator import Speculator

        self.target = NativeTarget.from_pretrained(pair / "target", kv_dtype=kv_dtype)
        drafter = Drafter.from_pretrained(pair / "drafter", self.target)
        self.spec = Speculator(self.target, drafter, seed=0)
        self.spec.warm_up(1)
        self.tokens = tokens
        self.reference: dict[int, list[list[int]]] = {}

    def run(self, mode: str, prompts: list[list[int]], context: int) -> dict[str, Any]:
        call = self.spec.generate_target_only if mode == "target-only" else self.spec.generate
        rates, got = timed_calls(call, [[p] for p in prompts], self.tokens)
        out: dict[str, Any] = {k: rates[k] for k in ("tokens_per_s", "decode_tokens_per_s")}
        if mode == "target-only":
            self.reference[context] = got
        else:
            out["tau"] = rates["tau"]
            out["greedy_equal"] = got == self.reference.get(context)
        return out


def peer_row(
    engine: str, bins: Path, gguf: Path, context: int, text: str, args: Any
) -> dict[str, Any] | None:
    """One llama.cpp row (see the module docs), or ``None`` when it fails."""
    th, n = str(args.threads), str(args.tokens)
    target, drafter = gguf / f"target-{args.dtype}.gguf", gguf / f"drafter-{args.dtype}.gguf"
    if engine == "llama-bench":
        # Decode at depth C, then prompt + decode from an empty cache (llama-bench skips the
        # zero-sized plain tests).
        got: dict[str, Any] = {}
        for extra in (["-p", "0", "-n", n, "-d", str(context)],
                      ["-p", "0", "-n", "0", "-pg", f"{context},{n}"]):  # fmt: skip
            out = run_command([str(bins / "llama-bench"), "-m", str(target), *extra,
                        "-t", th, "-r", "1", "-o", "json"], 900)  # fmt: skip
            if out is None:
                return None
            got.update(llama_bench_rates(json.loads(out[: out.rindex("]") + 1])) or {})
        return got if "tokens_per_s" in got and "decode_tokens_per_s" in got else None
    if engine == "draft-dspark":
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        out = run_command([str(bins / "llama-speculative-simple"), "-m", str(target),
                    "-md", str(drafter), "--spec-type", "draft-dspark",
                    "--spec-draft-n-max", "8", "-f", f.name, "-n", n, "--temp", "0", "--top-k", "1",
                    "-t", th, "-td", th, "-c", str(context + int(n) + 512),
                    # The prompt is one logical batch (the default 2,048 refuses 3,000 tokens).
                    "-b", str(max(2048, context + int(n)))], 900)  # fmt: skip
        Path(f.name).unlink(missing_ok=True)
        return speculative_simple_rates(out) if out else None
    return None


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per (dtype, context, engine), ratios against target-only with the same cache
    dtype (llama.cpp rows against dspark's default cache dtype's), τ against the shortest."""
    out: dict[str, Any] = {}
    for dt in dict.fromkeys(r["dtype"] for r in runs):
        out[dt] = {}
        contexts = sorted({r["context"] for r in runs if r["dtype"] == dt})
        for c in contexts:
            rows = [r for r in runs if r["dtype"] == dt and r["context"] == c]
            med: dict[str, dict[str, Any]] = {}
            for e in dict.fromkeys(r["engine"] for r in rows):
                mine = [r for r in rows if r["engine"] == e]
                med[e] = {
                    k: _median(mine, k) for k in ("tokens_per_s", "decode_tokens_per_s", "tau")
                }
                med[e] = {k: v for k, v in med[e].items() if v is not None}
                if any("greedy_equal" in r for r in mine):
                    med[e]["greedy_equal"] = all(r.get("greedy_equal", True) for r in mine)
            for e, v in med.items():
                kv = e.split("kv=")[1] if "kv=" in e else None
                ref = med.get(f"dspark target-only kv={kv}") if kv else None
                for key, ratio in (
                    ("tokens_per_s", "x_target_only"),
                    ("decode_tokens_per_s", "x_target_only_decode"),
                ):
                    if ref and ref.get(key) and key in v:
                        v[ratio] = v[key] / ref[key]
            out[dt][str(c)] = med
        shortest = out[dt].get(str(contexts[0]), {}) if contexts else {}
        for c in contexts:
            for e, v in out[dt][str(c)].items():
                base = shortest.get(e, {}).get("tau")
                if "tau" in v and base:
                    v["tau_ratio_to_shortest"] = v["tau"] / base
    return out


def run(args: argparse.Namespace) -> int:
    """Run the context-length benchmark for the parsed ``bench_memory_bound`` arguments."""
    start = time.perf_counter()
    peers: dict[str, Any] = {}
    if (PEERS / "peers.json").is_file():
        peers = json.loads((PEERS / "peers.json").read_text())
    else:
        print(f"skipping llama.cpp: no {PEERS / 'peers.json'} (benches/peers/setup.sh)")
    bins = Path(peers.get("bin", "/nonexistent"))
    bw = read_bandwidth(args.threads)
    results: dict[str, Any] = {
        "machine": {"isa": cpu_isa(), "threads": args.threads, "read_bandwidth_bytes_per_s": bw,
                    "note": "shared machine: other processes may have run during the measurements"},
        "tokens": args.tokens, "prompts": args.prompts, "contexts": args.contexts,
        "kv_dtypes": args.kv_dtypes, "runs": [],
    }  # fmt: skip
    from tokenizers import Tokenizer

    engines = [f"{m} kv={kv}" for kv in args.kv_dtypes for m in ("target-only", "speculative")]
    engines += ["llama-bench", "draft-dspark"] if peers else []
    for dt in args.dtypes:
        pair = args.pairs / dt
        prompts = long_prompts(pair / "target" / "tokenizer.json", args.contexts, args.prompts)
        tok = Tokenizer.from_file(str(pair / "target" / "tokenizer.json"))
        natives = {kv: Native(pair, kv, args.tokens) for kv in args.kv_dtypes}
        args.dtype = dt
        for r in range(args.repeats):
            for c in args.contexts:
                for engine in engines if r % 2 == 0 else engines[::-1]:
                    if time.perf_counter() - start > args.budget_s:
                        print(f"budget of {args.budget_s:.0f} s spent: stopping")
                        break
                    if engine.startswith(("target-only", "speculative")):
                        mode, kv = engine.split(" kv=")
                        got = natives[kv].run(mode, prompts[c], c)
                        name = f"dspark {engine}"
                    else:
                        got = peer_row(
                            engine, bins, args.gguf_dir, c, tok.decode(prompts[c][0]), args
                        )
                        name = engine
                    if got is None:
                        continue
                    got.update({"repeat": r, "dtype": dt, "context": c, "engine": name})
                    results["runs"].append(got)
                    tau = f"  tau {got['tau']:.2f}" if "tau" in got else ""
                    dec = got.get("decode_tokens_per_s", float("nan"))
                    print(f"[{r}] {dt} C={c:<5d} {name:32s} {got['tokens_per_s']:7.2f} tok/s"
                          f" (decode {dec:7.2f}){tau}", flush=True)  # fmt: skip
    results["median"] = summarize(results["runs"])
    results["seconds"] = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results["median"], indent=2))
    print(f"wrote {args.out}")
    return 0
