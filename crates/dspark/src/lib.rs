//! # dspark
//!
//! The engine of dspark, a DSpark speculative-decoding core. It owns every contract a DSpark
//! drafter has with its target model — config normalization ([`config`]), checkpoint weight
//! rules ([`checkpoint`]), vocabulary layout ([`vocab`]) and the draft-to-target id map
//! ([`idmap`]) — and the drafting and verification kernels ([`sampling`]) on candle tensors.
//!
//! This crate has no Python dependency; the `dspark-py` crate is thin glue over it.

pub mod checkpoint;
pub mod config;
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda_interop;
pub mod device;
pub mod drafter;
pub mod engine;
pub mod error;
pub mod files;
pub mod idmap;
pub mod inspect;
pub mod limits;
pub mod nn;
pub mod sampling;
pub mod schedule;
pub mod speculator;
pub mod sync;
pub mod target;
pub mod targets;
#[cfg(test)]
mod test_values;
pub mod threads;
pub mod view;
pub mod vocab;

pub use checkpoint::{Inventory, LoadPlan, TensorInfo, WeightSource};
pub use config::{
    ConfigFormat, DraftSpec, MarkovHeadType, NoiseToken, NoiseTokenSource, TargetSpec,
};
pub use drafter::{DraftState, Drafter, Proposal, ProposeOptions, Qwen3Drafter, SharedWeights};
pub use error::{Error, ErrorKind, Result};
pub use idmap::IdMap;
pub use inspect::{InspectOptions, Report, inspect, inspect_with};
pub use nn::{LoadOptions, WeightDtype};
pub use speculator::{Speculator, TargetModel};
pub use targets::Qwen3Target;
pub use vocab::{VocabLayout, VocabSizes};

/// A non-fatal finding: something loads, but not the way its author may expect.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Warning {
    /// Stable machine code, e.g. `"confidence-head-disabled"`.
    pub code: &'static str,
    /// Human-readable explanation.
    pub message: String,
}

impl Warning {
    /// Build a warning.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}
