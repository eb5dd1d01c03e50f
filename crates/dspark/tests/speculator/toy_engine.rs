//! The serving engine over the toy target (64 ids, 4 layers of 8, seed 17; continuous
//! batching) and the oracle drafter (6 slots, capturing layers 1 and 3), as the request-option
//! tests (log-probabilities, penalties, grammars) build it.

use crate::speculator_common::{Mode, OracleDrafter, ToyLm, ToyTarget};
use dspark::engine::{Engine, EngineConfig};

/// Target vocabulary.
pub const V: usize = 64;
/// Draft slots.
pub const K: usize = 6;

/// The toy's language model (the logits every engine below serves).
pub fn lm() -> ToyLm {
    ToyTarget::new(V, 4, 8, 17).lm
}

/// An engine drafting with `mode` under `config`.
pub fn engine(mode: Mode, config: EngineConfig) -> Engine<ToyTarget, OracleDrafter> {
    let t = ToyTarget::new(V, 4, 8, 17).into_resizable();
    let d = OracleDrafter::new(&t, K, &[1, 3], mode);
    Engine::new(t, d, config).unwrap()
}
