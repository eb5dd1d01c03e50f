"""Properties of ``Speculator.generate``'s arguments: hypothesis-generated prompts (lists,
tensors of any rank and dtype, odd values), token budgets and stop ids end in a typed error or
tokens inside the vocabulary and the budget.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from strategies import ODD_SCALARS, PROPS, given, outcome, st

import dspark


@pytest.mark.torch
@PROPS
@given(data=st.data())
def test_speculator_generate_arguments(tiny_speculator, data):
    spec = tiny_speculator
    vocab = spec.target.vocab_size
    prompt_kind = data.draw(
        st.sampled_from(["list", "lists", "tensor1", "tensor2", "tensor3", "odd"])
    )
    import torch

    ids = st.integers(-2, vocab + 2) if data.draw(st.booleans()) else st.integers(0, vocab - 1)
    if prompt_kind == "list":
        prompts: Any = data.draw(st.lists(ids, max_size=4))
    elif prompt_kind == "lists":
        prompts = data.draw(st.lists(st.lists(ids, max_size=4), max_size=3))
    elif prompt_kind == "odd":
        prompts = data.draw(st.sampled_from([*ODD_SCALARS, [[[1]]], [1, [2]], [1.5, 2.0]]))
    else:
        nd = {"tensor1": 1, "tensor2": 2, "tensor3": 3}[prompt_kind]
        shape = data.draw(st.lists(st.integers(0, 3), min_size=nd, max_size=nd))
        dtype = data.draw(st.sampled_from([torch.long, torch.int32, torch.float32, torch.bool]))
        prompts = torch.randint(0, vocab, shape).to(dtype)
    # No huge counts: a huge max_new_tokens is a legitimate (long) request, not an error.
    max_new = data.draw(
        st.one_of(
            st.integers(0, 3),
            st.sampled_from(
                [None, True, -1, 2.7, float("nan"), "3", [1], np.int64(2), np.bool_(1)]
            ),
        )
    )
    stops = data.draw(st.one_of(st.none(), st.lists(ids, max_size=2), st.sampled_from(ODD_SCALARS)))
    out = outcome(spec.generate, prompts, max_new, stops)
    if out is None:
        return
    assert all(len(t) <= int(max_new) for t in out.tokens)
    assert all(0 <= x < vocab for t in out.tokens for x in t)


@pytest.fixture(scope="module")
def tiny_speculator(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("transformers")
    from tiny_models import make_target, write_drafter

    target = make_target(0)
    path = write_drafter(tmp_path_factory.mktemp("props-drafter"), target, layout="own")
    drafter = dspark.Drafter.from_pretrained(path, target)
    return dspark.Speculator(target, drafter, temperature=0.0)
