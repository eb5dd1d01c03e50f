//! The drafter tests: one binary, a module per file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../child_common/mod.rs"]
mod child_common;
#[path = "../drafter_common/mod.rs"]
mod drafter_common;

mod cache;
mod counts;
mod generic;
mod layers;
mod load;
mod modes;
