//! The drafter's small-row product `x · wᵀ (+ b)` (dot kernel) agrees with candle's GEMM for
//! every row count around the cut-over, odd widths, views with an offset, and falls back to
//! GEMM (with its errors) where the kernel does not apply; attention built on it matches a
//! straightforward reference.
use candle_core::{D, DType, Device, IndexOp, Tensor};
use dspark::config::spec::RopeSpec;
use dspark::nn::{
    Linear, PAR_MIN_MACS, Rope, SMALL_ROWS, gqa_attention, matmul_t, rms_norm, softmax_last, swiglu,
};

fn randn(seed: u64, shape: &[usize]) -> Tensor {
    // A small LCG keeps the data deterministic without depending on candle's RNG.
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn gemm(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Tensor {
    let y = x.matmul(&w.t().unwrap()).unwrap();
    match b {
        Some(b) => y.broadcast_add(b).unwrap(),
        None => y,
    }
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn small_rows_match_gemm_around_the_cutover() {
    // (1024, 512) at 32 rows crosses PAR_MIN_MACS: the column-chunked parallel path.
    for &(d_in, out) in &[(192, 512), (37, 5), (8, 3008), (64, 1), (1024, 512)] {
        let w = randn(1, &[out, d_in]);
        let b = randn(2, &[out]);
        for n in [
            1,
            2,
            3,
            5,
            8,
            24,
            SMALL_ROWS - 1,
            SMALL_ROWS,
            SMALL_ROWS + 1,
        ] {
            let x = randn(n as u64 + 3, &[n, d_in]);
            for bias in [None, Some(&b)] {
                let got = matmul_t(&x, &w, bias).unwrap();
                let want = gemm(&x, &w, bias);
                let d = max_diff(&got, &want);
                assert!(
                    d <= 1e-4 * (d_in as f32).sqrt(),
                    "n {n} {d_in}->{out}: diff {d}"
                );
            }
        }
    }
}

// The test shapes reach both sides of the parallel cut-over.
const _: () = assert!(SMALL_ROWS * 1024 * 512 >= PAR_MIN_MACS && 8 * 3008 * 192 < PAR_MIN_MACS);

#[test]
fn linear_uses_the_same_product() {
    let lin = Linear::new(randn(7, &[48, 40]), Some(randn(8, &[48]))).unwrap();
    assert_eq!(lin.weight().unwrap().dims(), [48, 40]);
    for rows in [1, 6, 9, 40] {
        let x = randn(9, &[rows, 40]);
        let d = max_diff(
            &lin.forward(&x).unwrap(),
            &gemm(&x, &lin.weight().unwrap(), lin.bias()),
        );
        assert!(d <= 1e-4, "{rows} rows: diff {d}");
    }
    // Leading dimensions are kept; a wrong width or a bias of the wrong length is a typed error.
    let x3 = randn(10, &[2, 3, 40]);
    assert_eq!(lin.forward(&x3).unwrap().dims(), [2, 3, 48]);
    let empty = Tensor::zeros((0, 40), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(lin.forward(&empty).unwrap().dims(), [0, 48]);
    let err = lin.forward(&randn(11, &[2, 39])).unwrap_err();
    assert_eq!(err.code(), "bad-shape");
    let err = Linear::new(randn(7, &[48, 40]), Some(randn(8, &[47]))).unwrap_err();
    assert_eq!(err.code(), "bad-shape");
}

#[test]
fn grouped_linears_give_each_ones_bits_and_its_errors() {
    // q/k/v-like maps of one input: one grouped product, each output the bits of its own
    // forward, with leading dimensions kept; a mixed group (one map kept as bf16) falls back
    // to one product each, with the same bits; a wrong width is each map's error.
    let q = Linear::new(randn(21, &[64, 40]), Some(randn(22, &[64]))).unwrap();
    let k = Linear::new(randn(23, &[24, 40]), None).unwrap();
    let bf = Linear::new(randn(24, &[17, 40]).to_dtype(DType::BF16).unwrap(), None).unwrap();
    let values = |t: &Tensor| t.to_vec2::<f32>().unwrap();
    for rows in [1, 9, 40] {
        let x = randn(25, &[rows, 40]);
        for (other, name) in [(&k, "f32"), (&bf, "mixed")] {
            let [a, b] = Linear::forward_many([&q, other], &x).unwrap();
            assert_eq!(values(&a), values(&q.forward(&x).unwrap()), "{name} {rows}");
            assert_eq!(
                values(&b),
                values(&other.forward(&x).unwrap()),
                "{name} {rows}"
            );
        }
    }
    let x3 = randn(26, &[2, 3, 40]);
    let [a, b] = Linear::forward_many([&q, &k], &x3).unwrap();
    assert_eq!((a.dims(), b.dims()), (&[2, 3, 64][..], &[2, 3, 24][..]));
    let err = Linear::forward_many([&q, &k], &randn(27, &[2, 39])).unwrap_err();
    assert_eq!(err.code(), "bad-shape");
}

#[test]
fn weight_views_with_an_offset_are_read_at_the_offset() {
    // Rows 3..9 of a larger matrix: contiguous, but not starting at the storage's first value.
    let big = randn(11, &[12, 16]);
    let w = big.narrow(0, 3, 6).unwrap();
    let x = randn(12, &[4, 16]);
    let d = max_diff(&matmul_t(&x, &w, None).unwrap(), &gemm(&x, &w, None));
    assert!(d <= 1e-5, "diff {d}");
    // A transposed (non-contiguous) weight falls back to GEMM with the same answer.
    let wt = randn(13, &[16, 6]).t().unwrap();
    let d = max_diff(&matmul_t(&x, &wt, None).unwrap(), &gemm(&x, &wt, None));
    assert!(d <= 1e-5, "diff {d}");
}

#[test]
fn other_dtypes_and_bad_shapes_take_the_gemm_path() {
    let x = randn(14, &[3, 16]).to_dtype(DType::F64).unwrap();
    let w = randn(15, &[5, 16]).to_dtype(DType::F64).unwrap();
    assert_eq!(matmul_t(&x, &w, None).unwrap().dtype(), DType::F64);
    // Mismatched inner widths: candle's shape error, not a panic in the kernel.
    let x = randn(16, &[3, 16]);
    let w = randn(17, &[5, 15]);
    assert!(matmul_t(&x, &w, None).is_err());
    // A bias of the wrong length is refused the same way.
    let w = randn(18, &[5, 16]);
    assert!(matmul_t(&x, &w, Some(&randn(19, &[4]))).is_err());
}

#[test]
fn attention_matches_a_reference() {
    // 6 query heads over 2 key/value heads (groups of 3), 5 queries, 9 keys, head dim 16.
    let (q_len, heads, kvh, s, hd) = (5, 6, 2, 9, 16);
    let q = randn(20, &[q_len, heads, hd]);
    let k = randn(21, &[kvh, s, hd]);
    let v = randn(22, &[kvh, s, hd]);
    let scale = 0.25;
    let got = gqa_attention(&q, &k, &v, scale).unwrap();
    let mut rows = Vec::new();
    for i in 0..q_len {
        let mut heads_out = Vec::new();
        for h in 0..heads {
            let g = h / (heads / kvh);
            let qi = q.i((i, h)).unwrap().unsqueeze(0).unwrap(); // [1, hd]
            let scores = (qi.matmul(&k.i(g).unwrap().t().unwrap()).unwrap() * scale).unwrap();
            let p = softmax_last(&scores).unwrap();
            heads_out.push(p.matmul(&v.i(g).unwrap()).unwrap()); // [1, hd]
        }
        rows.push(Tensor::cat(&heads_out, D::Minus1).unwrap());
    }
    let want = Tensor::cat(&rows, 0).unwrap();
    let d = max_diff(&got, &want);
    assert!(d <= 1e-5, "diff {d}");
}

// ---- the single-pass CPU chains against the candle op chains they replace -------------------

fn ref_rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    let var = x.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
    let inv = (var + eps).unwrap().sqrt().unwrap().recip().unwrap();
    x.broadcast_mul(&inv).unwrap().broadcast_mul(w).unwrap()
}

#[test]
fn rms_norm_matches_the_op_chain() {
    for shape in [&[3usize, 192][..], &[5, 3, 64], &[1, 7]] {
        let h = *shape.last().unwrap();
        let x = (randn(30, shape) * 3.0).unwrap();
        let w = randn(31, &[h]);
        let d = max_diff(
            &rms_norm(&x, &w, 1e-6).unwrap(),
            &ref_rms_norm(&x, &w, 1e-6),
        );
        assert!(d <= 1e-5, "{shape:?}: diff {d}");
    }
    // A transposed (strided) input takes the op chain and still normalizes its own rows.
    let x = randn(32, &[8, 4]).t().unwrap();
    let w = randn(33, &[8]);
    let d = max_diff(
        &rms_norm(&x, &w, 1e-6).unwrap(),
        &ref_rms_norm(&x.contiguous().unwrap(), &w, 1e-6),
    );
    assert!(d <= 1e-5, "strided: diff {d}");
}

#[test]
fn softmax_and_swiglu_match_the_op_chains() {
    let x = (randn(40, &[6, 37]) * 8.0).unwrap();
    let max = x.max_keepdim(D::Minus1).unwrap();
    let e = x.broadcast_sub(&max).unwrap().exp().unwrap();
    let want = e.broadcast_div(&e.sum_keepdim(D::Minus1).unwrap()).unwrap();
    assert!(max_diff(&softmax_last(&x).unwrap(), &want) <= 1e-6);
    let lin = |seed, o, i| Linear::new(randn(seed, &[o, i]), None).unwrap();
    let (gate, up, down) = (lin(41, 24, 16), lin(42, 24, 16), lin(43, 16, 24));
    let h = randn(44, &[5, 16]);
    let g = gemm(&h, &gate.weight().unwrap(), None);
    let u = gemm(&h, &up.weight().unwrap(), None);
    let mid = (g.silu().unwrap() * u).unwrap();
    let want = gemm(&mid, &down.weight().unwrap(), None);
    let d = max_diff(&swiglu(&h, &gate, &up, &down).unwrap(), &want);
    assert!(d <= 1e-4, "swiglu diff {d}");
}

#[test]
fn rope_matches_rotate_half_with_partial_rotation() {
    // head_dim 16, a quarter rotating (4 dims: 2 frequencies), the other 12 passing through.
    let spec = RopeSpec {
        partial_rotary_factor: 0.25,
        ..RopeSpec::neox(10_000.0)
    };
    let rope = Rope::new(&spec, 16, "test").unwrap();
    let positions = [0usize, 3, 17];
    let (cos, sin) = rope.tables(&positions, &Device::Cpu).unwrap();
    let x = randn(50, &[3, 2, 16]);
    let got = rope
        .apply(&x, &cos, &sin)
        .unwrap()
        .to_vec3::<f32>()
        .unwrap();
    let xs = x.to_vec3::<f32>().unwrap();
    for (n, &p) in positions.iter().enumerate() {
        for h in 0..2 {
            let v = &xs[n][h];
            let mut want = v.clone();
            for j in 0..2 {
                let a = p as f64 / 10_000f64.powf(2.0 * j as f64 / 4.0);
                let (c, s) = (a.cos() as f32, a.sin() as f32);
                want[j] = v[j] * c - v[j + 2] * s;
                want[j + 2] = v[j + 2] * c + v[j] * s;
            }
            for (g, w) in got[n][h].iter().zip(&want) {
                assert!((g - w).abs() <= 1e-5, "pos {p} head {h}: {g} vs {w}");
            }
        }
    }
}
