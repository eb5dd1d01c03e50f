//! The native target tests: one binary, a module per file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../child_common/mod.rs"]
mod child_common;
#[path = "../drafter_common/mod.rs"]
mod drafter_common;
#[path = "../targets_common/mod.rs"]
mod targets_common;

mod counts;
mod dtype;
mod gguf;
mod gguf_tokenizer;
mod kv_dtype;
mod quant;
mod qwen3;
