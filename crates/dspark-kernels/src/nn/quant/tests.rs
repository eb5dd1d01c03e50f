use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use half::bf16;

use super::*;
use crate::test_values::values;

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

#[test]
fn the_x86_body_gives_the_rule_s_bits_and_rows_do_not_see_each_other() {
    for (rows, cols) in [(16, 64), (37, 96), (5, 40), (64, 1024)] {
        let (_, q) = quantized(rows, cols, 11);
        let bias = values(rows, 5);
        for n in [1, 3, 4, 5, 9, 13] {
            let x = values(n * cols, 100 + n as u32);
            let portable = q
                .matmul_with(QuantKernel::Portable, &x, n, Some(&bias))
                .unwrap();
            let best = q.matmul(&x, n, Some(&bias)).unwrap();
            assert_eq!(
                best.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                portable.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{rows}x{cols}, {n} rows"
            );
            // Each row alone: the same bits (activations are quantized per row).
            for r in 0..n {
                let one = q
                    .matmul(&x[r * cols..(r + 1) * cols], 1, Some(&bias))
                    .unwrap();
                let got = &best[r * rows..(r + 1) * rows];
                assert!(one.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }
}

#[test]
fn products_follow_the_f32_product_closely() {
    let (rows, cols, n) = (48, 256, 3);
    let (w, q) = quantized(rows, cols, 21);
    let x = values(n * cols, 9);
    let y = q.matmul(&x, n, None).unwrap();
    for r in 0..n {
        for o in 0..rows {
            let xr = &x[r * cols..(r + 1) * cols];
            let exact: f32 = w[o * cols..(o + 1) * cols]
                .iter()
                .zip(xr)
                .map(|(a, b)| a * b)
                .sum();
            // Two 8-bit roundings of values in [-0.5, 0.5]: well under 1% of the dot's scale.
            let scale: f32 = xr.iter().map(|v| v.abs()).sum::<f32>() * 0.5;
            let got = y[r * rows + o];
            assert!(
                (got - exact).abs() <= 0.01 * scale,
                "{r},{o}: {got} vs {exact}"
            );
        }
    }
}

#[test]
fn a_split_product_writes_every_output_once() {
    // Over 1 MiB of blocks: split over the pool where it has several threads.
    let (rows, cols, n) = (1100, 1024, 2);
    let (_, q) = quantized(rows, cols, 2);
    let x = values(n * cols, 4);
    let y = q.matmul(&x, n, None).unwrap();
    let mut want = vec![0.0f32; n * rows];
    rule::matmul_rows(
        &q.data,
        q.blocks,
        &QuantRows::new(&x, n, cols),
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
    // A q/k/v-like group (one part over 1 MiB: split over the pool), with and without biases.
    let cols = 512;
    let parts: Vec<QuantMatrix> = [(2200, 3), (40, 4), (17, 5)]
        .iter()
        .map(|&(rows, seed)| quantized(rows, cols, seed).1)
        .collect();
    let biases: Vec<Vec<f32>> = parts.iter().map(|m| values(m.rows(), 9)).collect();
    for n in [1, 9] {
        let x = values(n * cols, 31);
        let group: Vec<QuantPart<'_>> = parts
            .iter()
            .zip(&biases)
            .enumerate()
            .map(|(i, (m, b))| (m, (i != 1).then_some(b.as_slice())))
            .collect();
        let ys = matmul_group(&group, &x, n).unwrap();
        for ((m, b), y) in group.iter().zip(&ys) {
            let alone = m.matmul(&x, n, *b).unwrap();
            assert!(alone.iter().zip(y).all(|(a, c)| a.to_bits() == c.to_bits()));
        }
    }
    let narrow = quantized(4, 64, 1).1;
    let mixed: [QuantPart<'_>; 2] = [(&parts[0], None), (&narrow, None)];
    assert!(matmul_group(&mixed, &values(cols, 1), 1).is_none());
    assert!(matmul_group(&[], &[], 0).is_none());
}

#[test]
fn the_blocks_are_gguf_s_q8_0_both_ways() {
    // Our blocks read by candle's Q8_0 (GGUF's layout) and candle's read as a GGUF file's: the
    // same weights either way, and the same blocks (both round `x / (max|x| / 127)` half away
    // from zero).
    let (rows, cols) = (11, 96);
    let (w, ours) = quantized(rows, cols, 5);
    let mut bytes = Vec::new();
    for o in 0..rows {
        for b in 0..ours.blocks {
            let block = &ours.data[(o / GROUP) * ours.blocks + b];
            bytes.extend(block.d[o % GROUP].to_le_bytes());
            bytes.extend(block.qs[o % GROUP].map(|q| q as u8));
        }
    }
    let storage =
        QStorage::from_data(Cow::Borrowed(&bytes), &Device::Cpu, GgmlDType::Q8_0).unwrap();
    let seen = QTensor::new(storage, (rows, cols)).unwrap();
    let seen = seen
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&seen.to_vec1::<f32>().unwrap()),
        bits(&ours.dequantize())
    );
    assert_eq!(
        QuantMatrix::from_gguf(&bytes, rows, cols).as_ref(),
        Some(&ours)
    );
    let t = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
    let theirs = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
    assert_eq!(theirs.data().unwrap().as_ref(), &bytes[..]);
    assert!(QuantMatrix::from_gguf(&bytes[1..], rows, cols).is_none());
    assert!(QuantMatrix::from_gguf(&bytes, rows, cols - 1).is_none());
}
