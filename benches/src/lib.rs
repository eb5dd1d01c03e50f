//! Shared helpers for the dspark criterion benchmarks.
