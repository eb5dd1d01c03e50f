"""The training pipeline (``python -m dspark.train --smoke``) runs end to end, and the drafter it
trains has the same math as ``dspark.TorchDrafter`` and the candle ``dspark.Drafter``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")

import dspark  # noqa: E402
from dspark.cli import main as cli_main  # noqa: E402
from dspark.train.drafter_model import TrainableDrafter  # noqa: E402
from dspark.train.objective import anchor_hardness, make_blocks  # noqa: E402
from dspark.train.pipeline import main as train_main  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("train_smoke")
    assert train_main([str(out), "--smoke", "--threads", "1"]) == 0
    return out


def _load(run: Path):  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file
    from transformers import Qwen3ForCausalLM

    from dspark.train.drafter import DrafterTrainConfig, make_shape

    target = Qwen3ForCausalLM.from_pretrained(run / "target").eval()
    cfg = json.loads((run / "drafter" / "config.json").read_text())
    shape = make_shape(target.config, DrafterTrainConfig(block_size=int(cfg["block_size"])))
    model = TrainableDrafter(shape)
    model.load_state_dict(load_file(str(run / "drafter" / "model.safetensors")))
    return target, model.eval()


def test_pipeline_writes_a_loadable_pair(smoke_run: Path) -> None:
    for name in (
        "target/config.json",
        "target/tokenizer.json",
        "target/model.safetensors",
        "drafter/config.json",
        "drafter/model.safetensors",
        "heldout_prompts.json",
        "assistant/config.json",
        "assistant/model.safetensors",
    ):
        assert (smoke_run / name).is_file(), name
    assert (
        cli_main(["inspect", str(smoke_run / "drafter"), "--target", str(smoke_run / "target")])
        == 0
    )
    report = dspark.inspect(smoke_run / "drafter", smoke_run / "target").to_dict()
    v = report["vocab"]
    assert int(v["draft"]) > int(v["target"]) and int(v["draft"]) % 64 == 0  # padded path
    cfg = json.loads((smoke_run / "drafter" / "config.json").read_text())
    assert cfg["mask_token_id"] == int(v["target"])  # the first padded row
    n_layers = json.loads((smoke_run / "target" / "config.json").read_text())["num_hidden_layers"]
    assert len(cfg["target_layer_ids"]) == 3 and max(cfg["target_layer_ids"]) < n_layers - 1
    log = (smoke_run / "train.log").read_text()
    assert "target step 2" in log and "drafter step 2" in log and "assistant step 1" in log
    # the assisted-generation baseline shares the target's vocabulary and is smaller
    asst = json.loads((smoke_run / "assistant" / "config.json").read_text())
    tcfg = json.loads((smoke_run / "target" / "config.json").read_text())
    assert asst["vocab_size"] == tcfg["vocab_size"]
    assert asst["hidden_size"] < tcfg["hidden_size"]


def test_train_blocks_see_context_before_anchor_and_own_block() -> None:
    gen = torch.Generator().manual_seed(0)
    tokens = torch.arange(40).reshape(2, 20)
    b = make_blocks(tokens, 4, 99, 3, gen)
    q = b.block_ids.shape[1]
    assert q == 12 and b.mask.shape == (2, 12, 20 + 12)
    for r in range(2):
        for i in range(q):
            anchor = int(b.block_pos[r, i - i % 4])
            assert int(b.block_ids[r, i]) == (int(tokens[r, anchor]) if i % 4 == 0 else 99)
            assert int(b.prev_ids[r, i]) == int(tokens[r, anchor + i % 4])
            ctx = b.mask[r, i, :20]
            assert ctx[:anchor].all() and not ctx[anchor:].any()
            own = b.mask[r, i, 20:]
            assert own[i - i % 4 : i - i % 4 + 4].all() and int(own.sum()) == 4


def test_hard_anchors_follow_target_uncertainty() -> None:
    # hardness of position a = 1 - the target's top probability at a-1
    logits = torch.full((1, 6, 4), -30.0)
    logits[0, :, 0] = 30.0  # confident everywhere ...
    logits[0, 2] = 0.0  # ... but uniform at position 2
    h = anchor_hardness(logits)
    assert h.shape == (1, 6) and float(h[0, 0]) == 0.0
    assert abs(float(h[0, 3]) - 0.75) < 1e-6 and float(h[0, 1:3].max()) < 1e-6
    # all-hard sampling draws only anchors with hardness; a mixture also reaches the others
    gen = torch.Generator().manual_seed(0)
    tokens = torch.arange(60).reshape(2, 30)
    hard = torch.zeros(2, 30)
    hard[:, 5:9] = 1.0
    seen_mixed: set[int] = set()
    for _ in range(20):
        b = make_blocks(tokens, 4, 99, 3, gen, hard, 1.0)
        anchors = b.block_pos[:, ::4]
        assert bool(((anchors >= 5) & (anchors <= 8)).all())
        assert all(len(set(row.tolist())) == 3 for row in anchors)  # distinct per sequence
        m = make_blocks(tokens, 4, 99, 3, gen, hard, 0.5)
        seen_mixed.update(m.block_pos[:, ::4].flatten().tolist())
    assert any(a < 5 or a > 8 for a in seen_mixed) and any(5 <= a <= 8 for a in seen_mixed)
    with pytest.raises(ValueError, match="hard_share"):
        make_blocks(tokens, 4, 99, 3, gen, hard, 1.5)


def _greedy(model: TrainableDrafter, feats, anchor: int):  # type: ignore[no-untyped-def]
    s = model.shape
    t = feats.shape[1]
    ids = torch.full((1, s.block_size), s.mask_token_id)
    ids[0, 0] = anchor
    pos = torch.arange(t, t + s.block_size)[None]
    mask = torch.ones(1, s.block_size, t + s.block_size, dtype=torch.bool)
    with torch.no_grad():
        hidden = model.backbone(feats, ids, pos, mask)
        prev, toks, confs = torch.tensor([anchor]), [], []
        for k in range(s.block_size):
            logits, conf = model.heads(hidden[:, k], prev)
            prev = logits.argmax(-1)
            toks.append(int(prev))
            confs.append(float(torch.sigmoid(conf)))
    return hidden, toks, confs


def test_trained_drafter_matches_torch_and_candle_drafters(smoke_run: Path) -> None:
    target, model = _load(smoke_run)
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, 400, (1, 24)))
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i + 1] for i in model.shape.target_layer_ids], -1)
    anchor = int(out.logits[0, -1].argmax())
    hidden, toks, confs = _greedy(model, feats[:, :-1], anchor)
    ref = dspark.TorchDrafter.from_pretrained(smoke_run / "drafter", target)
    ref_hidden, _ = ref.forward_block(feats[:, :-1], [anchor])
    torch.testing.assert_close(hidden, ref_hidden, atol=1e-4, rtol=1e-4)
    prop = ref.propose(feats[:, :-1], [anchor])
    assert prop.tokens[0].tolist() == toks
    np.testing.assert_allclose(np.asarray(prop.confidence[0]), confs, atol=1e-4)
    candle = dspark.Drafter.from_pretrained(smoke_run / "drafter", target)
    blk = candle.propose(feats[:, :-1], [anchor])
    assert [int(x) for x in np.asarray(blk.tokens[0])] == toks
    np.testing.assert_allclose(np.asarray(blk.confidence[0]), confs, atol=1e-4)
    assert max(toks) < model.shape.target_vocab_size
