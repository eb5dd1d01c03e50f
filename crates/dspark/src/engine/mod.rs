//! The serving engine: requests join, leave and are cancelled between rounds (continuous
//! batching), each with its own sampling, seed, stop ids, budget and speculation limit.
//!
//! [`Engine::add_request`] queues a [`RequestSpec`]; each [`Engine::step`] applies aborts,
//! preempts and admits under the [`Budget`], runs one round over every running request — a
//! joining request's prefill riding the same target forward where the target is ragged — and
//! returns each request's new tokens and, when it ends, why ([`FinishReason`]) and what it used
//! ([`RequestUsage`]). [`Engine::metrics`] gives lifetime counters ([`EngineMetrics`]).
//!
//! Seeds: a request's draws are keyed by its own seed and the position they are drawn at
//! ([`derive_seed`]), never by its place in a batch. With `full` or `threshold` verification
//! (or greedy decoding under any policy) a seeded request gives the same tokens alone, in any
//! batch, joining mid-run, or resumed after a preemption. The scheduling policies (`scheduled`,
//! `pipelined`) choose each request's verify length from the whole batch's confidences and
//! from measured costs; the tokens they commit still follow the target distribution exactly,
//! but which tokens a given seed yields then depends on the batch and on timing.
//!
//! On the CPU fast path a row's arithmetic does not depend on the other rows of a forward, so
//! the promise above is bit for bit. On a device, batched matrix products may round
//! differently with the batch; greedy ties may then break differently.
//!
//! Files: `engine.rs` (the type, adding and aborting), `step.rs`, `admit.rs` (preemption and
//! admission), `round.rs` (the forward(s) of a round), `draft.rs` (whether and what a round
//! drafts, verify lengths), `commit.rs`, `verify.rs` (verification where the logits are),
//! `slot.rs` (a request's state), `acceptance.rs` and `learned.rs` (what the rounds teach the
//! schedulers), `seeds.rs`, and the public types.

mod acceptance;
mod admit;
mod commit;
mod config;
mod draft;
#[allow(clippy::module_inception)]
mod engine;
mod learned;
mod metrics;
mod output;
mod propose;
mod request;
mod round;
mod seeds;
mod slot;
mod step;
mod verify;

pub use commit::{PENDING_BYTES, PENDING_CAP};
pub use config::{Budget, EngineConfig};
pub use draft::{PLAIN_MARGIN, REFRESH_ROUNDS};
pub use engine::{AbortHandle, Engine};
pub use metrics::EngineMetrics;
pub use output::{FinishReason, RequestError, RequestOutput, RequestUsage, StepOutput, StepTiming};
pub use request::{RequestId, RequestSpec, SamplingParams};
pub use seeds::{call_seed, derive_seed, fresh_seed};
