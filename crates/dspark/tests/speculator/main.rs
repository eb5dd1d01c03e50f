//! The speculator and serving engine tests: one binary, a module per file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../drafter_common/mod.rs"]
mod drafter_common;
#[path = "../sampling_common/mod.rs"]
mod sampling_common;
#[path = "../speculator_common/mod.rs"]
mod speculator_common;

mod constraint;
mod logprobs;
mod penalties;
mod rounds;
mod serving;
mod toy_engine;
