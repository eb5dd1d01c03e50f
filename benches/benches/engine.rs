//! Criterion benches of the engine on the bundled tiny pair (CPU): one native Qwen3 target
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

criterion_group!(benches, bench_target);
criterion_main!(benches);
