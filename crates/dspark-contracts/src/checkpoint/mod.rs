//! Checkpoint inventory and weight-presence rules.
//!
//! Validation reads safetensors *headers* only — a single file or the shards of a
//! `model.safetensors.index.json` — and never tensor data, except the small `d2t` map.
//! [`Inventory`] lists what a checkpoint holds; [`LoadPlan::build`] applies the name rules and
//! the vocabulary predicate, checks every shape against the config and reports every problem
//! at once.
//!
//! Submodules: [`header`] (safetensors header parsing), [`inventory`] (files and shards),
//! [`names`] (checkpoint-name rules, DeepSeek-V4 `mtp.*` remap), [`shapes`] (shapes the config
//! implies), [`plan`] (the load plan), with the id-map and DeepSeek-V4 planners beside it.

mod d2t;
mod dsv4;
pub mod header;
pub mod inventory;
pub mod names;
pub mod plan;
pub mod shapes;

pub use header::TensorInfo;
pub use inventory::Inventory;
pub use names::{NameRule, classify};
pub use plan::{LoadPlan, WeightSource};
