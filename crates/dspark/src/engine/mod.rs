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
//! Three rooms, composed by [`Engine`] (`engine.rs`, `step.rs`):
//! - `scheduler/`: which requests run: the queue, the rows, admission and preemption under
//!   the [`Budget`], aborts. No model generics; tested without a model.
//! - `round/`: one round over the running rows: its plan (`plan.rs`, proposals in
//!   `propose.rs`), the target forward (`mod.rs`), verification where the logits are
//!   (`verify.rs`) and the commit (`commit.rs`).
//! - the policy room, [`crate::policy`]: whether a round drafts and how many drafts each
//!   request verifies, from what the rounds measured (its `Planner`).
//!
//! The public types: `config.rs`, `request.rs`, `output.rs`, `metrics.rs`, `seeds.rs`.

mod config;
mod constraint;
#[allow(clippy::module_inception)]
mod engine;
mod metrics;
mod output;
mod penalties;
mod request;
mod round;
mod scheduler;
mod seeds;
mod step;

pub use config::{Budget, EngineConfig};
pub use constraint::{Constraint, TokenConstraint};
pub use engine::Engine;
pub use metrics::EngineMetrics;
pub use output::{
    ConfidenceRecord, FinishReason, RequestError, RequestOutput, RequestUsage, StepOutput,
    StepTiming,
};
pub use penalties::{MAX_LOGIT_BIAS, Penalties};
pub use request::{RequestId, RequestSpec, SamplingParams};
pub use round::{PENDING_BYTES, PENDING_CAP};
pub use scheduler::AbortHandle;
pub use seeds::{call_seed, derive_seed, fresh_seed};
