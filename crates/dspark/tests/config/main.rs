//! The config tests: one binary, a module per file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../config_common/mod.rs"]
mod config_common;

mod detection;
mod layers;
mod noise;
mod shapes;
mod validation;
