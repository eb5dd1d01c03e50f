"""The training pipeline (``python -m dspark.train --smoke``) runs end to end, the drafter it
trains has the same math as ``dspark.TorchDrafter`` and the candle ``dspark.Drafter``, and the
confidence stage labels and trains the confidence head alone."""

from __future__ import annotations

import json
import shutil
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
from dspark.train.objective import (  # noqa: E402
    anchor_hardness,
    confidence_targets,
    make_blocks,
)
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
    assert "confidence fit:" in log and "confidence validation" in log
    # the long-context stage ran on both models, long windows included
    assert "extend target step 1" in log and "extend drafter step 5" in log
    # the target is extended before the drafter stage learns it; the drafter after that stage
    assert log.index("extend target step") < log.index("] drafter step 0")
    assert log.index("] drafter step 0") < log.index("extend drafter step 0")
    assert "held-out CE by depth" in log and "continuations of 48-token prompts" in log
    # the assisted-generation baseline shares the target's vocabulary and is smaller
    asst = json.loads((smoke_run / "assistant" / "config.json").read_text())
    tcfg = json.loads((smoke_run / "target" / "config.json").read_text())
    assert asst["vocab_size"] == tcfg["vocab_size"]
    assert asst["hidden_size"] < tcfg["hidden_size"]


def test_extend_knobs_reach_the_stage_and_bad_values_are_usage_errors(
    smoke_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a second drafter-only extension of (a copy of) the smoke pair, with its own share and lr
    run = tmp_path / "run"
    shutil.copytree(smoke_run, run)
    argv = [str(run), "--smoke", "--threads", "1", "--stage", "extend"]
    knobs = ["--extend-steps", "0", "2", "--extend-short-share", "1", "--extend-drafter-lr", "1e-4"]
    assert train_main(argv + knobs) == 0
    log = (run / "train.log").read_text().splitlines()
    config = [line for line in log if "extend config" in line][-1]
    assert "'short_share': 1.0" in config and "'drafter_lr': 0.0001" in config
    assert "'target_steps': 0" in config
    for bad in (["--extend-short-share", "1.5"], ["--extend-drafter-lr", "0"]):
        with pytest.raises(SystemExit) as exc:
            train_main(argv + bad)
        assert exc.value.code == 2
        assert bad[1] in capsys.readouterr().err


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


def test_anchors_from_a_first_position_stay_in_the_tail() -> None:
    # The long-context stage draws anchors in a window's last positions only (uniform and
    # hard-weighted alike); with first = 1 the draw is the first stage's, bit for bit.
    tokens = torch.arange(200).reshape(2, 100)
    hard = torch.rand(2, 100, generator=torch.Generator().manual_seed(3))
    for h, share in ((None, 0.0), (hard, 0.5)):
        b = make_blocks(tokens, 4, 999, 8, torch.Generator().manual_seed(1), h, share, first=70)
        anchors = b.block_pos[:, ::4]
        assert anchors.shape == (2, 8) and int(anchors.min()) >= 70
        assert int(anchors.max()) <= 100 - 4 - 1
        one = make_blocks(tokens, 4, 999, 8, torch.Generator().manual_seed(1), h, share)
        two = make_blocks(tokens, 4, 999, 8, torch.Generator().manual_seed(1), h, share, first=1)
        assert torch.equal(one.block_pos, two.block_pos)
    with pytest.raises(ValueError, match="anchors from"):
        make_blocks(tokens, 4, 999, 8, torch.Generator(), first=96)


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


def test_greedy_confidence_label_counts_the_slots_greedy_verification_reaches() -> None:
    # one block of 4 slots; the drafter's argmax agrees with the target's at slots 0, 1, 3
    greedy = torch.tensor([[5, 6, 7, 8]])
    logits = torch.full((1, 4, 10), -1.0)
    for j, tok in enumerate([5, 6, 9, 8]):
        logits[0, j, tok] = 1.0
    tv = torch.full((1, 4), 0.25)
    # teacher-forced Markov inputs: anchor, then the target's argmax tokens (greedy path) ...
    prev = torch.tensor([[1, 5, 6, 7]])
    y, w = confidence_targets(logits, greedy, prev, tv, 4, "greedy")
    assert y.tolist() == [[1.0, 1.0, 0.0, 1.0]]
    assert w.tolist() == [[1.0, 1.0, 1.0, 0.0]]  # slot 3 is behind a rejection
    # ... unless the true next token is not the target's argmax: slot 2 is never reached
    # with the token the drafter would have drafted
    y, w = confidence_targets(logits, greedy, torch.tensor([[1, 5, 4, 7]]), tv, 4, "greedy")
    assert w.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    # the T = 1 label: the acceptance probability, on every slot
    y, w = confidence_targets(logits, greedy, prev, tv, 4, "t1")
    assert torch.allclose(y, torch.full((1, 4), 0.75)) and bool((w == 1).all())
    with pytest.raises(ValueError, match="confidence label"):
        confidence_targets(logits, greedy, prev, tv, 4, "argmax")


def _markov_drafter(block_size: int = 4) -> TrainableDrafter:
    """A drafter that always drafts ``(previous token + 1) mod 8``, whatever its context."""
    from dspark.train.drafter_model import DrafterShape

    shape = DrafterShape(
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        num_layers=1,
        target_hidden_size=16,
        num_target_layers=4,
        target_layer_ids=(0, 1, 2),
        vocab_size=16,
        target_vocab_size=8,
        block_size=block_size,
        mask_token_id=8,
        markov_rank=16,
    )
    torch.manual_seed(0)
    model = TrainableDrafter(shape)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.markov_head.markov_w1.weight.copy_(torch.eye(16))
        w2 = torch.zeros(16, 16)
        for t in range(8):
            w2[(t + 1) % 8, t] = 10.0
        model.markov_head.markov_w2.weight.copy_(w2)
    return model


def _greedy_sequence(breaks: set[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens counting up mod 8 except after the positions in ``breaks`` (+4 there), and
    target logits whose argmax at every position is the next token: a greedy continuation."""
    toks = [0]
    for t in range(length - 1):
        toks.append((toks[-1] + (4 if t in breaks else 1)) % 8)
    tokens = torch.tensor([toks])
    logits = torch.full((1, length, 8), -5.0)
    for t in range(length - 1):
        logits[0, t, toks[t + 1]] = 5.0
    return tokens, logits


def test_greedy_walk_keeps_the_rounds_greedy_serving_runs() -> None:
    from dspark.train.objective import greedy_walk_samples

    k, length, start = 4, 40, 10
    model = _markov_drafter(k)
    breaks = {12, 20, 21, 30}  # the drafter misses the token after each of these positions
    tokens, logits = _greedy_sequence(breaks, length)
    feats = torch.randn(1, length, 3 * model.shape.target_hidden_size)
    x, y, slot, row = greedy_walk_samples(model, feats, logits, tokens, start)
    # the serving loop, by hand: a round at anchor a drafts slots a+1..a+K; slot j is accepted
    # iff the token at a+j+1 follows the one at a+j; the next anchor is a + accepted + 1
    want: list[tuple[int, float]] = []
    a = start
    while a <= length - k - 1:
        j = 0
        while j < k and (a + j) not in breaks:
            want.append((j, 1.0))
            j += 1
        if j < k:
            want.append((j, 0.0))
        a += j + 1
    assert list(zip(slot.tolist(), y.tolist(), strict=True)) == want
    assert x.shape == (len(want), model.shape.hidden_size + model.shape.markov_rank)
    assert row.tolist() == [0] * len(want) and not x.requires_grad
    with pytest.raises(ValueError, match="start"):
        greedy_walk_samples(model, feats, logits, tokens, length - k)


def test_confidence_stage_fits_only_the_confidence_head(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from dspark.train.confidence import (
        CONFIDENCE_TENSORS,
        ConfidenceTrainConfig,
        fit_confidence_head,
        save_confidence_head,
    )
    from dspark.train.objective import confidence_loss, greedy_walk_samples

    model = _markov_drafter()
    tokens, logits = _greedy_sequence({3, 9, 10, 17, 18, 19, 25, 33, 34, 41, 50}, 60)
    feats = torch.randn(1, 60, 3 * model.shape.target_hidden_size)
    x, y, slot, _ = greedy_walk_samples(model, feats, logits, tokens, 2)
    assert 0 < float(y.mean()) < 1
    before = {k: v.clone() for k, v in model.state_dict().items()}
    save_file(before, str(tmp_path / "model.safetensors"))
    with torch.no_grad():
        model.confidence_head.proj.weight.zero_()
        model.confidence_head.proj.bias.zero_()
        at_zero = float(confidence_loss(model, x, y))
    fit = fit_confidence_head(model, x, y, slot, ConfidenceTrainConfig(max_iter=50))
    with torch.no_grad():
        after_fit = float(confidence_loss(model, x, y))
    assert abs(fit["bce_before"] - at_zero) < 1e-6 and after_fit < at_zero - 0.05
    assert abs(fit["bce_after"] - after_fit) < 1e-6
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == set(CONFIDENCE_TENSORS)
    # the stage rewrites the checkpoint's confidence tensors only
    save_confidence_head(model, tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert saved.keys() == before.keys()
    for k in before:
        assert torch.equal(saved[k], after[k]), k
