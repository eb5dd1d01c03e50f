//! Criterion bench of the decode matvec per weight dtype, against the read-bandwidth floor.
//!
//! A memory-bound decode step multiplies one row (or the `K + 1` rows of a verification) by
//! every weight of the model, so its time is the time to read the weights. This bench streams a
//! ring of packed matrices of the memory-bound pair's MLP shapes (`[5120, 1024]` and
//! `[1024, 5120]`) through [`PackedWeight::matmul`] with 1 and 9 rows, and reports bytes of
//! weights per second, the figure to read against `matvec_bandwidth/sum` (a plain parallel read
//! with as many threads as the pool). bf16 / f16 panels read half the bytes of f32 ones, so at
//! the floor they multiply twice the weights per second; Q8_0 blocks (`q8_0/<body>`) read 34
//! bytes per 32 weights, Q4_K super-blocks (`q4_k/<body>`) 144 per 256, Q6_K ones (`q6_k/<body>`,
//! a GGUF Q4_K_M file's value, down and head maps) 210 per 256, each on every quantized body this
//! CPU runs (`avx512vnni`, `avxvnni`, `avx2`).
//!
//! The ring and the plain read each span [`stream_bytes`]: 4 times the last-level cache (at
//! least 256 MiB), so both come from DRAM. A fixed 168 MB ring was a DRAM figure on a 32 MiB
//! L3 and an L3 figure on a Xeon with 260 MiB of it.
//!
//! On a CPU with AMX the bf16 rows run twice, on AMX and on `vdpbf16ps` (`bf16-avx512bf16`).
//! `prefill_matmul` times a 96-row product of a cached weight, in multiply-adds per second.
//!
//! Run: `cargo bench -p dspark-benches --bench matvec -- --warm-up-time 1 --measurement-time 3`
//! (`RAYON_NUM_THREADS` sets the threads; the floor uses the same count).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dspark::nn::WeightDtype;
use dspark::nn::packed::{Kernel, PackedWeight};
use dspark::nn::quant::q4k::GroupQ4K;
use dspark::nn::quant::q6k::GroupQ6K;
use dspark::nn::quant::superblock::{SuperGroup, SuperMatrix};
use dspark::nn::quant::{GroupQ8, QuantKernel};
use dspark::view::Floats;
use dspark_benches::parallel_sum;
use std::hint::black_box;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The memory-bound target's MLP widths.
const HIDDEN: usize = 1024;
const MLP: usize = 5120;
/// Bytes the ring and the plain read span: 4x the largest cache this CPU reports (Linux
/// sysfs; 32 MiB assumed elsewhere), at least 256 MiB.
fn stream_bytes() -> usize {
    let largest = (0..8)
        .filter_map(|i| {
            let path = format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size");
            let text = std::fs::read_to_string(path).ok()?;
            let t = text.trim();
            let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
            let scale = match unit {
                "K" => 1 << 10,
                "M" => 1 << 20,
                _ => 1,
            };
            num.parse::<usize>().ok().map(|n| n * scale)
        })
        .max()
        .unwrap_or(32 << 20);
    (4 * largest).max(256 << 20)
}

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i.wrapping_mul(2_654_435_761) + seed) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

fn bench_matvec(c: &mut Criterion) {
    let threads = rayon::current_num_threads();
    let span = stream_bytes();
    let data = vec![1.0f32; span / 4];
    let mut g = c.benchmark_group("matvec_bandwidth");
    g.sample_size(10);
    g.throughput(Throughput::Bytes((data.len() * 4) as u64));
    g.bench_function(format!("sum_{}MiB_{threads}threads", span >> 20), |b| {
        b.iter(|| black_box(parallel_sum(&data, threads)))
    });
    g.finish();
    drop(data);

    let mut g = c.benchmark_group("decode_matvec");
    g.sample_size(20);
    for dtype in WeightDtype::ALL {
        let ring = Ring::new(span, dtype.size(), |w, rows, cols| {
            PackedWeight::pack(Floats::F32(w), rows, cols, dtype).unwrap()
        });
        for (label, kernel) in kernels(dtype) {
            let name = format!("{}{label}", dtype.as_str());
            ring.bench(&mut g, &name, |w, x, n| w.matmul_with(kernel, x, n, None));
        }
    }
    // The quantized formats' blocks, on every body this CPU runs (AMX runs Q8_0's tiles from 12
    // rows only: at 1 and 9 rows it is the AVX-512 VNNI body, so it is not repeated).
    let bodies: Vec<QuantKernel> = QuantKernel::runnable()
        .filter(|&k| !matches!(k, QuantKernel::Amx | QuantKernel::Portable))
        .collect();
    quant_ring::<GroupQ8>(&mut g, span, 2, "q8_0", &bodies);
    quant_ring::<GroupQ4K>(&mut g, span, 1, "q4_k", &bodies);
    // Q6_K: a GGUF Q4_K_M file's value and down maps (some layers) and head.
    quant_ring::<GroupQ6K>(&mut g, span, 1, "q6_k", &bodies);
    g.finish();
}

/// A ring of one quantized format (at least `per_weight` bytes a weight), `name/<body>` on each
/// of `bodies`.
fn quant_ring<G: SuperGroup>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    span: usize,
    per_weight: usize,
    name: &str,
    bodies: &[QuantKernel],
) {
    let ring = Ring::new(span, per_weight, |w, rows, cols| {
        SuperMatrix::<G>::quantize(Floats::F32(w), rows, cols).unwrap()
    });
    for &k in bodies {
        let label = format!("{name}/{}", k.name());
        ring.bench(g, &label, |w, x, n| w.matmul_with(k, x, n, None));
    }
}

/// Matrices of the MLP's two shapes (alternating `[MLP, HIDDEN]` and `[HIDDEN, MLP]`, an even
/// count) spanning at least `span` bytes at `per_weight` bytes a weight (or more), one of each
/// shape made and copied around the ring: distinct memory, so every product streams from DRAM
/// (quantizing a 1 GiB ring would take minutes).
struct Ring<W> {
    ring: Vec<W>,
    bytes: usize,
}

impl<W: Clone + Weight> Ring<W> {
    fn new(span: usize, per_weight: usize, make: impl Fn(&[f32], usize, usize) -> W) -> Self {
        let len = span.div_ceil(MLP * HIDDEN * per_weight).next_multiple_of(2);
        let shapes = [(MLP, HIDDEN), (HIDDEN, MLP)];
        let proto: Vec<W> = shapes
            .iter()
            .enumerate()
            .map(|(s, &(rows, cols))| make(&values(rows * cols, s), rows, cols))
            .collect();
        let ring: Vec<W> = (0..len).map(|s| proto[s % 2].clone()).collect();
        let bytes = ring[0].bytes();
        Self { ring, bytes }
    }

    /// `name`/1 and `name`/9: `product(w, x, n)` over the ring, in weight bytes per second.
    fn bench(
        &self,
        g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
        name: &str,
        product: impl Fn(&W, &[f32], usize) -> Option<Vec<f32>>,
    ) {
        for n in [1usize, 9] {
            let xs = [values(n * HIDDEN, 7), values(n * MLP, 8)];
            g.throughput(Throughput::Bytes(self.bytes as u64));
            let mut next = 0;
            g.bench_with_input(BenchmarkId::new(name, n), &n, |b, &n| {
                b.iter(|| {
                    next = (next + 1) % self.ring.len();
                    black_box(product(&self.ring[next], &xs[next % 2], n).unwrap())
                })
            });
        }
    }
}

/// A ring's matrix: its bytes.
trait Weight {
    fn bytes(&self) -> usize;
}

impl Weight for PackedWeight {
    fn bytes(&self) -> usize {
        PackedWeight::bytes(self)
    }
}

impl<G: SuperGroup> Weight for SuperMatrix<G> {
    fn bytes(&self) -> usize {
        SuperMatrix::bytes(self)
    }
}

fn kernels(dtype: WeightDtype) -> Vec<(&'static str, Kernel)> {
    let mut ks = vec![("", Kernel::best())];
    if dtype == WeightDtype::BF16 && Kernel::best() == Kernel::Amx {
        ks.push(("-avx512bf16", Kernel::Avx512Bf16));
    }
    ks
}

/// A prefill chunk's product: 96 rows against the MLP's `[5120, 1024]` weight (in cache after
/// the first call), in multiply-adds per second (Criterion's elements: 2 FLOP each), per
/// dtype and kernel as above. The machine's peak multiply rate is what to read it against.
fn bench_prefill(c: &mut Criterion) {
    const ROWS: usize = 96;
    let mut g = c.benchmark_group("prefill_matmul");
    g.sample_size(10);
    let w = values(MLP * HIDDEN, 3);
    let x = values(ROWS * HIDDEN, 5);
    g.throughput(Throughput::Elements((ROWS * MLP * HIDDEN) as u64));
    for dtype in WeightDtype::ALL {
        let p = PackedWeight::pack(Floats::F32(&w), MLP, HIDDEN, dtype).unwrap();
        for (label, kernel) in kernels(dtype) {
            let name = format!("{}{label}", dtype.as_str());
            g.bench_function(BenchmarkId::new(name, ROWS), |b| {
                b.iter(|| black_box(p.matmul_with(kernel, &x, ROWS, None).unwrap()))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench_matvec, bench_prefill);
criterion_main!(benches);
