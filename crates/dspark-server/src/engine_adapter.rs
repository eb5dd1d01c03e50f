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

/// Concurrent requests the scheduler's profile covers at start (a larger batch later grows it).
const WARM_UP_BATCH: usize = 16;

/// The native engine over a loaded pair (profiled for the scheduler first when it schedules).
pub fn native_engine(
    target: Qwen3Target,
    drafter: Qwen3Drafter,
    config: EngineConfig,
) -> Result<Box<dyn ServingEngine>, StartError> {
    let batch = config.budget.max_running.min(WARM_UP_BATCH);
    let mut engine = Engine::new(target, drafter, config)?;
    // Under `--verify scheduled` the target's profile is measured now, before the first
    // request, which would otherwise wait for it.
    engine.warm_up(batch)?;
    Ok(Box::new(engine))
}
