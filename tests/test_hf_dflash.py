"""``dspark.reference.hf_dflash``: a drafter backbone run by HF transformers' DFlash assisted
generation.

The HF assistant computes exactly ``TorchDrafter.forward_block``'s hidden states (both block
layouts, the bundled drafter's padded mask row included), HF ``generate`` with
``speculation_type="dflash"`` reproduces target-only greedy decoding, and drafters HF's path
cannot express raise typed errors.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
if not hasattr(transformers, "MuseGlimmerAssistantModel"):
    pytest.skip("transformers has no DFlash assistant", allow_module_level=True)

from spec_fixtures import checkpoint, target  # noqa: E402,F401
from tiny_models import greedy_reference, write_drafter  # noqa: E402

import dspark.reference.hf_dflash as hf_dflash  # noqa: E402
from dspark import BackendError, CheckpointError, TorchDrafter  # noqa: E402
from dspark.bundled import BundledPair, bundled_dir, load_pair  # noqa: E402
from dspark.reference.hf_dflash import to_hf_dflash  # noqa: E402

pytestmark = pytest.mark.torch

BUNDLE = bundled_dir()


def _blocks(path: Path, model: Any, ids: Any) -> tuple[Any, Any, Any, Any]:
    """(HF backbone hidden, HF forward hidden, forward_block hidden, assistant) for one block."""
    assistant = to_hf_dflash(path, model)
    ref = TorchDrafter.from_pretrained(path, model)
    cfg = assistant.config
    with torch.inference_mode():
        hs = model(ids, output_hidden_states=True).hidden_states
        ctx = torch.cat([hs[i + 1][:, :-1] for i in cfg.target_layer_ids], dim=-1)
        anchor = int(ids[0, -1])
        want, _ = ref.forward_block(ctx, anchor)
        block = torch.tensor([[anchor] + [cfg.mask_token_id] * (cfg.block_size - 1)])
        kw = {
            "noise_embeds": model.get_input_embeddings()(block),
            "context_hidden_states": ctx,
            "position_ids": torch.arange(ctx.shape[1] + cfg.block_size)[None],
        }
        raw = assistant.backbone(**kw).last_hidden_state
        seen = assistant(**kw).last_hidden_state
    return raw, seen, want, assistant


def _dflash_generate(model: Any, assistant: Any, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            assistant_model=assistant,
            speculation_type="dflash",
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


# ---- the bundled pair (DeepSpec layout, mask token in a padded row) ------------------------
@pytest.fixture(scope="module")
def pair() -> BundledPair:
    if not (BUNDLE / "target" / "config.json").is_file():
        pytest.skip(f"no bundled model pair at {BUNDLE}")
    return load_pair(threads=1)


@pytest.fixture(scope="module")
def heldout(pair: BundledPair) -> list[int]:
    text = json.loads((BUNDLE / "heldout_prompts.json").read_text())["texts"][0]
    return pair.tokenizer.encode(text).ids[:64]


def test_bundled_block_matches_torch_drafter(pair: BundledPair, heldout: list[int]) -> None:
    raw, seen, want, assistant = _blocks(BUNDLE / "drafter", pair.target, torch.tensor([heldout]))
    assert assistant.dspark_mask_embedding is not None  # mask id 3000 is not a target row
    assert assistant.config.block_size == want.shape[1]  # DeepSpec: K slots, anchor included
    torch.testing.assert_close(raw, want, atol=1e-4, rtol=0)
    # HF drafts from slots 1.. of what forward returns: dspark slots 0..K-2, same positions.
    torch.testing.assert_close(seen[:, 1:], want[:, :-1], atol=1e-4, rtol=0)


def test_bundled_dflash_generate_is_lossless(pair: BundledPair, heldout: list[int]) -> None:
    from dspark.measure import target_only

    assistant = to_hf_dflash(BUNDLE / "drafter", pair.target)
    want, _ = target_only(pair.target, heldout, 32)
    assert _dflash_generate(pair.target, assistant, heldout, 32) == want


# ---- tiny random pairs: both block layouts, and what cannot be expressed -------------------
@pytest.mark.parametrize("from_anchor", [True, False], ids=["deepspec", "one_plus_k"])
def test_tiny_layouts(target: Any, tmp_path: Path, from_anchor: bool) -> None:
    path = write_drafter(
        tmp_path, target, "shared", rank=0, config_overrides={"sample_from_anchor": from_anchor}
    )
    prompt = [5, 17, 99, 3, 42, 7, 61, 200, 13]
    raw, seen, want, assistant = _blocks(path, target, torch.tensor([prompt]))
    assert assistant.dspark_mask_embedding is None  # mask id 255 is a target row
    if from_anchor:
        torch.testing.assert_close(raw, want, atol=1e-4, rtol=0)
        torch.testing.assert_close(seen[:, 1:], want[:, :-1], atol=1e-4, rtol=0)
    else:  # 1+K: HF's own layout, block_size = K + 1, no shift
        assert assistant.config.block_size == want.shape[1] + 1
        torch.testing.assert_close(raw[:, 1:], want, atol=1e-4, rtol=0)
        torch.testing.assert_close(seen, raw, atol=0, rtol=0)
    assert _dflash_generate(target, assistant, prompt, 12) == greedy_reference(target, prompt, 12)


@pytest.mark.parametrize("layout", ["own", "reduced"])
def test_weights_not_the_targets_are_refused(
    checkpoint: Any,
    target: Any,
    layout: str,
) -> None:
    with pytest.raises(CheckpointError) as err:
        to_hf_dflash(checkpoint(layout), target)
    assert err.value.code == "target-mismatch"
    assert "HF's DFlash" in str(err.value)


def test_missing_transformers_class_is_a_backend_error(
    checkpoint: Any,
    target: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hf_dflash, "_CLASS", None)
    stub = types.ModuleType("transformers.generation.candidate_generator")
    monkeypatch.setitem(sys.modules, "transformers.generation.candidate_generator", stub)
    with pytest.raises(BackendError) as err:
        to_hf_dflash(checkpoint("shared"), target)
    assert err.value.code == "backend"
