//! Checkpoint inventory and weight-presence rules.
//!
//! Validation reads safetensors *headers* only — a single file or the shards of a
//! `model.safetensors.index.json` — and never tensor data, except the small `d2t` map.
//! [`Inventory`] lists what a checkpoint holds; [`LoadPlan::build`] applies the name rules and
//! the vocabulary predicate, checks every shape against the config and reports every problem
//! at once.
//!
//! Submodules: [`header`] (safetensors header parsing), [`inventory`] (files and shards),
//! [`names`] (checkpoint-name rules, DeepSeek-V4 `mtp.*` remap), [`plan`] (the load plan and
//! shape checks).

pub mod header;
pub mod inventory;
pub mod names;
pub mod plan;

pub use header::TensorInfo;
pub use inventory::Inventory;
pub use plan::{LoadPlan, WeightSource};
