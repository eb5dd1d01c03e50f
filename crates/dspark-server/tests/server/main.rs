//! dspark-server's integration tests, one binary: the HTTP API over the deterministic echo
//! engine (`api`, `choices`, `logprobs`, `structured`), the server on the native engine
//! (`native_serve`) and the `dspark-server` binary itself (`binary`). The bounded load test is a
//! binary of its own (`tests/load`): it checks its process's resident memory, which the other
//! tests' servers would move. Every server binds 127.0.0.1 on port 0.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod api;
mod binary;
mod choices;
mod logprobs;
mod native_serve;
mod structured;
