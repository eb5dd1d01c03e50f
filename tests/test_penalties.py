"""Penalties and logit bias on the bundled pair: speculative greedy output equals a target-only
greedy loop under the same penalties (``NativeTarget.logits`` penalized in numpy), under full
and scheduled verification; ``dspark serve`` applies them for the ``openai`` client; bad values
are typed errors naming the field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

import dspark
from dspark.bundled import bundled_dir

PROMPTS = [[(11 * i + 3 * j + 5) % 900 + 3 for j in range(4 + (5 * i) % 9)] for i in range(4)]
NEW = 24


def penalize(
    row: np.ndarray,
    prompt: Sequence[int],
    generated: Sequence[int],
    presence: float = 0.0,
    frequency: float = 0.0,
    repetition: float = 1.0,
    bias: Mapping[int, float] | None = None,
) -> np.ndarray:
    """vLLM's repetition rule over prompt and generated tokens, OpenAI's presence and frequency
    over the generated ones, then the bias."""
    x = row.astype(np.float32).copy()
    counts = np.bincount(np.asarray(generated, dtype=np.int64), minlength=len(x))[: len(x)]
    seen = counts > 0
    seen[list(prompt)] = True
    if repetition != 1.0:
        x[seen] = np.where(x[seen] > 0, x[seen] / repetition, x[seen] * repetition)
    x -= (presence * (counts > 0) + frequency * counts).astype(np.float32)
    for v, b in (bias or {}).items():
        x[v] += b
    return x


def target_only(target: Any, prompt: Sequence[int], new: int, **pen: Any) -> list[int]:
    out: list[int] = []
    for _ in range(new):
        row = target.logits(list(prompt) + out)[-1]
        out.append(int(np.argmax(penalize(row, prompt, out, **pen))))
    return out


CASES: list[dict[str, Any]] = [
    {"frequency": 2.0},
    {"presence": 1.5, "repetition": 1.3},
    {"frequency": 0.5, "bias": {17: 4.0, 5: -100.0}},
]


@pytest.mark.parametrize("verify", ["full", "scheduled"])
def test_greedy_under_penalties_equals_the_penalized_target(
    bundled_pair: tuple[Any, Any], verify: str
) -> None:
    target, drafter = bundled_pair
    eng = dspark.Engine(target, drafter, verify=verify)
    ids = []
    for prompt, pen in zip(PROMPTS, [*CASES, {}], strict=True):
        ids.append(
            eng.add_request(
                prompt,
                NEW,
                presence_penalty=pen.get("presence", 0.0),
                frequency_penalty=pen.get("frequency", 0.0),
                repetition_penalty=pen.get("repetition", 1.0),
                logit_bias=pen.get("bias"),
            )
        )
    out = eng.run()
    for rid, prompt, pen in zip(ids, PROMPTS, [*CASES, {}], strict=True):
        assert out[rid] == target_only(target, prompt, NEW, **pen), pen
    # A frequency penalty of 2 changes what the model repeats.
    plain = target_only(target, PROMPTS[0], NEW)
    assert out[ids[0]] != plain


def test_the_speculator_applies_them_to_every_request(bundled_pair: tuple[Any, Any]) -> None:
    target, drafter = bundled_pair
    pen = CASES[2]
    spec = dspark.Speculator(
        target, drafter, frequency_penalty=pen["frequency"], logit_bias=pen["bias"]
    )
    want = [target_only(target, p, 16, **pen) for p in PROMPTS[:2]]
    assert spec.generate(PROMPTS[:2], 16).tokens == want
    assert spec.generate_target_only(PROMPTS[:2], 16).tokens == want
    with pytest.raises(dspark.InputError) as e:
        dspark.Speculator(target, drafter, presence_penalty=3.0)
    assert "presence_penalty" in str(e.value)


def test_bad_penalties_are_typed_errors(bundled_pair: tuple[Any, Any]) -> None:
    target, drafter = bundled_pair
    eng = dspark.Engine(target, drafter)
    for kw, code in [
        ({"presence_penalty": 2.5}, "invalid-argument"),
        ({"frequency_penalty": float("nan")}, "invalid-argument"),
        ({"repetition_penalty": 0.0}, "invalid-argument"),
        ({"logit_bias": {target.vocab_size: 1.0}}, "token-out-of-range"),
        ({"logit_bias": {1: 101.0}}, "invalid-argument"),
        ({"logit_bias": [1, 2]}, "invalid-argument"),
    ]:
        with pytest.raises(dspark.InputError) as e:
            eng.add_request(PROMPTS[0], 4, **kw)
        assert e.value.code == code, kw
        assert next(iter(kw)) in str(e.value), (kw, str(e.value))


def test_openai_client_penalties(bundled_pair: tuple[Any, Any], bundled_server: Any) -> None:
    openai = pytest.importorskip("openai")
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(bundled_dir() / "target" / "tokenizer.json"))
    target, drafter = bundled_pair
    client = openai.OpenAI(base_url=bundled_server.url + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    prompt = PROMPTS[1]
    eng = dspark.Engine(target, drafter)
    rid = eng.add_request(
        prompt, 16, frequency_penalty=2.0, logit_bias={17: 3.0}, stop_token_ids=[0]
    )
    want = eng.run()[rid]
    got = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=16,
        temperature=0,
        frequency_penalty=2.0,
        logit_bias={"17": 3.0},
    )
    assert got.choices[0].text == tok.decode(want, skip_special_tokens=True)
    for bad in [{"frequency_penalty": 3.0}, {"logit_bias": {"999999": 1}}]:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=model, prompt="x", max_tokens=2, **bad)
        assert e.value.body["param"] == next(iter(bad)), e.value.body  # type: ignore[index]
        assert next(iter(bad)) in str(e.value)
