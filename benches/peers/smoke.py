"""Run each peer once on a pair for a few tokens: proof that the files load, and rough speeds.

    python benches/peers/smoke.py PAIR_DIR --gguf-dir GGUF_DIR [--dtype bf16] [--tokens 32]

``PAIR_DIR`` is what ``dspark make-example`` wrote (``target/``, ``drafter/``); ``GGUF_DIR``
holds ``target-{dtype}.gguf`` and ``drafter-{dtype}.gguf`` from ``benches/peers/convert.py``.
Every run decodes greedily from the first held-out prompt (its first 48 tokens):

* dspark, native engine: target-only and speculative (this process);
* llama.cpp through llama-cpp-python, target-only, fed the same token ids: its tokens are
  compared with dspark's;
* ``llama-bench`` (target-only generation speed, ``-p 0 -n TOKENS``);
* ``llama-speculative-simple --spec-type draft-dspark`` (llama.cpp's own DSpark mode; it
  tokenizes the prompt text itself, with the GGUF's SentencePiece vocabulary);
* mistral.rs (Python ``Runner``, ``Which.Plain`` on the HF target directory), target-only,
  computing in float32 and in bfloat16; it tokenizes with ``tokenizer.json``, so its text is
  compared with dspark's. (Its Python API offers speculative decoding only with an MTP
  assistant, ``Runner(mtp_model=...)``: nothing that runs a DSpark drafter.)

Prints each command, its wall time and tokens/s, and writes ``GGUF_DIR/smoke-{dtype}.json``.
This is a smoke test, not the benchmark (``benches/bench_memory_bound.py``): one run each, no
interleaving, ``--threads`` for every engine (on a busy 2-core machine, llama.cpp's spinning
thread pool collapses at 2 threads: measure with 1 there, or on an idle machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PEERS = Path(os.environ.get("DSPARK_PEERS_DIR", "/var/tmp/dspark-peers"))
PROMPT_TOKENS = 48

_LLAMA_CPP_PY = """
import json, sys, time, llama_cpp
prompt, n = json.loads(sys.argv[2]), int(sys.argv[3])
m = llama_cpp.Llama(sys.argv[1], n_ctx=1024, n_threads=int(sys.argv[4]), verbose=False)
out, t0, t1 = [], time.perf_counter(), None
for t in m.generate(prompt, temp=0.0, top_k=1, reset=True):
    t1 = t1 or time.perf_counter()
    out.append(t)
    if len(out) == n:
        break
t2 = time.perf_counter()
print(json.dumps({"tokens": out, "tokens_per_s": (n - 1) / (t2 - t1), "seconds": t2 - t0}))
"""

_MISTRALRS = """
import json, sys, time, mistralrs as m
r = m.Runner(which=m.Which.Plain(model_id=sys.argv[1], arch=m.Architecture.Qwen3,
                                 dtype=getattr(m.ModelDType, sys.argv[4])))
t0 = time.perf_counter()
res = r.send_completion_request(m.CompletionRequest(
    model="target", prompt=sys.argv[2], max_tokens=int(sys.argv[3]), temperature=0.0, top_k=1))
u = res.usage
print(json.dumps({"text": res.choices[0].text, "tokens_per_s": u.avg_compl_tok_per_sec,
                  "prompt_tokens": u.prompt_tokens, "seconds": time.perf_counter() - t0}))
"""


def _run(cmd: list[str], log: list[dict[str, Any]], name: str) -> str:
    shown = [c if len(c) < 120 else c[:60] + "..." for c in cmd]
    print(f"\n[{name}] $ " + " ".join(shown), flush=True)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    entry: dict[str, Any] = {"name": name, "command": shown, "seconds": round(seconds, 1)}
    entry["returncode"] = res.returncode
    log.append(entry)
    if res.returncode != 0:
        print(f"  FAILED ({res.returncode}) in {seconds:.1f} s:\n{res.stderr[-3000:]}")
        return ""
    print(f"  ok in {seconds:.1f} s")
    return res.stdout + "\n" + res.stderr


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (1 if any peer failed)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pair", type=Path)
    parser.add_argument("--gguf-dir", type=Path, required=True)
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="bf16")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    peers = json.loads((PEERS / "peers.json").read_text())
    bins, py = Path(peers["bin"]), peers["python"]
    n, th = args.tokens, str(args.threads)
    target_gguf = args.gguf_dir / f"target-{args.dtype}.gguf"
    drafter_gguf = args.gguf_dir / f"drafter-{args.dtype}.gguf"
    log: list[dict[str, Any]] = []
    results: dict[str, Any] = {"pair": str(args.pair), "dtype": args.dtype, "tokens": n}

    os.environ["RAYON_NUM_THREADS"] = th  # dspark's engine threads, like the peers'
    from tokenizers import Tokenizer

    from dspark.drafter import Drafter
    from dspark.memory_bound import bundled_tiny_dir
    from dspark.native_target import NativeTarget
    from dspark.speculator import Speculator

    tok = Tokenizer.from_file(str(args.pair / "target" / "tokenizer.json"))
    heldout = bundled_tiny_dir() / "heldout_prompts.json"
    prompt = tok.encode(json.loads(heldout.read_text())["texts"][0]).ids[:PROMPT_TOKENS]
    text = tok.decode(prompt)

    target = NativeTarget.from_pretrained(args.pair / "target")
    drafter = Drafter.from_pretrained(args.pair / "drafter", target)
    spec = Speculator(target, drafter, seed=0)
    for name, call in (("target-only", spec.generate_target_only), ("speculative", spec.generate)):
        t0 = time.perf_counter()
        res = call([prompt], n)
        dt = time.perf_counter() - t0
        results[f"dspark {name}"] = {"tokens_per_s": n / dt, "tokens": res.tokens[0]}
        extra = f", tau {res.stats.acceptance_length:.2f}" if name == "speculative" else ""
        print(f"[dspark {name}] {n / dt:.2f} tok/s (incl. prefill){extra}")
    want = results["dspark target-only"]["tokens"]

    out = _run([py, "-c", _LLAMA_CPP_PY, str(target_gguf), json.dumps(prompt), str(n), th],
               log, "llama-cpp-python target-only")  # fmt: skip
    if out:
        got = json.loads(out.strip().splitlines()[0])
        got["same_tokens_as_dspark"] = got["tokens"] == want
        results["llama-cpp-python target-only"] = got
        print(f"  {got['tokens_per_s']:.2f} tok/s decode; same tokens: {got['tokens'] == want}")

    out = _run([str(bins / "llama-bench"), "-m", str(target_gguf), "-p", "0", "-n", str(n),
                "-t", th, "-r", "2", "-o", "json"], log, "llama-bench target-only")  # fmt: skip
    if out:
        rows = json.loads(out[: out.rindex("]") + 1])
        results["llama-bench target-only"] = {"tokens_per_s": rows[0]["avg_ts"]}
        print(f"  {rows[0]['avg_ts']:.2f} tok/s (tg{n})")

    out = _run([str(bins / "llama-speculative-simple"), "-m", str(target_gguf), "-md",
                str(drafter_gguf), "--spec-type", "draft-dspark", "--spec-draft-n-max", "8",
                "-p", text, "-n", str(n), "--temp", "0", "--top-k", "1", "-t", th, "-td", th,
                "-c", "1024"], log, "llama.cpp draft-dspark")  # fmt: skip
    if out:
        stats = {k: float(v) for k, v in re.findall(r"(n_drafted|n_accept)\s*=\s*([\d.]+)", out)}
        speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+)", out)
        if speed:
            stats["tokens_per_s"] = float(speed.group(3))
        results["llama.cpp draft-dspark"] = stats
        print(f"  {stats}")

    # mistral.rs computes in the dtype it is given: F32 matches dspark's float32 arithmetic over
    # the stored weights; BF16 computes in bfloat16 (other near-tie tokens, and slow on CPUs).
    for dtype in ("F32", "BF16"):
        out = _run([py, "-c", _MISTRALRS, str(args.pair / "target"), text, str(n), dtype],
                   log, f"mistral.rs target-only {dtype}")  # fmt: skip
        if out:
            got = json.loads(next(ln for ln in out.splitlines() if ln.startswith("{")))
            got["same_text_as_dspark"] = got["text"] == tok.decode(want)
            results[f"mistral.rs target-only {dtype}"] = got
            print(f"  {got['tokens_per_s']:.2f} tok/s; same text: {got['same_text_as_dspark']}")

    results["commands"] = log
    path = args.gguf_dir / f"smoke-{args.dtype}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {path}")
    return 1 if any(e["returncode"] for e in log) else 0


if __name__ == "__main__":
    sys.exit(main())
