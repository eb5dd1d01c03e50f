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
//! Randomness: request `r`'s draws at position `p` come from counter-based streams keyed by
//! `(seed, r, p, use)` ([`derive_seed`]), so results depend on neither batch order nor thread
//! count. [`target_only`] decodes without a drafter on the same streams (the baseline).
//!
//! Submodules: `target` ([`TargetModel`]), `options`, `stats`, `generation`, `run` (the loop),
//! `state` (one generation's bookkeeping), `autoregressive` ([`target_only`]), `profile`
//! ([`measure_steps_per_second`]) and [`contract`] (the suite every `TargetModel` passes).

mod autoregressive;
pub mod contract;
mod generation;
mod options;
mod profile;
mod run;
mod state;
mod stats;
mod target;

pub use autoregressive::target_only;
pub use generation::{Generation, OnRound, RoundUpdate};
pub use options::{Request, SpeculatorOptions, VerifyPolicy, derive_seed};
pub use profile::measure_steps_per_second;
pub use run::Speculator;
pub use stats::{ConfidenceRecord, Stats};
pub use target::{LogitRows, TargetInput, TargetModel, TargetOutput};
