//! Criterion bench of the quantized kernels' compute: every body this CPU runs ([`QuantKernel`])
//! on one cache-resident `[5120, 1024]` matrix (the memory-bound pair's MLP shape) per format
//! (Q8_0, Q4_K, and Q6_K as a GGUF file's Q4_K_M mix has it), at 1, 4, 9, 16 and 96
//! activation rows (96: a prefill's; Q8_0's AMX body runs its tiles from 12). `decode_matvec`
//! (the `matvec` bench) measures the memory-bound one-row step from DRAM; this one measures
//! what verification and prefill add per row, where the kernels are bound by their integer dot
//! products, not by bytes.
//!
//! `quantize` times quantizing in place (a `[1024, 1024]` matrix per format, weights per second):
//! loading a safetensors checkpoint with `dtype="q4_k"` is bound by Q4_K's scale search.
//!
//! Run: `cargo bench -p dspark-benches --bench quant_rows -- --warm-up-time 1 --measurement-time 3`

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dspark::nn::quant::q4k::Q4KMatrix;
use dspark::nn::quant::q6k::Q6KMatrix;
use dspark::nn::quant::{QuantKernel, QuantMatrix};
use dspark::view::Floats;
use std::hint::black_box;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROWS: usize = 5120;
const COLS: usize = 1024;

/// Deterministic values in `[-0.5, 0.5)`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn bench_quant_rows(c: &mut Criterion) {
    let w = values(ROWS * COLS, 1);
    let q8 = QuantMatrix::quantize(Floats::F32(&w), ROWS, COLS).unwrap();
    let q4 = Q4KMatrix::quantize(Floats::F32(&w), ROWS, COLS).unwrap();
    let q6 = Q6KMatrix::quantize(Floats::F32(&w), ROWS, COLS).unwrap();
    let mut g = c.benchmark_group("quant_rows");
    g.sample_size(20);
    for kernel in QuantKernel::runnable().filter(|&k| k != QuantKernel::Portable) {
        for n in [1usize, 4, 9, 16, 96] {
            let x = values(n * COLS, 7);
            // Weights multiplied per second: the figure that stays flat when a kernel's cost
            // grows in step with its rows.
            g.throughput(Throughput::Elements((n * ROWS * COLS) as u64));
            let id = |f: &str| BenchmarkId::new(format!("{f}/{}", kernel.name()), n);
            g.bench_with_input(id("q8_0"), &n, |b, &n| {
                b.iter(|| black_box(q8.matmul_with(kernel, &x, n, None).unwrap()))
            });
            g.bench_with_input(id("q4_k"), &n, |b, &n| {
                b.iter(|| black_box(q4.matmul_with(kernel, &x, n, None).unwrap()))
            });
            g.bench_with_input(id("q6_k"), &n, |b, &n| {
                b.iter(|| black_box(q6.matmul_with(kernel, &x, n, None).unwrap()))
            });
        }
    }
    g.finish();
}

fn bench_quantize(c: &mut Criterion) {
    const N: usize = 1024;
    let w = values(N * N, 3);
    let mut g = c.benchmark_group("quantize");
    g.sample_size(10);
    g.throughput(Throughput::Elements((N * N) as u64));
    g.bench_function("q8_0", |b| {
        b.iter(|| black_box(QuantMatrix::quantize(Floats::F32(&w), N, N).unwrap()))
    });
    g.bench_function("q4_k", |b| {
        b.iter(|| black_box(Q4KMatrix::quantize(Floats::F32(&w), N, N).unwrap()))
    });
    g.bench_function("q6_k", |b| {
        b.iter(|| black_box(Q6KMatrix::quantize(Floats::F32(&w), N, N).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, bench_quant_rows, bench_quantize);
criterion_main!(benches);
