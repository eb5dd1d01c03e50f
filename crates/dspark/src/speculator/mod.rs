//! The speculative loop, once, in the engine: [`Speculator`] drives any [`TargetModel`] with any
//! [`Drafter`](crate::Drafter).
//!
//! A round, for every unfinished request of a batch at once:
//! 1. the drafter proposes `K` tokens from its cached context (anchor = the last committed
//!    token, at the position right after the context);
//! 2. the verify length of each request is chosen ([`VerifyPolicy`]: the full block, a static
//!    confidence threshold, or the paper's scheduler), never past the request's token budget;
//! 3. the target runs `[anchor, drafts…]` of every request in ONE forward (ragged: each row
//!    only its own verified length);
//! 4. [`verify_slices`](crate::sampling::verify_slices) commits the accepted drafts plus one
//!    correction or bonus token (greedy at `T = 0`, exact rejection sampling otherwise; an
//!    accepted stop token ends the request);
//! 5. the target cache is truncated to the committed length, and the drafter context is
//!    extended with the target features of the accepted positions (DeepSpec
//!    `verified_target_hidden[:, :accepted + 1]`).
//!
//! Under a scheduling policy (`scheduled`, `pipelined`) a round may also draft nothing: when the
//! scheduler's objective (expected tokens per second, from the measured acceptance and each
//! request's latest confidences, the steps-per-second table and the measured cost of drafting)
//! says one target-only step of
//! every request beats the best drafted round, steps 1-2 are skipped and the round is an
//! autoregressive step whose features still extend the drafter's context (module `drafting`).
//! A large batch on a compute-bound target decodes at target-only speed instead of paying for
//! drafts it cannot afford to verify; a drafted round every [`REFRESH_ROUNDS`] keeps the
//! confidences current.
//!
//! Randomness: request `r`'s draws at position `p` come from counter-based streams keyed by
//! `(seed, r, p, use)` ([`derive_seed`]), so results depend on neither batch order nor thread
//! count. [`target_only`] decodes without a drafter on the same streams (the baseline).
//!
//! Submodules: `target` ([`TargetModel`]), `options`, `stats`, `generation`, `run` (the loop),
//! `drafting` (whether a round drafts, and the round that does not),
//! `state` (one generation's bookkeeping), `autoregressive` ([`target_only`]), `profile`
//! ([`measure_steps_per_second`]), `observed` (what rounds cost, learned while serving: the
//! forward timings that refine a measured table, the costs outside the forward) and
//! [`contract`] (the suite every `TargetModel` passes).

mod autoregressive;
pub mod contract;
mod drafting;
mod generation;
mod observed;
mod options;
mod profile;
mod run;
mod state;
mod stats;
mod target;

pub use autoregressive::target_only;
pub use drafting::{PLAIN_MARGIN, REFRESH_ROUNDS};
pub use generation::{Generation, OnRound, RoundUpdate};
pub use options::{Request, SpeculatorOptions, VerifyPolicy, derive_seed};
pub use profile::{MAX_PROFILE_TOKENS, measure_steps_per_second};
pub use run::Speculator;
pub use stats::{ConfidenceRecord, Stats};
pub use target::{LogitRows, TargetInput, TargetModel, TargetOutput};
