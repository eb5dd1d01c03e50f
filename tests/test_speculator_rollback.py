"""After rounds with partial acceptance, target cache and drafter contexts equal a fresh run on
the committed prefix (cache rollback is exact)."""

from __future__ import annotations

from typing import Any

import pytest
from spec_fixtures import checkpoint, load_drafter, single_thread, target, torch  # noqa: F401
from tiny_models import OracleDrafter

import dspark
from dspark.target import HFTarget

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("single_thread")]

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7], [1, 8, 2, 8, 1]]


class Tandem:
    """Oracle proposals (partial acceptance) + a TorchDrafter context updated alongside."""

    def __init__(self, oracle: OracleDrafter, real: Any) -> None:
        self.oracle, self.real = oracle, real
        self.made: list[_Pair] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.oracle, name)

    def new_state(self) -> Any:
        self.made.append(_Pair(self.oracle.new_state(), self.real.new_state()))
        return self.made[-1]

    def propose_states(self, states, anchors, **kw):  # type: ignore[no-untyped-def]
        self.real.propose_states([s.real for s in states], anchors, **kw)  # exercised, ignored
        return self.oracle.propose_states([s.oracle for s in states], anchors, **kw)


class _Pair:
    def __init__(self, oracle: Any, real: Any) -> None:
        self.oracle, self.real = oracle, real

    @property
    def length(self) -> int:
        assert self.oracle.length == self.real.length
        return self.real.length

    def extend(self, features: Any, start: int) -> None:
        self.oracle.extend(features, start)
        self.real.extend(features, start)

    def truncate(self, n: int) -> None:
        self.oracle.truncate(n)
        self.real.truncate(n)


class Recording:
    """A TargetModel over an :class:`HFTarget` that keeps the cache the engine made."""

    def __init__(self, inner: HFTarget) -> None:
        self.inner = inner
        self.cache: Any = None
        self.num_hidden_layers = inner.num_hidden_layers
        self.hidden_size = inner.hidden_size
        self.vocab_size = inner.vocab_size

    def new_cache(self, batch_size: int) -> Any:
        self.cache = self.inner.new_cache(batch_size)
        return self.cache

    def forward(self, cache, input_ids, num_tokens, capture):  # type: ignore[no-untyped-def]
        return self.inner.forward(cache, input_ids, num_tokens, capture)

    def crop(self, cache: Any, lengths: Any) -> None:
        self.inner.crop(cache, lengths)


class CheckedError(Exception):
    """Raised by the hook once the checks ran: ends the generation."""


@torch.inference_mode()
def test_rollback_matches_fresh_prefix(target, checkpoint):
    real = load_drafter("TorchDrafter", checkpoint("own"), target)
    drafter = Tandem(OracleDrafter(target, PROMPTS, corrupt=0.4, seed=3), real)
    rec = Recording(HFTarget(target))
    # Full verification: every round drafts and extends each drafter context (the default
    # policy defers them in plain rounds).
    spec = dspark.Speculator(rec, drafter, verify="full")
    out: list[list[int]] = [[] for _ in PROMPTS]
    calls = []

    def hook(new: list[list[int]]) -> None:
        for o, n in zip(out, new, strict=True):
            o.extend(n)
        calls.append(1)
        if len(calls) == 5:  # the prefill and four rounds
            check(rec, drafter, real, out)
            raise CheckedError

    with pytest.raises(CheckedError):  # the hook's own exception comes back unchanged
        spec.generate([list(p) for p in PROMPTS], 40, on_round=hook)
    # The same oracle over a whole run: partial acceptance happens (rollback was exercised).
    oracle = OracleDrafter(target, PROMPTS, corrupt=0.4, seed=3)
    spec = dspark.Speculator(target, oracle, verify="full")
    st = spec.generate([list(p) for p in PROMPTS], 40).stats
    assert 0 < st.accepted_tokens < st.drafted_tokens


def check(rec: Recording, drafter: Tandem, real: Any, out: list[list[int]]) -> None:
    """The engine's caches after some rounds equal fresh ones on the committed prefixes."""
    fresh = HFTarget(rec.inner.model)
    capture = real.capture_layer_ids
    lengths = [int(x) for x in rec.cache.lengths.tolist()]
    for i, prompt in enumerate(PROMPTS):
        n = lengths[i]
        anchor = out[i][-1]
        committed = (list(prompt) + out[i])[:n]  # tokens whose KV / features are held
        assert len(prompt) + len(out[i]) == n + 1  # everything but the anchor is cached
        cache = fresh.new_cache(1)
        ref = fresh.forward(cache, torch.tensor([committed]), [n], capture)
        # Drafter: the rolled-back context equals a fresh context from the fresh features.
        state = real.new_state()
        state.extend(ref.hidden_states[0], 0)
        got = drafter.made[i].real
        assert got.length == n
        got_k, got_v = got.context_kv()
        ref_k, ref_v = state.context_kv()
        for k_got, k_ref in zip(got_k + got_v, ref_k + ref_v, strict=True):
            torch.testing.assert_close(k_got, k_ref, rtol=1e-4, atol=1e-4)
        a = real.propose_states([got], [anchor])
        b = real.propose_states([state], [anchor])
        assert torch.equal(a.tokens, b.tokens)
        torch.testing.assert_close(a.confidence, b.confidence, rtol=1e-4, atol=1e-4)
        # Target: the next step from the rolled-back cache equals the fresh one.
        probe = torch.tensor([[anchor, 11]])
        want = fresh.forward(cache, probe, [2], capture)
        ids = torch.zeros(len(PROMPTS), 2, dtype=torch.long)
        ids[i] = probe[0]
        num = [0] * len(PROMPTS)
        num[i] = 2
        got_out = rec.inner.forward(rec.cache, ids, num, capture)
        rec.inner.crop(rec.cache, lengths)
        torch.testing.assert_close(got_out.logits[i], want.logits[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(
            got_out.hidden_states[i], want.hidden_states[0], rtol=1e-4, atol=1e-4
        )


def test_truncate_then_extend_equals_fresh(target, checkpoint):
    drafter = load_drafter("TorchDrafter", checkpoint("reduced"), target)
    feats = torch.randn(9, len(drafter.capture_layer_ids) * target.config.hidden_size)
    state = drafter.new_state()
    state.extend(feats[:7], 0)
    state.extend(feats[:8], 0)  # held positions are skipped, only position 7 is new
    assert state.length == 8
    state.truncate(4)
    state.extend(feats[4:], 4)
    fresh = drafter.new_state()
    fresh.extend(feats, 0)
    x = drafter.propose_states([state], [5], temperature=1.0, seed=9)
    y = drafter.propose_states([fresh], [5], temperature=1.0, seed=9)
    assert torch.equal(x.tokens, y.tokens)
    torch.testing.assert_close(x.draft_logits, y.draft_logits, rtol=1e-5, atol=1e-5)
    # Stateless propose over the same context agrees with the cached path.
    z = drafter.propose(feats[None], [5], temperature=1.0, seed=9)
    assert torch.equal(z.tokens, y.tokens)
    torch.testing.assert_close(z.draft_logits, y.draft_logits, rtol=1e-5, atol=1e-5)
