//! Every kernel against the portable one, bit for bit, in every panel dtype; the portable one
//! against an f64 oracle; packing, views and the pool split.

use half::{bf16, f16};

use super::*;
use crate::test_values::values;

/// `x · Wᵀ` in f64, the oracle.
fn reference(w: &[f32], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f64> {
    let mut y = vec![0f64; n * rows];
    for i in 0..n {
        for o in 0..rows {
            y[i * rows + o] = (0..cols)
                .map(|k| f64::from(w[o * cols + k]) * f64::from(x[i * cols + k]))
                .sum();
        }
    }
    y
}

/// The kernels this machine can run, lowest first: the higher ones are checked against the
/// portable one by forcing each in turn (one this CPU lacks runs as the portable one).
const KERNELS: [Kernel; 4] = [
    Kernel::Portable,
    Kernel::Avx2,
    Kernel::Avx512,
    Kernel::Avx512Bf16,
];

/// `x` as a bf16 product reads it: rounded to bf16 (see `pairs.rs`).
fn bf16_inputs(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| pairs::round_input(v).to_f32()).collect()
}

#[test]
fn pack_round_trips_and_rejects_bad_lengths() {
    for (rows, cols) in [(1, 1), (5, 3), (16, 7), (17, 2), (33, 40)] {
        let w = values(rows * cols, 3);
        let p = PackedMatrix::pack(&w, rows, cols).unwrap();
        assert_eq!(p.unpack(), w);
        assert_eq!((p.rows(), p.cols()), (rows, cols));
        assert_eq!(
            p,
            PackedMatrix::pack_with(rows, cols, |o, k| w[o * cols + k])
        );
        // Wᵀ from a strided [cols, rows] view of a wider buffer.
        let stride = rows + 3;
        let a: Vec<f32> = (0..cols * stride)
            .map(|i| {
                if i % stride < rows {
                    w[(i % stride) * cols + i / stride]
                } else {
                    9.0
                }
            })
            .collect();
        assert_eq!(PackedMatrix::pack_transposed(&a, stride, rows, cols), p);
        // Narrow dtypes: rounded once, to nearest even, then exact.
        let b: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        let pb = PackedMatrix::<bf16>::pack_floats(Floats::F32(&w), rows, cols).unwrap();
        assert_eq!(pb, PackedMatrix::pack(&b, rows, cols).unwrap());
        let wb: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
        assert_eq!(pb.unpack(), wb);
        let slots = cols.div_ceil(2) * 2;
        assert_eq!(pb.bytes(), rows.div_ceil(PANEL) * slots * PANEL * 2);
        let pw = PackedWeight::pack(Floats::BF16(&b), rows, cols, WeightDtype::F32).unwrap();
        assert_eq!(
            pw,
            PackedWeight::F32(PackedMatrix::pack(&wb, rows, cols).unwrap())
        );
        let ph = PackedWeight::pack(Floats::BF16(&b), rows, cols, WeightDtype::F16).unwrap();
        let want: Vec<f32> = wb.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        assert_eq!((ph.unpack(), ph.dtype()), (want, WeightDtype::F16));
    }
    assert!(PackedMatrix::pack(&[1.0; 5], 2, 3).is_none());
    assert!(PackedWeight::pack(Floats::F32(&[1.0; 5]), 2, 3, WeightDtype::BF16).is_none());
    // Empty products: no rows in, no outputs, or no inputs (zeros).
    let p = PackedMatrix::pack(&[1.0; 6], 2, 3).unwrap();
    assert_eq!(p.matmul(&[], 0, None).unwrap(), Vec::<f32>::new());
    let none = PackedMatrix::<f32>::pack(&[], 0, 3).unwrap();
    assert_eq!(none.matmul(&[1.0; 6], 2, None).unwrap(), Vec::<f32>::new());
    let flat = PackedMatrix::<f32>::pack(&[], 17, 0).unwrap();
    assert_eq!(
        flat.matmul(&[], 2, Some(&[1.0; 17])).unwrap(),
        vec![1.0; 34]
    );
    let p = PackedMatrix::pack(&[1.0; 6], 2, 3).unwrap();
    assert!(p.matmul(&[1.0; 5], 2, None).is_none());
    assert!(p.matmul(&[1.0; 6], 2, Some(&[0.0; 3])).is_none());
}

/// Shapes around panel and panel-group edges, row counts around tile splits.
const SHAPES: [(usize, usize); 7] = [
    (1, 5),
    (15, 8),
    (16, 16),
    (17, 9),
    (64, 33),
    (100, 24),
    (131, 3),
];
const ROWS: [usize; 8] = [1, 2, 5, 6, 7, 9, 13, 40];

/// Every kernel gives the portable kernel's bits for `dtype` panels of `w`, with and without
/// a bias; the portable one is within rounding of the f64 product of the stored values (and,
/// for bf16, of the inputs rounded to bf16).
fn kernels_agree(dtype: WeightDtype) {
    for (rows, cols) in SHAPES {
        let w = values(rows * cols, 11);
        let p = PackedWeight::pack(Floats::F32(&w), rows, cols, dtype).unwrap();
        let stored = p.unpack();
        let bias = values(rows, 5);
        for n in ROWS {
            let x = values(n * cols, n as u32);
            let read = if dtype == WeightDtype::BF16 {
                bf16_inputs(&x)
            } else {
                x.clone()
            };
            let want = reference(&stored, rows, cols, &read, n);
            let port = p.matmul_with(Kernel::Portable, &x, n, None).unwrap();
            for (a, b) in port.iter().zip(&want) {
                assert!(
                    (f64::from(*a) - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{a} vs {b}"
                );
            }
            for k in KERNELS {
                let got = p.matmul_with(k, &x, n, None).unwrap();
                assert_eq!(got, port, "{dtype} {k:?} rows {rows} cols {cols} n {n}");
                let with_bias = p.matmul_with(k, &x, n, Some(&bias)).unwrap();
                for (i, row) in with_bias.chunks(rows).enumerate() {
                    for (o, v) in row.iter().enumerate() {
                        assert_eq!(*v, port[i * rows + o] + bias[o], "{dtype} {k:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn every_kernel_matches_the_oracle_and_each_other_bit_for_bit_f32() {
    kernels_agree(WeightDtype::F32);
}

#[test]
fn every_kernel_matches_the_oracle_and_each_other_bit_for_bit_bf16() {
    kernels_agree(WeightDtype::BF16);
}

#[test]
fn every_kernel_matches_the_oracle_and_each_other_bit_for_bit_f16() {
    kernels_agree(WeightDtype::F16);
}

#[test]
fn narrow_panels_multiply_their_widened_values_exactly() {
    // Special values (subnormals, signed zeros, extremes) widen exactly: an f16 panel gives
    // the bits of the f32 panel holding the same values, on every kernel; a bf16 panel gives
    // the portable kernel's bits (its subnormals are stored as signed zeros).
    let (rows, cols) = (37, 19);
    let specials =
        |bits: &[u16]| -> Vec<u16> { (0..rows * cols).map(|i| bits[i % bits.len()]).collect() };
    let hb = specials(&[
        0x0001, 0x8000, 0x3f80, 0x7000, 0x0080, 0xbf00, 0x0000, 0x3e4d, 0x807f,
    ]);
    let hh = specials(&[
        0x0001, 0x8000, 0x3c00, 0x7bff, 0x03ff, 0xb800, 0x0000, 0x2e66,
    ]);
    let b: Vec<bf16> = hb.iter().map(|&v| bf16::from_bits(v)).collect();
    let h: Vec<f16> = hh.iter().map(|&v| f16::from_bits(v)).collect();
    let pb = PackedMatrix::pack(&b, rows, cols).unwrap();
    let ph = PackedMatrix::pack(&h, rows, cols).unwrap();
    let flushed: Vec<f32> = b.iter().map(|v| pairs::daz(v.to_f32())).collect();
    assert_eq!(
        pb.unpack().iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        flushed.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let fh = PackedMatrix::pack(&ph.unpack(), rows, cols).unwrap();
    for n in [1, 4, 9] {
        let x = values(n * cols, 3);
        let want_b = pb.matmul_with(Kernel::Portable, &x, n, None);
        for k in KERNELS {
            assert_eq!(pb.matmul_with(k, &x, n, None), want_b, "bf16 {k:?}");
            let want = fh.matmul_with(Kernel::Portable, &x, n, None);
            assert_eq!(ph.matmul_with(k, &x, n, None), want, "f16 {k:?}");
        }
    }
}

/// The bf16 rule by hand for one output: `acc = daz(fma(w_odd, x_odd, acc))`, then the even
/// column, per pair, from `+0.0`.
fn bf16_rule(w: &[f32], x: &[f32]) -> f32 {
    let read = bf16_inputs(x);
    let at = |v: &[f32], k: usize| v.get(k).copied().unwrap_or(0.0);
    (0..w.len().div_ceil(2)).fold(0f32, |acc, s| {
        let (o, e) = (2 * s + 1, 2 * s);
        let acc = pairs::daz(pairs::daz(at(w, o)).mul_add(at(&read, o), acc));
        pairs::daz(pairs::daz(at(w, e)).mul_add(at(&read, e), acc))
    })
}

#[test]
fn bf16_products_follow_the_pair_rule_through_subnormal_sums() {
    // Partial sums below 2^-126 flush to signed zeros; the widening kernels compute them with
    // plain FMAs, see the flags, and compute again exactly. Tiny weights and inputs make
    // products around and below the smallest normal, in both signs, beside ordinary ones.
    let (rows, cols) = (40, 37);
    let exps = [-72, -70, -68, -64, -3, 0, 2, -127];
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| {
            // Every fourth row holds tiny weights only, so its sums stay tiny.
            let span = if (i / cols) % 4 == 0 { 4 } else { exps.len() };
            let e = exps[(i * 7 + i / cols) % span];
            let s = if (i * 13) % 5 < 2 { -1.0 } else { 1.0 };
            s * (1.0 + (i % 11) as f32 / 16.0) * 2f32.powi(e)
        })
        .collect();
    let p = PackedWeight::pack(Floats::F32(&w), rows, cols, WeightDtype::BF16).unwrap();
    let stored = p.unpack();
    for n in [1, 3, 9, 12] {
        let x: Vec<f32> = (0..n * cols)
            .map(|i| {
                // Even rows hold tiny inputs only: against the tiny weights, sums below 2^-126.
                let span = if (i / cols) % 2 == 0 { 4 } else { exps.len() };
                let e = exps[(i * 3 + 1) % span];
                let s = if i % 3 == 0 { -1.0 } else { 1.0 };
                s * (1.0 + (i % 9) as f32 / 8.0) * 2f32.powi(e)
            })
            .collect();
        let want: Vec<u32> = (0..n)
            .flat_map(|i| {
                let (stored, x) = (&stored, &x);
                (0..rows).map(move |o| {
                    let row = &stored[o * cols..(o + 1) * cols];
                    bf16_rule(row, &x[i * cols..(i + 1) * cols]).to_bits()
                })
            })
            .collect();
        // The data exercises the flushes: zeros of both signs where plain FMAs leave tiny
        // sums.
        assert!(
            want.contains(&0x8000_0000) && want.contains(&0),
            "{want:x?}"
        );
        for k in KERNELS {
            let got = p.matmul_with(k, &x, n, None).unwrap();
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{k:?} n {n}");
        }
    }
}

#[test]
fn the_pool_split_gives_the_same_bits() {
    // Enough work to cross PAR_MIN_MACS, so the panels are split over the pool.
    let (rows, cols, n) = (1000, 512, 20);
    assert!(rows * cols * n >= crate::cpu::par::PAR_MIN_MACS);
    let w = values(rows * cols, 1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for dtype in WeightDtype::ALL {
        let p = PackedWeight::pack(Floats::F32(&w), rows, cols, dtype).unwrap();
        let x = values(n * cols, 2);
        let split = pool.install(|| p.matmul(&x, n, None).unwrap());
        let inline = one.install(|| p.matmul(&x, n, None).unwrap());
        assert_eq!(split, inline);
        // The bias is added by the tiles on both paths: the same bits.
        let bias = values(rows, 3);
        let split = pool.install(|| p.matmul(&x, n, Some(&bias)).unwrap());
        let inline = crate::threads::in_round(|| p.matmul(&x, n, Some(&bias)).unwrap());
        assert_eq!(split, inline);
        let shifted: Vec<f32> = one
            .install(|| p.matmul(&x, n, None).unwrap())
            .chunks(rows)
            .flat_map(|row| row.iter().zip(&bias).map(|(a, b)| a + b))
            .collect();
        assert_eq!(split, shifted);
    }
}

#[test]
fn streamed_matvecs_split_from_a_worker_in_a_round_with_the_same_bits() {
    // One row against a weight above the streaming bar: inside a round, from a pool worker,
    // the panels are split; the bits are the inline ones.
    let (rows, cols) = (1100, 512);
    let w = values(rows * cols, 7);
    let p = PackedMatrix::pack(&w, rows, cols).unwrap();
    assert!(p.bytes() >= crate::threads::STREAM_POOL_MIN_BYTES);
    let x = values(cols, 1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let split = pool.install(|| {
        crate::threads::in_round(|| {
            assert!(crate::threads::split_stream(p.bytes()));
            p.matmul(&x, 1, None).unwrap()
        })
    });
    let inline = p.matmul_with(Kernel::Portable, &x, 1, None).unwrap();
    assert_eq!(split, inline);
}

#[test]
fn strided_views_give_the_packed_bits_and_refuse_short_data() {
    // Wᵀ of a token-major [S, 2 heads, 32] buffer, head 1, read in place: panel p, column
    // k is row k's dimensions 16p..16p+16; and the same keys transposed with capacity 48.
    let (s, hd, stride, cap) = (21, 32, 64, 48);
    let v = values(s * stride, 4);
    let packed = PackedMatrix::pack_transposed(&v[hd..], stride, hd, s);
    let view = PanelView::new(&v[hd..], hd, s, PANEL, stride).unwrap();
    let mut kt = vec![f32::NAN; hd * cap];
    for j in 0..s {
        for d in 0..hd {
            kt[d * cap + j] = v[j * stride + hd + d];
        }
    }
    let keys = PackedMatrix::pack_strided(&v[hd..], stride, s, hd);
    let kview = PanelView::new(&kt, s, hd, PANEL, cap).unwrap();
    for n in [1, 3, 7, 12, 13] {
        for k in KERNELS {
            let x = values(n * s, n as u32);
            assert_eq!(
                view.matmul_with(k, &x, n, None),
                packed.matmul_with(k, &x, n, None)
            );
            let x = values(n * hd, n as u32 + 9);
            assert_eq!(
                kview.matmul_with(k, &x, n, None),
                keys.matmul_with(k, &x, n, None)
            );
        }
    }
    // The last panel's 16 lanes of the last column must lie inside the data.
    assert!(PanelView::new(&v[hd..], hd, s, PANEL, stride + 1).is_none());
    assert!(PanelView::new(&kt, cap, hd, PANEL, cap).is_some());
    assert!(PanelView::new(&kt, cap + 1, hd, PANEL, cap).is_none());
    assert!(PanelView::new(&kt[..hd * cap - 1], cap, hd, PANEL, cap).is_none());
    assert!(PanelView::<f32>::new(&[], 0, 5, PANEL, 1).is_some());
}

#[test]
fn row_tiles_fill_the_first_then_balance_and_interleaving_keeps_each_tile_in_place() {
    use super::dst::row_tiles;
    use super::tile::interleave;
    assert_eq!(row_tiles(13, 12).collect::<Vec<_>>(), [(0, 12), (12, 1)]);
    assert_eq!(
        row_tiles(29, 12).collect::<Vec<_>>(),
        [(0, 12), (12, 9), (21, 8)]
    );
    assert_eq!(row_tiles(0, 12).count(), 0);
    for n in 1..=40 {
        for max in [6, 9, 12] {
            let tiles: Vec<_> = row_tiles(n, max).collect();
            assert_eq!(tiles.len(), n.div_ceil(max));
            assert_eq!(tiles[0], (0, n.min(max)));
            let rest = &tiles[1..];
            let mut at = 0;
            for &(i0, m) in &tiles {
                assert_eq!(i0, at);
                assert!(m >= 1 && m <= max);
                at += m;
            }
            if let (Some(lo), Some(hi)) = (
                rest.iter().map(|t| t.1).min(),
                rest.iter().map(|t| t.1).max(),
            ) {
                assert!(hi - lo <= 1, "{tiles:?}");
            }
            assert_eq!(at, n);
            let cols = 3;
            let x: Vec<f32> = (0..n * cols).map(|v| v as f32).collect();
            let y = interleave(&x, n, cols, max);
            for (i0, m) in tiles {
                for q in 0..m {
                    for k in 0..cols {
                        assert_eq!(y[i0 * cols + k * m + q], x[(i0 + q) * cols + k]);
                    }
                }
            }
        }
    }
}

#[test]
fn grouped_products_give_each_products_bits() {
    // One input against several weights of one width (q/k/v-like outputs, a partial last
    // panel, an empty one), every kernel, inline and split over a pool (the group streams
    // more than the split bar in every dtype), with and without biases: each output is the
    // bits of that product alone.
    let cols = 1700;
    let shapes = [70, 16, 33, 0, 200];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for dtype in WeightDtype::ALL {
        let ws: Vec<PackedWeight> = shapes
            .iter()
            .map(|&r| {
                PackedWeight::pack(Floats::F32(&values(r * cols, r as u32)), r, cols, dtype)
                    .unwrap()
            })
            .collect();
        let biases: Vec<Vec<f32>> = shapes.iter().map(|&r| values(r, 2)).collect();
        let bytes: usize = ws.iter().map(PackedWeight::bytes).sum();
        assert!(pool.install(|| crate::threads::split_stream(bytes)));
        for n in [0, 1, 9, 13] {
            let x = values(n * cols, n as u32 + 1);
            for with_bias in [false, true] {
                let b = |i: usize| with_bias.then_some(&biases[i][..]);
                let alone = |k: Kernel| -> Vec<Vec<f32>> {
                    let each = |(i, w): (usize, &PackedWeight)| w.matmul_with(k, &x, n, b(i));
                    ws.iter()
                        .enumerate()
                        .map(each)
                        .collect::<Option<_>>()
                        .unwrap()
                };
                let parts: Vec<WeightPart<'_>> =
                    ws.iter().enumerate().map(|(i, w)| (w, b(i))).collect();
                let want = Some(alone(Kernel::best()));
                let split = pool.install(|| PackedWeight::matmul_group(&parts, &x, n));
                assert_eq!(split, want, "{dtype} n {n}");
                let inline = crate::threads::in_round(|| PackedWeight::matmul_group(&parts, &x, n));
                assert_eq!(inline, want, "{dtype} n {n}");
                // Every kernel, through the views (f32 panels).
                let views: Vec<GroupPart<'_, f32>> = ws
                    .iter()
                    .enumerate()
                    .filter_map(|(i, w)| match w {
                        PackedWeight::F32(m) => Some((m.view(), b(i))),
                        _ => None,
                    })
                    .collect();
                if views.len() == ws.len() {
                    for k in KERNELS {
                        let got = pool.install(|| matmul_group(k, &views, &x, n));
                        assert_eq!(got, Some(alone(k)), "{k:?} n {n}");
                    }
                }
            }
        }
    }
    // Mixed dtypes, widths or bias lengths: no group.
    let a = PackedWeight::pack(Floats::F32(&values(64, 1)), 16, 4, WeightDtype::F32).unwrap();
    let h = PackedWeight::pack(Floats::F32(&values(64, 1)), 16, 4, WeightDtype::BF16).unwrap();
    let wide = PackedWeight::pack(Floats::F32(&values(80, 1)), 16, 5, WeightDtype::F32).unwrap();
    let x = values(8, 3);
    assert!(PackedWeight::matmul_group(&[(&a, None), (&h, None)], &x, 2).is_none());
    assert!(PackedWeight::matmul_group(&[(&a, None), (&wide, None)], &x, 2).is_none());
    assert!(PackedWeight::matmul_group(&[(&a, Some(&[0.0; 3]))], &x, 2).is_none());
    assert!(PackedWeight::matmul_group(&[(&a, None)], &x[..7], 2).is_none());
    assert!(PackedWeight::matmul_group(&[], &x, 2).is_none());
}

#[test]
fn quantized_weights_of_several_formats_group_with_each_one_s_bits() {
    // A Q4_K_M layer's query and key in Q4_K beside its value in Q6_K (and a Q8_0 one): one
    // dispatch, each part the bits of its own product, split over a pool or not.
    use crate::nn::quant::Quant;
    let cols = 512;
    let formats = [
        (Quant::Q4K, 64),
        (Quant::Q4K, 24),
        (Quant::Q6K, 24),
        (Quant::Q8_0, 16),
    ];
    let ws: Vec<PackedWeight> = formats
        .iter()
        .map(|&(q, r)| {
            PackedWeight::quantize(Floats::F32(&values(r * cols, r as u32)), r, cols, q).unwrap()
        })
        .collect();
    let biases: Vec<Vec<f32>> = formats.iter().map(|&(_, r)| values(r, 2)).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for n in [1, 4, 9] {
        let x = values(n * cols, n as u32 + 5);
        for pick in [&[0usize, 1, 2][..], &[2, 0], &[0, 2, 3], &[3, 2]] {
            let parts: Vec<WeightPart<'_>> = pick
                .iter()
                .map(|&i| (&ws[i], Some(&biases[i][..])))
                .collect();
            let want: Vec<Vec<f32>> = pick
                .iter()
                .map(|&i| ws[i].matmul(&x, n, Some(&biases[i])).unwrap())
                .collect();
            let split = pool.install(|| PackedWeight::matmul_group(&parts, &x, n));
            assert_eq!(split.as_ref(), Some(&want), "{pick:?} n {n}");
            let inline = crate::threads::in_round(|| PackedWeight::matmul_group(&parts, &x, n));
            assert_eq!(inline.as_ref(), Some(&want), "{pick:?} n {n}");
        }
    }
    // A float weight among quantized ones: no group.
    let f = PackedWeight::pack(Floats::F32(&values(8 * cols, 1)), 8, cols, WeightDtype::F32);
    let f = f.unwrap();
    let x = values(cols, 1);
    assert!(PackedWeight::matmul_group(&[(&ws[0], None), (&f, None)], &x, 1).is_none());
}

#[test]
fn bf16_input_rounding_is_halfs_nearest_even_with_subnormals_flushed() {
    // The integer rounding of the tiles' inputs against `half`'s conversion then the flush,
    // over a sweep of every f32 bit pattern and the edges.
    let edges = [
        0u32,
        0x8000_0000,
        1,
        0x007f_ffff,
        0x0080_0000,
        0x0080_7fff,
        0x0080_8000,
        0x3f80_8000,
        0x3f81_8000,
        0x7f7f_ffff,
        0x7f7f_7fff,
        0x7f80_0000,
        0xff80_0000,
        0x7f80_0001,
        0xffc0_0000,
        0x7fff_ffff,
        0x807f_ffff,
    ];
    let sweep = (0..u32::MAX / 9973).map(|i| i * 9973);
    for b in edges.into_iter().chain(sweep) {
        let v = f32::from_bits(b);
        let h = bf16::from_f32(v);
        let want = if h.to_f32().is_subnormal() {
            h.to_bits() & 0x8000
        } else {
            h.to_bits()
        };
        assert_eq!(pairs::round_input(v).to_bits(), want, "{b:#x}");
    }
}

#[test]
fn amx_inputs_are_the_rule_s_words_for_every_value() {
    // The AMX inputs convert whole chunks with `vcvtne2ps2bf16` where the CPU has it: the
    // same words as the scalar rule, special values and subnormals included.
    let specials = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::from_bits(0x007f_ffff),
        f32::from_bits(0x8000_0001),
        f32::MIN_POSITIVE,
        -0.0,
        1.0 + f32::EPSILON,
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
    ];
    for cols in [1, 2, 31, 32, 33, 64, 96, 101] {
        for n in [1, 3] {
            let mut x = values(n * cols, cols as u32);
            if cols > 40 && n == 3 {
                // A subnormal in a chunk of the second row, the other rows plain.
                x[cols + 5] = specials[5];
            } else if cols >= 32 {
                for (i, v) in specials.iter().enumerate() {
                    if i != 5 && i != 6 {
                        x[i % cols] = *v;
                    }
                }
            }
            let got = pairs::inputs(Kernel::Amx, &x, n, cols, 16);
            let want: Vec<u32> = x
                .chunks(cols)
                .flat_map(|row| {
                    row.chunks(2)
                        .map(|p| pairs::word(p[0], p.get(1).copied().unwrap_or(0.0)).to_bits())
                })
                .collect();
            let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "cols {cols} n {n}");
        }
    }
}
