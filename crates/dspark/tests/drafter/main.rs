//! The drafter tests: one binary, a module per file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../child_common/mod.rs"]
mod child_common;
#[path = "../drafter_common/mod.rs"]
mod drafter_common;
#[path = "../sampling_common/mod.rs"]
mod sampling_common;

mod cache;
mod cost;
mod counts;
mod generic;
mod guide;
mod in_block;
mod layers;
mod load;
mod modes;
