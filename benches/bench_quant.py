"""Quantized targets: dspark's native target at bf16, ``q8_0`` and ``q4_k`` on the same
checkpoint, and llama.cpp on the same weights (bf16, Q8_0 and Q4_K_M GGUF files), at B = 1,
greedy.

    python benches/bench_quant.py /var/tmp/mb-bf16 [--gguf-dir DIR] [--dtypes bfloat16 q4_k]
        [--tokens 64] [--prompts 2] [--prompt-tokens 96] [--repeats 3] [--threads 2]
        [--out benches/results/quant_<machine>.json]

``PAIR`` holds ``target`` and ``drafter`` (``dspark make-example PAIR --memory-bound --dtype
bfloat16``). ``--gguf-dir`` holds ``target-bf16.gguf``, ``target-q8_0.gguf``,
``target-q4_k_m.gguf`` and ``drafter-bf16.gguf`` (llama.cpp's own converter and
``llama-quantize`` on that pair: ``benches/peers/convert.py PAIR/target --drafter PAIR/drafter
--outdir DIR --outtype bf16 --outtype q8_0 --quantize Q4_K_M``); without it, or without the peers
(``benches/peers/setup.sh``), llama.cpp is skipped with a line saying so.

dspark's ``q4_k`` is the checkpoint quantized in place (every layer map in Q4_K, the head in
Q8_0); llama.cpp's is its own Q4_K_M mix (Q4_K with Q6_K for some maps and the head) of the same
checkpoint: the same weights, each engine's quantizer. With ``--gguf-dir``, dspark also runs
llama.cpp's very files (rows ``<dtype>@gguf``: ``NativeTarget.from_pretrained(file.gguf)``, the
blocks as ``llama-quantize`` wrote them), the fairest comparison: the same bytes in both
engines.

Rows, each interleaved with the others in every repeat (the order reversed on odd repeats):

* ``dspark target-only`` / ``dspark speculative`` (default policy) / ``dspark full`` (every
  round verifies its whole block), per dtype, end to end (prefill included) and decode only;
  ``greedy_equal`` says whether the speculative tokens equal the same dtype's target-only
  tokens;
* ``llama-bench``: llama.cpp target-only on the GGUF of that dtype, decode only (``-n``) and
  end to end (``-pg PROMPT,TOKENS``);
* ``draft-dspark``: ``llama-speculative-simple --spec-type draft-dspark`` on that GGUF with the
  bf16 drafter GGUF, greedy, on the first held-out prompt's text (llama.cpp tokenizes it).

The JSON keeps every run, the medians, and the ratios: each quantized dtype against bf16 (same
engine, same mode), speculative against target-only (same dtype), and dspark against llama.cpp
(same dtype: target-only against ``llama-bench``, speculative against ``draft-dspark``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path
from typing import Any

from peer_runs import (
    cpu_isa,
    llama_bench_rates,
    run_command,
    speculative_simple_rates,
    timed_calls,
)

DTYPES = ("bfloat16", "q8_0", "q4_k")
GGUF = {
    "bfloat16": "target-bf16.gguf",
    "q8_0": "target-q8_0.gguf",
    "q4_k": "target-q4_k_m.gguf",
}
DRAFTER_GGUF = "drafter-bf16.gguf"


def prompts(pair: Path, n: int, length: int) -> list[list[int]]:
    """The first ``n`` held-out prompts, each cycled to ``length`` tokens."""
    from tokenizers import Tokenizer

    from dspark.bundled import bundled_dir

    texts = json.loads((bundled_dir() / "heldout_prompts.json").read_text())["texts"]
    tok = Tokenizer.from_file(str(pair / "target" / "tokenizer.json"))
    out = []
    for text in texts[:n]:
        ids = list(tok.encode(text).ids)
        out.append([ids[i % len(ids)] for i in range(length)])
    return out


class Native:
    """dspark's native target in one dtype, alone and behind the bundled drafter."""

    def __init__(self, pair: Path, dtype: str, tokens: int, gguf: Path | None = None) -> None:
        from dspark.drafter import Drafter
        from dspark.native_target import NativeTarget
        from dspark.speculator import Speculator

        if gguf is not None:
            self.target = NativeTarget.from_pretrained(gguf)
        else:
            self.target = NativeTarget.from_pretrained(pair / "target", dtype=dtype)
        drafter = Drafter.from_pretrained(pair / "drafter", self.target)
        self.modes = {
            "speculative": Speculator(self.target, drafter, seed=0),
            "full": Speculator(self.target, drafter, seed=0, verify="full"),
        }
        self.tokens = tokens
        self.reference: list[list[int]] = []

    def run(self, mode: str, ps: list[list[int]]) -> dict[str, Any]:
        spec = self.modes["full" if mode == "target-only" else mode]
        call = spec.generate_target_only if mode == "target-only" else spec.generate
        rates, got = timed_calls(call, [[p] for p in ps], self.tokens)
        out: dict[str, Any] = {k: rates[k] for k in ("tokens_per_s", "decode_tokens_per_s")}
        if mode == "target-only":
            self.reference = got
        else:
            out["tau"] = rates["tau"]
            out["greedy_equal"] = got == self.reference
        return out


def llama_bench(peers: dict[str, Any], gguf: Path, threads: int, ptoks: int, tokens: int):
    """llama-bench's decode-only and end-to-end rates on ``gguf``, or ``None``."""
    exe = Path(peers.get("tools", {}).get("llama-bench", "/nonexistent"))
    if not exe.is_file() or not gguf.is_file():
        return None
    out = run_command(
        [
            str(exe),
            "-m",
            str(gguf),
            "-t",
            str(threads),
            "-n",
            str(tokens),
            "-p",
            "0",
            "-pg",
            f"{ptoks},{tokens}",
            "-r",
            "1",
            "-o",
            "json",
        ],
        timeout=600,
    )
    if out is None:
        return None
    return llama_bench_rates(json.loads(out))


def draft_dspark(
    peers: dict[str, Any], gguf_dir: Path, dtype: str, text: str, threads: int, tokens: int
) -> dict[str, Any] | None:
    """``llama-speculative-simple --spec-type draft-dspark`` on ``dtype``'s GGUF, or ``None``."""
    exe = Path(peers.get("tools", {}).get("llama-speculative-simple", "/nonexistent"))
    gguf, drafter = gguf_dir / GGUF[dtype], gguf_dir / DRAFTER_GGUF
    if not (exe.is_file() and gguf.is_file() and drafter.is_file()):
        return None
    th = str(threads)
    out = run_command([str(exe), "-m", str(gguf), "-md", str(drafter),
                       "--spec-type", "draft-dspark", "--spec-draft-n-max", "8", "-p", text,
                       "-n", str(tokens), "--temp", "0", "--top-k", "1", "-t", th, "-td", th,
                       "-c", "2048"], 600)  # fmt: skip
    return speculative_simple_rates(out) if out else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pair", type=Path)
    ap.add_argument("--gguf-dir", type=Path)
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peers", type=Path, default=Path("/var/tmp/dspark-peers/peers.json"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import os

    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    dtypes = [d for d in DTYPES if d in args.dtypes]
    ps = prompts(args.pair, args.prompts, args.prompt_tokens)
    from dspark.bundled import bundled_dir

    text = json.loads((bundled_dir() / "heldout_prompts.json").read_text())["texts"][0]
    natives = {d: Native(args.pair, d, args.tokens) for d in dtypes}
    if args.gguf_dir is not None:
        for d in dtypes:
            if (args.gguf_dir / GGUF[d]).is_file():
                natives[f"{d}@gguf"] = Native(args.pair, d, args.tokens, args.gguf_dir / GGUF[d])
    peers = json.loads(args.peers.read_text()) if args.peers.is_file() else {}
    if not peers or args.gguf_dir is None:
        print("llama.cpp: skipped (no peers.json or no --gguf-dir)")
    engines = [(d, m) for d in natives for m in ("target-only", "speculative", "full")]
    engines += [(d, m) for d in dtypes for m in ("llama-bench", "draft-dspark")]
    runs: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        order = engines if rep % 2 == 0 else engines[::-1]
        # Target-only first within a dtype, so the speculative rows compare with this repeat.
        order = sorted(order, key=lambda e: e[1] != "target-only")
        for dtype, mode in order:
            if mode in ("llama-bench", "draft-dspark"):
                if not peers or args.gguf_dir is None:
                    continue
                if mode == "llama-bench":
                    got = llama_bench(
                        peers,
                        args.gguf_dir / GGUF[dtype],
                        args.threads,
                        args.prompt_tokens,
                        args.tokens,
                    )
                else:
                    got = draft_dspark(peers, args.gguf_dir, dtype, text, args.threads, args.tokens)
                if got is None:
                    continue
                row = dict(got)
            else:
                row = natives[dtype].run(mode, ps)
            row.update(repeat=rep, dtype=dtype, engine=mode)
            runs.append(row)
            print(json.dumps(row), flush=True)

    def med(dtype: str, engine: str, key: str) -> float | None:
        vals = [r[key] for r in runs if (r["dtype"], r["engine"]) == (dtype, engine) and key in r]
        return statistics.median(vals) if vals else None

    medians = {
        f"{d} {e}": {k: med(d, e, k) for k in ("tokens_per_s", "decode_tokens_per_s", "tau")}
        for d, e in engines
    }
    from dspark import build_info

    ratios: dict[str, Any] = {}
    keys = ("tokens_per_s", "decode_tokens_per_s")

    def ratio(name: str, a: float | None, b: float | None) -> None:
        if a and b:
            ratios[name] = a / b

    for d in natives:
        base = d.split("@")[0]
        for k in keys:
            if "@" in d:
                ratio(
                    f"{d}/{base} target-only {k}",
                    med(d, "target-only", k),
                    med(base, "target-only", k),
                )
            if d != "bfloat16" and "@" not in d:
                for e in ("target-only", "speculative", "full", "llama-bench", "draft-dspark"):
                    ratio(f"{d}/bf16 {e} {k}", med(d, e, k), med("bfloat16", e, k))
            ratio(
                f"{d} dspark speculative / target-only {k}",
                med(d, "speculative", k),
                med(d, "target-only", k),
            )
            ratio(
                f"{d} dspark target-only / llama-bench {k}",
                med(d, "target-only", k),
                med(base, "llama-bench", k),
            )
            for e in ("speculative", "full"):
                ratio(
                    f"{d} dspark {e} / draft-dspark {k}",
                    med(d, e, k),
                    med(base, "draft-dspark", k),
                )
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "isa": cpu_isa(),
            "quant_kernel": build_info()["quant_kernel"],
        },
        "pair": str(args.pair),
        "threads": args.threads,
        "tokens": args.tokens,
        "prompt_tokens": args.prompt_tokens,
        "weight_bytes_per_step": {d: n.target.weight_bytes_per_step for d, n in natives.items()},
        "greedy_equal": all(r.get("greedy_equal", True) for r in runs),
        "medians": medians,
        "ratios": ratios,
        "runs": runs,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({"medians": medians, "ratios": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
