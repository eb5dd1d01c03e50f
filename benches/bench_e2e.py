"""End-to-end benchmark on the bundled pair and held-out prompts (every number from one run).

Rows, each over the same held-out standard-library prompts (files the pair never trained on):
target-only greedy decoding (one KV-cached forward per token, the baseline of every ratio); HF
``generate`` greedy; ``dspark.Speculator`` greedy and T = 0.7, full verification and the paper's
confidence scheduler (steps/s table measured here); HF transformers' assisted generation with
prompt-lookup drafting (``prompt_lookup_num_tokens``, its draft-model-free path), with a small
draft model (``assistant_model``: ``--assistant DIR``, else ``<model dir>/assistant`` when it
exists, trained by ``python -m dspark.train OUT --stage assistant``), and its DFlash path
(``speculation_type="dflash"``) running the bundled drafter's backbone without the Markov head
(:func:`dspark.reference.hf_dflash.to_hf_dflash`). Reports τ (tokens per target forward; for the HF
assisted rows counted from the target's forward calls after prefill), tokens/s, the ratio to
target-only, and writes a PNG of acceptance by position when matplotlib is installed.

    nice -n 19 python benches/bench_e2e.py [--prompts 8] [--new-tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dspark.bundled import load_pair
from dspark.measure import speculative, steps_per_second, target_only
from dspark.reference.hf_dflash import to_hf_dflash
from dspark.speculator import Speculator


def held_out_prompts(root: Path, tok: Any, n: int, prompt_tokens: int) -> list[list[int]]:
    """The first ``prompt_tokens`` tokens of the first ``n`` held-out files."""
    data = json.loads((root / "heldout_prompts.json").read_text())
    out = []
    for text in data["texts"][:n]:
        ids = tok.encode(text).ids[:prompt_tokens]
        if ids:
            out.append(ids)
    return out


def run_target_only(pair: Any, prompts: list[list[int]], n: int) -> dict[str, Any]:
    toks, secs = 0, 0.0
    outs = []
    for p in prompts:
        o, s = target_only(pair.target, p, n)
        outs.append(o)
        toks += len(o)
        secs += s
    return {"tokens": toks, "seconds": secs, "tau": 1.0, "outputs": outs}


def run_hf(pair: Any, prompts: list[list[int]], n: int, **kw: Any) -> dict[str, Any]:
    toks, secs, outs, rounds = 0, 0.0, [], 0
    calls = [0]
    hook = pair.target.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    for p in prompts:
        calls[0] = 0
        ids = torch.tensor([p])
        t0 = time.perf_counter()
        with torch.inference_mode():
            res = pair.target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                do_sample=False,
                min_new_tokens=n,
                pad_token_id=pair.eos_id,
                **kw,
            )
        secs += time.perf_counter() - t0
        o = res[0, len(p) :].tolist()
        outs.append(o)
        toks += len(o)
        rounds += calls[0] - 1  # the prefill forward commits the first token
    hook.remove()
    # Assisted rows: tokens after the first per verification forward (as dspark's τ counts).
    tau = (toks - len(prompts)) / rounds if kw and rounds > 0 else float("nan")
    return {"tokens": toks, "seconds": secs, "tau": tau, "outputs": outs}


def run_spec(pair: Any, prompts: list[list[int]], n: int, **kw: Any) -> dict[str, Any]:
    sp = Speculator(pair.target, pair.drafter, seed=0, **kw)
    toks, secs, committed, rounds = 0, 0.0, 0, 0
    att = [0] * pair.drafter.block_size
    acc = [0] * pair.drafter.block_size
    outs = []
    for p in prompts:
        o, st, s = speculative(sp, p, n, None, lambda _new: None)
        outs.append(o)
        toks += len(o)
        secs += s
        committed += st.committed_tokens
        rounds += st.request_rounds
        for pos, (a, b) in enumerate(zip(st.position_attempts, st.position_accepts, strict=True)):
            att[pos] += a
            acc[pos] += b
    return {
        "tokens": toks,
        "seconds": secs,
        "tau": committed / rounds if rounds else float("nan"),
        "per_position": [a / b if b else float("nan") for a, b in zip(acc, att, strict=True)],
        "outputs": outs,
    }


def plot(rows: dict[str, dict[str, Any]], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot"
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in rows.items():
        if "per_position" in r:
            ax.plot(range(1, len(r["per_position"]) + 1), r["per_position"], marker="o", label=name)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance (given earlier positions accepted)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return f"plot: {path}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model-dir", type=Path, default=None)
    ap.add_argument(
        "--assistant",
        type=Path,
        default=None,
        help="HF draft model for assisted gen (default: <model dir>/assistant if present)",
    )
    ap.add_argument("--out", type=Path, default=Path("bench_e2e"), help="output prefix")
    args = ap.parse_args()
    pair = load_pair(args.model_dir, args.threads)
    from dspark.bundled import bundled_dir

    root = args.model_dir or bundled_dir()
    prompts = held_out_prompts(root, pair.tokenizer, args.prompts, args.prompt_tokens)
    n = args.new_tokens
    k = pair.drafter.block_size
    table = steps_per_second(pair.target, prompts[0], k + 1)
    target_only(pair.target, prompts[0], 4)  # warm-up
    rows: dict[str, dict[str, Any]] = {}
    rows["target-only greedy"] = run_target_only(pair, prompts, n)
    rows["HF generate greedy"] = run_hf(pair, prompts, n)
    rows["HF assisted, prompt lookup"] = run_hf(pair, prompts, n, prompt_lookup_num_tokens=k)
    asst_dir = args.assistant or (root / "assistant")
    if (asst_dir / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        asst = AutoModelForCausalLM.from_pretrained(asst_dir).eval()
        rows["HF assisted, draft model"] = run_hf(pair, prompts, n, assistant_model=asst)
    else:
        print(
            f"HF assisted, draft model: skipped, no draft model at {asst_dir} (pass --assistant "
            "DIR or train one: python -m dspark.train OUT --stage assistant)"
        )
    dflash = to_hf_dflash(root / "drafter", pair.target)
    rows["HF DFlash path (dspark backbone, no Markov)"] = run_hf(
        pair, prompts, n, assistant_model=dflash, speculation_type="dflash"
    )
    rows["dspark greedy, full"] = run_spec(pair, prompts, n)
    rows["dspark greedy, scheduled"] = run_spec(
        pair, prompts, n, verify="scheduled", steps_per_second=table
    )
    rows["dspark T=0.7, full"] = run_spec(pair, prompts, n, temperature=0.7)
    rows["dspark T=0.7, scheduled"] = run_spec(
        pair, prompts, n, temperature=0.7, verify="scheduled", steps_per_second=table
    )
    base = rows["target-only greedy"]
    base_tps = base["tokens"] / base["seconds"]
    print(
        f"{len(prompts)} held-out prompts x {n} new tokens, block size {k}, "
        f"{torch.get_num_threads()} torch threads"
    )
    print(f"{'row':44s} {'tau':>6s} {'tok/s':>8s} {'vs target-only':>15s}  greedy==target")
    summary = {}
    for name, r in rows.items():
        tps = r["tokens"] / r["seconds"]
        same = "-" if "T=0.7" in name else str(r["outputs"] == base["outputs"])
        tau = "-" if math.isnan(r["tau"]) else f"{r['tau']:.2f}"
        print(f"{name:44s} {tau:>6s} {tps:8.1f} {tps / base_tps:14.2f}x  {same}")
        summary[name] = {
            "tau": None if math.isnan(r["tau"]) else r["tau"],
            "tokens_per_second": tps,
            "ratio_vs_target_only": tps / base_tps,
            "per_position": r.get("per_position"),
            "greedy_matches_target": None if same == "-" else same == "True",
        }
    for name, r in rows.items():
        if "per_position" in r:
            print(f"{name:44s} per position: " + " ".join(f"{a:.2f}" for a in r["per_position"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(summary, indent=1))
    print(plot({k_: v for k_, v in rows.items()}, Path(f"{args.out}_acceptance.png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
