"""What a grammar costs the engine, in one process (issue 48): the same greedy requests free,
under a JSON schema (lazy masks: the target's greedy token checked first, the full allowed set
only where it is refused), and under the same schema with ``logprobs=0`` (the full sets of the
emitted positions too, for their log-probabilities).

    python benches/bench_grammar.py [--pair DIR] [--verify full] [--requests 8] [--tokens 64] \\
        [--repeats 5] [--concurrency 0] [--out benches/results/grammar.json]

The requests are the first 400 characters of the pair's held-out prompts (the bundled pair's
by default), all added at once (or ``--concurrency`` at a time), up to ``--tokens`` new tokens
each. The three modes are interleaved within each repeat; reported: tokens/s of the whole run
and each request's decode rate (median and all), the ratio of each schema mode to free text,
and that log-probabilities left the tokens as they were (asserted). A schema's document may end
before ``--tokens``: the run's tokens/s then counts fewer rows at its end, a request's decode
rate does not.
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

#: One mode's run: tokens/s, the median request's decode rate, the tokens.
Run = tuple[float, float, list[list[int]]]

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
    p.add_argument("--concurrency", type=int, default=0, help="requests at a time (0: all at once)")
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

    def run(logprobs: int | None, fmt: dict[str, Any] | None) -> Run:
        """Tokens/s of the whole run, the median request's decode rate (its tokens after the
        first over the time from its first token to its last) and the tokens."""
        eng = dspark.Engine(target, drafter, verify=args.verify, tokenizer_dir=str(tdir))
        kw: dict[str, Any] = {"stop_token_ids": [eos]}
        if fmt is not None:
            kw["response_format"] = fmt
        if logprobs is not None:
            kw["logprobs"] = logprobs
        out: dict[int, list[int]] = {}
        first: dict[int, float] = {}
        last: dict[int, float] = {}
        waves = (
            [prompts]
            if args.concurrency == 0
            else [
                prompts[i : i + args.concurrency] for i in range(0, len(prompts), args.concurrency)
            ]
        )
        start = time.perf_counter()
        n = 0
        for wave in waves:
            for ids in wave:
                out[eng.add_request(ids, args.tokens, **kw)] = []
            for u in eng.updates():
                now = time.perf_counter()
                if u.new_tokens:
                    first.setdefault(u.request_id, now)
                    last[u.request_id] = now
                out[u.request_id].extend(u.new_tokens)
                n += len(u.new_tokens)
        rate = n / (time.perf_counter() - start)
        decode = sorted(
            (len(out[r]) - 1) / (last[r] - first[r])
            for r in out
            if last.get(r, 0.0) > first.get(r, 0.0)
        )
        return rate, decode[len(decode) // 2] if decode else 0.0, [out[k] for k in sorted(out)]

    modes = {"free": (None, None), "json": (None, SCHEMA), "json logprobs": (0, SCHEMA)}
    rates: dict[str, list[float]] = {m: [] for m in modes}
    decodes: dict[str, list[float]] = {m: [] for m in modes}
    for rep in range(args.repeats):
        tokens: dict[str, list[list[int]]] = {}
        order = list(modes) if rep % 2 == 0 else list(reversed(modes))
        for m in order:
            rate, decode, tokens[m] = run(*modes[m])
            rates[m].append(rate)
            decodes[m].append(decode)
        assert tokens["json"] == tokens["json logprobs"], "log-probabilities changed the tokens"
        print(f"[rep {rep}] " + "  ".join(f"{m} {rates[m][-1]:7.1f} tok/s" for m in modes))

    def median(v: list[float]) -> float:
        return sorted(v)[len(v) // 2]

    result: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {"cpu": platform.processor() or platform.machine()},
        "tokens_per_s": {m: {"median": median(v), "all": v} for m, v in rates.items()},
        "request_decode_tokens_per_s": {
            m: {"median": median(v), "all": v} for m, v in decodes.items()
        },
        "json_x_free": median(rates["json"]) / median(rates["free"]),
        "json_logprobs_x_free": median(rates["json logprobs"]) / median(rates["free"]),
        "request_decode_json_x_free": median(decodes["json"]) / median(decodes["free"]),
        "request_decode_json_logprobs_x_free": median(decodes["json logprobs"])
        / median(decodes["free"]),
        "logprobs_equal_tokens": True,
    }
    print(json.dumps({k: v for k, v in result.items() if k.endswith("free")}))
    result["note"] = (
        "tokens_per_s: the whole run (schema requests that end early leave fewer rows running);"
        " request_decode: each request's tokens after its first over its time from first to last"
        " token, median over requests"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
