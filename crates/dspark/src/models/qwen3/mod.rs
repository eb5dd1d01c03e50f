//! The native Qwen3 target: an implementation of [`TargetModel`](super::TargetModel) in candle,
//! for a speculator that runs without Python.
//!
//! [`Qwen3Target`] loads a Hugging Face `Qwen3ForCausalLM` directory ([`Qwen3Config`] from its
//! `config.json`, weights from safetensors) and runs the ragged batched forward against a
//! rollback KV cache ([`Qwen3Cache`]). Its decoder layers come from [`crate::nn`], as the
//! drafter's do, so the target and the drafter run one implementation of a Qwen3 layer;
//! [`Qwen3Target::shared_weights`] hands a drafter the embedding and lm_head without a
//! copy.
//!
//! Submodules: [`cache`] ([`Qwen3Cache`]), `model` ([`Qwen3Target`], loading), `gguf` (loading
//! a GGUF file: [`Qwen3Target::load_gguf`]), `forward` (the packed forward), `device_rows` (its
//! device-path attention).

pub mod cache;
mod device_rows;
mod forward;
mod gguf;
mod model;

pub use crate::config::Qwen3Config;
pub use cache::Qwen3Cache;
pub use gguf::{gguf_config_json, gguf_name};
pub use model::Qwen3Target;
