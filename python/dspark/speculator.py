"""``dspark.Speculator``: speculative decoding with a DSpark drafter, the loop run by the engine.

The round loop lives in the Rust engine (``dspark::speculator``), once for every kind of target
and drafter: the drafter proposes K tokens from its cached context (anchor = the last committed
token); the verify length is chosen (full block, a static confidence threshold, or the paper's
scheduler); the target runs ``[anchor, drafts]`` in ONE forward; exact rejection sampling
(greedy at T = 0) commits the accepted drafts plus one correction/bonus token; the target cache
is cropped back to the committed length and the drafter context is extended with the target
features of the accepted positions.

Targets: a :class:`dspark.NativeTarget` (candle, no Python in the loop at all), an HF causal LM
(wrapped in :class:`dspark.HFTarget`) or any :class:`dspark.protocols.TargetModel`: one Python
call per round for the forward (and one for the crop). Drafters: :class:`dspark.Drafter` runs
natively; any other :class:`dspark.protocols.DrafterProtocol` (``dspark.TorchDrafter``) is called
once per round. The GIL is released while the engine works.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from dspark import _native
from dspark._args import as_bool, as_float, as_int, as_seed, id_list, id_rows
from dspark._errors import raise_error
from dspark._native import InputError
from dspark.protocols import DRAFTER_MEMBERS

if TYPE_CHECKING:
    import torch

    from dspark._typing import TensorLike
    from dspark.drafter import Drafter
    from dspark.native_target import NativeTarget
    from dspark.protocols import DrafterProtocol, TargetModel

#: A streaming hook: called with each request's newly committed tokens.
OnRound: TypeAlias = "Callable[[list[list[int]]], object]"

__all__ = ["GenerationResult", "SpeculationStats", "Speculator"]


#: What a :meth:`Speculator.generate` call did (the engine's statistics, read-only): rounds,
#: ``plain_rounds`` (rounds a scheduling policy drafted nothing in), ``request_rounds``,
#: ``committed_tokens``, ``drafted_tokens``, ``accepted_tokens``, ``position_attempts`` /
#: ``position_accepts`` (per draft position), the time split (``drafter_seconds``,
#: ``target_seconds``, ``kernel_seconds``, ``total_seconds``, ``prefill_seconds``),
#: ``confidence_records`` (with ``record_confidence=True``), and the derived
#: ``acceptance_length`` (τ) and ``per_position_acceptance``, computed by the engine.
SpeculationStats = _native.SpeculationStats


@dataclass(frozen=True)
class GenerationResult:
    """Generated tokens (prompt excluded), one list per request, and the run's statistics."""

    tokens: list[list[int]]
    stats: SpeculationStats


def _engine_target(target: object) -> tuple[object, _native.NativeTarget | TargetModel[Any]]:
    """``(front object, engine-side target)``: a ``NativeTarget`` runs natively; anything else
    goes through the :class:`dspark.protocols.TargetModel` protocol (HF models wrapped)."""
    native = getattr(target, "_native_target", target)
    if isinstance(native, _native.NativeTarget):
        return target, native
    from dspark.target import as_target  # the torch path

    wrapped = as_target(target)
    return wrapped, wrapped


class Speculator:
    """Speculative decoding of ``target`` with ``drafter``; see the module docstring."""

    def __init__(
        self,
        target: NativeTarget | TargetModel[Any] | torch.nn.Module,
        drafter: Drafter | DrafterProtocol[Any],
        *,
        num_speculative_tokens: int | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        verify: str | float = "scheduled",
        steps_per_second: Sequence[tuple[int, float]] | None = None,
        steps_interpolation: str = "step",
        record_confidence: bool = False,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        logit_bias: Mapping[int, float] | None = None,
    ) -> None:
        """Check the pair and the options (typed errors), nothing runs yet.

        Args:
            target: a :class:`dspark.NativeTarget`, an HF causal LM, or a
                :class:`dspark.protocols.TargetModel`.
            drafter: :class:`dspark.Drafter` or any :class:`dspark.protocols.DrafterProtocol`.
            num_speculative_tokens: drafts verified per round (default and maximum: block size).
            temperature, top_k, top_p: the target's sampling (T = 0: greedy).
            seed: the call-level seed, an int in ``[0, 2**64)``: request ``i`` of a call
                without its own seed draws from a stream derived from (seed, i), so the rows
                of a call are independent samples that repeat with the seed. ``None``: such
                requests draw fresh entropy (every call samples anew). A negative seed is
                ``invalid-argument``, a larger one ``too-large``.
            verify: ``"scheduled"`` (the default: the paper's scheduler on a cost model that
                needs no profile, which also takes plain target steps where drafting would not
                pay; see ``docs/scheduling.md``), ``"full"``, a confidence threshold in
                ``[0, 1]``, or ``"pipelined"``.
            steps_per_second: ``(verified tokens, steps/s)`` table of the target's forward for
                ``"scheduled"`` (when not given: a prior from the target's shape and this
                machine's speed, refined by every round's timings, kept by this speculator)
                and ``"pipelined"`` (required). The scheduler adds what each
                round costs outside that forward (drafting, kernels; the mean of the call's
                earlier rounds) to every entry.
            steps_interpolation: how ``steps_per_second`` reads between its sizes: ``"step"``
                (the value at the next profiled size, as a target padded to capture sizes
                runs: SGLang's tables) or ``"linear"`` (a ragged target, such as
                :class:`NativeTarget`, whose cost follows the token count; the scheduler's
                early stop then does not halt at the first step of a sparse table).
            record_confidence: keep every verified slot's confidence and outcome in
                ``stats.confidence_records`` (what ``dspark calibrate`` fits on).
            presence_penalty, frequency_penalty, repetition_penalty, logit_bias: change the
                target distribution of every request at each position from the tokens before
                it, as :meth:`dspark.Engine.add_request` does (output follows the changed
                distribution exactly; :meth:`generate_target_only` applies them too).
        """
        self.target, engine_target, native_drafter = _engine_pair(target, drafter)
        self.drafter = drafter
        # At most the drafter's block: the engine checks it against the block it reads.
        n = None
        if num_speculative_tokens is not None:
            n = as_int(num_speculative_tokens, "num_speculative_tokens")
        temperature = as_float(temperature, "temperature")
        if not temperature >= 0.0:
            raise_error(InputError, "invalid-argument", f"temperature {temperature}: must be >= 0")
        if top_k is not None:
            top_k = as_int(top_k, "top_k", lo=None, hi=2**64 - 1)
            if top_k < 1:
                raise_error(InputError, "invalid-argument", f"top_k {top_k}: must be >= 1")
        if top_p is not None:
            top_p = as_float(top_p, "top_p")
            if not 0.0 < top_p <= 1.0:
                raise_error(InputError, "invalid-argument", f"top_p {top_p}: must be in (0, 1]")
        mode, threshold = _verify_mode(verify, steps_per_second)
        self.seed = None if seed is None else as_seed(seed)
        self.verify = verify
        self.steps_per_second = (
            list(steps_per_second)
            if isinstance(steps_per_second, (list, tuple))
            else steps_per_second
        )
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self._native = _native.Speculator(
            engine_target,
            native_drafter,
            num_speculative_tokens=n,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=self.seed,
            verify=mode,
            threshold=threshold,
            steps_per_second=self.steps_per_second if mode in ("scheduled", "pipelined") else None,
            steps_interpolation=steps_interpolation,
            record_confidence=as_bool(record_confidence, "record_confidence"),
            presence_penalty=as_float(presence_penalty, "presence_penalty"),
            frequency_penalty=as_float(frequency_penalty, "frequency_penalty"),
            repetition_penalty=as_float(repetition_penalty, "repetition_penalty"),
            logit_bias=dict(logit_bias) if isinstance(logit_bias, Mapping) else logit_bias,
        )
        self.num_speculative_tokens = self._native.num_speculative_tokens

    def generate(
        self,
        input_ids: TensorLike,
        max_new_tokens: int,
        stop_token_ids: Sequence[int] | TensorLike | None = None,
        *,
        on_round: OnRound | None = None,
        seed: int | Sequence[int] | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` per prompt (a ``[B,S]`` tensor or a list of prompts
        of any lengths), stopping a request after it emits a stop token.

        ``on_round``, if given, is called after the prefill and after every round with the
        tokens each request committed since the previous call (one list per request, possibly
        empty): the hook for streaming. Time spent inside it is not counted in the stats, and
        an exception it raises ends the call.

        ``seed``: one per request (each request's own seed, the unit of reproducibility), or
        one int for the call (request ``i`` then draws from (seed, i)); default: the
        speculator's. A request's draws depend only on its seed and positions, never on the
        batch: the same
        prompt and seed give the same tokens alone, reversed or in any batch, under every
        policy (a sampled request with a seed verifies whole blocks in drafted rounds under the
        scheduling policies; see ``docs/python-api.md``).
        """
        return self._run(input_ids, max_new_tokens, stop_token_ids, on_round, seed, False)

    def generate_target_only(
        self,
        input_ids: TensorLike,
        max_new_tokens: int,
        stop_token_ids: Sequence[int] | TensorLike | None = None,
        *,
        on_round: OnRound | None = None,
        seed: int | Sequence[int] | None = None,
    ) -> GenerationResult:
        """The baseline: the target alone, same options, seeds and stop rules (greedy output
        equals :meth:`generate`'s)."""
        return self._run(input_ids, max_new_tokens, stop_token_ids, on_round, seed, True)

    def warm_up(self, batch: int = 16) -> None:
        """With ``verify="scheduled"`` and no ``steps_per_second``: time the target's
        steps-per-second profile now for ``batch`` concurrent requests (the GIL released), in
        place of the prior from its shape. Optional: the prior and each round's timings need
        no profile. Nothing under other policies."""
        self._native.warm_up(as_int(batch, "batch", lo=1))

    def _run(
        self,
        input_ids: object,
        max_new_tokens: object,
        stop_token_ids: object,
        on_round: OnRound | None,
        seed: int | Sequence[int] | None,
        target_only: bool,
    ) -> GenerationResult:
        count = as_int(max_new_tokens, "max_new_tokens")
        if on_round is not None and not callable(on_round):
            raise_error(InputError, "invalid-argument", "on_round must be callable")
        vocab = int(self._native_vocab())
        prompts = id_rows(input_ids, "input_ids", vocab)
        stops = None if stop_token_ids is None else id_list(stop_token_ids, "stop_token_ids", vocab)
        seeds: int | list[int] | None
        if seed is None:
            seeds = self.seed
        elif isinstance(seed, (list, tuple)):
            seeds = [as_seed(x) for x in seed]
            if len(seeds) != len(prompts):
                raise_error(
                    InputError,
                    "bad-shape",
                    f"seed: {len(seeds)} seeds for {len(prompts)} prompts",
                )
        else:
            seeds = as_seed(seed)
        tokens, stats = self._native.generate(prompts, count, stops, on_round, seeds, target_only)
        return GenerationResult(tokens=tokens, stats=stats)

    def _native_vocab(self) -> int:
        return self._native.vocab_size


def _engine_pair(
    target: object, drafter: object
) -> tuple[object, _native.NativeTarget | TargetModel[Any], object]:
    """Check that ``drafter`` has every contract member; then ``(front target, engine-side
    target, engine-side drafter)`` (see :func:`_engine_target`; a :class:`dspark.Drafter` runs
    natively, any other drafter through the protocol)."""
    missing = [m for m in DRAFTER_MEMBERS if not hasattr(drafter, m)]
    if missing:
        raise_error(InputError, "invalid-argument", f"drafter lacks contract members {missing}")
    front, engine_target = _engine_target(target)
    native_drafter = getattr(drafter, "_native", None)
    if not isinstance(native_drafter, _native.Drafter):
        native_drafter = drafter
    return front, engine_target, native_drafter


def _verify_mode(verify: object, steps_per_second: object) -> tuple[str, float | None]:
    """``(mode, threshold)`` of a ``verify`` argument (typed errors; ``"pipelined"`` needs a
    ``steps_per_second`` table)."""
    if isinstance(verify, str) and verify in ("full", "scheduled", "pipelined"):
        if verify == "pipelined" and steps_per_second is None:
            raise_error(InputError, "invalid-argument", "verify='pipelined' needs steps_per_second")
        return verify, None
    if isinstance(verify, (int, float)) and not isinstance(verify, bool) and 0 <= verify <= 1:
        return "threshold", float(verify)
    raise_error(
        InputError,
        "invalid-argument",
        f"verify {verify!r}: 'full', 'scheduled', 'pipelined' or a threshold in [0, 1]",
    )
