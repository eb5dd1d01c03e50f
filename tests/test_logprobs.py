"""Log-probabilities on the bundled pair: the engine's equal the target's own
(``NativeTarget.logits`` on the same prefix, to 1e-4) at every position, whatever the rounds
were, greedy (the model's softmax) and sampled (after temperature, top-k and top-p); sampled
tokens follow the distribution the log-probabilities describe (chi-square); and ``dspark serve``
hands them to the official ``openai`` client, streamed and not."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import dspark

PROMPTS = [[(13 * i + 5 * j + 7) % 900 + 3 for j in range(3 + (7 * i) % 11)] for i in range(5)]
TOP = 5


def reference(row: np.ndarray, temperature: float, top_k: int | None, top_p: float) -> np.ndarray:
    """Log-probabilities of one logits row under the sampling (``-inf`` outside the kept set):
    greedy reports the model's softmax; ties order by lower id."""
    x = row.astype(np.float64)
    if temperature == 0.0:
        return x - x.max() - np.log(np.exp(x - x.max()).sum())
    z = (x - x.max()) / temperature
    order = sorted(range(len(x)), key=lambda v: (-x[v], v))
    if top_k is not None:
        order = order[:top_k]
    w = np.exp(z[order])
    keep = len(order)
    if top_p < 1.0:
        cum = np.cumsum(w)
        keep = int(np.searchsorted(cum, top_p * w.sum())) + 1
    kept = order[:keep]
    out = np.full(len(x), -np.inf)
    out[kept] = z[kept] - np.log(np.exp(z[kept]).sum())
    return out


def check_entries(
    target: Any,
    prompt: Sequence[int],
    tokens: Sequence[int],
    entries: Sequence[tuple[int, float, list[tuple[int, float]]]],
    sampling: dict[str, Any],
) -> None:
    assert len(entries) == len(tokens)
    logits = target.logits(list(prompt) + list(tokens))
    t = sampling.get("temperature", 0.0)
    for n, (tok, lp, top) in enumerate(entries):
        assert tok == tokens[n]
        ref = reference(
            logits[len(prompt) - 1 + n], t, sampling.get("top_k"), sampling.get("top_p", 1.0)
        )
        assert math.isfinite(lp)
        assert abs(lp - ref[tok]) < 1e-4, (n, lp, ref[tok])
        finite = np.sort(ref[np.isfinite(ref)])[::-1]
        assert len(top) == min(TOP, len(finite))
        for rank, (v, vlp) in enumerate(top):
            assert abs(vlp - ref[v]) < 1e-4
            # the listed tokens are the likeliest (to rounding)
            assert ref[v] >= finite[rank] - 1e-4


@pytest.mark.parametrize("verify", ["full", "scheduled"])
def test_engine_logprobs_are_the_targets(bundled_pair: tuple[Any, Any], verify: str) -> None:
    target, drafter = bundled_pair
    eng = dspark.Engine(target, drafter, verify=verify)
    samplings: list[dict[str, Any]] = [
        {},
        {"temperature": 0.8, "seed": 3},
        {"temperature": 1.2, "top_k": 40, "seed": 4},
        {"temperature": 0.7, "top_p": 0.9, "seed": 5},
        {"temperature": 0.0},
    ]
    ids = [
        eng.add_request(p, 24, logprobs=TOP, **s) for p, s in zip(PROMPTS, samplings, strict=True)
    ]
    tokens: dict[int, list[int]] = {i: [] for i in ids}
    entries: dict[int, list[Any]] = {i: [] for i in ids}
    while eng.has_work():
        for u in eng.step():
            tokens[u.request_id].extend(u.new_tokens)
            entries[u.request_id].extend(u.logprobs)
    for i, p, s in zip(ids, PROMPTS, samplings, strict=True):
        assert len(tokens[i]) == 24
        check_entries(target, p, tokens[i], entries[i], s)


def test_no_logprobs_unless_asked_and_bad_counts_are_typed(bundled_pair: tuple[Any, Any]) -> None:
    target, drafter = bundled_pair
    eng = dspark.Engine(target, drafter)
    eng.add_request(PROMPTS[0], 4)
    assert all(u.logprobs == [] for u in eng.step())
    for bad in [21, -1, 1.5]:
        with pytest.raises(dspark.InputError) as e:
            eng.add_request(PROMPTS[0], 4, logprobs=bad)  # type: ignore[arg-type]
        assert e.value.code == "invalid-argument" and "logprobs" in str(e.value)


def test_sampled_first_tokens_follow_their_logprobs(bundled_pair: tuple[Any, Any]) -> None:
    """Many seeds, one prompt: the first generated token's frequencies match exp(logprob) of
    the alternatives the engine reports (chi-square, bins of expected count >= 5)."""
    target, drafter = bundled_pair
    eng = dspark.Engine(target, drafter, verify="full")
    n = 600
    ids = [
        eng.add_request(PROMPTS[1], 1, temperature=1.0, top_k=20, seed=s, logprobs=20)
        for s in range(n)
    ]
    first: dict[int, int] = {}
    probs: dict[int, float] = {}
    while eng.has_work():
        for u in eng.step():
            if u.new_tokens:
                first[u.request_id] = u.new_tokens[0]
                for v, lp in u.logprobs[0][2]:
                    probs[v] = math.exp(lp)
    counts = Counter(first[i] for i in ids)
    assert abs(sum(probs.values()) - 1.0) < 1e-4  # top-20 of a top-k 20 row: all of it
    bins = [v for v, p in probs.items() if p * n >= 5]
    rest = 1.0 - sum(probs[v] for v in bins)
    observed = [counts[v] for v in bins] + [n - sum(counts[v] for v in bins)]
    expected = [probs[v] * n for v in bins] + [rest * n]
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True) if e > 0)
    dof = len([e for e in expected if e > 0]) - 1
    # p = 0.001 upper tail, Wilson-Hilferty
    z = 3.09
    crit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert stat < crit, (stat, crit, dof)


def test_openai_client_logprobs_whole_and_streamed(
    bundled_pair: tuple[Any, Any], bundled_server: Any
) -> None:
    openai = pytest.importorskip("openai")
    target, drafter = bundled_pair
    client = openai.OpenAI(base_url=bundled_server.url + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    prompt = PROMPTS[2]
    want = dspark.Speculator(target, drafter).generate([prompt], 12, stop_token_ids=[0])
    tokens = list(want.tokens[0])
    logits = target.logits(prompt + tokens)
    whole = client.completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0, logprobs=3
    )
    lp = whole.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert len(lp.token_logprobs) == len(tokens)
    for n, (tok, v) in enumerate(zip(tokens, lp.token_logprobs, strict=True)):
        ref = reference(logits[len(prompt) - 1 + n], 0.0, None, 1.0)
        assert abs(v - ref[tok]) < 1e-4
        assert len(lp.top_logprobs[n]) <= 3
    assert "".join(lp.tokens or []) == whole.choices[0].text
    parts = client.completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0, logprobs=3, stream=True
    )
    streamed: list[float] = []
    for p in parts:
        if p.choices and p.choices[0].logprobs is not None:
            streamed.extend(p.choices[0].logprobs.token_logprobs or [])
    assert streamed == lp.token_logprobs

    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "def add(a, b):"}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0.0 for e in content)
    assert all(e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in content)
    joined = b"".join(bytes(e.bytes or []) for e in content).decode()
    assert joined == chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "x"}],
            logprobs=True,
            top_logprobs=21,
        )
