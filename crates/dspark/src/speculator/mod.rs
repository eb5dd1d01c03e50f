//! The batch API: [`Speculator`] decodes a batch of requests to the end on the serving
//! [`Engine`](crate::engine::Engine) (add every request, then step until done), and
//! [`target_only`] is the same without a drafter (the baseline).
//!
//! A round, for every running request at once (see [`crate::engine`] for the whole step):
//! 1. the drafter proposes `K` tokens from its cached context (anchor = the last committed
//!    token, at the position right after the context);
//! 2. the verify length of each request is chosen ([`VerifyPolicy`]: the full block, a static
//!    confidence threshold, or the paper's scheduler), never past the request's budget;
//! 3. the target runs `[anchor, drafts…]` of every request in ONE forward (ragged: each row
//!    only its own verified length);
//! 4. rejection sampling commits the accepted drafts plus one correction or bonus token
//!    (greedy at `T = 0`, exact otherwise; an accepted stop token ends the request);
//! 5. the target cache is truncated to the committed length, and the drafter context is
//!    extended with the target features of the accepted positions.
//!
//! Randomness: a request's draws at position `p` come from counter-based streams keyed by
//! `(its seed, p, use)` ([`derive_seed`]), so its tokens depend on neither batch order, batch
//! mates nor thread count.
//!
//! Submodules: `options` ([`SpeculatorOptions`], [`Request`]), `stats`, `generation`,
//! `batch` ([`Speculator`]), `autoregressive` ([`target_only`]). The target contract
//! ([`TargetModel`]) lives in [`crate::models`] and is re-exported here.

mod autoregressive;
mod batch;
mod generation;
mod options;
mod stats;

pub use crate::engine::ConfidenceRecord;
pub use crate::engine::{PENDING_BYTES, PENDING_CAP, derive_seed};
pub use crate::models::{LogitRows, TargetInput, TargetModel, TargetOutput, contract};
pub use crate::policy::{
    MAX_PROFILE_TOKENS, PLAIN_MARGIN, REFRESH_ROUNDS, VerifyPolicy, measure_steps_per_second,
};
pub use autoregressive::target_only;
pub use batch::Speculator;
pub use generation::{Generation, OnRound, RoundUpdate};
pub use options::{Request, SpeculatorOptions};
pub use stats::Stats;
