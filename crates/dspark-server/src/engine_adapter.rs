//! The native engine behind the server: `dspark::engine::Engine<Qwen3Target, Qwen3Drafter>`
//! as a [`ServingEngine`].

use dspark::engine::{Engine, EngineConfig, EngineMetrics, RequestId, RequestSpec, StepOutput};
use dspark::{Qwen3Drafter, Qwen3Target};

use crate::engine::ServingEngine;
use crate::error::StartError;

impl ServingEngine for Engine<Qwen3Target, Qwen3Drafter> {
    fn add_request(&mut self, spec: RequestSpec) -> dspark::Result<RequestId> {
        Engine::add_request(self, spec)
    }
    fn abort(&mut self, id: RequestId) -> dspark::Result<()> {
        Engine::abort(self, id)
    }
    fn step(&mut self) -> dspark::Result<StepOutput> {
        Engine::step(self)
    }
    fn has_work(&self) -> bool {
        Engine::has_work(self)
    }
    fn metrics(&self) -> EngineMetrics {
        Engine::metrics(self)
    }
}

/// The native engine over a loaded pair. Nothing is profiled before serving: under
/// `--verify scheduled` (the default) the scheduler starts from a prior built from the
/// target's shape and this machine's speed, and every round's timings refine it.
pub fn native_engine(
    target: Qwen3Target,
    drafter: Qwen3Drafter,
    config: EngineConfig,
) -> Result<Box<dyn ServingEngine>, StartError> {
    Ok(Box::new(Engine::new(target, drafter, config)?))
}
