"""Serving benchmark over HTTP: ``dspark serve`` (speculation on, drafting off) against
llama.cpp's OpenAI server (``llama-cpp-python[server]``), the same requests, one run.

For each pair (the bundled one, and with ``--memory-bound DIR`` a pair made by ``dspark
make-example --memory-bound``) and each server, the server is started on a free loopback port,
then for each concurrency C in ``--concurrency`` (default 1 4 16) ``--requests`` streamed
completions (held-out prompts, the first ``--prompt-chars`` characters, greedy, up to
``--max-tokens`` tokens) are sent with Poisson arrivals (mean gap ``--gap`` seconds) and at
most C in flight. The load is bounded: a fixed count of requests, each with a deadline, and the
run's own deadline. Per server and C: throughput (completion tokens / wall seconds), time to
first token, time per output token (after the first), end-to-end latency (p50 and p99), and
errors. ``dspark`` and ``llama.cpp`` also run the load with ``logprobs: 5`` and with frequency
and presence penalties, and ``dspark`` with a JSON schema (``--extras``), rows ``NAME +logprobs``
/ ``NAME +penalties`` / ``dspark +json``; ``dspark-nodraft +json`` is the schema without
drafting (the grammar's own cost, apart from the acceptance JSON text gets). Writes
``benches/results/server.json`` (``--out``).

Servers:

* ``dspark``: ``python -m dspark serve`` (this interpreter's dspark), default verification
  (the whole block);
* ``dspark-scheduled``: drafting left to the scheduler (``--verify scheduled``);
* ``dspark-nodraft``: the same with ``--num-speculative-tokens 0``;
* ``llama.cpp``: ``python -m llama_cpp.server`` in the peers venv (``benches/peers/setup.sh``)
  on an f32 GGUF of the same target made by llama.cpp's own converter
  (``benches/peers/convert.py``), with ``--interrupt_requests False`` (by default a new request
  cuts the stream in progress short); it serves one request at a time. Skipped, with a line
  that says why, when the peers are not installed.

The HTTP client is a small asyncio one (no dependency): it reads the server-sent events as they
arrive, so the first token's time is the client's.

    nice -n 19 python benches/bench_server.py [--concurrency 1 4 16] [--requests 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dspark.bundled import bundled_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from output_watch import watch_for

ROOT = Path(__file__).resolve().parent.parent
PEERS = Path(os.environ.get("DSPARK_PEERS_DIR", "/var/tmp/dspark-peers"))
#: Seconds a server may take to start.
START_TIMEOUT = 300.0
#: Seconds one request may take.
REQUEST_TIMEOUT = 300.0


class Proc:
    """A server process; ``url`` once it listens (found by ``pattern`` on its output)."""

    def __init__(self, cmd: list[str], pattern: str, port: int | None = None) -> None:
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.log: list[str] = []
        m = watch_for(
            self.proc, self.proc.stdout, pattern, self.log, timeout=START_TIMEOUT, poll=0.2
        )
        if m is None:
            self.stop()
            raise RuntimeError("server did not start:\n" + "".join(self.log[-20:]))
        self.url = f"http://127.0.0.1:{port}" if port else m.group(1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def one_request(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST a streaming completion; times of the first and last token, tokens, status."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    first = last = None
    chunks = 0
    usage: int | None = None
    while line := await reader.readline():
        text = line.decode(errors="replace").strip()
        if not text.startswith("data:"):
            continue
        payload = text[5:].strip()
        if payload == "[DONE]":
            break
        chunk = json.loads(payload)
        if chunk.get("usage"):
            usage = int(chunk["usage"]["completion_tokens"])
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            now = time.perf_counter()
            first = first or now
            last = now
            chunks += 1
    writer.close()
    end = time.perf_counter()
    tokens = usage if usage is not None else chunks
    return {
        "status": status,
        "tokens": tokens,
        "ttft": (first - start) if first else None,
        "tpot": ((last - first) / (tokens - 1)) if first and last and tokens > 1 else None,
        "latency": end - start,
    }


#: Request fields of the extra rows (``--extras``): the same load with these fields set.
EXTRAS: dict[str, dict[str, Any]] = {
    "logprobs": {"logprobs": 5},
    "penalties": {"frequency_penalty": 1.0, "presence_penalty": 0.5},
    "json": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "record",
                "schema": {
                    "type": "object",
                    "properties": {
                        "title": {"type": "string", "maxLength": 40},
                        "lines": {"type": "array", "items": {"type": "string", "maxLength": 60}},
                    },
                    "required": ["title", "lines"],
                },
            },
        }
    },
}
#: Which extras each peer takes (llama-cpp-python's completions take no ``response_format``).
EXTRAS_OF: dict[str, list[str]] = {"llama.cpp": ["logprobs", "penalties"]}


async def run_level(
    url: str,
    prompts: list[str],
    concurrency: int,
    args: argparse.Namespace,
    model: str,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``args.requests`` requests, Poisson arrivals, at most ``concurrency`` in flight, each
    with the fields of ``extra`` too."""
    rng = random.Random(concurrency)
    gate = asyncio.Semaphore(concurrency)
    results: list[dict[str, Any]] = []

    async def send(i: int) -> None:
        body = {
            "model": model,
            "prompt": prompts[i % len(prompts)],
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **(extra or {}),
        }
        async with gate:
            try:
                r = await asyncio.wait_for(one_request(url, body), REQUEST_TIMEOUT)
            except (TimeoutError, OSError, ValueError) as e:
                r = {"status": 0, "error": str(e)}
            results.append(r)

    start = time.perf_counter()
    tasks = []
    for i in range(args.requests):
        tasks.append(asyncio.create_task(send(i)))
        await asyncio.sleep(rng.expovariate(1.0 / args.gap) if args.gap > 0 else 0)
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    ok = [r for r in results if r["status"] == 200]

    def pct(key: str, q: float) -> float | None:
        vals = sorted(r[key] for r in ok if r.get(key) is not None)
        return vals[min(len(vals) - 1, int(q * len(vals)))] if vals else None

    tokens = sum(r["tokens"] for r in ok)
    tpots = [r["tpot"] for r in ok if r.get("tpot") is not None]
    return {
        "concurrency": concurrency,
        "requests": args.requests,
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "completion_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "ttft_p50_s": pct("ttft", 0.5),
        "ttft_p99_s": pct("ttft", 0.99),
        "tpot_mean_s": statistics.fmean(tpots) if tpots else None,
        "latency_p50_s": pct("latency", 0.5),
        "latency_p99_s": pct("latency", 0.99),
    }


def gguf_for(target: Path, outdir: Path) -> Path | None:
    """An f32 GGUF of ``target`` made by llama.cpp's converter (cached), or ``None``."""
    out = outdir / "target-f32.gguf"
    if out.is_file():
        return out
    r = subprocess.run(
        [sys.executable, str(ROOT / "benches/peers/convert.py"), str(target),
         "--outdir", str(outdir), "--outtype", "f32"],
        capture_output=True, text=True,
    )  # fmt: skip
    if r.returncode != 0 or not out.is_file():
        print(f"  llama.cpp: GGUF conversion failed, skipped: {r.stderr.strip()[-300:]}")
        return None
    return out


def servers_for(pair: Path, args: argparse.Namespace, workdir: Path) -> list[tuple[str, Any]]:
    """``(name, start)`` for every server that can run here; prints why one cannot."""
    base = [sys.executable, "-m", "dspark", "serve", "--port", "0",
            "--target", str(pair / "target"), "--drafter", str(pair / "drafter"),
            "--served-model-name", "m", "--max-running", "64"]  # fmt: skip
    if args.threads:
        base += ["--threads", str(args.threads)]
    pattern = r"listening on (http://\S+)"
    out: list[tuple[str, Any]] = [
        ("dspark", lambda: Proc(base, pattern)),
        ("dspark-scheduled", lambda: Proc([*base, "--verify", "scheduled"], pattern)),
        ("dspark-nodraft", lambda: Proc([*base, "--num-speculative-tokens", "0"], pattern)),
    ]
    peers_py = PEERS / "venv/bin/python"
    check = subprocess.run(
        [str(peers_py), "-c", "import llama_cpp.server, uvicorn"], capture_output=True
    ) if peers_py.exists() else None  # fmt: skip
    if check is None or check.returncode != 0:
        print(
            "  llama.cpp: llama-cpp-python[server] not installed (benches/peers/setup.sh): skipped"
        )
        return out
    gguf = gguf_for(pair / "target", workdir / pair.name)
    if gguf is None:
        return out

    def llama() -> Proc:
        port = free_port()
        cmd = [str(peers_py), "-m", "llama_cpp.server", "--model", str(gguf),
               "--host", "127.0.0.1", "--port", str(port), "--model_alias", "m",
               "--n_ctx", "4096", "--interrupt_requests", "False"]  # fmt: skip
        if args.threads:
            cmd += ["--n_threads", str(args.threads)]
        return Proc(cmd, r"Uvicorn running on", port)

    out.append(("llama.cpp", llama))
    return out


def report(label: str, c: int, row: dict[str, Any]) -> None:
    """One printed line of a row."""
    ttft = row["ttft_p50_s"] or float("nan")
    tpot = row["tpot_mean_s"] or float("nan")
    lat50 = row["latency_p50_s"] or float("nan")
    lat99 = row["latency_p99_s"] or float("nan")
    print(f"  {label:22s} C={c:3d} {row['tokens_per_s']:8.1f} tok/s  "
          f"TTFT p50 {ttft * 1e3:7.1f} ms  TPOT {tpot * 1e3:6.2f} ms  "
          f"latency p50/p99 {lat50:.2f}/{lat99:.2f} s  errors {row['errors']}")  # fmt: skip


def main() -> int:
    """Entry point; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-chars", type=int, default=400)
    p.add_argument("--gap", type=float, default=0.05, help="mean Poisson gap between arrivals (s)")
    p.add_argument("--threads", type=int, default=None, help="engine threads of every server")
    p.add_argument(
        "--memory-bound", type=Path, default=None, help="a make-example --memory-bound pair"
    )
    p.add_argument("--workdir", type=Path, default=Path("/var/tmp/dspark-bench-server"))
    p.add_argument("--out", type=Path, default=ROOT / "benches/results/server.json")
    p.add_argument(
        "--extras",
        nargs="*",
        choices=sorted(EXTRAS),
        default=sorted(EXTRAS),
        help="extra rows of dspark and llama.cpp with these request fields set",
    )
    args = p.parse_args()
    texts = json.loads((bundled_dir() / "heldout_prompts.json").read_text())["texts"]
    prompts = [str(t)[: args.prompt_chars] for t in texts]
    pairs = [("bundled", bundled_dir())]
    if args.memory_bound is not None:
        pairs.append(("memory-bound", args.memory_bound))
    else:
        print("memory-bound pair: not given (--memory-bound DIR): skipped")
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "pairs": {}}
    for pair_name, pair in pairs:
        print(f"== {pair_name} ({pair})")
        rows: dict[str, Any] = {}
        for name, start in servers_for(pair, args, args.workdir):
            try:
                server = start()
            except RuntimeError as e:
                print(f"  {name}: {e}")
                continue
            variants: list[tuple[str, dict[str, Any] | None]] = [(name, None)]
            if name in ("dspark", "llama.cpp"):
                takes = EXTRAS_OF.get(name, list(EXTRAS))
                variants += [(f"{name} +{e}", EXTRAS[e]) for e in args.extras if e in takes]
            elif name == "dspark-nodraft" and "json" in args.extras:
                # The grammar's own cost, apart from what JSON text does to acceptance.
                variants.append((f"{name} +json", EXTRAS["json"]))
            try:
                for label, extra in variants:
                    rows[label] = []
                    for c in args.concurrency:
                        row = asyncio.run(run_level(server.url, prompts, c, args, "m", extra))
                        rows[label].append(row)
                        report(label, c, row)
            finally:
                server.stop()
        results["pairs"][pair_name] = rows
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
