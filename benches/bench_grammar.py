"""What a grammar costs the engine, in one process (issue 48): the same greedy requests free,
under a JSON schema with lazy masks (no log-probabilities: the target's greedy token checked
first, the full allowed set only where it is refused), and under the same schema with eager
masks (``logprobs=0``: every verified position's set computed before the forward).

    python benches/bench_grammar.py [--pair DIR] [--verify full] [--requests 8] [--tokens 64] \\
        [--repeats 5] [--out benches/results/grammar.json]

The requests are the first 400 characters of the pair's held-out prompts (the bundled pair's
by default), all added at once, up to ``--tokens`` new tokens each. The three modes are
interleaved within each repeat; reported: tokens/s (median and all), the ratio of each schema
mode to free text, and that the lazy and eager modes gave the same tokens (asserted).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from bench_server import EXTRAS

import dspark
from dspark.bundled import bundled_dir

ROOT = Path(__file__).resolve().parent.parent

#: The schema of ``bench_server.py``'s ``+json`` rows.
SCHEMA: dict[str, Any] = EXTRAS["json"]["response_format"]


def main() -> int:
    """Entry point; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", type=Path, default=bundled_dir())
    p.add_argument("--verify", default="full")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "benches/results/grammar.json")
    args = p.parse_args()
    from tokenizers import Tokenizer

    tdir = args.pair / "target"
    tok = Tokenizer.from_file(str(tdir / "tokenizer.json"))
    texts = json.loads((bundled_dir() / "heldout_prompts.json").read_text())["texts"]
    prompts = [tok.encode(str(t)[:400]).ids for t in texts][: args.requests]
    eos = json.loads((tdir / "config.json").read_text()).get("eos_token_id", 0)
    target = dspark.NativeTarget.from_pretrained(str(tdir))
    drafter = dspark.Drafter.from_pretrained(str(args.pair / "drafter"), target)

    def run(logprobs: int | None, fmt: dict[str, Any] | None) -> tuple[float, list[list[int]]]:
        eng = dspark.Engine(target, drafter, verify=args.verify, tokenizer_dir=str(tdir))
        out: dict[int, list[int]] = {}
        for ids in prompts:
            kw: dict[str, Any] = {"stop_token_ids": [eos]}
            if fmt is not None:
                kw["response_format"] = fmt
            if logprobs is not None:
                kw["logprobs"] = logprobs
            out[eng.add_request(ids, args.tokens, **kw)] = []
        start = time.perf_counter()
        n = 0
        for u in eng.updates():
            out[u.request_id].extend(u.new_tokens)
            n += len(u.new_tokens)
        return n / (time.perf_counter() - start), [out[k] for k in sorted(out)]

    modes = {"free": (None, None), "json lazy": (None, SCHEMA), "json eager": (0, SCHEMA)}
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for rep in range(args.repeats):
        tokens: dict[str, list[list[int]]] = {}
        order = list(modes) if rep % 2 == 0 else list(reversed(modes))
        for m in order:
            rate, tokens[m] = run(*modes[m])
            rates[m].append(rate)
        assert tokens["json lazy"] == tokens["json eager"], "lazy and eager masks differ"
        print(f"[rep {rep}] " + "  ".join(f"{m} {rates[m][-1]:7.1f} tok/s" for m in modes))

    def median(v: list[float]) -> float:
        return sorted(v)[len(v) // 2]

    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {"cpu": platform.processor() or platform.machine()},
        "tokens_per_s": {m: {"median": median(v), "all": v} for m, v in rates.items()},
        "json_lazy_x_free": median(rates["json lazy"]) / median(rates["free"]),
        "json_eager_x_free": median(rates["json eager"]) / median(rates["free"]),
        "lazy_x_eager": median(rates["json lazy"]) / median(rates["json eager"]),
        "lazy_equals_eager": True,
    }
    print(json.dumps({k: v for k, v in result.items() if k.endswith(("free", "eager"))}))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
