"""User-defined targets and drafters that declare or return the wrong things.

A user ``TargetModel`` (here an HF target behind a wrapper that can lie) or ``DrafterProtocol``
object is read by one typed reader: a member of the wrong type (bool or float where an int is
meant, a string, ``None``), out of range or missing is ``invalid-argument`` / ``too-large``
naming it; a method returning ``None``, an object without its fields, a non-tensor or a tensor
of the wrong shape is ``invalid-argument`` / ``bad-shape`` naming the method; an exception the
user's own code raises reaches the caller unchanged. Never a ``TypeError``, ``OverflowError``
or ``AttributeError`` from dspark, never a panic. The same objects then still work when they
behave (nothing is left half-built).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from strategies import CODES, ODD_SCALARS, PROPS, given, st

import dspark

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

#: A member that is absent (``AttributeError`` on access).
MISSING = object()


class UserBoomError(RuntimeError):
    """The user's own exception: it must reach the caller as itself."""


def _boom() -> None:
    raise UserBoomError("the user's property failed")


#: A member whose getter raises the user's own exception.
RAISES = object()

TARGET_MEMBERS = ("vocab_size", "hidden_size", "num_hidden_layers")


class UserTarget:
    """A protocol target delegating to an :class:`dspark.target.HFTarget`, with members and
    method results replaced by ``over`` (a value, :data:`MISSING`, :data:`RAISES`; for a
    method, a function of the real result)."""

    def __init__(self, inner: Any, **over: Any) -> None:
        self._inner = inner
        self._over = over

    def _member(self, name: str) -> Any:
        v = self._over.get(name, getattr(self._inner, name))
        if v is MISSING:
            raise AttributeError(name)
        if v is RAISES:
            _boom()
        return v

    @property
    def vocab_size(self) -> Any:
        return self._member("vocab_size")

    @property
    def hidden_size(self) -> Any:
        return self._member("hidden_size")

    @property
    def num_hidden_layers(self) -> Any:
        return self._member("num_hidden_layers")

    def _result(self, name: str, real: Callable[[], Any]) -> Any:
        f = self._over.get(name)
        return real() if f is None else f(real)

    def new_cache(self, batch_size: int) -> Any:
        return self._result("new_cache", lambda: self._inner.new_cache(batch_size))

    def forward(self, cache: Any, ids: Any, num: Any, capture: Any) -> Any:
        return self._result("forward", lambda: self._inner.forward(cache, ids, num, capture))

    def crop(self, cache: Any, lengths: Any) -> None:
        self._inner.crop(cache, lengths)

    def grow(self, cache: Any, n: int) -> None:
        self._inner.grow(cache, n)

    def retain(self, cache: Any, keep: Any) -> None:
        self._inner.retain(cache, keep)


class Out:
    """A forward result with the given fields."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


@pytest.fixture(scope="module")
def hf() -> Any:
    from dspark.bundled import load_pair

    return load_pair()


@pytest.fixture(scope="module")
def base(hf: Any) -> Any:
    from dspark.target import as_target

    return as_target(hf.target)


PROMPT = [[5, 17, 300, 2]]


def _generate(target: Any, drafter: Any, **kw: Any) -> list[list[int]]:
    return dspark.Speculator(target, drafter, **kw).generate(PROMPT, 6).tokens


def test_the_wrapper_itself_is_a_working_target(hf: Any, base: Any) -> None:
    assert _generate(UserTarget(base), hf.drafter) == _generate(base, hf.drafter)


@pytest.mark.parametrize("member", TARGET_MEMBERS)
@pytest.mark.parametrize(
    ("value", "code"),
    [
        (-1, "invalid-argument"),
        (0, "invalid-argument"),
        (3000.0, "invalid-argument"),
        (True, "invalid-argument"),
        ("3000", "invalid-argument"),
        (None, "invalid-argument"),
        (MISSING, "invalid-argument"),
        ([3000], "invalid-argument"),
        (2**70, "too-large"),
        (2**40, "too-large"),
    ],
)
def test_bad_target_members_are_typed(
    hf: Any, base: Any, member: str, value: object, code: str
) -> None:
    target = UserTarget(base, **{member: value})
    with pytest.raises(dspark.DSparkError) as e:
        dspark.Speculator(target, hf.drafter)
    assert e.value.code == code, e.value
    assert member in str(e.value), e.value


def test_a_failing_target_property_keeps_the_users_exception(hf: Any, base: Any) -> None:
    for member in TARGET_MEMBERS:
        with pytest.raises(UserBoomError):
            dspark.Speculator(UserTarget(base, **{member: RAISES}), hf.drafter)


@pytest.mark.parametrize("value", ["yes", 1, 0.0, [True]])
def test_a_ragged_flag_that_is_not_a_bool_is_typed(hf: Any, base: Any, value: object) -> None:
    target = UserTarget(base)
    target.ragged = value  # type: ignore[attr-defined]
    with pytest.raises(dspark.InputError) as e:
        dspark.Engine(target, hf.drafter)
    assert e.value.code == "invalid-argument" and "target.ragged" in str(e.value)


def _logits_of(real: Callable[[], Any]) -> Any:
    return real().logits


def _hidden_of(real: Callable[[], Any]) -> Any:
    return real().hidden_states


FORWARD_CASES: list[tuple[str, Callable[[Callable[[], Any]], Any], str]] = [
    ("none", lambda real: None, "invalid-argument"),
    ("int", lambda real: 3, "invalid-argument"),
    ("no fields", lambda real: Out(), "invalid-argument"),
    ("no logits", lambda real: Out(hidden_states=_hidden_of(real)), "invalid-argument"),
    ("no hidden", lambda real: Out(logits=_logits_of(real)), "invalid-argument"),
    (
        "hidden None",
        lambda real: Out(logits=_logits_of(real), hidden_states=None),
        "invalid-argument",
    ),
    (
        "logits a list",
        lambda real: Out(logits=_logits_of(real).tolist(), hidden_states=_hidden_of(real)),
        "invalid-argument",
    ),
    (
        "logits a string",
        lambda real: Out(logits="logits", hidden_states=_hidden_of(real)),
        "invalid-argument",
    ),
    (
        "logits 2-D",
        lambda real: Out(logits=_logits_of(real)[0], hidden_states=_hidden_of(real)),
        "bad-shape",
    ),
    (
        "logits too narrow",
        lambda real: Out(logits=_logits_of(real)[..., :10], hidden_states=_hidden_of(real)),
        "bad-shape",
    ),
    (
        "logits one row short",
        lambda real: Out(logits=_logits_of(real)[:, :-1], hidden_states=_hidden_of(real)),
        "bad-shape",
    ),
    (
        "hidden too wide",
        lambda real: Out(
            logits=_logits_of(real),
            hidden_states=torch.cat([_hidden_of(real), _hidden_of(real)], dim=-1),
        ),
        "bad-shape",
    ),
    (
        "hidden too narrow",
        lambda real: Out(logits=_logits_of(real), hidden_states=_hidden_of(real)[..., :3]),
        "bad-shape",
    ),
    (
        "hidden 2-D",
        lambda real: Out(logits=_logits_of(real), hidden_states=_hidden_of(real)[0]),
        "bad-shape",
    ),
    (
        "logits int",
        lambda real: Out(logits=_logits_of(real).to(torch.int64), hidden_states=_hidden_of(real)),
        "unsupported-dtype",
    ),
]


@pytest.mark.parametrize(
    ("case", "forward", "code"), FORWARD_CASES, ids=[c[0] for c in FORWARD_CASES]
)
def test_bad_forward_results_are_typed(
    hf: Any, base: Any, case: str, forward: Callable[[Callable[[], Any]], Any], code: str
) -> None:
    target = UserTarget(base, forward=forward)
    spec = dspark.Speculator(target, hf.drafter)
    with pytest.raises(dspark.DSparkError) as e:
        spec.generate(PROMPT, 6)
    assert e.value.code == code, f"{case}: {e.value.code}: {e.value}"
    assert "forward" in str(e.value), e.value
    # The same speculator works once the target behaves again.
    target._over.clear()
    assert spec.generate(PROMPT, 6).tokens == _generate(base, hf.drafter)


def test_bad_forward_results_are_typed_in_the_engine(hf: Any, base: Any) -> None:
    target = UserTarget(base, forward=lambda real: None)
    eng = dspark.Engine(target, hf.drafter)
    eng.add_request(PROMPT[0], 4)
    with pytest.raises(dspark.InputError) as e:
        eng.run()
    assert e.value.code == "invalid-argument" and "target.forward" in str(e.value)


def test_a_forward_that_raises_keeps_the_users_exception(hf: Any, base: Any) -> None:
    def fail(real: Callable[[], Any]) -> Any:
        raise UserBoomError("the user's forward failed")

    spec = dspark.Speculator(UserTarget(base, forward=fail), hf.drafter)
    with pytest.raises(UserBoomError):
        spec.generate(PROMPT, 4)


def test_new_cache_returning_none_is_not_a_crash(hf: Any, base: Any) -> None:
    """``None`` as the cache reaches the user's own forward, whose failure is theirs."""
    spec = dspark.Speculator(UserTarget(base, new_cache=lambda real: None), hf.drafter)
    with pytest.raises(Exception) as e:
        spec.generate(PROMPT, 4)
    assert not isinstance(e.value, dspark.InternalError)


@PROPS
@given(
    member=st.sampled_from(TARGET_MEMBERS),
    value=st.one_of(
        st.sampled_from([*ODD_SCALARS, MISSING, None, (), {}, np.int64(-3), np.float64(2.0)]),
        st.integers(-(2**80), 2**80),
        st.floats(allow_nan=True),
        st.text(max_size=3),
    ),
)
def test_any_target_member_ends_typed_or_working(
    hf: Any, base: Any, member: str, value: object
) -> None:
    target = UserTarget(base, **{member: value})
    try:
        dspark.Speculator(target, hf.drafter)
    except dspark.DSparkError as e:
        assert e.code in CODES and e.code != "internal", e


# -- drafters ---------------------------------------------------------------------------------


class UserDrafter:
    """A protocol drafter delegating to a :class:`dspark.TorchDrafter`, with members and
    method results replaced as in :class:`UserTarget`."""

    def __init__(self, inner: Any, **over: Any) -> None:
        self._inner = inner
        self._over = over

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_"):
            return object.__getattribute__(self, name)
        over = self._over
        if name in over and name not in ("propose_states", "new_state", "propose"):
            v = over[name]
            if v is MISSING:
                raise AttributeError(name)
            if v is RAISES:
                _boom()
            return v
        real = getattr(self._inner, name)
        if name in over:
            f = over[name]

            def call(*a: Any, **k: Any) -> Any:
                return f(lambda: real(*a, **k))

            return call
        return real


@pytest.fixture(scope="module")
def torch_drafter(hf: Any) -> Any:
    from dspark.bundled import bundled_dir

    return dspark.TorchDrafter.from_pretrained(bundled_dir() / "drafter", hf.target)


DRAFTER_MEMBER_CASES: list[tuple[str, object, str]] = [
    ("block_size", 0, "invalid-argument"),
    ("block_size", 4.0, "invalid-argument"),
    ("block_size", True, "invalid-argument"),
    ("block_size", None, "invalid-argument"),
    ("block_size", 2**40, "too-large"),
    ("vocab_size", -5, "invalid-argument"),
    ("target_vocab_size", "3000", "invalid-argument"),
    ("noise_token_id", 10**9, "too-large"),
    ("noise_token_id", 1.5, "invalid-argument"),
    ("has_confidence_head", 1, "invalid-argument"),
    ("has_own_lm_head", "yes", "invalid-argument"),
    ("sample_from_anchor", None, "invalid-argument"),
    ("capture_layer_ids", [1.5], "invalid-argument"),
    ("capture_layer_ids", None, "invalid-argument"),
    ("capture_layer_ids", [-1], "invalid-argument"),
    ("target_layer_ids", ["a"], "invalid-argument"),
    ("target_layer_ids", MISSING, "invalid-argument"),
]


@pytest.mark.parametrize(("member", "value", "code"), DRAFTER_MEMBER_CASES)
def test_bad_drafter_members_are_typed(
    base: Any, torch_drafter: Any, member: str, value: object, code: str
) -> None:
    drafter = UserDrafter(torch_drafter, **{member: value})
    with pytest.raises(dspark.DSparkError) as e:
        dspark.Speculator(base, drafter)
    assert e.value.code == code, e.value
    assert member in str(e.value), e.value


def test_the_drafter_wrapper_itself_works(base: Any, torch_drafter: Any) -> None:
    assert _generate(base, UserDrafter(torch_drafter)) == _generate(base, torch_drafter)


def _proposal(real: Callable[[], Any], **changes: Any) -> Any:
    from dataclasses import replace

    return replace(real(), **changes)


PROPOSE_CASES: list[tuple[str, Callable[[Callable[[], Any]], Any], str]] = [
    ("none", lambda real: None, "invalid-argument"),
    ("no fields", lambda real: Out(), "invalid-argument"),
    ("tokens a string", lambda real: _proposal(real, tokens="abc"), "invalid-argument"),
    ("tokens None", lambda real: _proposal(real, tokens=None), "invalid-argument"),
    ("tokens 1-D", lambda real: _proposal(real, tokens=real().tokens[0]), "bad-shape"),
    (
        "tokens out of vocab",
        lambda real: _proposal(real, tokens=real().tokens + 10**6),
        "token-out-of-range",
    ),
    (
        "tokens float",
        lambda real: _proposal(real, tokens=real().tokens.float()),
        "unsupported-dtype",
    ),
    (
        "draft logits too short",
        lambda real: _proposal(real, draft_logits=real().draft_logits[:, :1]),
        "bad-shape",
    ),
]


@pytest.mark.parametrize(
    ("case", "propose", "code"), PROPOSE_CASES, ids=[c[0] for c in PROPOSE_CASES]
)
def test_bad_proposals_are_typed(
    base: Any, torch_drafter: Any, case: str, propose: Callable[..., Any], code: str
) -> None:
    drafter = UserDrafter(torch_drafter, propose_states=propose)
    spec = dspark.Speculator(base, drafter)
    with pytest.raises(dspark.DSparkError) as e:
        spec.generate(PROMPT, 6)
    assert e.value.code == code, f"{case}: {e.value.code}: {e.value}"
    assert "propose" in str(e.value), e.value


def test_new_state_returning_none_is_typed(base: Any, torch_drafter: Any) -> None:
    spec = dspark.Speculator(base, UserDrafter(torch_drafter, new_state=lambda real: None))
    with pytest.raises(dspark.InputError) as e:
        spec.generate(PROMPT, 4)
    assert e.value.code == "invalid-argument" and "new_state" in str(e.value)
