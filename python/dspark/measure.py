"""What the demo and the benchmarks time: the target-only baseline and the target's steps/s.

* :func:`target_only`: plain autoregressive decoding of an HF causal LM, one KV-cached forward
  per token: the baseline every speedup is a ratio against;
* :func:`steps_per_second`: the target's measured verify throughput per forward size, the table
  ``verify="scheduled"`` prices rounds with;
* :func:`speculative`: one :meth:`dspark.Speculator.generate` call on one prompt, streaming.

Needs ``torch`` (imported on call).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from dspark._hf_cache import cache_kwarg, output_cache

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from dspark.speculator import SpeculationStats, Speculator

__all__ = ["speculative", "steps_per_second", "target_only"]


def target_only(
    model: PreTrainedModel,
    prompt: list[int],
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_p: float | None = None,
    seed: int = 0,
    stop: int | None = None,
    on_token: Callable[[], None] | None = None,
) -> tuple[list[int], float]:
    """Plain autoregressive decoding, one KV-cached forward per token; (tokens, seconds).

    ``on_token``, if given, is called after every token (progress); its time is not counted.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)

    def pick(logits: torch.Tensor) -> int:
        if temperature < 1e-5:  # dspark.GREEDY_BELOW: greedy, as every kernel path
            return int(logits.argmax())
        probs = torch.softmax(logits.double() / temperature, dim=-1)
        if top_p is not None and top_p < 1.0:
            sp, idx = probs.sort(descending=True)
            keep = sp.cumsum(0) - sp < top_p
            probs = torch.zeros_like(probs).scatter(0, idx[keep], sp[keep])
        return int(torch.multinomial(probs, 1, generator=gen))

    out: list[int] = []
    kw = cache_kwarg(model)
    outside = 0.0
    t0 = time.perf_counter()
    with torch.inference_mode():
        res = model(input_ids=torch.tensor([prompt]), use_cache=True)
        while True:
            tok = pick(res.logits[0, -1])
            out.append(tok)
            if on_token is not None:
                t = time.perf_counter()
                on_token()
                outside += time.perf_counter() - t
            if len(out) >= max_new_tokens or tok == stop:
                break
            res = model(input_ids=torch.tensor([[tok]]), use_cache=True, **{kw: output_cache(res)})
    return out, time.perf_counter() - t0 - outside


def steps_per_second(
    model: PreTrainedModel, prompt: list[int], max_tokens: int, reps: int = 3
) -> list[tuple[int, float]]:
    """Measured target verify throughput: ``(tokens in the forward, forwards per second)``.

    One entry per forward size ``1..max_tokens`` after ``prompt`` (the fastest of ``reps``).
    """
    import torch

    table = []
    with torch.inference_mode():
        base = output_cache(model(input_ids=torch.tensor([prompt]), use_cache=True))
        kw = cache_kwarg(model)
        for n in range(1, max_tokens + 1):
            ids = torch.tensor([prompt[-1:] * n])
            best = float("inf")
            for _ in range(reps):
                cache = copy.deepcopy(base)
                t0 = time.perf_counter()
                model(input_ids=ids, use_cache=True, **{kw: cache})
                best = min(best, time.perf_counter() - t0)
            table.append((n, 1.0 / best))
    return table


def speculative(
    sp: Speculator,
    prompt: list[int],
    max_new_tokens: int,
    stop: int | None,
    emit: Callable[[list[int]], object],
) -> tuple[list[int], SpeculationStats, float]:
    """Run ``sp`` on one prompt, calling ``emit(new_tokens)`` after every round.

    Returns (tokens, stats, seconds spent in decoding, excluding ``emit``).
    """
    stops = [] if stop is None else [stop]
    res = sp.generate([prompt], max_new_tokens, stops, on_round=lambda new: emit(new[0]))
    return res.tokens[0], res.stats, res.stats.total_seconds
