"""``dspark.Speculator``: speculative decoding of a torch target with a DSpark drafter.

A round, for every unfinished request at once: the drafter proposes K tokens from its cached
context (anchor = the last committed token); the verify length is chosen (full block, a static
confidence threshold, or the paper's scheduler); the target runs ``[anchor, drafts]`` in ONE
forward; ``dspark.verify`` (exact rejection sampling, greedy at T = 0) commits the accepted
drafts plus one correction/bonus token; the target cache is cropped back to the committed
length and the drafter context is extended with the target features of the accepted positions
(DeepSpec ``verified_target_hidden[:, :accepted+1]``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dspark import kernels
from dspark._args import as_float, as_int, id_list, id_rows
from dspark._errors import raise_error
from dspark._native import CheckpointError, ConfigError, InputError
from dspark.protocols import DRAFTER_MEMBERS
from dspark.target import as_target, check_capture_layers

__all__ = ["GenerationResult", "SpeculationStats", "Speculator", "derive_seeds"]

_MASK63 = (1 << 63) - 1


def derive_seeds(
    seed: int, requests: Sequence[int], positions: Sequence[int], salt: int
) -> list[int]:
    """One 63-bit seed per (request, position, salt): independent streams for every draw."""
    out = []
    for r, p in zip(requests, positions, strict=True):
        z = seed * 0x9E3779B97F4A7C15 + r * 0xBF58476D1CE4E5B9 + p * 0x94D049BB133111EB + salt
        z &= (1 << 64) - 1
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
        out.append((z ^ (z >> 31)) & _MASK63)
    return out


@dataclass
class SpeculationStats:
    """What a :meth:`Speculator.generate` call did.

    Attributes:
        rounds: speculative rounds (one batched draft + verify each).
        request_rounds: sum over requests of the rounds each took part in.
        committed_tokens: tokens committed by rounds (accepted drafts + correction/bonus).
        drafted_tokens: draft tokens sent to verification.
        accepted_tokens: draft tokens accepted.
        position_attempts: per draft position k, how often it was verified after all earlier
            drafts were accepted.
        position_accepts: per draft position k, how often it was then accepted.
        drafter_seconds / target_seconds / kernel_seconds: time split.
        total_seconds: wall time of the call.
    """

    rounds: int = 0
    request_rounds: int = 0
    committed_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    position_attempts: list[int] = field(default_factory=list)
    position_accepts: list[int] = field(default_factory=list)
    drafter_seconds: float = 0.0
    target_seconds: float = 0.0
    kernel_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def acceptance_length(self) -> float:
        """τ: mean tokens committed per request-round (accepted drafts + 1)."""
        return self.committed_tokens / self.request_rounds if self.request_rounds else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """Conditional acceptance rate of draft position k given positions < k were accepted."""
        return [
            a / n if n else float("nan")
            for a, n in zip(self.position_accepts, self.position_attempts, strict=True)
        ]


@dataclass(frozen=True)
class GenerationResult:
    """Generated tokens (prompt excluded), one list per request, and the run's statistics."""

    tokens: list[list[int]]
    stats: SpeculationStats


def _prompts(input_ids: Any, vocab: int) -> list[list[int]]:
    """Prompts as lists of ids in ``[0, vocab)`` (typed errors, see ``_args.id_rows``)."""
    return id_rows(input_ids, "input_ids", vocab)


class Speculator:
    """Speculative decoding of ``target`` with ``drafter``; see the module docstring."""

    def __init__(
        self,
        target: Any,
        drafter: Any,
        *,
        num_speculative_tokens: int | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        verify: str | float = "full",
        steps_per_second: Sequence[tuple[int, float]] | None = None,
    ) -> None:
        """Check the pair and the options (typed errors), nothing runs yet.

        Args:
            target: an HF causal LM or a :class:`dspark.protocols.TargetModel`.
            drafter: any drafter implementing :class:`dspark.protocols.DrafterProtocol`.
            num_speculative_tokens: drafts verified per round (default and maximum: block size).
            temperature, top_k, top_p: the target's sampling (T = 0: greedy).
            seed: base of every random stream (``None``: a fresh random seed).
            verify: ``"full"``, a confidence threshold in ``[0, 1]``, or ``"scheduled"``.
            steps_per_second: ``(verified tokens, steps/s)`` table for ``"scheduled"``.
        """
        missing = [m for m in DRAFTER_MEMBERS if not hasattr(drafter, m)]
        if missing:
            raise_error(InputError, "invalid-argument", f"drafter lacks contract members {missing}")
        self.target = as_target(target)
        self.drafter = drafter
        check_capture_layers(drafter.capture_layer_ids, self.target.num_hidden_layers)
        width = getattr(drafter, "target_hidden_size", None)
        if width is not None and int(width) != self.target.hidden_size:
            raise_error(
                CheckpointError,
                "target-mismatch",
                f"drafter fuses target features of width {width}, target hidden_size is "
                f"{self.target.hidden_size}",
            )
        if int(drafter.target_vocab_size) != self.target.vocab_size:
            raise_error(
                CheckpointError,
                "target-mismatch",
                f"drafter target vocab {drafter.target_vocab_size} != target vocab "
                f"{self.target.vocab_size}",
            )
        k = int(drafter.block_size)
        n = (
            k
            if num_speculative_tokens is None
            else as_int(num_speculative_tokens, "num_speculative_tokens")
        )
        if not 0 <= n <= k:
            raise_error(
                InputError, "invalid-argument", f"num_speculative_tokens {n}: must be in [0, {k}]"
            )
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
        self._check_verify(verify, steps_per_second)
        self.num_speculative_tokens = n
        self.temperature = temperature
        self.top_k = top_k
        self.top_p = top_p
        self.seed = secrets.randbits(62) if seed is None else as_int(seed, "seed", lo=None)
        self.verify = verify
        self.steps_per_second = (
            list(steps_per_second)
            if isinstance(steps_per_second, (list, tuple))
            else steps_per_second
        )

    def _check_verify(self, verify: Any, table: Any) -> None:
        if isinstance(verify, str) and verify == "full":
            return
        is_threshold = isinstance(verify, (int, float)) and not isinstance(verify, bool)
        if not (is_threshold or (isinstance(verify, str) and verify == "scheduled")):
            raise_error(
                InputError,
                "invalid-argument",
                f"verify {verify!r}: 'full', 'scheduled' or a threshold in [0, 1]",
            )
        if not self.drafter.has_confidence_head:
            raise_error(ConfigError, "bad-config", f"verify={verify!r} needs a confidence head")
        if isinstance(verify, str) and verify == "scheduled":
            if table is None or (hasattr(table, "__len__") and len(table) == 0):
                raise_error(
                    InputError, "invalid-argument", "verify='scheduled' needs steps_per_second"
                )
            # The table's own checks (typed errors) now, not in the middle of a generation.
            kernels.schedule_lengths(np.ones((1, 1), np.float32), table)
            return
        if isinstance(verify, bool) or not isinstance(verify, (int, float)) or not 0 <= verify <= 1:
            raise_error(
                InputError,
                "invalid-argument",
                f"verify {verify!r}: 'full', 'scheduled' or a threshold in [0, 1]",
            )

    # ------------------------------------------------------------------------------------
    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int,
        stop_token_ids: Sequence[int] | None = None,
        *,
        on_round: Callable[[list[list[int]]], None] | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` per prompt (a ``[B,S]`` tensor or a list of prompts
        of any lengths), stopping a request after it emits a stop token.

        ``on_round``, if given, is called after the prefill and after every round with the
        tokens each request committed since the previous call (one list per request, possibly
        empty): the hook for streaming. Time spent inside it is not counted in the stats.
        """
        max_new_tokens = as_int(max_new_tokens, "max_new_tokens")
        if on_round is not None and not callable(on_round):
            raise_error(InputError, "invalid-argument", "on_round must be callable")
        vocab = self.target.vocab_size
        prompts = _prompts(input_ids, vocab)
        stops = (
            set()
            if stop_token_ids is None
            else set(id_list(stop_token_ids, "stop_token_ids", vocab))
        )
        run = _Run(self, prompts, max_new_tokens, stops)
        shown = [0] * run.b
        in_hook = 0.0

        def report() -> None:
            nonlocal in_hook
            if on_round is None:
                return
            t = time.perf_counter()
            new = [run.out[i][shown[i] :] for i in range(run.b)]
            shown[:] = [len(o) for o in run.out]
            on_round(new)
            in_hook += time.perf_counter() - t

        t0 = time.perf_counter()
        if max_new_tokens > 0:
            run.prefill()
            report()
            while run.active():
                run.round()
                report()
        run.stats.total_seconds = time.perf_counter() - t0 - in_hook
        return GenerationResult(tokens=run.out, stats=run.stats)


class _Run:
    """The state of one ``generate`` call (per-request lengths, anchors, outputs)."""

    def __init__(self, sp: Speculator, prompts: list[list[int]], budget: int, stops: set[int]):
        self.sp, self.prompts, self.budget, self.stops = sp, prompts, budget, stops
        self.b = len(prompts)
        self.out: list[list[int]] = [[] for _ in prompts]
        self.done = [budget == 0] * self.b
        self.lengths = [len(p) for p in prompts]  # tokens whose target KV is committed
        self.stats = SpeculationStats()
        self.cache: Any = None
        self.states: list[Any] = []

    def active(self) -> list[int]:
        return [i for i in range(self.b) if not self.done[i]]

    def _commit(self, i: int, tokens: list[int]) -> None:
        for t in tokens:
            self.out[i].append(t)
            if t in self.stops or len(self.out[i]) >= self.budget:
                self.done[i] = True
                return

    def _sample_kwargs(self) -> dict[str, Any]:
        sp = self.sp
        return {"temperature": sp.temperature, "top_k": sp.top_k, "top_p": sp.top_p}

    def prefill(self) -> None:
        sp, tgt = self.sp, self.sp.target
        width = max(self.lengths)
        ids = torch.zeros(self.b, width, dtype=torch.long)
        for i, p in enumerate(self.prompts):
            ids[i, : len(p)] = torch.tensor(p)
        t0 = time.perf_counter()
        self.cache = tgt.new_cache(self.b)
        out = tgt.forward(self.cache, ids, self.lengths, sp.drafter.capture_layer_ids)
        t1 = time.perf_counter()
        last = torch.tensor(self.lengths) - 1
        v_t = tgt.vocab_size
        logits = out.logits[torch.arange(self.b), last, :v_t].float().contiguous()[:, None, :]
        seeds = derive_seeds(sp.seed, range(self.b), self.lengths, 0)
        v = kernels.verify(
            logits, torch.zeros(self.b, 0, dtype=torch.long), seed=seeds, **self._sample_kwargs()
        )
        t2 = time.perf_counter()
        feats = out.hidden_states.float()
        for i in range(self.b):
            state = sp.drafter.new_state()
            state.extend(feats[i, : self.lengths[i]].contiguous(), 0)
            self.states.append(state)
        t3 = time.perf_counter()
        self.stats.target_seconds += t1 - t0
        self.stats.kernel_seconds += t2 - t1
        self.stats.drafter_seconds += t3 - t2
        self.anchors = [int(x) for x in v.tokens[:, 0].tolist()]
        for i in range(self.b):
            self._commit(i, [self.anchors[i]])

    def _verify_lengths(self, act: list[int], conf: Any) -> list[int]:
        sp = self.sp
        n = sp.num_speculative_tokens
        if sp.verify == "full" or conf is None:
            lens = [n] * len(act)
        elif sp.verify == "scheduled":
            lens = kernels.schedule_lengths(
                conf[:, :n].float().contiguous(), sp.steps_per_second or []
            )
        else:
            lens = kernels.schedule_threshold(conf[:, :n].float().contiguous(), float(sp.verify))
        # A round commits at most drafts + 1 tokens: never verify past the token budget.
        return [
            min(int(n_i), self.budget - len(self.out[i]) - 1)
            for n_i, i in zip(lens, act, strict=True)
        ]

    def round(self) -> None:
        sp, tgt, st = self.sp, self.sp.target, self.stats
        act = self.active()
        anchors = torch.tensor([self.anchors[i] for i in act])
        pos = [self.lengths[i] for i in act]
        t0 = time.perf_counter()
        prop = sp.drafter.propose_states(
            [self.states[i] for i in act],
            anchors,
            temperature=sp.temperature,
            seed=derive_seeds(sp.seed, act, pos, 1),
        )
        t1 = time.perf_counter()
        lens = self._verify_lengths(act, prop.confidence)
        kmax = max(lens)
        drafts = torch.as_tensor(prop.tokens)[:, :kmax].long()
        ids = torch.zeros(self.b, kmax + 1, dtype=torch.long)
        num = [0] * self.b
        for j, i in enumerate(act):
            ids[i, 0] = self.anchors[i]
            ids[i, 1 : kmax + 1] = drafts[j]
            num[i] = lens[j] + 1
        t2 = time.perf_counter()
        out = tgt.forward(self.cache, ids, num, sp.drafter.capture_layer_ids)
        t3 = time.perf_counter()
        rows = torch.tensor(act)
        logits = out.logits[rows, :, : tgt.vocab_size].float().contiguous()
        q = None
        if sp.temperature > 0.0:
            q = torch.as_tensor(prop.draft_logits)[:, :kmax].float().contiguous()
        v = kernels.verify(
            logits,
            drafts.contiguous(),
            q,
            seed=derive_seeds(sp.seed, act, pos, 2),
            num_draft=lens,
            stop_token_ids=sorted(self.stops) or None,
            **self._sample_kwargs(),
        )
        t4 = time.perf_counter()
        accepted = [int(a) for a in v.num_accepted.tolist()]
        toks = v.tokens.tolist()
        new_lengths = list(self.lengths)
        for j, i in enumerate(act):
            new_lengths[i] = self.lengths[i] + accepted[j] + 1
        tgt.crop(self.cache, new_lengths)
        t5 = time.perf_counter()
        feats = out.hidden_states.float()
        for j, i in enumerate(act):
            a = accepted[j]
            self.states[i].extend(feats[i, : a + 1].contiguous(), self.lengths[i])
            committed = [t for t in toks[j] if t >= 0]
            self._record(lens[j], a, len(committed))
            self._commit(i, committed)
            self.anchors[i] = committed[-1]
        self.lengths = new_lengths
        t6 = time.perf_counter()
        st.rounds += 1
        st.drafter_seconds += (t1 - t0) + (t6 - t5)
        st.target_seconds += t3 - t2
        st.kernel_seconds += (t2 - t1) + (t4 - t3) + (t5 - t4)

    def _record(self, verified: int, accepted: int, committed: int) -> None:
        st = self.stats
        st.request_rounds += 1
        st.committed_tokens += committed
        st.drafted_tokens += verified
        st.accepted_tokens += accepted
        while len(st.position_attempts) < verified:
            st.position_attempts.append(0)
            st.position_accepts.append(0)
        for k in range(min(accepted + 1, verified)):
            st.position_attempts[k] += 1
            st.position_accepts[k] += int(k < accepted)
