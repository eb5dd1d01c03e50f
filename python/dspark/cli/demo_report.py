"""What ``dspark demo`` reports: each prompt's measurements, their aggregate (the JSON summary
and the closing lines) and the per-position acceptance plot.

Every figure pools the prompts: τ is tokens committed per request-round over every round,
per-position acceptance counts position k's attempts and accepts over every round, tokens/s
divides all new tokens by all decoding time. The same figures are also given without the
continuations that loop (distinct 4-gram ratio below :data:`LOOP_RATIO`): a loop is easy to
draft, so it inflates τ.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark._errors import raise_error
from dspark._files import check_output_file, write_atomic
from dspark._native import InputError
from dspark.cli.terminal import distinct_ngrams

if TYPE_CHECKING:
    from dspark.speculator import SpeculationStats

__all__ = [
    "LOOP_RATIO",
    "PromptRun",
    "Totals",
    "check_plot",
    "plot_acceptance",
    "rounded_4gram_ratio",
]

#: A continuation whose distinct 4-gram ratio is below this is counted as looping.
LOOP_RATIO = 0.5


def rounded_4gram_ratio(tokens: list[int]) -> float | None:
    """Distinct 4-grams / 4-grams of ``tokens`` to 4 decimals, as reported (``None``: fewer
    than 4 tokens)."""
    distinct, total = distinct_ngrams(tokens, 4)
    return round(distinct / total, 4) if total else None


@dataclass
class PromptRun:
    """One prompt, decoded speculatively and then by the target alone."""

    name: str
    prompt_tokens: int
    tokens: list[int]
    stats: SpeculationStats
    seconds: float
    target_tokens: list[int]
    target_seconds: float

    @property
    def distinct_4gram_ratio(self) -> float | None:
        """Distinct 4-grams / 4-grams of the speculative continuation, rounded as reported."""
        return rounded_4gram_ratio(self.tokens)

    def row(self, greedy: bool) -> dict[str, Any]:
        """This prompt's entry of the summary's ``per_prompt`` list."""
        secs = self.seconds
        return {
            "name": self.name,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": len(self.tokens),
            "acceptance_length": round(self.stats.acceptance_length, 4),
            "tokens_per_second": round(len(self.tokens) / secs, 2) if secs > 0 else None,
            "distinct_4gram_ratio": self.distinct_4gram_ratio,
            "greedy_matches_target": self.tokens == self.target_tokens if greedy else None,
        }


def _fmt_rate(a: float) -> str:
    return "-" if math.isnan(a) else f"{a:.2f}"


@dataclass
class Totals:
    """The aggregate of every prompt's run (see the module docstring)."""

    runs: list[PromptRun]
    block_size: int
    greedy: bool

    @property
    def new_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.runs)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.runs)

    @property
    def target_new_tokens(self) -> int:
        return sum(len(r.target_tokens) for r in self.runs)

    @property
    def target_seconds(self) -> float:
        return sum(r.target_seconds for r in self.runs)

    @property
    def request_rounds(self) -> int:
        return sum(r.stats.request_rounds for r in self.runs)

    @property
    def rounds(self) -> int:
        return sum(r.stats.rounds for r in self.runs)

    @property
    def plain_rounds(self) -> int:
        """Rounds the scheduling policy ran as plain target steps (no drafting)."""
        return sum(r.stats.plain_rounds for r in self.runs)

    def policy_line(self, verify: object) -> str:
        """Which verify policy ran and what it chose."""
        if verify != "scheduled":
            return f"policy                {verify}: every round drafted"
        plain, rounds = self.plain_rounds, self.rounds
        if plain == 0:
            return (
                f"policy                scheduled: all {rounds} rounds drafted (drafting paid "
                "every round)"
            )
        return (
            f"policy                scheduled: {plain} of {rounds} rounds were plain target "
            "steps (the cost model found drafting slower there than the target alone)"
        )

    @property
    def acceptance_length(self) -> float:
        """τ over every round of every prompt."""
        committed = sum(r.stats.committed_tokens for r in self.runs)
        rounds = self.request_rounds
        return committed / rounds if rounds else 0.0

    @property
    def per_position(self) -> list[float]:
        """Position k's acceptance given the positions before it, trailing unreached cut."""
        att = [0] * self.block_size
        acc = [0] * self.block_size
        for r in self.runs:
            pairs = zip(r.stats.position_attempts, r.stats.position_accepts, strict=False)
            for pos, (a, b) in enumerate(pairs):
                att[pos] += a
                acc[pos] += b
        per_pos = [a / b if b else float("nan") for a, b in zip(acc, att, strict=True)]
        while per_pos and math.isnan(per_pos[-1]):
            per_pos.pop()
        return per_pos

    @property
    def tokens_per_second(self) -> float:
        secs = self.seconds
        return self.new_tokens / secs if secs > 0 else float("nan")

    @property
    def target_tokens_per_second(self) -> float:
        secs = self.target_seconds
        return self.target_new_tokens / secs if secs > 0 else float("nan")

    @property
    def matches(self) -> list[bool]:
        """Per prompt: the speculative continuation equals the target-only one."""
        return [r.tokens == r.target_tokens for r in self.runs]

    @property
    def distinct_4gram_ratio(self) -> float | None:
        grams = [distinct_ngrams(r.tokens, 4) for r in self.runs]
        total = sum(t for _, t in grams)
        return sum(d for d, _ in grams) / total if total else None

    def non_repeating(self) -> dict[str, Any]:
        """τ and the speedup over the continuations that do not loop (when some do)."""
        fresh = [
            r
            for r in self.runs
            if r.distinct_4gram_ratio is not None and r.distinct_4gram_ratio >= LOOP_RATIO
        ]
        out: dict[str, Any] = {"prompts": len(fresh), "distinct_4gram_ratio_min": LOOP_RATIO}
        if fresh and len(fresh) < len(self.runs):
            f_tau = sum(r.stats.committed_tokens for r in fresh) / max(
                1, sum(r.stats.request_rounds for r in fresh)
            )
            f_tps = sum(len(r.tokens) for r in fresh) / sum(r.seconds for r in fresh)
            f_ref = sum(len(r.target_tokens) for r in fresh) / sum(r.target_seconds for r in fresh)
            out["acceptance_length"] = round(f_tau, 4)
            out["speedup_vs_target_only"] = round(f_tps / f_ref, 3)
        return out

    def summary(self, settings: dict[str, Any], threads: int) -> dict[str, Any]:
        """The JSON summary (``settings``: the options the run was made with)."""
        per_pos = self.per_position
        spec_tps, ref_tps = self.tokens_per_second, self.target_tokens_per_second
        distinct = self.distinct_4gram_ratio
        return {
            "acceptance_length": round(self.acceptance_length, 4),
            "per_position_acceptance": [None if math.isnan(a) else round(a, 4) for a in per_pos],
            "tokens_per_second": round(spec_tps, 2),
            "target_only_tokens_per_second": round(ref_tps, 2),
            "speedup_vs_target_only": round(spec_tps / ref_tps, 3),
            "greedy_matches_target": all(self.matches) if self.greedy else None,
            "prompts": len(self.runs),
            "prompt_names": [r.name for r in self.runs],
            "held_out": settings["held_out"],
            "distinct_4gram_ratio": None if distinct is None else round(distinct, 4),
            "non_repeating": self.non_repeating(),
            "new_tokens": self.new_tokens,
            "target_only_new_tokens": self.target_new_tokens,
            "prompt_tokens": sum(r.prompt_tokens for r in self.runs),
            "max_new_tokens": settings["max_new_tokens"],
            "rounds": self.rounds,
            "plain_rounds": self.plain_rounds,
            "block_size": self.block_size,
            "verify": settings["verify"],
            "temperature": settings["temperature"],
            "top_p": settings["top_p"],
            "seed": settings["seed"],
            "threads": threads,
            "per_prompt": [r.row(self.greedy) for r in self.runs],
        }

    def lines(self, measured: str, speedup: float, verify: object = "full") -> list[str]:
        """The closing lines printed after the continuations (``verify``: the policy)."""
        k = self.block_size
        matches = self.matches
        distinct = self.distinct_4gram_ratio
        non_repeating = self.non_repeating()
        lines = [
            f"measured: {measured}",
            f"acceptance length τ   {self.acceptance_length:.2f} tokens/round (max {k + 1}; "
            f"{self.request_rounds} rounds)",
            "per-position accept   " + " ".join(_fmt_rate(a) for a in self.per_position),
            f"speculative           {self.tokens_per_second:8.1f} tok/s ({self.new_tokens} "
            f"tokens, {self.seconds:.2f} s)",
            f"target only           {self.target_tokens_per_second:8.1f} tok/s "
            f"({self.target_new_tokens} tokens, {self.target_seconds:.2f} s)",
            f"speedup               {speedup:.2f}x",
            self.policy_line(verify),
            "greedy == target-only "
            + (
                f"{'yes' if all(matches) else 'NO'} ({sum(matches)}/{len(matches)} prompts)"
                if self.greedy
                else "n/a (sampling)"
            ),
            "distinct 4-grams      "
            + ("-" if distinct is None else f"{distinct:.2f}")
            + " (1.00: no 4-token sequence repeats within a continuation)",
        ]
        fresh = int(non_repeating["prompts"])
        loops = len(self.runs) - fresh
        if "acceptance_length" in non_repeating:
            lines.append(
                f"without the {loops} looping continuation{'s' * (loops != 1)} (distinct 4-grams "
                f"< {LOOP_RATIO:.2f}): τ {non_repeating['acceptance_length']:.2f}, speedup "
                f"{non_repeating['speedup_vs_target_only']:.2f}x over {fresh} prompts"
            )
        elif loops:
            lines.append(f"every continuation loops (distinct 4-grams < {LOOP_RATIO:.2f})")
        if speedup < 1.0 and self.request_rounds and self.target_new_tokens:
            # Said, not hidden: what a round costs against what it commits.
            step = self.target_seconds / self.target_new_tokens
            cost = self.seconds / self.request_rounds / step
            pad = " " * 22
            lines += [
                f"why below 1x          a round (drafting, then verifying up to {k + 1} tokens) "
                f"costs {cost:.1f} target-only steps",
                f"{pad}and commits τ {self.acceptance_length:.2f}: this target is too cheap per "
                "token for speculation to pay here",
                f"{pad}(a busy machine adds to it); --target-backend hf, or a memory-bound "
                "target (dspark make-example",
                f"{pad}--memory-bound), shows where it pays",
            ]
        return lines


def check_plot(path: Path | None) -> None:
    """Typed errors for a ``--plot`` path that cannot be written, before anything runs."""
    if path is None:
        return
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise_error(InputError, "invalid-argument", f"--plot {path}: use a .png, .svg or .pdf name")
    check_output_file(path, "--plot")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise_error(
            InputError,
            "invalid-argument",
            "--plot needs matplotlib (pip install matplotlib, or dspark[bench])",
        )


def plot_acceptance(per_position: list[float], path: Path, title: str) -> None:
    """Bar chart of per-position acceptance (conditional) with the cumulative survival line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(1, len(per_position) + 1))
    rates = [0.0 if math.isnan(a) else a for a in per_position]
    survival, s = [], 1.0
    for a in rates:
        s *= a
        survival.append(s)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(xs, rates, color="tab:green", label="accepted | earlier drafts accepted")
    ax.plot(xs, survival, marker="o", color="black", label="reached and accepted (cumulative)")
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance")
    ax.set_ylim(0, 1)
    ax.set_xticks(xs)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lower().lstrip("."), dpi=120)
    plt.close(fig)
    write_atomic(path, buf.getvalue())
