use candle_core::quantized::GgmlDType;
use half::bf16;

use super::rule::{SUBS, nibble, pack, unpack};
use super::search;
use super::*;
use crate::nn::quant::GROUP;
use crate::nn::quant::tests::{
    assert_group_gives_each_part_its_bits, assert_product_close, assert_runnable_give, bits,
    candle_quantizes, candle_reads,
};
use crate::nn::quant::{Quant, QuantKernel};
use crate::test_values::values;
use crate::view::Floats;

fn quantized(rows: usize, cols: usize, seed: u32) -> (Vec<f32>, Q4KMatrix) {
    let w = values(rows * cols, seed);
    let q = Q4KMatrix::quantize(Floats::F32(&w), rows, cols).unwrap();
    (w, q)
}

#[test]
fn six_bit_scales_and_mins_pack_and_unpack() {
    for seed in 0..64u32 {
        let v = values(16, seed);
        let sc: [u8; SUBS] = std::array::from_fn(|s| ((v[s] + 0.5) * 63.99) as u8);
        let m: [u8; SUBS] = std::array::from_fn(|s| ((v[8 + s] + 0.5) * 63.99) as u8);
        assert_eq!(unpack(&pack(&sc, &m)), (sc, m), "{sc:?} {m:?}");
    }
    assert_eq!(unpack(&pack(&[63; 8], &[63; 8])), ([63; 8], [63; 8]));
}

#[test]
fn the_blocks_are_gguf_s_q4_k_both_ways() {
    // Our blocks read by candle's Q4_K (GGUF's layout), and candle's blocks read as a GGUF
    // file's: the same weights either way.
    let (rows, cols) = (11, 512);
    let (_, ours) = quantized(rows, cols, 5);
    let bytes = ours.to_gguf();
    let seen = candle_reads(&bytes, (rows, cols), GgmlDType::Q4K);
    assert_eq!(bits(&seen), bits(&ours.dequantize()));
    assert_eq!(
        Q4KMatrix::from_gguf(&bytes, rows, cols).as_ref(),
        Some(&ours)
    );

    let (raw, back) = candle_quantizes(values(rows * cols, 9), (rows, cols), GgmlDType::Q4K);
    let read = Q4KMatrix::from_gguf(&raw, rows, cols).unwrap();
    assert_eq!(bits(&read.dequantize()), bits(&back));
    // Wrong lengths and widths are refused.
    assert!(Q4KMatrix::from_gguf(&bytes[1..], rows, cols).is_none());
    assert!(Q4KMatrix::from_gguf(&bytes, rows, cols - 1).is_none());
}

#[test]
fn super_blocks_keep_each_weight_within_its_sub_block_s_step() {
    for (rows, cols) in [(3, 256), (5, 300), (1, 1), (17, 512), (9, 40)] {
        let (w, q) = quantized(rows, cols, 7);
        assert_eq!(
            q.bytes(),
            rows.div_ceil(GROUP) * GROUP * cols.div_ceil(SUPER) * BLOCK_BYTES
        );
        let back = q.dequantize();
        assert_eq!(back.len(), w.len());
        for (o, (row, got)) in w.chunks(cols).zip(back.chunks(cols)).enumerate() {
            for (s, (x, y)) in row.chunks(SUB).zip(got.chunks(SUB)).enumerate() {
                let lo = x.iter().fold(0.0f32, |m, &v| m.min(v));
                let hi = x.iter().fold(lo, |m, &v| m.max(v));
                // A level is (hi − lo) / 15 wide; 6-bit scales and mins move it a little more,
                // and the f16 factors by 2^-11 of a weight's size.
                let bound = 0.75 * (hi - lo) / 15.0 + 0.02 * (hi - lo) + 1e-6;
                for (a, c) in x.iter().zip(y) {
                    let bound = bound + a.abs() * 1e-3;
                    assert!((a - c).abs() <= bound, "row {o} sub-block {s}: {a} vs {c}");
                }
            }
        }
    }
    // bf16 weights quantize the values they hold.
    let w = values(4 * 256, 3);
    let b: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
    let wide: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
    let qb = Q4KMatrix::quantize(Floats::BF16(&b), 4, 256).unwrap();
    assert_eq!(Some(qb), Q4KMatrix::quantize(Floats::F32(&wide), 4, 256));
}

#[test]
fn nibbles_are_the_levels_of_their_sub_blocks() {
    // Sub-block s holds level s (and min 0, scale 1): its dequantized weights are d · s.
    let mut sc = [0u8; SUBS];
    sc.fill(1);
    let mut qs = [0u8; SUPER / 2];
    for (i, q) in qs.iter_mut().enumerate() {
        let c = i / SUB;
        *q = (2 * c as u8) | ((2 * c as u8 + 1) << 4);
    }
    for i in 0..SUPER {
        assert_eq!(usize::from(nibble(&qs, i)), i / SUB);
    }
    let mut block = GroupQ4K::default();
    block.d[0] = half::f16::from_f32(0.5);
    block.set_row(0, &pack(&sc, &[0; SUBS]), &qs);
    let mut out = [0.0f32; SUPER];
    rule::dequantize_row(&block, 0, &mut out);
    assert!(
        out.iter()
            .enumerate()
            .all(|(i, &v)| v == 0.5 * (i / SUB) as f32)
    );
}

#[test]
fn extreme_levels_scales_and_activations_stay_exact_in_every_body() {
    // Every level 15, every scale and min 63, and activations at ±127: the largest integer
    // sums the kernels hold (a sub-block's 16-bit partial sums included).
    let (rows, cols) = (11, 512);
    let mut m = Q4KMatrix::zeros(rows, cols);
    let packed = pack(&[63; SUBS], &[63; SUBS]);
    for o in 0..rows {
        for b in 0..m.blocks {
            let block = m.block_mut(o, b);
            let j = o % GROUP;
            block.d[j] = half::f16::from_f32(0.25 + o as f32);
            block.dmin[j] = half::f16::from_f32(0.5);
            block.set_row(j, &packed, &[0xff; SUPER / 2]);
        }
    }
    for sign in [1.0f32, -1.0] {
        let n = 9;
        // Alternating ±1 within a block would cancel; a constant sign makes the sums extreme.
        let x: Vec<f32> = (0..n * cols)
            .map(|i| sign * (1.0 + (i % 7) as f32 * 1e-3))
            .collect();
        let q = Q8KRows::new(&x, n, cols);
        assert!(q.qs.iter().all(|&v| v.unsigned_abs() >= 126));
        let portable = m.matmul_with(QuantKernel::Portable, &x, n, None).unwrap();
        let exact = |r: usize, o: usize| {
            let (xd, xq, _) = q.row(r);
            let d = m.data[(o / GROUP) * m.blocks].d[o % GROUP].to_f32();
            let mut acc = 0.0f32;
            for b in 0..m.blocks {
                let s: i32 = xq[b * SUPER..(b + 1) * SUPER]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum();
                acc = ((63 * 15 * s) as f32).mul_add(d * xd[b], acc);
                acc = (-((63 * s) as f32)).mul_add(0.5 * xd[b], acc);
            }
            acc
        };
        for r in 0..n {
            for o in 0..rows {
                assert_eq!(portable[r * rows + o].to_bits(), exact(r, o).to_bits());
            }
        }
        assert_runnable_give(&portable, |k| m.matmul_with(k, &x, n, None));
    }
}

#[test]
fn products_follow_the_dequantized_product_closely() {
    // Only the activations' 8-bit rounding is left.
    let (rows, cols, n) = (48, 512, 3);
    let (_, q) = quantized(rows, cols, 21);
    let x = values(n * cols, 9);
    let y = q.matmul(&x, n, None).unwrap();
    assert_product_close(&y, &q.dequantize(), &x, (rows, cols));
}

#[test]
fn a_split_group_gives_each_part_its_own_bits() {
    // A q/k/v-like group, with and without biases.
    let parts: Vec<Q4KMatrix> = [(2200, 3), (40, 4), (17, 5)]
        .iter()
        .map(|&(rows, seed)| quantized(rows, 1024, seed).1)
        .collect();
    assert_group_gives_each_part_its_bits(&parts, &quantized(4, 256, 1).1, |m, x, n, b| {
        m.matmul_with(QuantKernel::Portable, x, n, b)
    });
}

#[test]
fn bad_shapes_and_unrepresentable_weights_are_refused() {
    let (_, q) = quantized(4, 256, 1);
    assert!(q.matmul(&[0.0; 255], 1, None).is_none());
    assert!(q.matmul(&[0.0; 256], 1, Some(&[0.0; 3])).is_none());
    assert_eq!(q.matmul(&[], 0, None), Some(Vec::new()));
    assert!(Q4KMatrix::quantize(Floats::F32(&[0.0; 5]), 2, 3).is_none());
    let mut w = vec![0.0f32; 256];
    for bad in [f32::INFINITY, f32::NAN, 1e12] {
        w[3] = bad;
        assert!(
            Q4KMatrix::quantize(Floats::F32(&w), 1, 256).is_none(),
            "{bad}"
        );
    }
    // All-zero and constant rows are exact.
    let z = Q4KMatrix::quantize(Floats::F32(&[0.0; 512]), 2, 256).unwrap();
    assert_eq!(z.matmul(&values(256, 1), 1, None), Some(vec![0.0, 0.0]));
    let c = Q4KMatrix::quantize(Floats::F32(&[-0.25; 256]), 1, 256).unwrap();
    assert!(c.dequantize().iter().all(|&v| (v + 0.25).abs() < 1e-3));
    assert_eq!(Quant::parse("Q4_K"), Some(Quant::Q4K));
}

#[test]
fn in_place_quantization_is_as_close_as_llama_cpp_s() {
    // Bell-shaped weights (a sum of four uniforms) with a few outliers, as trained layers have;
    // candle's Q4_K quantizer is llama.cpp's reference one.
    let (rows, cols) = (64, 1024);
    let u: Vec<Vec<f32>> = (0..4).map(|k| values(rows * cols, 40 + k)).collect();
    let mut w: Vec<f32> = (0..rows * cols)
        .map(|i| 0.05 * u.iter().map(|v| v[i]).sum::<f32>())
        .collect();
    for i in (0..w.len()).step_by(997) {
        w[i] *= 8.0;
    }
    let mse = |back: &[f32]| -> f64 {
        let s: f64 = w
            .iter()
            .zip(back)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum();
        s / w.len() as f64
    };
    let ours = mse(&Q4KMatrix::quantize(Floats::F32(&w), rows, cols)
        .unwrap()
        .dequantize());
    let theirs = mse(&candle_quantizes(w.clone(), (rows, cols), GgmlDType::Q4K).1);

    assert!(ours <= 1.05 * theirs, "{ours} vs {theirs}");
}

/// The scale search one candidate at a time, each candidate's sums in the weights' order (the
/// quantizer's first form, its per-candidate solve shared): the oracle for the batched search's
/// bits.
fn fit_sub_oracle(x: &[f32]) -> (f32, f32) {
    let level = |v: f32| ((v + 0.5) as u8).min(15);
    let fit = |q: &[u8]| -> Option<(f32, f32, f32)> {
        let n = x.len() as f32;
        let (mut sq, mut sqq, mut sx, mut sqx) = (0.0f32, 0.0f32, 0.0f32, 0.0f32);
        for (&v, &l) in x.iter().zip(q) {
            let l = f32::from(l);
            sq += l;
            sqq += l * l;
            sx += v;
            sqx += l * v;
        }
        // The least-squares solve is per candidate in both forms: shared.
        let (a, b) = search::solve(n, sq, sqq, sx, sqx)?;
        let err = x
            .iter()
            .zip(q)
            .map(|(&v, &l)| (a * f32::from(l) + b - v).powi(2))
            .sum();
        Some((a, b, err))
    };
    let lo = x.iter().fold(0.0f32, |m, &v| m.min(v));
    let hi = x.iter().fold(lo, |m, &v| m.max(v));
    if hi <= lo {
        return (0.0, -lo);
    }
    let mut best = (0.0, -lo, x.iter().map(|&v| (v - lo).powi(2)).sum::<f32>());
    for step in 0..=20 {
        let iscale = (14.0 + 0.1 * step as f32) / (hi - lo);
        let q: Vec<u8> = x.iter().map(|&v| level(iscale * (v - lo))).collect();
        if let Some((a, b, err)) = fit(&q)
            && err < best.2
        {
            best = (a, -b, err);
        }
    }
    (best.0, best.1)
}

#[test]
fn the_batched_scale_search_keeps_the_one_at_a_time_search_s_bits() {
    let mut cases: Vec<Vec<f32>> = Vec::new();
    for seed in 0..400u32 {
        let scale = [1e-6f32, 1e-3, 0.05, 1.0, 300.0][seed as usize % 5];
        let len = [SUB, SUB, SUB, 1, 2, 7, 31][seed as usize % 7];
        let mut x: Vec<f32> = values(len, seed).iter().map(|v| v * scale).collect();
        match seed % 6 {
            // One outlier, all positive, all negative, a coarse grid (ties between levels).
            1 => x[0] *= 40.0,
            2 => x.iter_mut().for_each(|v| *v = v.abs() + scale),
            3 => x.iter_mut().for_each(|v| *v = -v.abs()),
            4 => x = crate::test_values::grid(len, seed, 7, 2.0, 1.5),
            _ => {}
        }
        cases.push(x);
    }
    cases.extend([
        vec![0.0; SUB],
        vec![-2.5; SUB],
        vec![3.0; SUB],
        vec![1.0, -1.0],
    ]);
    for x in &cases {
        let want = fit_sub_oracle(x);
        for got in [search::fit_sub(x), search::fit_sub_portable(x)] {
            assert_eq!(
                (got.0.to_bits(), got.1.to_bits()),
                (want.0.to_bits(), want.1.to_bits()),
                "{x:?}: {got:?} vs {want:?}"
            );
        }
    }
}
