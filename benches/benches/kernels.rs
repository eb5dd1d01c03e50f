//! Criterion benches of the drafting and verification kernels (CPU), each with a bytes
//! throughput so results read against the machine's measured read bandwidth (`bandwidth/*`).
//!
//! Run: `cargo bench -p dspark-benches --bench kernels -- --warm-up-time 1 --measurement-time 3`

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use candle_core::{DType, Device, Tensor};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dspark::IdMap;
use dspark::sampling::{
    BlockOptions, Floats, Mat, PerRequest, Rows3, Seeds, Tokens, Verification, VerifyOptions,
    mask_padded_rows, sample_block, sample_block_slices, verify, verify_slices,
};
use dspark_benches::parallel_sum;
use std::hint::black_box;

/// Deterministic pseudo-normal values (sum of 4 uniforms), cheap to generate.
fn normals(n: usize, seed: u64, std: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            let mut acc = 0f32;
            for _ in 0..4 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                acc += (s >> 40) as f32 / (1u64 << 24) as f32;
            }
            (acc - 2.0) * std * 1.73
        })
        .collect()
}

/// The read bandwidth over all cores.
fn bandwidth(c: &mut Criterion) {
    let data = vec![1.0f32; 64 << 20]; // 256 MiB
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut g = c.benchmark_group("bandwidth");
    g.sample_size(10);
    g.throughput(Throughput::Bytes((data.len() * 4) as u64));
    g.bench_function("sum_f32_256MiB", |b| {
        b.iter(|| black_box(parallel_sum(&data, threads)))
    });
    g.finish();
}

fn mask(c: &mut Criterion) {
    let (rows, v, valid) = (56, 152_064, 151_936);
    let x = Tensor::from_vec(normals(rows * v, 1, 1.0), (rows, v), &Device::Cpu).unwrap();
    let mut g = c.benchmark_group("mask");
    g.sample_size(10);
    // Read once, written once.
    g.throughput(Throughput::Bytes((2 * rows * v * 4) as u64));
    g.bench_function("f32_56x152064", |b| {
        b.iter(|| black_box(mask_padded_rows(&x, valid).unwrap()))
    });
    g.finish();
}

fn block(c: &mut Criterion) {
    let (b, k, v, r) = (8, 7, 151_936, 256);
    let base = normals(b * k * v, 2, 2.0);
    let w1 = normals(v * r, 3, 0.05);
    let w2 = normals(v * r, 4, 0.05);
    let w1_bf = Tensor::from_vec(w1.clone(), (v, r), &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let w2_bf = Tensor::from_vec(w2.clone(), (v, r), &Device::Cpu)
        .unwrap()
        .to_dtype(DType::BF16)
        .unwrap();
    let anchors: Vec<u32> = (0..b as u32).map(|i| i * 1000).collect();
    let map = IdMap::identity(v).unwrap();
    let mut g = c.benchmark_group("block");
    g.sample_size(10);
    for (t, top_k) in [(1.0f32, None), (0.0, None), (1.0, Some(64))] {
        let opts = BlockOptions {
            temperature: t,
            seeds: Seeds::Scalar(1),
            id_map: &map,
            top_k,
            logit_scale: 1.0,
        };
        // The floor: W2 read once per slot.
        g.throughput(Throughput::Bytes((k * v * r * 4) as u64));
        let name = format!(
            "f32_B{b}_K{k}_V{v}_r{r}_T{t}_topk{}",
            top_k.map_or("none".into(), |k: usize| k.to_string())
        );
        g.bench_function(name, |bch| {
            bch.iter(|| {
                black_box(
                    sample_block_slices(
                        Rows3::new(Floats::F32(&base), [b, k, v]).unwrap(),
                        Mat::new(Floats::F32(&w1), [v, r]).unwrap(),
                        Mat::new(Floats::F32(&w2), [v, r]).unwrap(),
                        &anchors,
                        &opts,
                    )
                    .unwrap(),
                )
            })
        });
    }
    // One request, greedy, a reduced draft vocabulary (the one-row decode and a guided
    // slot's redraw: `W2` in the last-level cache, the single-request tile).
    let (v1, r1) = (32_000, 64);
    let map1 = IdMap::identity(v1).unwrap();
    let base1 = normals(k * v1, 5, 2.0);
    let (w1s, w2s) = (normals(v1 * r1, 6, 0.05), normals(v1 * r1, 7, 0.05));
    let greedy = BlockOptions {
        temperature: 0.0,
        seeds: Seeds::Scalar(1),
        id_map: &map1,
        top_k: None,
        logit_scale: 1.0,
    };
    g.throughput(Throughput::Bytes((k * v1 * r1 * 4) as u64));
    g.bench_function(format!("f32_B1_K{k}_V{v1}_r{r1}_T0"), |bch| {
        bch.iter(|| {
            black_box(
                sample_block_slices(
                    Rows3::new(Floats::F32(&base1), [1, k, v1]).unwrap(),
                    Mat::new(Floats::F32(&w1s), [v1, r1]).unwrap(),
                    Mat::new(Floats::F32(&w2s), [v1, r1]).unwrap(),
                    &anchors[..1],
                    &greedy,
                )
                .unwrap(),
            )
        })
    });
    // bf16 Markov weights through the tensor front (read in place).
    let opts = BlockOptions {
        temperature: 1.0,
        seeds: Seeds::Scalar(1),
        id_map: &map,
        top_k: None,
        logit_scale: 1.0,
    };
    let base_t = Tensor::from_vec(base.clone(), (b, k, v), &Device::Cpu).unwrap();
    let anchors_t = Tensor::from_vec(anchors.clone(), b, &Device::Cpu).unwrap();
    g.throughput(Throughput::Bytes((k * v * r * 2) as u64));
    g.bench_function(format!("bf16w_B{b}_K{k}_V{v}_r{r}_T1"), |bch| {
        bch.iter(|| black_box(sample_block(&base_t, &w1_bf, &w2_bf, &anchors_t, &opts).unwrap()))
    });
    g.finish();
}

/// Target logits `[B, K+1, V]` where every draft has probability ~1 (so every row is read),
/// drafts `[B, K]`, and draft logits equal to the target rows.
/// `verify_slices` of f32 target rows `[b, k + 1, v]` for `drafts` `[b, k]`, with the draft
/// rows `q` `[b, k, v]` when given.
fn verify_f32(
    target: &[f32],
    drafts: &[i64],
    q: Option<&[f32]>,
    [b, k, v]: [usize; 3],
    o: &VerifyOptions,
) -> Verification {
    verify_slices(
        Rows3::new(Floats::F32(target), [b, k + 1, v]).unwrap(),
        Tokens::new(drafts, [b, k]).unwrap(),
        q.map(|q| Rows3::new(Floats::F32(q), [b, k, v]).unwrap()),
        o,
    )
    .unwrap()
}

fn verify_inputs(b: usize, k: usize, v: usize) -> (Vec<f32>, Vec<i64>, Vec<f32>) {
    let mut target = normals(b * (k + 1) * v, 5, 1.0);
    let drafts: Vec<i64> = (0..b * k).map(|i| ((i * 7919) % v) as i64).collect();
    let mut q = Vec::with_capacity(b * k * v);
    for r in 0..b {
        for j in 0..k {
            let row = &mut target[(r * (k + 1) + j) * v..(r * (k + 1) + j + 1) * v];
            row[drafts[r * k + j] as usize] = 25.0;
            q.extend_from_slice(row);
        }
    }
    (target, drafts, q)
}

fn verify_bench(c: &mut Criterion) {
    let k = 7;
    let opts = VerifyOptions::default();
    let mut g = c.benchmark_group("verify");
    g.sample_size(10);
    for v in [32_000usize, 151_936] {
        for b in [1usize, 8, 32] {
            let (target, drafts, q) = verify_inputs(b, k, v);
            let tbytes = (b * (k + 1) * v * 4) as u64;
            g.throughput(Throughput::Bytes(tbytes));
            g.bench_with_input(
                BenchmarkId::new(format!("f32_onehot_V{v}"), b),
                &b,
                |bch, _| {
                    bch.iter(|| black_box(verify_f32(&target, &drafts, None, [b, k, v], &opts)))
                },
            );
            g.throughput(Throughput::Bytes(tbytes + (b * k * v * 4) as u64));
            g.bench_with_input(BenchmarkId::new(format!("f32_q_V{v}"), b), &b, |bch, _| {
                bch.iter(|| black_box(verify_f32(&target, &drafts, Some(&q), [b, k, v], &opts)))
            });
            let sampled = VerifyOptions {
                temperature: dspark::sampling::PerRequest::All(1.0),
                ..VerifyOptions::default()
            };
            g.bench_with_input(
                BenchmarkId::new(format!("f32_q_T1_V{v}"), b),
                &b,
                |bch, _| {
                    bch.iter(|| {
                        black_box(verify_f32(&target, &drafts, Some(&q), [b, k, v], &sampled))
                    })
                },
            );
            // bf16 through the tensor front (contiguous CPU tensors are read in place).
            let tt = Tensor::from_vec(target, (b, k + 1, v), &Device::Cpu)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap();
            let dt = Tensor::from_vec(drafts, (b, k), &Device::Cpu).unwrap();
            g.throughput(Throughput::Bytes(tbytes / 2));
            g.bench_with_input(
                BenchmarkId::new(format!("bf16_onehot_V{v}"), b),
                &b,
                |bch, _| bch.iter(|| black_box(verify(&tt, &dt, None, &opts).unwrap())),
            );
        }
    }
    let topk = VerifyOptions {
        top_k: PerRequest::All(Some(50)),
        top_p: PerRequest::All(0.9),
        ..VerifyOptions::default()
    };
    let (b, v) = (8, 151_936);
    let (target, drafts, _) = verify_inputs(b, k, v);
    g.throughput(Throughput::Bytes((b * (k + 1) * v * 4) as u64));
    g.bench_function(format!("f32_onehot_topk50_topp0.9_V{v}/{b}"), |bch| {
        bch.iter(|| black_box(verify_f32(&target, &drafts, None, [b, k, v], &topk)))
    });
    g.finish();
}

criterion_group!(benches, bandwidth, mask, block, verify_bench);
criterion_main!(benches);
