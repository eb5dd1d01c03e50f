"""``n`` choices from ``dspark serve`` for the ``openai`` client: a seeded request's choices
differ from each other and repeat, whole and streamed alike, and a greedy request's choices
are all the target's greedy continuation."""

from __future__ import annotations

from typing import Any

import pytest


def test_openai_client_n_choices(bundled_server: Any) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=bundled_server.url + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    ask = {"model": model, "prompt": "def main(", "max_tokens": 12, "temperature": 1.0}
    a = client.completions.create(n=4, seed=5, **ask)
    texts = [c.text for c in sorted(a.choices, key=lambda c: c.index)]
    assert len(set(texts)) == 4, texts
    b = client.completions.create(n=4, seed=5, **ask)
    assert [c.text for c in sorted(b.choices, key=lambda c: c.index)] == texts
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(n=4, seed=5, stream=True, **ask):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[i] for i in range(4)] == texts
    # the prompt counted once, every choice's tokens summed
    one = client.completions.create(n=1, seed=5, **ask)
    assert a.usage is not None and one.usage is not None
    assert a.usage.prompt_tokens == one.usage.prompt_tokens
    assert a.usage.completion_tokens > one.usage.completion_tokens
    greedy = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0, n=3
    )
    assert len({c.message.content for c in greedy.choices}) == 1
    with pytest.raises(openai.BadRequestError):
        client.completions.create(n=0, **ask)
