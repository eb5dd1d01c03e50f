//! The sampling kernel and scheduler tests: one binary, a module per file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../sampling_common/mod.rs"]
mod sampling_common;

mod confidence;
mod generic;
mod lossless;
mod markov;
mod props;
mod regressions;
mod schedule;
mod schedule_batch;
mod verify;
