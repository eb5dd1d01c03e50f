//! Draft and target `config.json` normalization.
//!
//! Four draft config shapes are accepted and normalized into one [`DraftSpec`]:
//! DeepSpec native (`Qwen3DSparkModel`, `Gemma4DSparkModel`), speculators (`DSparkDraftModel`
//! with `speculators_model_type: "dspark"` and a nested `transformer_layer_config`),
//! `dflash_config`-nested, and DeepSeek-V4 in-checkpoint drafters (`dspark_*` keys in the
//! target's own config). The target's config is read into a [`TargetSpec`]; a native Qwen3
//! target's into a [`Qwen3Config`]. Both models' stacks are described by one [`ModelShape`].
//!
//! Submodules: [`spec`] (the types), [`shape`] ([`ModelShape`]), [`noise`] (the noise-token
//! chain), [`layers`] (the target-layer resolver), [`parse`] (format detection and
//! normalization), [`json`] (reading a `config.json`), [`target`], [`qwen3`] (the native
//! target's config).
//! Private helpers: `fields` (typed, key-naming lookups), `formats` (the DSpark keys of each
//! shape), `backbone` (transformer shape), `rope` (RoPE parameters).

mod backbone;
pub(crate) mod fields;
mod formats;
pub mod json;
pub mod layers;
pub mod noise;
pub mod parse;
pub mod qwen3;
pub(crate) mod rope;
pub mod shape;
pub mod spec;
pub mod sts;
pub mod target;

pub use qwen3::Qwen3Config;
pub use shape::{ModelShape, RopeSpec};
pub use spec::{ConfigFormat, DraftSpec, MarkovHeadType, NoiseToken, NoiseTokenSource};
pub use sts::{STS_FILE, StsCalibration};
pub use target::TargetSpec;
