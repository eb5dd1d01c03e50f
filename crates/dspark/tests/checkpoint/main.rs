//! The checkpoint and inspect tests: one binary, a module per file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../checkpoint_common/mod.rs"]
mod checkpoint_common;

mod dsv4;
mod header;
mod inspect;
mod inventory;
mod plan;
