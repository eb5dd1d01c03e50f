"""The candle drafter (``dspark.Drafter``) against the plain-torch reference (``TorchDrafter``).

Same checkpoints, same inputs: identical greedy drafts, draft logits to 1e-4 (teacher-forced on
the candle drafter's own samples at T > 0), confidences to 1e-4; the cached path equals the
stateless one; shared weights come from an HF target; misfits are typed errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import BLOCK, TARGET_LAYER_IDS, make_target, write_drafter  # noqa: E402

import dspark  # noqa: E402
from dspark.protocols import DRAFTER_MEMBERS  # noqa: E402
from dspark.reference.torch_drafter import TorchDrafter  # noqa: E402

pytestmark = pytest.mark.torch

TOL = 1e-4

#: name → (layout, write_drafter kwargs)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "own": ("own", {}),
    "shared": ("shared", {}),
    "reduced": ("reduced", {}),
    "padded": ("padded", {}),
    "dflash": ("shared", {"rank": 0, "confidence": False}),
    "one_plus_k": ("own", {"config_overrides": {"sample_from_anchor": False}}),
}


@pytest.fixture(scope="module")
def target() -> Any:
    return make_target(0)


def _pair(tmp_path: Path, target: Any, case: str, seed: int = 1) -> tuple[Any, Any]:
    layout, kw = CASES[case]
    path = write_drafter(tmp_path / case, target, layout, seed, **kw)
    return dspark.Drafter.from_pretrained(path, target), TorchDrafter.from_pretrained(path, target)


def _context(seed: int, b: int, t: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    width = len(TARGET_LAYER_IDS) * 64
    return torch.randn(b, t, width, generator=g)


def _features(target: Any, ids: list[int]) -> Any:
    """Context features of ``ids`` with the +1 rule: id ``i`` = HF ``hidden_states[i + 1]``."""
    with torch.inference_mode():
        out = target(torch.tensor([ids]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1] for i in TARGET_LAYER_IDS], dim=-1)


def _teacher_forced_q(
    td: Any, ctx: Any, anchors: Any, starts: list[int], tokens: Any, temp: float
) -> Any:
    """Torch draft logits ``[B, K, V_t]`` conditioned on the given drafted tokens."""
    w = td.weights
    _hidden, base = td.forward_block(ctx, anchors, starts)
    b, k_n, _ = base.shape
    to_target = w.draft_to_target
    live = to_target >= 0
    q = torch.full((b, k_n, w.target_vocab_size), float("-inf"))
    prev = anchors
    for k in range(k_n):
        logits = base[:, k].float()
        if w.markov_w1 is not None and w.markov_w2 is not None:
            logits = logits + w.markov_w1[prev] @ w.markov_w2.T
        logits = w.logit_scale * logits
        q[:, k, to_target[live]] = logits[:, live] / temp
        prev = tokens[:, k]
    return q


def _assert_q_close(a: Any, b: Any) -> None:
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    assert torch.equal(fa, fb), "supports differ"
    diff = (a[fa] - b[fb]).abs().max().item()
    assert diff <= TOL, f"draft logits differ by {diff}"


def test_the_reference_modules_keep_their_old_names() -> None:
    import dspark.hf_dflash
    import dspark.reference.hf_dflash
    import dspark.torch_drafter

    assert dspark.torch_drafter.TorchDrafter is TorchDrafter
    assert dspark.TorchDrafter is TorchDrafter
    assert dspark.hf_dflash.to_hf_dflash is dspark.reference.hf_dflash.to_hf_dflash


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_drafts_and_confidence_match_torch(tmp_path: Path, target: Any, case: str) -> None:
    cd, td = _pair(tmp_path, target, case)
    ctx = _context(3, 3, 6)
    anchors = torch.tensor([5, 77, 200])
    starts = [0, 2, 9]
    a = cd.propose(ctx, anchors, start_positions=starts)
    b = td.propose(ctx, anchors, start_positions=starts)
    assert a.tokens.shape == (3, BLOCK) and a.tokens.dtype == torch.int64
    assert torch.equal(a.tokens, b.tokens), f"{a.tokens}\n{b.tokens}"
    assert a.draft_logits.shape == (3, BLOCK, cd.target_vocab_size)
    assert torch.equal(a.draft_logits, b.draft_logits)
    assert bool((a.tokens < cd.target_vocab_size).all())
    if b.confidence is None:
        assert a.confidence is None and not cd.has_confidence_head
    else:
        assert torch.allclose(a.confidence, b.confidence, atol=TOL, rtol=0)
    # Greedy drafts are the argmax of the teacher-forced torch logits at every slot.
    q = _teacher_forced_q(td, ctx, anchors, starts, a.tokens, 1.0)
    assert torch.equal(q.argmax(-1), a.tokens)


@pytest.mark.parametrize("case", ["own", "reduced", "padded", "dflash", "one_plus_k"])
@pytest.mark.parametrize("temp", [0.7, 1.0])
def test_sampled_draft_logits_match_torch(
    tmp_path: Path, target: Any, case: str, temp: float
) -> None:
    cd, td = _pair(tmp_path, target, case, seed=2)
    ctx = _context(4, 2, 5)
    anchors = torch.tensor([1, 128])
    starts = [3, 0]
    a = cd.propose(ctx, anchors, start_positions=starts, temperature=temp, seed=11)
    q = _teacher_forced_q(td, ctx, anchors, starts, a.tokens, temp)
    _assert_q_close(a.draft_logits, q)
    # Every sampled token lies in the support of its row.
    picked = a.draft_logits.gather(-1, a.tokens.unsqueeze(-1))
    assert bool(torch.isfinite(picked).all())


def test_real_target_features_cached_path(tmp_path: Path, target: Any) -> None:
    cd, td = _pair(tmp_path, target, "shared")
    ids = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]
    n = len(ids) - 1
    feats = _features(target, ids)[:, :n]  # positions 0..n-1; the anchor ids[n] sits at n
    whole = cd.propose(feats, [ids[n]])
    state = cd.new_state()
    state.extend(feats[0, :4], 0)
    state.extend(feats[0, 2:n], 2)  # overlaps: rows already held are skipped
    assert (state.length, state.end) == (n, n)
    cached = cd.propose_states([state], [ids[n]])
    assert torch.equal(whole.tokens, cached.tokens)
    _assert_q_close(whole.draft_logits, cached.draft_logits)
    assert torch.allclose(whole.confidence, cached.confidence, atol=1e-5, rtol=0)
    assert torch.equal(whole.tokens, td.propose(feats, [ids[n]]).tokens)
    # Roll back two positions and re-extend: same as before.
    state.truncate(n - 2)
    state.extend(feats[0, n - 2 :], n - 2)
    again = cd.propose_states([state], [ids[n]], temperature=1.0, seed=5)
    ref = cd.propose(feats, [ids[n]], temperature=1.0, seed=5)
    assert torch.equal(again.tokens, ref.tokens)


def test_contract_members(tmp_path: Path, target: Any) -> None:
    for case in ["own", "reduced"]:
        cd, td = _pair(tmp_path, target, case)
        for name in DRAFTER_MEMBERS:
            assert hasattr(cd, name), name
            if name != "draft_id_to_target_id" and not callable(getattr(cd, name)):
                assert getattr(cd, name) == getattr(td, name), name
        if case == "own":
            assert cd.draft_id_to_target_id is None and td.draft_id_to_target_id is None
            assert cd.has_own_embed_tokens and cd.has_own_lm_head
        else:
            d2t = cd.draft_id_to_target_id
            assert d2t.dtype == torch.int64 and d2t.shape == (cd.draft_vocab_size,)
            assert torch.equal(d2t, td.draft_id_to_target_id.to(torch.int64))
            assert not cd.has_own_embed_tokens and cd.has_own_lm_head
        assert cd.capture_layer_ids == [i + 1 for i in cd.target_layer_ids]


def test_numpy_inputs_give_numpy_outputs(tmp_path: Path, target: Any) -> None:
    cd, _ = _pair(tmp_path, target, "own")
    ctx = _context(1, 1, 4).numpy()
    p = cd.propose(ctx, np.array([7]), temperature=0.0)
    assert isinstance(p.tokens, np.ndarray) and p.tokens.shape == (1, BLOCK)
    assert isinstance(p.draft_logits, np.ndarray) and p.draft_logits.dtype == np.float32


def test_to_moves_the_weights_and_keeps_the_drafts(tmp_path: Path, target: Any) -> None:
    _, td = _pair(tmp_path, target, "own")
    ctx, anchors = _context(2, 2, 5), torch.tensor([9, 31])
    before = td.propose(ctx, anchors, temperature=1.0, seed=4)
    assert td.to("cpu") is td and td.device == torch.device("cpu")
    after = td.propose(ctx, anchors, temperature=1.0, seed=4)
    assert torch.equal(before.tokens, after.tokens)
    assert torch.equal(before.draft_logits, after.draft_logits)
    with pytest.raises(dspark.InputError) as e:
        td.to("no-such-device")
    assert e.value.code == "invalid-argument"
    if not torch.cuda.is_available():
        with pytest.raises(dspark.InputError) as e:
            td.to("cuda")
        assert e.value.code == "device-unavailable"
        assert td.device == torch.device("cpu")  # nothing moved
        assert torch.equal(td.propose(ctx, anchors, temperature=1.0, seed=4).tokens, before.tokens)


def _dict_target(target: Any, **config: Any) -> dict[str, Any]:
    cfg = target.config.to_dict()
    cfg.update(config)
    return {
        "config": cfg,
        "embed_tokens": target.get_input_embeddings().weight,
        "lm_head": target.get_output_embeddings().weight,
    }


def test_dict_target_equals_hf_target(tmp_path: Path, target: Any) -> None:
    path = write_drafter(tmp_path / "d", target, "shared", 4)
    a = dspark.Drafter.from_pretrained(path, target)
    b = dspark.Drafter.from_pretrained(path, _dict_target(target))
    ctx = _context(6, 2, 3)
    pa = a.propose(ctx, [1, 2], temperature=1.0, seed=1)
    pb = b.propose(ctx, [1, 2], temperature=1.0, seed=1)
    assert torch.equal(pa.tokens, pb.tokens)
    assert torch.equal(pa.draft_logits, pb.draft_logits)


def test_misfits_are_typed_errors(tmp_path: Path, target: Any) -> None:
    path = write_drafter(tmp_path / "d", target, "shared", 4)
    # A shared lm_head nobody passes.
    missing = _dict_target(target)
    del missing["lm_head"]
    with pytest.raises(dspark.CheckpointError) as e:
        dspark.Drafter.from_pretrained(path, missing)
    assert e.value.code == "missing-tensor"
    # target_layer_ids [0, 2] on a 2-layer target.
    small = make_target(0, num_hidden_layers=2)
    with pytest.raises(dspark.CheckpointError) as e:
        dspark.Drafter.from_pretrained(path, small)
    assert {c for c, _ in e.value.problems} == {"target-mismatch"}
    # Hidden-size mismatch.
    with pytest.raises(dspark.CheckpointError) as e:
        dspark.Drafter.from_pretrained(path, _dict_target(target, hidden_size=32))
    assert "target-mismatch" in {c for c, _ in e.value.problems}
    # Wrong feature width and a gap in the cache.
    cd = dspark.Drafter.from_pretrained(path, target)
    with pytest.raises(dspark.InputError) as e:
        cd.propose(torch.zeros(1, 3, 5), [1])
    assert e.value.code == "bad-shape"
    state = cd.new_state()
    state.extend(_context(1, 1, 3)[0], 0)
    with pytest.raises(dspark.InputError):
        state.extend(_context(1, 1, 3)[0], 5)
    with pytest.raises(dspark.InputError):
        cd.propose_states([state], [cd.vocab_size])
    # A state from another drafter.
    other = dspark.Drafter.from_pretrained(path, target)
    with pytest.raises(dspark.InputError):
        other.propose_states([state], [1])
    assert json.dumps(cd.warnings)  # warnings are plain (code, message) pairs
