"""Speculator and drafter benchmarks (a plain script; every number is a same-run ratio).

1. End-to-end tokens/s of ``dspark.Speculator.generate`` vs target-only greedy decoding (own HF
   ``DynamicCache`` loop, and HF ``generate``) on the tiny random Qwen3 target of the tests. The
   drafters are random, so acceptance is near zero: this measures the speculator's overhead per
   round, not a speed-up (τ is printed next to it).
2. Drafter ``propose`` (stateless, greedy): candle ``dspark.Drafter`` vs ``dspark.TorchDrafter``
   on the same weights and inputs, for the tiny config and a Qwen3-0.6B-shaped stack (2 layers,
   hidden 1024, V = 151936, r = 256, random weights, embed / lm_head shared from the "target").

Run: ``python benches/bench_speculator.py [--quick] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tiny_models import greedy_reference, make_target, write_drafter

import dspark
from dspark._safetensors import save_file
from dspark.example import _drafter_head, _qwen3_layer


def best_of(fn: Callable[[], Any], repeats: int) -> float:
    """Median of ``repeats`` timed calls after one warm-up (seconds)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_end_to_end(tmp: Path, new_tokens: int, repeats: int) -> None:
    target = make_target(0)
    prompts = [[(7 * i + j) % 250 for j in range(6 + i)] for i in range(4)]
    drafters: dict[str, Any] = {"TorchDrafter": dspark.TorchDrafter}
    if hasattr(dspark, "Drafter"):
        drafters["Drafter (candle)"] = dspark.Drafter
    path = write_drafter(tmp / "e2e", target, "own")

    def target_only() -> None:
        for p in prompts:
            greedy_reference(target, p, new_tokens)

    def hf_generate() -> None:
        for p in prompts:
            target.generate(
                torch.tensor([p]),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )

    base = best_of(target_only, repeats)
    total = len(prompts) * new_tokens
    print(f"\n## end-to-end, tiny Qwen3 target, {len(prompts)} prompts x {new_tokens} tokens")
    print(f"{'decoder':<34}{'tok/s':>10}{'vs target-only':>16}{'tau':>7}")
    print(f"{'target-only loop (B=1 each)':<34}{total / base:>10.1f}{1.0:>16.2f}{'-':>7}")
    t = best_of(hf_generate, repeats)
    print(f"{'HF generate (B=1 each)':<34}{total / t:>10.1f}{base / t:>16.2f}{'-':>7}")
    for name, cls in drafters.items():
        drafter = cls.from_pretrained(path, target)
        for batched in (False, True):
            spec = dspark.Speculator(target, drafter)
            stats: list[Any] = []

            def run(spec: Any = spec, batched: bool = batched, stats: list[Any] = stats) -> None:
                if batched:
                    stats.append(spec.generate(prompts, new_tokens).stats)
                else:
                    for p in prompts:
                        stats.append(spec.generate([p], new_tokens).stats)

            t = best_of(run, repeats)
            tau = statistics.mean(s.acceptance_length for s in stats)
            label = f"Speculator + {name} ({'B=4' if batched else 'B=1'})"
            print(f"{label:<34}{total / t:>10.1f}{base / t:>16.2f}{tau:>7.2f}")


def write_stack(
    root: Path,
    *,
    hidden: int,
    heads: int,
    kv: int,
    head_dim: int,
    inter: int,
    layers: int,
    vocab: int,
    rank: int,
    n_ctx: int,
    seed: int = 0,
) -> dict[str, Any]:
    """A shared-vocab drafter checkpoint of the given shape (f16 on disk); returns the target."""
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float16)

    t = _drafter_head(w, hidden=hidden, ctx_width=n_ctx * hidden, v_in=vocab, v_d=vocab, rank=rank)
    for i in range(layers):
        t.update(
            _qwen3_layer(
                f"layers.{i}.",
                w,
                ones,
                hidden=hidden,
                heads=heads,
                kv_heads=kv,
                head_dim=head_dim,
                intermediate=inter,
            )
        )
    target_cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": 28,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e6,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    }
    cfg = {
        **target_cfg,
        "architectures": ["Qwen3DSparkModel"],
        "num_hidden_layers": layers,
        "num_target_layers": 28,
        "block_size": 7,
        "mask_token_id": vocab - 1,
        "target_layer_ids": [1, 9, 17, 25, 26][:n_ctx],
        "markov_rank": rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "layer_types": ["full_attention"] * layers,
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(__import__("json").dumps(cfg))
    save_file(t, root / "model.safetensors")
    gen = torch.Generator().manual_seed(seed)
    return {
        "config": target_cfg,
        "embed_tokens": torch.randn(vocab, hidden, generator=gen) * 0.02,
        "lm_head": torch.randn(vocab, hidden, generator=gen) * 0.02,
    }


def bench_propose(tmp: Path, quick: bool, repeats: int) -> None:
    shapes = {
        "tiny (H=64, V=256, r=8, 2 layers)": dict(
            hidden=64, heads=4, kv=2, head_dim=16, inter=128, layers=2, vocab=256, rank=8
        )
    }
    if not quick:
        shapes["Qwen3-0.6B-shaped (H=1024, V=151936, r=256, 2 layers)"] = dict(
            hidden=1024, heads=16, kv=8, head_dim=128, inter=3072, layers=2, vocab=151936, rank=256
        )
    print("\n## drafter propose (stateless, greedy, K=7): candle vs torch, same weights and inputs")
    print(f"{'shape':<56}{'B':>3}{'T':>5}{'torch ms':>10}{'candle ms':>11}{'torch/candle':>14}")
    for label, shape in shapes.items():
        n_ctx = 3
        target = write_stack(tmp / label.split()[0], n_ctx=n_ctx, **shape)
        path = tmp / label.split()[0]
        torch_d = dspark.TorchDrafter.from_pretrained(path, target)
        candle_d = (
            dspark.Drafter.from_pretrained(path, target) if hasattr(dspark, "Drafter") else None
        )
        for b, t in [(1, 64), (8, 64)]:
            ctx = torch.randn(
                b, t, n_ctx * shape["hidden"], generator=torch.Generator().manual_seed(1)
            )
            anchors = torch.arange(b) + 1
            tt = best_of(lambda ctx=ctx, a=anchors, d=torch_d: d.propose(ctx, a), repeats)
            tc = float("nan")
            if candle_d is not None:
                tc = best_of(lambda ctx=ctx, a=anchors, d=candle_d: d.propose(ctx, a), repeats)
            print(f"{label:<56}{b:>3}{t:>5}{tt * 1e3:>10.2f}{tc * 1e3:>11.2f}{tt / tc:>14.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes only")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads")
    with tempfile.TemporaryDirectory() as tmp:
        bench_end_to_end(Path(tmp), args.new_tokens, args.repeats)
        bench_propose(Path(tmp), args.quick, args.repeats)


if __name__ == "__main__":
    main()
