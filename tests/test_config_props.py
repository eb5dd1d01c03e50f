"""Properties of config normalization and ``inspect``: a drafter config mutated at random, and
odd values where a path belongs, end in a typed error or a valid ``DraftSpec`` / report.
"""

from __future__ import annotations

from typing import Any

from strategies import ODD_SCALARS, PROPS, given, outcome, st

import dspark
from dspark.example import draft_config

CONFIG_KEYS = [
    "block_size",
    "markov_rank",
    "mask_token_id",
    "vocab_size",
    "draft_vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "target_layer_ids",
    "num_target_layers",
    "rope_theta",
    "rms_norm_eps",
    "architectures",
]
CONFIG_VALUES = [
    float("nan"),
    float("inf"),
    -1,
    0,
    2**31,
    2**64,
    2**70,
    1e300,
    2.5,
    True,
    None,
    "x",
    [],
    [0, 2**40],
    {"a": 1},
    ...,
]


@PROPS
@given(
    st.lists(st.tuples(st.sampled_from(CONFIG_KEYS), st.sampled_from(CONFIG_VALUES)), max_size=3)
)
def test_draft_spec_from_mutated_dict(mutations):
    cfg: dict[str, Any] = draft_config("full")
    for key, value in mutations:
        if value is ...:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    spec = outcome(dspark.DraftSpec.from_pretrained, cfg)
    if spec is None:
        return
    assert spec.block_size >= 1 and spec.vocab_size >= 1
    assert 0 <= spec.noise_token_id < spec.vocab_size
    assert isinstance(spec.to_dict(), dict)


@PROPS
@given(st.sampled_from(ODD_SCALARS), st.sampled_from([*ODD_SCALARS, "/nonexistent/dir"]))
def test_inspect_and_spec_paths(draft, target):
    report = outcome(dspark.inspect, draft, target)
    if report is not None:
        assert isinstance(report.ok, bool) and isinstance(report.to_dict(), dict)
    outcome(dspark.DraftSpec.from_pretrained, draft)
