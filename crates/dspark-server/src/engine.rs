//! What the server needs from an engine: the step-level interface of
//! `dspark::engine::Engine` (add, abort, step, has work, metrics), as a trait so the server
//! runs the native engine (`engine_adapter.rs`) and the deterministic test engine
//! (the test echo engine, `fake.rs`) alike.
//!
//! The engine is built on, and never leaves, its own thread ([`crate::engine_thread`]), so it
//! need not be `Send`.

use dspark::engine::{EngineMetrics, RequestId, RequestSpec, StepOutput};

/// A step-level serving engine: requests join between steps, each step runs one round over
/// every running request.
pub trait ServingEngine {
    /// Admit a request (typed errors: bad values, or a request that can never fit the budget).
    fn add_request(&mut self, spec: RequestSpec) -> dspark::Result<RequestId>;
    /// Cancel a request; its rows are freed at the next step (unknown or finished id: an
    /// error).
    fn abort(&mut self, id: RequestId) -> dspark::Result<()>;
    /// One round over every running request.
    fn step(&mut self) -> dspark::Result<StepOutput>;
    /// Whether a request is running or waiting.
    fn has_work(&self) -> bool;
    /// The engine's counters.
    fn metrics(&self) -> EngineMetrics;
}

impl<E: ServingEngine + ?Sized> ServingEngine for Box<E> {
    fn add_request(&mut self, spec: RequestSpec) -> dspark::Result<RequestId> {
        (**self).add_request(spec)
    }
    fn abort(&mut self, id: RequestId) -> dspark::Result<()> {
        (**self).abort(id)
    }
    fn step(&mut self) -> dspark::Result<StepOutput> {
        (**self).step()
    }
    fn has_work(&self) -> bool {
        (**self).has_work()
    }
    fn metrics(&self) -> EngineMetrics {
        (**self).metrics()
    }
}
