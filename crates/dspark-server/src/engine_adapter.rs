//! The native engine behind the server: `dspark::engine::Engine<Qwen3Target, Qwen3Drafter>`
//! as a [`ServingEngine`].
//!
//! Behind the `real-engine` cargo feature until the engine lands in the dspark crate; without
//! it [`native_engine`] refuses with code `no-engine` (after the pair has been loaded and
//! checked), and only the test engine (`--fake-engine`) serves.

use dspark::engine::EngineConfig;
use dspark::{Qwen3Drafter, Qwen3Target};

use crate::engine::ServingEngine;
use crate::error::StartError;

#[cfg(feature = "real-engine")]
mod native {
    use dspark::engine::{
        Engine, EngineMetrics, RequestId, RequestSpec, StepOutput,
    };
    use dspark::{Qwen3Drafter, Qwen3Target};

    use crate::engine::ServingEngine;

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
}

/// Whether this build serves the native engine.
pub const HAS_NATIVE_ENGINE: bool = cfg!(feature = "real-engine");

/// The native engine over a loaded pair.
pub fn native_engine(
    target: Qwen3Target,
    drafter: Qwen3Drafter,
    config: EngineConfig,
) -> Result<Box<dyn ServingEngine>, StartError> {
    #[cfg(feature = "real-engine")]
    {
        let engine = dspark::engine::Engine::new(target, drafter, config)?;
        Ok(Box::new(engine))
    }
    #[cfg(not(feature = "real-engine"))]
    {
        let _ = (target, drafter, config);
        Err(StartError::new(
            "no-engine",
            "this build has no serving engine yet (the dspark-server `real-engine` feature is \
             off): the pair loaded and checked, but only the test engine can serve",
        ))
    }
}
