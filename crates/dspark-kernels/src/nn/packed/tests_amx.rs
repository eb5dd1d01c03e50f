//! The AMX kernel (`amx.rs`), where this machine runs it: each row's bits alone (any row
//! count, tile position, split or view), close to the `vdpbf16ps` rule, and every shape's
//! partial steps and panels. Elsewhere these tests check only that the kernel stays off.

use half::bf16;

use super::*;
use crate::test_values::values;

/// Whether the tests can run the kernel (else they return early, having checked it is off).
fn amx() -> bool {
    let on = Kernel::Amx.available();
    if !on {
        assert_ne!(Kernel::best(), Kernel::Amx);
        assert_eq!(Kernel::Amx.or_portable(), Kernel::Portable);
    }
    on
}

/// Shapes with full and partial 32-column steps, odd columns, partial last panels and
/// groups of 1 to 4 panels.
const SHAPES: [(usize, usize); 9] = [
    (1, 1),
    (16, 2),
    (17, 31),
    (33, 32),
    (40, 33),
    (64, 64),
    (70, 100),
    (48, 519),
    (130, 1024),
];

/// Row counts: one row, partial and full 16-row blocks, two blocks, several row tiles.
const ROWS: [usize; 10] = [1, 2, 9, 15, 16, 17, 31, 32, 33, 70];

#[test]
fn every_row_has_its_one_row_bits_at_every_row_count() {
    if !amx() {
        return;
    }
    for (rows, cols) in SHAPES {
        let w = values(rows * cols, 3);
        let p = PackedWeight::pack(Floats::F32(&w), rows, cols, WeightDtype::BF16).unwrap();
        let bias = values(rows, 9);
        for n in ROWS {
            let x = values(n * cols, n as u32 + 1);
            let all = p.matmul_with(Kernel::Amx, &x, n, None).unwrap();
            let with_bias = p.matmul_with(Kernel::Amx, &x, n, Some(&bias)).unwrap();
            for i in 0..n {
                let one = p
                    .matmul_with(Kernel::Amx, &x[i * cols..(i + 1) * cols], 1, None)
                    .unwrap();
                let got = &all[i * rows..(i + 1) * rows];
                assert_eq!(got, &one[..], "rows {rows} cols {cols} n {n} row {i}");
                for (o, v) in with_bias[i * rows..(i + 1) * rows].iter().enumerate() {
                    assert_eq!(*v, one[o] + bias[o], "bias: rows {rows} cols {cols} n {n}");
                }
            }
        }
    }
}

#[test]
fn sums_stay_within_rounding_of_the_pair_rule() {
    // The AMX unit rounds its own way (see `amx.rs`): each output within the recursive-sum
    // bound (`cols · ε · Σ|w·x|`) of the portable kernel's `vdpbf16ps` rule.
    if !amx() {
        return;
    }
    for (rows, cols) in SHAPES {
        let w = values(rows * cols, 5);
        let p = PackedWeight::pack(Floats::F32(&w), rows, cols, WeightDtype::BF16).unwrap();
        let stored = p.unpack();
        for n in [1, 9, 33] {
            let x = values(n * cols, 7);
            let got = p.matmul_with(Kernel::Amx, &x, n, None).unwrap();
            let rule = p.matmul_with(Kernel::Portable, &x, n, None).unwrap();
            for i in 0..n {
                for o in 0..rows {
                    let scale: f32 = (0..cols)
                        .map(|k| (stored[o * cols + k] * x[i * cols + k]).abs())
                        .sum();
                    let (a, b) = (got[i * rows + o], rule[i * rows + o]);
                    assert!(
                        (a - b).abs() <= cols as f32 * f32::EPSILON * scale.max(f32::MIN_POSITIVE),
                        "rows {rows} cols {cols} n {n}: {a} vs {b} (scale {scale})"
                    );
                }
            }
        }
    }
}

#[test]
fn special_values_give_the_rule_where_no_rounding_happens() {
    // Exact sums (small integers): every kernel gives the same value, AMX included; zeros,
    // infinities and NaN propagate as in the rule.
    if !amx() {
        return;
    }
    let (rows, cols) = (20, 45);
    let w: Vec<f32> = (0..rows * cols).map(|i| (i % 7) as f32 - 3.0).collect();
    let p = PackedWeight::pack(Floats::F32(&w), rows, cols, WeightDtype::BF16).unwrap();
    for n in [1, 5, 20] {
        let x: Vec<f32> = (0..n * cols).map(|i| (i % 5) as f32 - 2.0).collect();
        assert_eq!(
            p.matmul_with(Kernel::Amx, &x, n, None),
            p.matmul_with(Kernel::Portable, &x, n, None)
        );
        let mut bad = x.clone();
        bad[cols - 1] = f32::INFINITY;
        bad[(n - 1) * cols] = f32::NAN;
        let got = p.matmul_with(Kernel::Amx, &bad, n, None).unwrap();
        let want = p.matmul_with(Kernel::Portable, &bad, n, None).unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!(a == b || (a.is_nan() && b.is_nan()), "{a} vs {b}");
        }
    }
}

#[test]
fn views_groups_and_the_pool_give_each_product_its_own_bits() {
    if !amx() {
        return;
    }
    // A strided view (attention's values read in place) against the same matrix packed.
    let (s, hd, stride) = (45, 32, 64);
    let v: Vec<bf16> = values(s * stride, 4)
        .iter()
        .map(|&f| bf16::from_f32(f))
        .collect();
    let packed = PackedMatrix::pack_transposed(&v[hd..], stride, hd, s);
    let slot = 2 * PANEL;
    let mut in_place = vec![bf16::ZERO; hd.div_ceil(PANEL) * s.div_ceil(2) * slot];
    let panel_len = s.div_ceil(2) * slot;
    for o in 0..hd {
        for k in 0..s {
            let at = (o / PANEL) * panel_len + pairs::slot_index::<bf16>(k, o % PANEL);
            in_place[at] = v[k * stride + hd + o];
        }
    }
    let view = PanelView::new(&in_place, hd, s, panel_len, slot).unwrap();
    for n in [1, 7, 18] {
        let x = values(n * s, 2);
        assert_eq!(
            view.matmul_with(Kernel::Amx, &x, n, None),
            packed.matmul_with(Kernel::Amx, &x, n, None)
        );
    }
    // A group, split over a pool, against each product alone on one thread.
    let (rows, cols, n) = (1000, 512, 20);
    let w = values(rows * cols, 1);
    let a = PackedWeight::pack(Floats::F32(&w), rows, cols, WeightDtype::BF16).unwrap();
    let b =
        PackedWeight::pack(Floats::F32(&w[..300 * cols]), 300, cols, WeightDtype::BF16).unwrap();
    let x = values(n * cols, 6);
    let bias = values(300, 2);
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let alone = one.install(|| {
        (
            a.matmul_with(Kernel::Amx, &x, n, None).unwrap(),
            b.matmul_with(Kernel::Amx, &x, n, Some(&bias)).unwrap(),
        )
    });
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let grouped = pool
        .install(|| PackedWeight::matmul_group(&[(&a, None), (&b, Some(&bias))], &x, n))
        .unwrap();
    assert_eq!(grouped, vec![alone.0, alone.1]);
}

#[test]
fn f32_and_f16_panels_run_their_own_kernels_under_amx() {
    // AMX multiplies bf16 only: the other dtypes keep the shared rule's bits.
    let (rows, cols, n) = (33, 70, 9);
    let w = values(rows * cols, 8);
    let x = values(n * cols, 1);
    for dtype in [WeightDtype::F32, WeightDtype::F16] {
        let p = PackedWeight::pack(Floats::F32(&w), rows, cols, dtype).unwrap();
        assert_eq!(
            p.matmul_with(Kernel::Amx, &x, n, None),
            p.matmul_with(Kernel::Portable, &x, n, None),
            "{dtype}"
        );
    }
}
