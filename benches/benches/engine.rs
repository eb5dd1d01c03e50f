//! Criterion benches of the engine on the bundled tiny pair (CPU), and of the packed matmul
//! micro-kernel under them (weights in L2 vs streamed from memory): one native Qwen3 target
//! forward over `S` new tokens after a 64-token context (S = 1 is an autoregressive step, S = 9 a
//! K = 8 verification), and one drafter proposal. These two are a speculative round's cost, so
//! they are where a change to the matmul micro-kernel or the decoder layer shows first. Every
//! call runs inside [`dspark::threads::in_round`], under the thread policy of a round.
//!
//! The bundled target sits in cache; a user's does not. With `DSPARK_BENCH_PAIR=DIR` (a pair
//! from `dspark make-example DIR --memory-bound`) the same forwards and proposals also run on
//! that pair, memory-bound at B = 1 and compute-bound from a few dozen rows (B = 1 with 48 new
//! tokens, a prompt's prefill; B = 4 with 9 each, a full verification). `DSPARK_BENCH_QUANT`
//! (`q8_0`, `q4_k`) quantizes that pair's target in place, as `--dtype` does.
//!
//! Under mimalloc, the allocator the Python extension uses (see README "Threads").
//!
//! Run: `cargo bench -p dspark-benches --bench engine -- --warm-up-time 1 --measurement-time 3`
//! (add `DSPARK_BENCH_PAIR=DIR` in front for the memory-bound pair).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use candle_core::Device;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dspark::drafter::ProposeOptions;
use dspark::nn::LoadOptions;
use dspark::nn::quant::Quant;
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

/// For each `(batch, sizes)` of `runs`: a target forward over `s` new tokens per request for
/// `batch` requests after a [`CONTEXT`]-token prompt each (the cache cut back to the prompt
/// after every call), for each `s` of `sizes`, and one drafter proposal per request; on the
/// pair in `dir` (`target/`, `drafter/`, loaded once), named `name` in the report.
fn bench_pair(
    c: &mut Criterion,
    name: &str,
    dir: &Path,
    quant: Option<Quant>,
    runs: &[(usize, &[usize])],
) {
    let options = LoadOptions {
        quant,
        ..LoadOptions::default()
    };
    let target = Qwen3Target::load_with(&dir.join("target"), &Device::Cpu, options).unwrap();
    let drafter = Qwen3Drafter::load(
        &dir.join("drafter"),
        &target.target_spec(),
        target.shared_weights(),
    )
    .unwrap();
    for &(batch, sizes) in runs {
        bench_batch(c, name, &target, &drafter, batch, sizes);
    }
}

/// One `(batch, sizes)` run of [`bench_pair`].
fn bench_batch(
    c: &mut Criterion,
    name: &str,
    target: &Qwen3Target,
    drafter: &Qwen3Drafter,
    batch: usize,
    sizes: &[usize],
) {
    let v = target.vocab_size();
    let capture = drafter.info().capture_layer_ids.as_slice().to_vec();
    let mut cache = target.new_cache(batch).unwrap();
    let prompt = ids(CONTEXT * batch, v);
    let context = vec![CONTEXT; batch];
    let input = TargetInput {
        tokens: &prompt,
        width: CONTEXT,
        num_tokens: &context,
        logits: LogitRows::Last,
    };
    let out = target.forward(&mut cache, &input, &capture).unwrap();
    let mut group = c.benchmark_group(format!("target_forward/{name}"));
    for &s in sizes {
        let new = ids(s * batch, v);
        let news = vec![s; batch];
        group.throughput(Throughput::Elements((s * batch) as u64));
        let id = BenchmarkId::new(format!("b{batch}_ctx{CONTEXT}"), s);
        group.bench_with_input(id, &s, |bch, &s| {
            bch.iter(|| {
                let input = TargetInput {
                    tokens: &new,
                    width: s,
                    num_tokens: &news,
                    logits: LogitRows::All,
                };
                dspark::threads::in_round(|| {
                    let out = target.forward(&mut cache, &input, &capture).unwrap();
                    target.truncate(&mut cache, &context).unwrap();
                    black_box(out)
                })
            })
        });
    }
    group.finish();

    // The drafter's context: the prompt's features of the first request, for every request.
    let mut state = drafter.new_state().unwrap();
    let feats = out.hidden_states.get(0).unwrap();
    drafter.extend(&mut state, &feats, 0).unwrap();
    let states = vec![&state; batch];
    let anchors = vec![7; batch];
    let opts = ProposeOptions::default();
    c.bench_function(
        &format!("drafter_propose/{name}/b{batch}_ctx{CONTEXT}"),
        |bch| {
            bch.iter(|| {
                dspark::threads::in_round(|| {
                    black_box(drafter.propose_cached(&states, &anchors, &opts).unwrap())
                })
            })
        },
    );
}

/// The bundled pair at B = 1 (`S` = 1, 4, 9); with `DSPARK_BENCH_PAIR` set to a pair directory
/// (`dspark make-example DIR --memory-bound` writes one), that pair too, at B = 1 (`S` = 1, 9
/// and 48, a prefill chunk) and B = 4 (`S` = 1, 3, 9).
fn bench_target(c: &mut Criterion) {
    bench_pair(c, "bundled", &models(), None, &[(1, &[1, 4, 9])]);
    if let Some(dir) = std::env::var_os("DSPARK_BENCH_PAIR") {
        let dir = PathBuf::from(dir);
        let quant = std::env::var("DSPARK_BENCH_QUANT")
            .ok()
            .filter(|q| !q.is_empty());
        let quant = quant.map(|q| Quant::parse(&q).expect("DSPARK_BENCH_QUANT: q8_0 or q4_k"));
        let mut name = dir
            .file_name()
            .map_or("pair".into(), |n| n.to_string_lossy().into_owned());
        if let Some(q) = quant {
            name = format!("{name}-{}", q.as_str());
        }
        bench_pair(c, &name, &dir, quant, &[(1, &[1, 9, 48]), (4, &[1, 3, 9])]);
    }
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
