//! Criterion benches of the engine on the bundled tiny pair (CPU), and of the packed matmul
//! micro-kernel under them (weights in L2 vs streamed from memory): one native Qwen3 target
//! forward over `S` new tokens after a 64-token context (S = 1 is an autoregressive step, S = 9 a
//! K = 8 verification), and one drafter proposal. These two are a speculative round's cost, so
//! they are where a change to the matmul micro-kernel or the decoder layer shows first. Every
//! call runs inside [`dspark::threads::in_round`], under the thread policy of a round.
//!
//! Under mimalloc, the allocator the Python extension uses (see README "Threads").
//!
//! Run: `cargo bench -p dspark-benches --bench engine -- --warm-up-time 1 --measurement-time 3`

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use candle_core::Device;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dspark::drafter::ProposeOptions;
use dspark::speculator::{LogitRows, TargetInput};
use dspark::{Drafter, Qwen3Drafter, Qwen3Target, TargetModel};
use std::hint::black_box;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONTEXT: usize = 64;

fn models() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../python/dspark/models/tiny")
}

fn ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

fn bench_target(c: &mut Criterion) {
    let target = Qwen3Target::load(&models().join("target"), &Device::Cpu).unwrap();
    let v = target.vocab_size();
    let mut cache = target.new_cache(1).unwrap();
    let prompt = ids(CONTEXT, v);
    let input = TargetInput {
        tokens: &prompt,
        width: CONTEXT,
        num_tokens: &[CONTEXT],
        logits: LogitRows::Last,
    };
    target.forward(&mut cache, &input, &[]).unwrap();
    let capture = [1usize, 4, 7];
    let mut group = c.benchmark_group("target_forward");
    for s in [1usize, 4, 9] {
        let new = ids(s, v);
        group.throughput(Throughput::Elements(s as u64));
        group.bench_with_input(BenchmarkId::new("b1_ctx64", s), &s, |bch, &s| {
            bch.iter(|| {
                let input = TargetInput {
                    tokens: &new,
                    width: s,
                    num_tokens: &[s],
                    logits: LogitRows::All,
                };
                dspark::threads::in_round(|| {
                    let out = target.forward(&mut cache, &input, &capture).unwrap();
                    target.truncate(&mut cache, &[CONTEXT]).unwrap();
                    black_box(out)
                })
            })
        });
    }
    group.finish();

    let drafter = Qwen3Drafter::load(
        &models().join("drafter"),
        &target.target_spec(),
        target.shared_weights(),
    )
    .unwrap();
    let capture = drafter.capture_layer_ids().to_vec();
    let mut cache = target.new_cache(1).unwrap();
    let input = TargetInput {
        tokens: &prompt,
        width: CONTEXT,
        num_tokens: &[CONTEXT],
        logits: LogitRows::Last,
    };
    let out = target.forward(&mut cache, &input, &capture).unwrap();
    let mut state = drafter.new_state().unwrap();
    let feats = out.hidden_states.get(0).unwrap();
    drafter.extend(&mut state, &feats, 0).unwrap();
    let opts = ProposeOptions::default();
    c.bench_function("drafter_propose/b1_ctx64", |bch| {
        bch.iter(|| {
            dspark::threads::in_round(|| {
                black_box(drafter.propose_cached(&[&state], &[7], &opts).unwrap())
            })
        })
    });
}

/// The packed micro-kernel alone: `n` rows times a weight that stays in L2 (`[512, 192]`,
/// 384 KiB), and times weights streamed from memory (a ring of `[3000, 192]` matrices larger
/// than the L3, the shape of the bundled pair's logit head): rows per second of MACs show
/// whether a verification's product is compute- or bandwidth-bound.
fn bench_packed(c: &mut Criterion) {
    use dspark::nn::packed::PackedMatrix;
    let values = |n: usize, seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 2_654_435_761 + seed) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    };
    let cached = PackedMatrix::pack(&values(512 * 192, 1), 512, 192).unwrap();
    let ring: Vec<PackedMatrix> = (0..24)
        .map(|s| PackedMatrix::pack(&values(3000 * 192, s), 3000, 192).unwrap())
        .collect();
    let mut group = c.benchmark_group("packed_matmul");
    for n in [1usize, 4, 6, 9, 12] {
        let x = values(n * 192, 7);
        group.throughput(Throughput::Elements((n * 512 * 192) as u64));
        group.bench_with_input(BenchmarkId::new("l2_512x192", n), &n, |bch, &n| {
            bch.iter(|| black_box(cached.matmul(&x, n, None).unwrap()))
        });
        group.throughput(Throughput::Elements((n * 3000 * 192) as u64));
        let mut next = 0;
        group.bench_with_input(BenchmarkId::new("stream_3000x192", n), &n, |bch, &n| {
            bch.iter(|| {
                next = (next + 1) % ring.len();
                black_box(ring[next].matmul(&x, n, None).unwrap())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_packed, bench_target);
criterion_main!(benches);
