use candle_core::quantized::GgmlDType;

use super::rule::{SUBS, ZERO_LEVEL, level};
use super::*;
use crate::nn::quant::tests::{assert_runnable_give, bits, candle_quantizes, candle_reads};
use crate::nn::quant::{GROUP, QuantKernel};
use crate::test_values::values;
use crate::view::Floats;

fn quantized(rows: usize, cols: usize, seed: u32) -> (Vec<f32>, Q6KMatrix) {
    let w = values(rows * cols, seed);
    let q = Q6KMatrix::quantize(Floats::F32(&w), rows, cols).unwrap();
    (w, q)
}

#[test]
fn the_blocks_are_gguf_s_q6_k_both_ways() {
    // candle's Q6_K blocks read as a GGUF file's, and ours read by candle: the same weights.
    let (rows, cols) = (11, 512);
    let (raw, back) = candle_quantizes(values(rows * cols, 9), (rows, cols), GgmlDType::Q6K);
    let read = Q6KMatrix::from_gguf(&raw, rows, cols).unwrap();
    assert_eq!(bits(&read.dequantize()), bits(&back));
    assert_eq!(read.to_gguf(), raw);

    let (_, ours) = quantized(rows, cols, 5);
    let bytes = ours.to_gguf();
    let seen = candle_reads(&bytes, (rows, cols), GgmlDType::Q6K);
    assert_eq!(bits(&seen), bits(&ours.dequantize()));
    assert_eq!(
        Q6KMatrix::from_gguf(&bytes, rows, cols).as_ref(),
        Some(&ours)
    );
    // Wrong lengths and widths are refused.
    assert!(Q6KMatrix::from_gguf(&bytes[1..], rows, cols).is_none());
    assert!(Q6KMatrix::from_gguf(&bytes, rows, cols - 1).is_none());
    assert_eq!(
        ours.bytes(),
        rows.div_ceil(GROUP) * GROUP * (cols / SUPER) * BLOCK_BYTES
    );
}

#[test]
fn levels_sit_where_gguf_puts_them() {
    // Weight i at level i % 64: every nibble and bit pair in its place, read back by `level`
    // and by candle.
    let mut row = RowQ6K {
        ql: [0; SUPER / 2],
        qh: [0; SUPER / 4],
        scales: [1; SUBS],
        d: half::f16::ONE,
    };
    for i in 0..SUPER {
        let (h, p, l) = (i / 128, (i % 128) / 32, i % 32);
        let q = (i % 64) as u8;
        row.ql[64 * h + 32 * (p % 2) + l] |= (q & 15) << (4 * (p / 2));
        row.qh[32 * h + l] |= (q >> 4) << (2 * p);
    }
    assert!((0..SUPER).all(|i| usize::from(level(&row, i)) == i % 64));
    let bytes = row.to_bytes();
    assert_eq!(RowQ6K::from_bytes(&bytes), Some(row));
    let seen = candle_reads(&bytes, (1, SUPER), GgmlDType::Q6K);
    let want: Vec<f32> = (0..SUPER).map(|i| (i % 64) as f32 - 32.0).collect();
    assert_eq!(seen, want);
}

#[test]
fn super_blocks_keep_each_weight_within_its_sub_block_s_step() {
    for (rows, cols) in [(3, 256), (5, 300), (1, 1), (17, 512), (9, 40)] {
        let (w, q) = quantized(rows, cols, 7);
        let back = q.dequantize();
        assert_eq!(back.len(), w.len());
        for (row, got) in w.chunks(cols).zip(back.chunks(cols)) {
            for (x, y) in row.chunks(SUB).zip(got.chunks(SUB)) {
                let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                // A step is about amax / 31; the 8-bit scale moves it by up to 1/254 of the
                // largest step, the f16 factor by 2^-11.
                let bound = 0.5 * amax / 31.0 * 1.05 + 0.01 * amax + 1e-6;
                for (a, c) in x.iter().zip(y) {
                    assert!((a - c).abs() <= bound, "{a} vs {c} (amax {amax})");
                }
            }
        }
    }
    // Zero rows stay zero, at level 32.
    let q = Q6KMatrix::quantize(Floats::F32(&[0.0; 512]), 2, 256).unwrap();
    assert!(q.dequantize().iter().all(|&v| v == 0.0));
    assert!((0..SUPER).all(|i| level(&q.data[0].row(1), i) == ZERO_LEVEL));
    assert!(Q6KMatrix::quantize(Floats::F32(&[f32::NAN; 256]), 1, 256).is_none());
    assert!(Q6KMatrix::quantize(Floats::F32(&[1.0; 10]), 2, 6).is_none());
}

#[test]
fn the_product_is_the_dequantized_weights_times_the_activations() {
    let (rows, cols, n) = (13, 768, 3);
    let (_, q) = quantized(rows, cols, 3);
    let w = q.dequantize();
    let x = values(n * cols, 4);
    let got = q.matmul(&x, n, None).unwrap();
    for r in 0..n {
        let xr = &x[r * cols..(r + 1) * cols];
        let amax = xr.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for o in 0..rows {
            let wr = &w[o * cols..(o + 1) * cols];
            let want: f64 = wr.iter().zip(xr).map(|(&a, &b)| f64::from(a * b)).sum();
            let wsum: f32 = wr.iter().map(|v| v.abs()).sum();
            // Activations are rounded to amax / 127 steps.
            let bound = 0.5 * amax / 127.0 * wsum + 1e-4;
            let err = (f64::from(got[r * rows + o]) - want).abs();
            assert!(err <= f64::from(bound), "row {r} out {o}: {err} > {bound}");
        }
    }
}

#[test]
fn extreme_levels_scales_and_activations_stay_exact_in_every_body() {
    // Levels at 0 and 63, scales at ±127 and -128, activations at ±127: the largest integer
    // sums the kernels hold.
    let (rows, cols, n) = (11, 512, 9);
    for (lvl, sc) in [(0u8, 127i8), (63, -128), (0, -128), (63, 127)] {
        let mut m = Q6KMatrix::zeros(rows, cols);
        let mut row = RowQ6K {
            ql: [0; SUPER / 2],
            qh: [0; SUPER / 4],
            scales: [sc; SUBS],
            d: half::f16::ONE,
        };
        for i in 0..SUPER {
            let (h, p, l) = (i / 128, (i % 128) / 32, i % 32);
            row.ql[64 * h + 32 * (p % 2) + l] |= (lvl & 15) << (4 * (p / 2));
            row.qh[32 * h + l] |= (lvl >> 4) << (2 * p);
        }
        for o in 0..rows {
            row.d = half::f16::from_f32(0.25 + o as f32);
            for b in 0..m.blocks {
                m.block_mut(o, b).set_row(o % GROUP, &row);
            }
        }
        for sign in [1.0f32, -1.0] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| sign * (1.0 + (i % 7) as f32 * 1e-3))
                .collect();
            let acts = Q6KRows::new(&x, n, cols);
            let portable = m.matmul_with(QuantKernel::Portable, &x, n, None).unwrap();
            for r in 0..n {
                let (xd, xq, _) = acts.row(r);
                for o in 0..rows {
                    let d = 0.25 + o as f32;
                    let mut acc = 0.0f32;
                    for b in 0..m.blocks {
                        let s: i64 = xq[b * SUPER..(b + 1) * SUPER]
                            .iter()
                            .map(|&v| i64::from(v))
                            .sum();
                        let isum = i64::from(sc) * (i64::from(lvl) - 32) * s;
                        acc = (isum as f32).mul_add(d * xd[b], acc);
                    }
                    assert_eq!(portable[r * rows + o].to_bits(), acc.to_bits());
                }
            }
            assert_runnable_give(&portable, |k| m.matmul_with(k, &x, n, None));
        }
    }
}
