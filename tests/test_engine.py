"""``dspark.Engine``: continuous batching from Python.

The bundled bundled_pair runs on the native target with no torch: requests joining and leaving
between steps give the tokens they give alone, a seeded request's draws depend on its seed and
positions only (never on the batch, its order or its arrival step), aborts from another thread
end a request at the next step, and bad input is a typed error naming the field. The torch
tests run an HF target through the same engine (it grows and drops cache rows).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

import dspark

PROMPTS = [[(5 * i + 7 * j + 11) % 900 + 3 for j in range(2 + (3 * i) % 9)] for i in range(6)]


def _engine(bundled_pair: tuple[Any, Any], **kw: Any) -> dspark.Engine:
    target, drafter = bundled_pair
    return dspark.Engine(target, drafter, **kw)


def _alone(bundled_pair: tuple[Any, Any], prompt: Sequence[int], new: int, **kw: Any) -> list[int]:
    eng = _engine(bundled_pair, verify=kw.pop("verify", "full"))
    rid = eng.add_request(list(prompt), new, **kw)
    return eng.run()[rid]


def test_greedy_engine_equals_the_speculator(bundled_pair: tuple[Any, Any]) -> None:
    target, drafter = bundled_pair
    ref = dspark.Speculator(target, drafter).generate(PROMPTS, 16).tokens
    eng = _engine(bundled_pair)
    ids = [eng.add_request(p, 16) for p in PROMPTS]
    out = eng.run()
    assert [out[i] for i in ids] == ref
    assert not eng.has_work()
    assert eng.num_running == 0 and eng.num_waiting == 0


def test_requests_joining_between_steps_give_their_own_tokens(
    bundled_pair: tuple[Any, Any],
) -> None:
    """Arrivals mid-run, a small batch cap and a KV budget that forces preemption: every
    request's tokens are the ones it gives alone, at temperature 0 and with its own seed."""
    kw: list[dict[str, Any]] = [
        {"temperature": 0.0} if i % 2 == 0 else {"temperature": 0.8, "seed": 100 + i}
        for i in range(len(PROMPTS))
    ]
    alone = [_alone(bundled_pair, p, 14, **k) for p, k in zip(PROMPTS, kw, strict=True)]
    eng = _engine(bundled_pair, max_running=3, kv_tokens=60)
    pending = list(range(len(PROMPTS)))
    ids: dict[int, int] = {}
    got: dict[int, list[int]] = {}
    steps = 0
    while pending or eng.has_work():
        if pending and steps % 2 == 0:
            i = pending.pop(0)
            ids[i] = eng.add_request(PROMPTS[i], 14, **kw[i])
        for u in eng.step():
            got.setdefault(u.request_id, []).extend(u.new_tokens)
        steps += 1
        assert steps < 500
    assert [got[ids[i]] for i in range(len(PROMPTS))] == alone


@pytest.mark.parametrize("verify", ["full", 0.4])
def test_seeded_requests_do_not_depend_on_batch_order(
    bundled_pair: tuple[Any, Any], verify: str | float
) -> None:
    """Temperature 0.7: the same seeded requests in forward and reversed order, and each
    alone, commit the same tokens."""
    seeds = [7, 7, 123, 2**64 - 1, 0, 99]

    def batch(order: list[int]) -> dict[int, list[int]]:
        eng = _engine(bundled_pair, verify=verify)
        ids = {
            i: eng.add_request(PROMPTS[i], 12, temperature=0.7, top_p=0.95, seed=seeds[i])
            for i in order
        }
        out = eng.run()
        return {i: out[rid] for i, rid in ids.items()}

    forward = batch(list(range(len(PROMPTS))))
    backward = batch(list(reversed(range(len(PROMPTS)))))
    assert forward == backward
    assert forward[0] == _alone(
        bundled_pair, PROMPTS[0], 12, temperature=0.7, top_p=0.95, seed=7, verify=verify
    )
    # And a rerun is the same run.
    other = batch(list(range(len(PROMPTS))))
    assert other == forward


def test_different_seeds_give_different_samples(bundled_pair: tuple[Any, Any]) -> None:
    prompt = PROMPTS[1]
    runs = {tuple(_alone(bundled_pair, prompt, 10, temperature=1.0, seed=s)) for s in range(8)}
    assert len(runs) > 1


def test_unseeded_requests_are_independent_samples(bundled_pair: tuple[Any, Any]) -> None:
    """Requests without a seed draw fresh entropy: 600 copies of one prompt give first tokens
    distributed as the target's softmax at T = 1 (chi-square), not 600 copies of one sample."""
    import numpy as np
    from conftest import ALPHA
    from scipy import stats

    target, _ = bundled_pair
    prompt = PROMPTS[2]
    logits = np.asarray(target.logits(prompt))[-1].astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    eng = _engine(bundled_pair, max_running=64)
    ids = [eng.add_request(prompt, 1, temperature=1.0) for _ in range(600)]
    out = eng.run()
    counts = np.bincount([out[i][0] for i in ids], minlength=p.size).astype(np.float64)
    expected = p * len(ids)
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:
        obs[-2] += obs[-1]
        exp[-2] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    _, pvalue = stats.chisquare(obs, exp)
    assert pvalue > ALPHA, pvalue


def test_stop_ids_and_budgets(bundled_pair: tuple[Any, Any]) -> None:
    greedy = _alone(bundled_pair, PROMPTS[2], 12)
    stop = greedy[4]
    first = greedy.index(stop)
    eng = _engine(bundled_pair)
    rid = eng.add_request(PROMPTS[2], 12, stop_token_ids=[stop])
    no_draft = eng.add_request(PROMPTS[2], 12, max_drafts=0)
    finished: dict[int, str | None] = {}
    tokens: dict[int, list[int]] = {}
    for u in eng.updates():
        tokens.setdefault(u.request_id, []).extend(u.new_tokens)
        if u.finish_reason is not None:
            finished[u.request_id] = u.finish_reason
            assert u.usage["generated_tokens"] == len(tokens[u.request_id])
    assert tokens[rid] == greedy[: first + 1]
    assert finished[rid] == "stop"
    assert tokens[no_draft] == greedy
    assert finished[no_draft] == "length"


def test_abort_from_another_thread(bundled_pair: tuple[Any, Any]) -> None:
    eng = _engine(bundled_pair)
    long = eng.add_request(PROMPTS[0], 400)
    short = eng.add_request(PROMPTS[1], 8)
    updates = eng.step()
    assert {u.request_id for u in updates} == {long, short}
    t = threading.Thread(target=eng.abort, args=(long,))
    t.start()
    t.join()
    reasons: dict[int, str] = {}
    for u in eng.updates():
        if u.finish_reason is not None:
            reasons[u.request_id] = u.finish_reason
    assert reasons[long] == "aborted"
    assert reasons[short] == "length"
    assert eng.metrics()["requests_aborted"] == 1
    with pytest.raises(dspark.InputError) as e:
        eng.abort(long)
    assert e.value.code == "invalid-argument"


def test_step_timing_adds_up(bundled_pair: tuple[Any, Any]) -> None:
    eng = _engine(bundled_pair)
    for p in PROMPTS:
        eng.add_request(p, 6)
    eng.step()
    assert eng.last_step_timing()["round"] is False  # joining requests' prefill only
    eng.step()
    t = eng.last_step_timing()
    assert t["round"] is True
    parts = ("drafter", "target", "kernels", "overhead")
    assert all(float(t[k]) >= 0.0 for k in parts)
    assert float(t["target"]) > 0.0
    assert abs(sum(float(t[k]) for k in parts) - float(t["total"])) < 1e-9


def test_metrics_count_what_ran(bundled_pair: tuple[Any, Any]) -> None:
    eng = _engine(bundled_pair)
    for p in PROMPTS[:3]:
        eng.add_request(p, 10)
    eng.run()
    m = eng.metrics()
    assert m["requests_added"] == 3 and m["requests_length"] == 3
    assert m["generation_tokens"] == 30
    assert m["requests_running"] == 0 and m["requests_waiting"] == 0
    assert m["num_accepted_tokens"] <= m["num_draft_tokens"]
    assert sum(m["num_accepted_tokens_per_pos"]) == m["num_accepted_tokens"]


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda e: e.add_request([1, 2], -1), "invalid-argument"),
        (lambda e: e.add_request([1, 2], 4, temperature=-1.0), "invalid-argument"),
        (lambda e: e.add_request([1, 2], 4, top_p=0.0), "invalid-argument"),
        (lambda e: e.add_request([1, 2], 4, top_k=0), "invalid-argument"),
        (lambda e: e.add_request([1, 2], 4, seed=-1), "invalid-argument"),
        (lambda e: e.add_request([1, 2], 4, seed=2**64), "too-large"),
        (lambda e: e.add_request([10**7], 4), "token-out-of-range"),
        (lambda e: e.add_request([1], 4, stop_token_ids=[10**7]), "token-out-of-range"),
        (lambda e: e.add_request([], 4), None),
        (lambda e: e.abort(12345), "invalid-argument"),
    ],
)
def test_bad_requests_are_typed(bundled_pair: tuple[Any, Any], call: Any, code: str | None) -> None:
    eng = _engine(bundled_pair)
    with pytest.raises(dspark.DSparkError) as e:
        call(eng)
    if code is not None:
        assert e.value.code == code
    assert not eng.has_work()


def test_a_request_that_can_never_fit_is_refused(bundled_pair: tuple[Any, Any]) -> None:
    eng = _engine(bundled_pair, kv_tokens=16)
    with pytest.raises(dspark.InputError) as e:
        eng.add_request(list(range(3, 30)), 8)
    assert e.value.code == "too-large"
    assert "kv_tokens" in str(e.value)
    assert not eng.has_work()
    eng = _engine(bundled_pair, max_batched_tokens=8)
    with pytest.raises(dspark.InputError) as e:
        eng.add_request(list(range(3, 30)), 8)
    assert e.value.code == "too-large"
    assert "max_batched_tokens" in str(e.value)


@pytest.mark.parametrize(
    "kw",
    [
        {"max_running": 0},
        {"max_batched_tokens": 0},
        {"kv_tokens": 0},
        {"verify": "nope"},
        {"verify": "pipelined"},
        {"num_speculative_tokens": -2},
    ],
)
def test_bad_engine_options_are_typed(bundled_pair: tuple[Any, Any], kw: dict[str, Any]) -> None:
    with pytest.raises(dspark.DSparkError) as e:
        _engine(bundled_pair, **kw)
    assert e.value.code


def test_not_a_target_is_refused(bundled_pair: tuple[Any, Any]) -> None:
    _, drafter = bundled_pair
    with pytest.raises(dspark.DSparkError) as e:
        dspark.Engine(object(), drafter)
    assert e.value.code == "invalid-argument"


# --- torch targets ----------------------------------------------------------------------------


@pytest.mark.torch
def test_hf_target_engine_matches_the_native_one(bundled_pair: tuple[Any, Any]) -> None:
    """The bundled bundled_pair's HF target through the same engine: greedy tokens identical to the
    native target's, with arrivals and a batch cap."""
    from dspark.bundled import load_pair

    hf = load_pair()
    eng = dspark.Engine(hf.target, hf.drafter, max_running=2)
    ids = [eng.add_request(p, 10) for p in PROMPTS[:4]]
    out = eng.run()
    native = _engine(bundled_pair)
    nids = [native.add_request(p, 10) for p in PROMPTS[:4]]
    nout = native.run()
    assert [out[i] for i in ids] == [nout[i] for i in nids]


class _StaticTarget:
    """A protocol target that cannot add or drop cache rows (no ``grow`` / ``retain``)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in ("grow", "retain"):
            raise AttributeError(name)
        return getattr(self._inner, name)


@pytest.mark.torch
def test_a_target_without_grow_and_retain_is_refused() -> None:
    """The engine needs rows to come and go; a static protocol target is refused when the
    engine is built (the Speculator still takes it)."""
    from dspark.bundled import load_pair
    from dspark.target import as_target

    hf = load_pair()
    static = _StaticTarget(as_target(hf.target))
    with pytest.raises(dspark.InputError) as e:
        dspark.Engine(static, hf.drafter)
    assert e.value.code == "invalid-argument"
    assert "grow" in str(e.value)
    tokens = dspark.Speculator(static, hf.drafter).generate([PROMPTS[0]], 6).tokens
    assert len(tokens[0]) == 6


def test_a_warmed_up_speculator_keeps_its_greedy_tokens(bundled_pair: tuple[Any, Any]) -> None:
    """``Speculator.warm_up`` profiles for the scheduler before the first call (the Rust
    suite checks the profile); the tokens are those of full verification; bad sizes are
    typed."""
    target, drafter = bundled_pair
    sp = dspark.Speculator(target, drafter, verify="scheduled")
    sp.warm_up(2)
    full = dspark.Speculator(target, drafter)
    got = sp.generate([list(p) for p in PROMPTS[:2]], 10).tokens
    assert got == full.generate([list(p) for p in PROMPTS[:2]], 10).tokens
    dspark.Speculator(target, drafter).warm_up(3)  # nothing to measure: a no-op
    for bad in (0, -1, 1.5, True):
        with pytest.raises(dspark.InputError):
            sp.warm_up(bad)


def test_warm_up_then_serve_with_the_scheduler(bundled_pair: tuple[Any, Any]) -> None:
    """A warmed-up scheduling engine serves the greedy tokens of any other engine."""
    eng = _engine(bundled_pair, verify="scheduled")
    eng.warm_up(2)
    ids = [eng.add_request(p, 10) for p in PROMPTS[:2]]
    out = eng.run()
    assert [out[i] for i in ids] == [_alone(bundled_pair, p, 10) for p in PROMPTS[:2]]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(dspark.InputError):
            eng.warm_up(bad)


# --- threads: no deadlock, re-entry refused -------------------------------------------------


def _joined(threads: list[threading.Thread], seconds: float) -> bool:
    """Start ``threads`` and wait at most ``seconds`` for all of them."""
    for t in threads:
        t.daemon = True
        t.start()
    for t in threads:
        t.join(seconds)
    return not any(t.is_alive() for t in threads)


@pytest.mark.torch
def test_adding_requests_while_another_thread_steps_an_hf_engine() -> None:
    """``add_request`` from the main thread while a worker runs ``step()`` over an HF target
    (which needs the GIL inside the step): it used to hang for good (the lock was taken with
    the GIL held). Bounded: the test fails instead of hanging."""
    from dspark.bundled import load_pair

    hf = load_pair()
    eng = dspark.Engine(hf.target, hf.drafter, max_running=4)
    eng.add_request(PROMPTS[0], 40)
    stop = threading.Event()
    errors: list[BaseException] = []

    def stepper() -> None:
        try:
            while not stop.is_set():
                if eng.has_work():
                    eng.step()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    worker = threading.Thread(target=stepper, daemon=True)
    worker.start()
    ids = [eng.add_request(p, 6) for p in PROMPTS[1:5]]
    assert len(set(ids)) == 4
    deadline = time.monotonic() + 60
    while eng.has_work() and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    worker.join(30)
    assert not worker.is_alive(), "the stepping thread hung"
    assert not errors, errors
    assert not eng.has_work()


def test_generate_from_four_threads_at_once(bundled_pair: tuple[Any, Any]) -> None:
    """Four Python threads share one speculator (sampled, T = 0.8): every call completes with
    its own tokens (each seeded request equals its run alone)."""
    target, drafter = bundled_pair
    spec = dspark.Speculator(target, drafter, temperature=0.8)
    want = {i: spec.generate([PROMPTS[i]], 12, seed=[100 + i]).tokens[0] for i in range(4)}
    got: dict[int, list[int]] = {}

    def call(i: int) -> None:
        got[i] = spec.generate([PROMPTS[i]], 12, seed=[100 + i]).tokens[0]

    assert _joined([threading.Thread(target=call, args=(i,)) for i in range(4)], 120)
    assert got == want


def test_a_reentrant_call_from_on_round_is_a_typed_error(bundled_pair: tuple[Any, Any]) -> None:
    """An ``on_round`` hook that calls ``generate`` on the same speculator: a typed
    ``invalid-argument`` (never a hang), and the speculator keeps serving."""
    target, drafter = bundled_pair
    spec = dspark.Speculator(target, drafter, temperature=0.8)
    seen: list[BaseException] = []

    def hook(_: object) -> None:
        try:
            spec.generate([PROMPTS[1]], 4)
        except dspark.DSparkError as e:
            seen.append(e)
            raise

    outer: list[BaseException] = []

    def call() -> None:
        try:
            spec.generate([PROMPTS[0]], 8, on_round=hook)
        except dspark.DSparkError as e:
            outer.append(e)

    assert _joined([threading.Thread(target=call)], 60), "the re-entrant call hung"
    assert seen and seen[0].code == "invalid-argument" and "re-entrant" in str(seen[0])
    assert outer, "the hook's error did not end the outer call"
    assert len(spec.generate([PROMPTS[2]], 5).tokens[0]) == 5


class _PoisonedTarget:
    """A protocol target whose rows holding ``poison`` in their input get NaN logits."""

    def __init__(self, inner: Any, poison: int) -> None:
        self._inner = inner
        self._poison = poison

    def forward(self, cache: Any, input_ids: Any, num_tokens: Sequence[int], capture: Any) -> Any:
        import torch

        out = self._inner.forward(cache, input_ids, num_tokens, capture)
        ids = torch.as_tensor(input_ids)
        bad = [r for r, n in enumerate(num_tokens) if bool((ids[r, :n] == self._poison).any())]
        if not bad:
            return out
        logits = out.logits.clone()
        logits[bad] = float("nan")
        return type(out)(logits=logits, hidden_states=out.hidden_states)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.torch
def test_a_request_with_non_finite_logits_fails_alone() -> None:
    """One request's rows go NaN: it ends with ``finish_reason == "error"`` and a code; the
    requests batched with it finish with the tokens they give alone."""
    from dspark.bundled import load_pair
    from dspark.target import as_target

    hf = load_pair()
    poison = 2
    good = [p for p in PROMPTS if poison not in p][:4]
    eng = dspark.Engine(_PoisonedTarget(as_target(hf.target), poison), hf.drafter)
    alone = {}
    for p in good:
        rid = eng.add_request(p, 8)
        alone[tuple(p)] = eng.run()[rid]
        assert poison not in alone[tuple(p)]
    bad = eng.add_request([poison, *PROMPTS[1]], 8)
    ids = {eng.add_request(p, 8): p for p in good}
    tokens: dict[int, list[int]] = {}
    ended: dict[int, Any] = {}
    while eng.has_work():
        for u in eng.step():
            tokens.setdefault(u.request_id, []).extend(u.new_tokens)
            if u.finish_reason is not None:
                ended[u.request_id] = u
    assert ended[bad].finish_reason == "error"
    assert ended[bad].error_code == "non-finite", ended[bad].error
    assert ended[bad].error
    for rid, p in ids.items():
        assert ended[rid].finish_reason == "length"
        assert ended[rid].error is None and ended[rid].error_code is None
        assert tokens[rid] == alone[tuple(p)]
    assert eng.metrics()["requests_failed"] == 1
