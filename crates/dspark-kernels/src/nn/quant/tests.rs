use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use half::bf16;

use super::*;
use crate::test_values::values;
use crate::view::Floats;

fn quantized(rows: usize, cols: usize, seed: u32) -> (Vec<f32>, QuantMatrix) {
    let w = values(rows * cols, seed);
    let q = QuantMatrix::quantize(Floats::F32(&w), rows, cols).unwrap();
    (w, q)
}

#[test]
fn blocks_round_each_weight_to_half_a_step() {
    for (rows, cols) in [(3, 32), (5, 70), (1, 1), (17, 96)] {
        let (w, q) = quantized(rows, cols, 7);
        assert_eq!(
            q.bytes(),
            rows.div_ceil(GROUP) * GROUP * cols.div_ceil(BLOCK) * 34
        );
        let back = q.dequantize();
        assert_eq!(back.len(), w.len());
        for (o, (row, got)) in w.chunks(cols).zip(back.chunks(cols)).enumerate() {
            for (b, (x, y)) in row.chunks(BLOCK).zip(got.chunks(BLOCK)).enumerate() {
                let step = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
                for (a, c) in x.iter().zip(y) {
                    // Half a step, plus the f16 scale's own rounding (2^-11 relative).
                    let bound = 0.5 * step + a.abs() * 1e-3 + 1e-7;
                    assert!((a - c).abs() <= bound, "row {o} block {b}: {a} vs {c}");
                }
            }
        }
    }
    // bf16 weights quantize the values they hold.
    let w = values(4 * 64, 3);
    let b: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
    let wide: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
    let qb = QuantMatrix::quantize(Floats::BF16(&b), 4, 64).unwrap();
    let qw = QuantMatrix::quantize(Floats::F32(&wide), 4, 64).unwrap();
    assert_eq!(qb, qw);
}

pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every body this CPU runs gives the portable kernel's bits for a `[rows, cols]` weight at
/// each row count of `ns`, and each activation row alone gives its rows' bits (activations are
/// quantized per row): `product(kernel, x, n)` is the weight's product with its bias. Shared by
/// every format's tests.
pub(crate) fn assert_bodies_agree(
    (rows, cols): (usize, usize),
    ns: &[usize],
    product: impl Fn(QuantKernel, &[f32], usize) -> Option<Vec<f32>>,
) {
    for &n in ns {
        let x = values(n * cols, 100 + n as u32);
        let portable = product(QuantKernel::Portable, &x, n).unwrap();
        for kernel in QuantKernel::runnable() {
            let got = product(kernel, &x, n).unwrap();
            let at = format!("{}: {rows}x{cols}, {n} rows", kernel.name());
            assert_eq!(bits(&got), bits(&portable), "{at}");
            for r in 0..n {
                let one = product(kernel, &x[r * cols..(r + 1) * cols], 1).unwrap();
                assert_eq!(bits(&one), bits(&got[r * rows..(r + 1) * rows]), "{at}");
            }
        }
    }
}

/// Every body this CPU runs gives `portable`'s bits: `product(kernel)`.
pub(crate) fn assert_runnable_give(
    portable: &[f32],
    product: impl Fn(QuantKernel) -> Option<Vec<f32>>,
) {
    for kernel in QuantKernel::runnable() {
        let got = product(kernel).unwrap();
        assert_eq!(bits(&got), bits(portable), "{}", kernel.name());
    }
}

/// `bytes` (a GGUF tensor of `dtype`, `[rows, cols]`) as candle reads them: the weights.
pub(crate) fn candle_reads(
    bytes: &[u8],
    (rows, cols): (usize, usize),
    dtype: GgmlDType,
) -> Vec<f32> {
    let storage = QStorage::from_data(Cow::Borrowed(bytes), &Device::Cpu, dtype).unwrap();
    let t = QTensor::new(storage, (rows, cols)).unwrap();
    let w = t.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap();
    w.to_vec1().unwrap()
}

/// `w: [rows, cols]` quantized by candle (llama.cpp's reference quantizers) to `dtype`: the
/// GGUF bytes and the weights they hold.
pub(crate) fn candle_quantizes(
    w: Vec<f32>,
    (rows, cols): (usize, usize),
    dtype: GgmlDType,
) -> (Vec<u8>, Vec<f32>) {
    let t = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, dtype).unwrap();
    let back = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap();
    (q.data().unwrap().to_vec(), back.to_vec1().unwrap())
}

/// A group product over `parts` (one over 1 MiB: split over the pool), with and without
/// biases, gives each part the bits of `alone` (its own product); a part of another width
/// (`narrow`) is refused.
pub(crate) fn assert_group_gives_each_part_its_bits<M: Blocks>(
    parts: &[M],
    narrow: &M,
    alone: impl Fn(&M, &[f32], usize, Option<&[f32]>) -> Option<Vec<f32>>,
) {
    let cols = parts[0].shape().1;
    let biases: Vec<Vec<f32>> = parts.iter().map(|m| values(m.shape().0, 9)).collect();
    for n in [1, 9] {
        let x = values(n * cols, 31);
        let group: Vec<(&M, Option<&[f32]>)> = parts
            .iter()
            .zip(&biases)
            .enumerate()
            .map(|(i, (m, b))| (m, (i != 1).then_some(b.as_slice())))
            .collect();
        let ys = group_with(QuantKernel::best(), &group, &x, n).unwrap();
        for ((m, b), y) in group.iter().zip(&ys) {
            assert_eq!(bits(&alone(m, &x, n, *b).unwrap()), bits(y));
        }
    }
    let mixed = [(&parts[0], None), (narrow, None)];
    assert!(group_with(QuantKernel::best(), &mixed, &values(cols, 1), 1).is_none());
}

/// The K-quants' every-body check, partial super-blocks included.
fn k_quant_bodies_agree<G: superblock::SuperGroup>() {
    for (rows, cols) in [(16, 256), (37, 512), (5, 40), (64, 1024), (9, 300)] {
        let w = values(rows * cols, 11);
        let q = superblock::SuperMatrix::<G>::quantize(Floats::F32(&w), rows, cols).unwrap();
        let bias = values(rows, 5);
        let ns = [1, 2, 3, 4, 5, 8, 9, 13, 17];
        assert_bodies_agree((rows, cols), &ns, |k, x, n| {
            q.matmul_with(k, x, n, Some(&bias))
        });
    }
}

#[test]
fn every_k_quant_body_gives_the_rule_s_bits_and_rows_do_not_see_each_other() {
    k_quant_bodies_agree::<q4k::GroupQ4K>();
    k_quant_bodies_agree::<q6k::GroupQ6K>();
}

#[test]
fn every_body_gives_the_rule_s_bits_and_rows_do_not_see_each_other() {
    for (rows, cols) in [(16, 64), (37, 96), (5, 40), (64, 1024)] {
        let (_, q) = quantized(rows, cols, 11);
        let bias = values(rows, 5);
        // Past 16 rows the AMX body runs several tiles, of two sizes from 17 on.
        let ns = [1, 3, 4, 5, 8, 9, 13, 16, 17, 19, 32, 41];
        assert_bodies_agree((rows, cols), &ns, |k, x, n| {
            q.matmul_with(k, x, n, Some(&bias))
        });
    }
}

#[test]
fn extreme_bytes_stay_exact_in_every_body() {
    // A GGUF file may hold -128 (llama.cpp's quantizer writes -127 ..= 127): weights at -128
    // and 127 against activations at ±127, the largest sums the kernels hold.
    let (rows, cols) = (9, 128);
    let mut bytes = Vec::new();
    for o in 0..rows {
        for b in 0..cols / BLOCK {
            bytes.extend(half::f16::from_f32(0.5 + o as f32).to_le_bytes());
            bytes.extend((0..BLOCK).map(|i| if (i + b + o) % 3 == 0 { 0x80u8 } else { 0x7f }));
        }
    }
    let m = QuantMatrix::from_gguf(&bytes, rows, cols).unwrap();
    // 16 rows: the AMX body's tiles, where it runs.
    for (sign, n) in [(1.0f32, 9), (-1.0, 9), (1.0, 16), (-1.0, 16)] {
        let x: Vec<f32> = (0..n * cols)
            .map(|i| sign * (1.0 + (i % 5) as f32 * 1e-3))
            .collect();
        let portable = m.matmul_with(QuantKernel::Portable, &x, n, None).unwrap();
        let q = QuantRows::new(&x, n, cols);
        for r in 0..n {
            let (xd, xq, _) = q.row(r);
            for o in 0..rows {
                let block = &m.data[(o / GROUP) * m.blocks..];
                let mut acc = 0.0f32;
                for b in 0..m.blocks {
                    let w = block[b].row(o % GROUP);
                    let s: i32 = (0..BLOCK)
                        .map(|i| i32::from(w[i]) * i32::from(xq[b * BLOCK + i]))
                        .sum();
                    acc = (s as f32).mul_add(block[b].d[o % GROUP].to_f32() * xd[b], acc);
                }
                assert_eq!(portable[r * rows + o].to_bits(), acc.to_bits());
            }
        }
        assert_runnable_give(&portable, |k| m.matmul_with(k, &x, n, None));
    }
}

/// `y: [n, rows]` is within 1% of each dot's scale (`Σ|x| / 2`) of `x: [n, cols]` times
/// `w: [rows, cols]` in f32: the 8-bit roundings of values in [-0.5, 0.5] are well under that.
pub(crate) fn assert_product_close(y: &[f32], w: &[f32], x: &[f32], (rows, cols): (usize, usize)) {
    for (r, xr) in x.chunks_exact(cols).enumerate() {
        let scale: f32 = xr.iter().map(|v| v.abs()).sum::<f32>() * 0.5;
        for (o, wr) in w.chunks_exact(cols).enumerate() {
            let exact: f32 = wr.iter().zip(xr).map(|(a, b)| a * b).sum();
            let got = y[r * rows + o];
            let at = format!("{r},{o}: {got} vs {exact}");
            assert!((got - exact).abs() <= 0.01 * scale, "{at}");
        }
    }
}

#[test]
fn products_follow_the_f32_product_closely() {
    // Two 8-bit roundings: the weights' and the activations'.
    let (rows, cols, n) = (48, 256, 3);
    let (w, q) = quantized(rows, cols, 21);
    let x = values(n * cols, 9);
    assert_product_close(&q.matmul(&x, n, None).unwrap(), &w, &x, (rows, cols));
}

#[test]
fn a_split_product_writes_every_output_once() {
    // Over 1 MiB of blocks: split over the pool where it has several threads.
    let (rows, cols, n) = (1100, 1024, 2);
    let (_, q) = quantized(rows, cols, 2);
    let x = values(n * cols, 4);
    let y = q.matmul(&x, n, None).unwrap();
    let mut want = vec![0.0f32; n * rows];
    let acts = QuantRows::new(&x, n, cols);
    GroupQ8::BODIES.run(
        QuantKernel::Portable,
        &q.data,
        q.blocks,
        &acts,
        n,
        0,
        &mut want,
    );
    assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn bad_shapes_and_unrepresentable_scales_are_refused() {
    let (_, q) = quantized(4, 32, 1);
    assert!(q.matmul(&[0.0; 31], 1, None).is_none());
    assert!(q.matmul(&[0.0; 32], 1, Some(&[0.0; 3])).is_none());
    assert_eq!(q.matmul(&[], 0, None), Some(Vec::new()));
    assert!(QuantMatrix::quantize(Floats::F32(&[0.0; 5]), 2, 3).is_none());
    let mut w = vec![0.0f32; 32];
    w[3] = f32::INFINITY;
    assert!(QuantMatrix::quantize(Floats::F32(&w), 1, 32).is_none());
    w[3] = f32::NAN;
    assert!(QuantMatrix::quantize(Floats::F32(&w), 1, 32).is_none());
    w[3] = 1e9;
    assert!(QuantMatrix::quantize(Floats::F32(&w), 1, 32).is_none());
    // An all-zero block has a zero scale and gives exact zeros.
    let z = QuantMatrix::quantize(Floats::F32(&[0.0; 64]), 2, 32).unwrap();
    assert_eq!(z.matmul(&values(32, 1), 1, None), Some(vec![0.0, 0.0]));
    assert_eq!(Quant::parse(" Q8_0"), Some(Quant::Q8_0));
    assert_eq!(Quant::parse("q3_k"), None);
}

#[test]
fn a_group_gives_each_part_its_own_bits() {
    // A q/k/v-like group, with and without biases.
    let parts: Vec<QuantMatrix> = [(2200, 3), (40, 4), (17, 5)]
        .iter()
        .map(|&(rows, seed)| quantized(rows, 512, seed).1)
        .collect();
    assert_group_gives_each_part_its_bits(&parts, &quantized(4, 64, 1).1, |m, x, n, b| {
        m.matmul(x, n, b)
    });
    assert!(matmul_group(&[], &[], 0).is_none());
}

#[test]
fn the_blocks_are_gguf_s_q8_0_both_ways() {
    // Our blocks read by candle's Q8_0 (GGUF's layout) and candle's read as a GGUF file's: the
    // same weights either way, and the same blocks (both round `x / (max|x| / 127)` half away
    // from zero).
    let (rows, cols) = (11, 96);
    let (w, ours) = quantized(rows, cols, 5);
    let bytes = ours.to_gguf();
    let seen = candle_reads(&bytes, (rows, cols), GgmlDType::Q8_0);
    assert_eq!(bits(&seen), bits(&ours.dequantize()));
    assert_eq!(
        QuantMatrix::from_gguf(&bytes, rows, cols).as_ref(),
        Some(&ours)
    );
    assert_eq!(candle_quantizes(w, (rows, cols), GgmlDType::Q8_0).0, bytes);
    assert!(QuantMatrix::from_gguf(&bytes[1..], rows, cols).is_none());
    assert!(QuantMatrix::from_gguf(&bytes, rows, cols - 1).is_none());
}

#[test]
fn activation_blocks_are_the_rule_s_bits_on_every_path() {
    // Random rows, rows of exact ties (k + 0.5 after scaling), NaN, infinities, subnormals and
    // zeros: the AVX2 body (whole blocks) and the rule (partial blocks, and everywhere without
    // AVX2) give the same scales and bytes.
    let cols = 32 * 9 + 7;
    let mut x = values(6 * cols, 17);
    for (i, v) in x[cols..2 * cols].iter_mut().enumerate() {
        // max 127 · 0.5: every value a multiple of 0.5 after scaling, ties included.
        *v = ((i % 255) as f32 - 127.0) * 0.5;
    }
    x[2 * cols + 3] = f32::NAN;
    x[2 * cols + 40] = f32::INFINITY;
    x[2 * cols + 80] = f32::NEG_INFINITY;
    for v in &mut x[3 * cols..3 * cols + 64] {
        *v *= 1e-40;
    }
    x[4 * cols..5 * cols].fill(0.0);
    for block in [BLOCK, 256] {
        let n = 6;
        let blocks = cols.div_ceil(block);
        let mut d = vec![0.0f32; n * blocks];
        let mut qs = vec![0i8; n * blocks * block];
        acts::quantize_rows(&x, n, cols, block, &mut d, &mut qs);
        for r in 0..n {
            let row = &x[r * cols..(r + 1) * cols];
            for b in 0..blocks {
                let mut want = vec![0i8; block];
                let values = &row[(b * block).min(cols)..((b + 1) * block).min(cols)];
                let scale = rule::quantize_block(values, &mut want);
                let i = r * blocks + b;
                assert_eq!(
                    d[i].to_bits(),
                    scale.to_bits(),
                    "row {r} block {b} of {block}"
                );
                assert_eq!(
                    &qs[i * block..(i + 1) * block],
                    &want[..],
                    "row {r} block {b}"
                );
            }
        }
    }
    // The rule's rounding: half away from zero, clamped, NaN to 0.
    let cases = [
        (0.5, 1),
        (-0.5, -1),
        (1.5, 2),
        (2.5, 3),
        (-2.5, -3),
        (0.49999997, 0),
        (126.6, 127),
        (127.5, 127),
        (-1e9, -127),
        (f32::NAN, 0),
        (f32::INFINITY, 127),
    ];
    for (v, want) in cases {
        assert_eq!(rule::level(v), want, "{v}");
    }
}

/// The AMX body runs where Linux reports AMX-INT8 and AVX-512 VNNI (and `DSPARK_AMX` is not
/// `0`), so the every-body tests above check its bits on such a machine; it is never the best
/// kernel elsewhere.
#[test]
fn amx_runs_where_the_cpu_has_it() {
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    let off = std::env::var("DSPARK_AMX").is_ok_and(|v| v.trim() == "0");
    let expect = cfg!(target_os = "linux") && has("amx_int8") && has("avx512_vnni") && !off;
    assert_eq!(QuantKernel::Amx.available(), expect);
    assert_eq!(QuantKernel::best() == QuantKernel::Amx, expect);
}

/// Each row of `w` (`[rows, cols]`) quantized alone: its bytes as a GGUF file stores them.
fn rows_alone<G: SuperGroup>(w: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    (0..rows)
        .flat_map(|o| {
            let row = &w[o * cols..(o + 1) * cols];
            SuperMatrix::<G>::quantize(Floats::F32(row), 1, cols)
                .unwrap()
                .to_gguf()
        })
        .collect()
}

#[test]
fn a_matrix_quantized_over_the_pool_has_each_row_s_own_blocks() {
    // 43 rows: 5 full groups and a partial one, quantized group by group over the pool; each
    // row's blocks are the ones it gets alone, in its own group and slot.
    let (rows, cols) = (43, 512);
    let w = values(rows * cols, 11);
    let q8 = QuantMatrix::quantize(Floats::F32(&w), rows, cols).unwrap();
    assert_eq!(q8.to_gguf(), rows_alone::<GroupQ8>(&w, rows, cols));
    let q4 = q4k::Q4KMatrix::quantize(Floats::F32(&w), rows, cols).unwrap();
    assert_eq!(q4.to_gguf(), rows_alone::<q4k::GroupQ4K>(&w, rows, cols));
    // A value that is not finite in the last group's last row still refuses the matrix.
    let mut bad = w.clone();
    bad[rows * cols - 1] = f32::NAN;
    assert!(QuantMatrix::quantize(Floats::F32(&bad), rows, cols).is_none());
    assert!(q4k::Q4KMatrix::quantize(Floats::F32(&bad), rows, cols).is_none());
}
