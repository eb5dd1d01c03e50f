//! The serving engine: requests join, leave and are cancelled between rounds (continuous
//! batching), each with its own sampling, seed, stop ids, budget and speculation limit.
//!
//! Types: [`RequestSpec`] (what a caller adds), [`RequestId`], [`StepOutput`] /
//! [`RequestOutput`] (what a step gives back), [`FinishReason`], [`RequestUsage`],
//! [`EngineConfig`] / [`Budget`], [`EngineMetrics`].

mod config;
mod metrics;
mod output;
mod request;

pub use config::{Budget, EngineConfig};
pub use metrics::EngineMetrics;
pub use output::{FinishReason, RequestOutput, RequestUsage, StepOutput};
pub use request::{RequestId, RequestSpec, SamplingParams};
