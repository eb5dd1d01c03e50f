"""Structured output from ``dspark serve`` on the bundled pair, for the ``openai`` client:
schema-constrained answers always parse and validate (sampled, many seeds), greedy output under
a grammar is what target-only decoding gives under the same grammar, and regexes and Lark
grammars match whole."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {
            "type": "array",
            "items": {"enum": ["red", "green", "blue"]},
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}


def valid(doc: Any) -> bool:
    """``doc`` against ``SCHEMA`` (written out: no validator dependency)."""
    return (
        isinstance(doc, dict)
        and set(doc) == {"name", "age", "tags"}
        and isinstance(doc["name"], str)
        and len(doc["name"]) <= 12
        and isinstance(doc["age"], int)
        and not isinstance(doc["age"], bool)
        and 0 <= doc["age"] <= 120
        and isinstance(doc["tags"], list)
        and len(doc["tags"]) <= 3
        and all(t in ("red", "green", "blue") for t in doc["tags"])
    )


@pytest.fixture(scope="module")
def client(bundled_server: Any) -> Any:
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=bundled_server.url + "/v1", api_key="none", max_retries=0)


def test_schema_answers_always_parse_and_validate(client: Any) -> None:
    model = client.models.list().data[0].id
    bad = []
    for seed in range(100):
        r = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"a person, please ({seed})"}],
            max_tokens=160,
            temperature=1.0,
            seed=seed,
            response_format=FORMAT,
        )
        text = r.choices[0].message.content or ""
        try:
            ok = valid(json.loads(text)) and r.choices[0].finish_reason == "stop"
        except json.JSONDecodeError:
            ok = False
        if not ok:
            bad.append((seed, r.choices[0].finish_reason, text))
    assert not bad, bad[:3]


def test_greedy_under_a_grammar_is_target_only_greedy(client: Any) -> None:
    model = client.models.list().data[0].id
    for fmt in [FORMAT, {"type": "json_object"}, {"type": "regex", "regex": "(ab|cd)+e"}]:
        ask = {"model": model, "prompt": "def main(", "max_tokens": 48, "temperature": 0}
        spec = client.completions.create(extra_body={"response_format": fmt}, **ask)
        plain = client.completions.create(
            extra_body={"response_format": fmt, "max_drafts": 0}, **ask
        )
        assert spec.choices[0].text == plain.choices[0].text, fmt
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            extra_body={"response_format": FORMAT}, stream=True, **ask
        )
        if c.choices
    )
    whole = client.completions.create(extra_body={"response_format": FORMAT}, **ask)
    assert streamed == whole.choices[0].text


def test_regexes_match_whole_and_drafting_goes_on(client: Any) -> None:
    model = client.models.list().data[0].id

    def complete(prompt: str, response_format: dict[str, str], **options: Any) -> Any:
        return client.completions.create(
            model=model,
            prompt=prompt,
            extra_body={"response_format": response_format},
            **options,
        )

    rx = "[0-9]{3}-[0-9]{4}"
    r = complete(
        "call me at ", {"type": "regex", "regex": rx}, max_tokens=20, temperature=0.7, seed=3
    )
    assert re.fullmatch(rx, r.choices[0].text), r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    # A grammar the drafter can follow: output stays in it (that its drafts are verified is
    # the engine tests' check: the server's scheduler may choose plain rounds here).
    lines = r"(import [a-z]{1,8}\n){1,3}"
    g = complete("import os\n", {"type": "regex", "regex": lines}, max_tokens=60, temperature=0)
    assert re.fullmatch(lines, g.choices[0].text), g.choices[0].text
    lark = 'start: "yes" | "no" | "maybe"'
    y = complete(
        "Is it? ", {"type": "grammar", "grammar": lark}, max_tokens=8, temperature=1.0, seed=1
    )
    assert y.choices[0].text in ("yes", "no", "maybe")


def test_the_python_engine_takes_a_response_format() -> None:
    import dspark
    from dspark.bundled import bundled_dir

    root = bundled_dir()
    target = dspark.NativeTarget.from_pretrained(root / "target")
    drafter = dspark.Drafter.from_pretrained(root / "drafter", target)
    eng = dspark.Engine(target, drafter, verify="full")
    fmt = {"type": "regex", "regex": "[a-z]{2,5}( [a-z]{2,5}){2}"}
    rid = eng.add_request(
        [5, 6, 7], 40, temperature=0.8, seed=2, stop_token_ids=[0], response_format=fmt
    )
    free = eng.add_request([5, 6, 7], 8)
    out = eng.run()
    tok = pytest.importorskip("tokenizers").Tokenizer.from_file(
        str(root / "target" / "tokenizer.json")
    )
    assert out[rid][-1] == 0, "the completed grammar allows the end-of-sequence id alone"
    text = tok.decode(out[rid][:-1], skip_special_tokens=True)
    assert re.fullmatch(fmt["regex"], text), text
    assert len(out[free]) == 8
    with pytest.raises(dspark.InputError) as e:
        eng.add_request([5], 4, response_format={"type": "regex", "regex": "a("})
    assert e.value.code == "invalid-argument" and "response_format" in str(e.value)


def test_sampled_tokens_follow_the_target_restricted_to_the_grammar(
    assert_distribution: Any,
) -> None:
    """Sampled under a regex while drafting inside it (each drafted slot drawn from the
    drafter's distribution restricted to the grammar): every token sequence of the language
    comes at its probability under the target restricted to the grammar (chi-square)."""
    import numpy as np

    import dspark
    from dspark.bundled import bundled_dir

    root = bundled_dir()
    tok = pytest.importorskip("tokenizers").Tokenizer.from_file(
        str(root / "target" / "tokenizer.json")
    )
    target = dspark.NativeTarget.from_pretrained(root / "target")
    drafter = dspark.Drafter.from_pretrained(root / "drafter", target)
    # The language: three letters of {a, b}, then the end-of-sequence id 0. Its tokens are the
    # vocabulary's a/b strings (the bundled vocabulary has `a`, `b` and `ab`).
    pieces = {
        t: tok.decode([t]) for t in range(target.vocab_size) if tok.decode([t]).strip("ab") == ""
    }
    pieces = {t: s for t, s in pieces.items() if s}
    assert len(pieces) >= 3, pieces
    prompt = [5, 6, 7, 8]
    # Every token sequence of the language with its probability under the restricted target.
    seqs: list[tuple[list[int], float]] = []

    def walk(ids: list[int], text: str, prob: float) -> None:
        if len(text) == 3:
            seqs.append(([*ids, 0], prob))
            return
        allowed = [t for t, s in pieces.items() if len(text) + len(s) <= 3]
        row = np.asarray(target.logits(prompt + ids))[-1].astype(np.float64)[allowed]
        p = np.exp(row - row.max())
        p /= p.sum()
        for t, q in zip(allowed, p, strict=True):
            walk([*ids, t], text + pieces[t], prob * float(q))

    walk([], "", 1.0)
    assert abs(sum(p for _, p in seqs) - 1.0) < 1e-9
    index = {tuple(s): i for i, (s, _) in enumerate(seqs)}
    eng = dspark.Engine(target, drafter, verify="full", max_running=64)
    fmt = {"type": "regex", "regex": "[ab]{3}"}
    ids = [
        eng.add_request(prompt, 6, temperature=1.0, seed=s, stop_token_ids=[0], response_format=fmt)
        for s in range(800)
    ]
    out = eng.run()
    samples = np.array([index[tuple(out[i])] for i in ids])
    drafted = eng.metrics()["num_draft_tokens"]
    assert drafted > 0, "the drafts were verified"
    assert_distribution(samples, np.array([p for _, p in seqs]), what="sequences under [ab]{3}")
