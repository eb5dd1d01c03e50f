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
pub mod models;
pub mod nn;
pub mod policy;
pub mod sampling;
pub mod speculator;
pub mod sync;
#[cfg(test)]
mod test_values;
pub mod threads;
pub mod trace;
pub mod view;
pub mod vocab;

pub use checkpoint::{Inventory, LoadPlan, TensorInfo, WeightSource};
pub use config::{
    ConfigFormat, DraftSpec, MarkovHeadType, NoiseToken, NoiseTokenSource, TargetSpec,
};
pub use drafter::{
    DraftState, Drafter, DrafterInfo, Proposal, ProposeOptions, Qwen3Drafter, SharedWeights,
};
pub use error::{Error, ErrorKind, Result, Warning};
pub use idmap::IdMap;
pub use inspect::{InspectOptions, Report, inspect, inspect_with};
pub use models::Qwen3Target;
pub use nn::{LoadOptions, WeightDtype};
pub use speculator::{Speculator, TargetModel};
pub use vocab::{VocabLayout, VocabSizes};
