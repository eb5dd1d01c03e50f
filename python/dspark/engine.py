"""``dspark.Engine``: the serving engine — requests join, leave and are cancelled between
rounds (continuous batching), each with its own sampling, seed, stop ids, budget and
speculation limit.

A step runs one round over every running request (a joining request's prefill rides the same
target forward on a :class:`dspark.NativeTarget`) with the GIL released. A request's draws
depend only on its own seed and positions: a seeded request gives the same tokens alone, in any
batch, joining mid-run or resumed after a preemption, under every policy (under the default
``verify="scheduled"`` a sampled request with a seed verifies whole blocks in drafted
rounds). Targets must be able to add and drop cache rows (a ``NativeTarget``, an HF model, or
a :class:`dspark.protocols.TargetModel` with ``grow`` and ``retain``).

Example::

    eng = dspark.Engine(target, drafter)  # verify="scheduled", the default
    rid = eng.add_request(prompt_ids, max_new_tokens=64, temperature=0.7, seed=1)
    for u in eng.updates():          # steps until idle, one update per request per step
        print(u.request_id, u.new_tokens, u.finish_reason)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dspark import _native
from dspark._args import as_bool, as_float, as_int, as_seed
from dspark._errors import raise_error
from dspark._native import InputError, RequestUpdate
from dspark.speculator import _engine_pair, _verify_mode

if TYPE_CHECKING:
    import torch

    from dspark._typing import TensorLike
    from dspark.drafter import Drafter
    from dspark.native_target import NativeTarget
    from dspark.protocols import DrafterProtocol, TargetModel

__all__ = ["Engine", "RequestUpdate"]


class Engine:
    """The serving engine over ``target`` and ``drafter`` (see the module docstring)."""

    def __init__(
        self,
        target: NativeTarget | TargetModel[Any] | torch.nn.Module,
        drafter: Drafter | DrafterProtocol[Any],
        *,
        num_speculative_tokens: int | None = None,
        verify: str | float = "scheduled",
        steps_per_second: Sequence[tuple[int, float]] | None = None,
        steps_interpolation: str = "step",
        record_confidence: bool = False,
        max_running: int | None = None,
        max_batched_tokens: int | None = None,
        kv_tokens: int | None = None,
        tokenizer_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """Check the pair, the options and that the target can grow and drop cache rows.

        Args:
            target, drafter, num_speculative_tokens, verify, steps_per_second,
                steps_interpolation, record_confidence: as :class:`dspark.Speculator`.
            max_running: requests in the running batch at most (default 256).
            max_batched_tokens: prompt tokens a step prefills beside the running requests'
                rounds at most (default 8192; a longer prompt is refused at ``add_request``).
            kv_tokens: KV cache tokens the running requests may hold together (default:
                unbounded). A request that could never fit is refused at ``add_request``; when
                the running requests cannot take their next round the newest one is preempted
                and resumes later where it was.
            tokenizer_dir: the target's directory (``tokenizer.json``, ``config.json``, the
                end-of-sequence id), for requests with a ``response_format``; default: a
                :class:`NativeTarget`'s own directory, or an HF model's local
                ``name_or_path``. Read at the first such request.
        """
        self.target, engine_target, native_drafter = _engine_pair(target, drafter)
        self.drafter = drafter
        mode, threshold = _verify_mode(verify, steps_per_second)
        table = list(steps_per_second) if steps_per_second is not None else None
        self._native = _native.Engine(
            engine_target,
            native_drafter,
            num_speculative_tokens=num_speculative_tokens,
            verify=mode,
            threshold=threshold,
            steps_per_second=table if mode in ("scheduled", "pipelined") else None,
            steps_interpolation=steps_interpolation,
            record_confidence=as_bool(record_confidence, "record_confidence"),
            max_running=max_running,
            max_batched_tokens=max_batched_tokens,
            kv_tokens=kv_tokens,
            tokenizer_dir=_tokenizer_dir(target) if tokenizer_dir is None else tokenizer_dir,
        )

    def add_request(
        self,
        prompt_ids: Sequence[int] | TensorLike,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        max_drafts: int | None = None,
        logprobs: int | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repetition_penalty: float = 1.0,
        logit_bias: Mapping[int, float] | None = None,
        response_format: Mapping[str, Any] | None = None,
    ) -> int:
        """Queue a request; returns its id. ``seed``: the request's own seed (the unit of
        reproducibility); ``None`` draws fresh entropy, so unseeded requests are independent
        samples. ``max_drafts``: drafts verified per round at most for this request (``0``: no
        drafting; ``None``: the engine's limit). ``logprobs``: report each new token's
        log-probability with that many likeliest alternatives (0 to 20) in
        :attr:`RequestUpdate.logprobs`: the target's, from the verification rows, under the
        distribution the token was drawn from (the model's own softmax for a greedy request).
        ``presence_penalty`` / ``frequency_penalty`` (in [-2, 2], over the generated tokens),
        ``repetition_penalty`` (> 0, over prompt and generated tokens; 1 off) and
        ``logit_bias`` (token id to a bias in [-100, 100]) change the target distribution at
        each position; speculative output follows the changed distribution exactly.
        ``response_format``: structured output, as ``dspark serve`` takes it (``{"type":
        "json_schema", "json_schema": {"schema": ...}}``, ``json_object``, and the ``regex`` /
        ``grammar`` (Lark) extensions): the request's tokens follow the target restricted to
        the grammar (drafts it refuses are cut before verification). Values out of range, and
        grammars that do not compile, are typed errors naming the field."""
        return int(
            self._native.add_request(
                prompt_ids,
                as_int(max_new_tokens, "max_new_tokens"),
                temperature=as_float(temperature, "temperature"),
                top_k=None if top_k is None else as_int(top_k, "top_k", lo=1),
                top_p=as_float(top_p, "top_p"),
                seed=None if seed is None else as_seed(seed),
                stop_token_ids=stop_token_ids,
                max_drafts=None if max_drafts is None else as_int(max_drafts, "max_drafts"),
                logprobs=None if logprobs is None else as_int(logprobs, "logprobs", lo=0),
                presence_penalty=as_float(presence_penalty, "presence_penalty"),
                frequency_penalty=as_float(frequency_penalty, "frequency_penalty"),
                repetition_penalty=as_float(repetition_penalty, "repetition_penalty"),
                logit_bias=dict(logit_bias) if isinstance(logit_bias, Mapping) else logit_bias,
                response_format=_format_json(response_format),
            )
        )

    def step(self) -> list[RequestUpdate]:
        """One round over every running request (the GIL released): one update per request
        that committed tokens, finished, was aborted or failed (``finish_reason == "error"``,
        with ``error`` and ``error_code``: its own rows failed a check, such as non-finite
        logits; the others run on unchanged)."""
        updates: list[RequestUpdate] = self._native.step()
        return updates

    def abort(self, request_id: int) -> None:
        """Abort a request, from any thread: it ends with ``"aborted"`` at the next step. An
        unknown or finished id is an ``InputError``."""
        self._native.abort(as_int(request_id, "request_id"))

    def has_work(self) -> bool:
        """Whether a step has anything to do."""
        return bool(self._native.has_work())

    @property
    def num_running(self) -> int:
        """Requests in the running batch."""
        return int(self._native.num_running)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for room (new, or preempted)."""
        return int(self._native.num_waiting)

    def warm_up(self, batch: int = 16) -> None:
        """With ``verify="scheduled"`` and no ``steps_per_second``: time the target's
        steps-per-second profile now for ``batch`` concurrent requests (the GIL released), in
        place of the prior from its shape. Optional: the prior and each round's timings need
        no profile. Nothing under other policies."""
        self._native.warm_up(as_int(batch, "batch", lo=1))

    def last_step_timing(self) -> dict[str, float | bool]:
        """Where the last step's time went, in seconds: ``drafter``, ``target`` (forwards),
        ``kernels`` (verify lengths, verification, commit), ``overhead`` (aborts, admission,
        planning, cache edits), ``total``; ``round``: whether it ran a round."""
        return dict(self._native.last_step_timing())

    def metrics(self) -> dict[str, Any]:
        """The engine's counters (named after vLLM's speculative-decoding metrics)."""
        return dict(self._native.metrics())

    def updates(self) -> Iterator[RequestUpdate]:
        """Step until idle, yielding every request's update of every step as it comes (the
        streaming helper: requests may be added or aborted between items)."""
        while self.has_work():
            yield from self.step()

    def run(self) -> dict[int, list[int]]:
        """Step until idle; every request's tokens by id (those that ran in these steps). A
        request that failed keeps the tokens it committed before; :meth:`updates` says why."""
        tokens: dict[int, list[int]] = {}
        for u in self.updates():
            tokens.setdefault(u.request_id, []).extend(u.new_tokens)
        return tokens


def _tokenizer_dir(target: object) -> str | None:
    """A target's own directory, when it has one on disk (a ``NativeTarget``'s path, an HF
    model's local ``name_or_path``)."""
    path = getattr(target, "path", None) or getattr(target, "name_or_path", None)
    return str(path) if path is not None and os.path.isdir(str(path)) else None


def _format_json(response_format: object) -> str | None:
    """``response_format`` as JSON text for the engine (``None`` stays ``None``)."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise_error(
            InputError,
            "invalid-argument",
            f"response_format: expected a mapping, got {type(response_format).__name__}",
        )
    try:
        return json.dumps(dict(response_format))
    except (TypeError, ValueError) as e:
        raise_error(InputError, "invalid-argument", f"response_format: not JSON ({e})")
