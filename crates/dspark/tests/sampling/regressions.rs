//! Directed regressions of the kernels' input boundary: each input here used to crash, allocate
//! without bound or return a wrong answer, and now gives a typed error.

use candle_core::{Device, Tensor};
use dspark::error::catch_panic;
use dspark::policy::threshold_lengths;
use dspark::sampling::{
    BlockOptions, Floats, Mat, Rows3, Seeds, Tokens, VerifyOptions, confidence, confidence_slices,
    sample_block_slices, verify, verify_slices,
};
use dspark::{Error, IdMap};

#[allow(clippy::too_many_arguments)]
fn block(
    base: &[f32],
    dims: [usize; 3],
    w1: (&[f32], [usize; 2]),
    w2: (&[f32], [usize; 2]),
    anchors: &[u32],
    map: &IdMap,
    top_k: Option<usize>,
    temperature: f32,
) -> dspark::Result<dspark::sampling::DraftBlock> {
    sample_block_slices(
        Rows3::new(Floats::F32(base), dims).unwrap(),
        Mat::new(Floats::F32(w1.0), w1.1).unwrap(),
        Mat::new(Floats::F32(w2.0), w2.1).unwrap(),
        anchors,
        &BlockOptions {
            temperature,
            seeds: Seeds::Scalar(1),
            id_map: map,
            top_k,
            logit_scale: 1.0,
        },
    )
}

#[test]
fn a_tiny_sample_block_call_cannot_ask_for_gigabytes() {
    // `target_vocab_size = 2**32 - 1` with a d2t: refused by the map (too-large), and an id map
    // built around the constructors cannot make the output huge either.
    let e = IdMap::from_offsets(&[0, 0], 2, (1 << 32) - 1).unwrap_err();
    assert_eq!(e.code(), "too-large");
    let forged = IdMap::Table {
        targets: vec![0, 1],
        target_vocab: (1 << 32) - 1,
    };
    let e = block(
        &[0.0; 2],
        [1, 1, 2],
        (&[0.0; 2], [2, 1]),
        (&[0.0; 2], [2, 1]),
        &[0],
        &forged,
        None,
        0.0,
    )
    .unwrap_err();
    assert_eq!(e.code(), "too-large");
    assert!(e.to_string().contains("target_vocab_size"), "{e}");
    // A legal map at the vocabulary limit with many rows: B·K·V_t > 2^31.
    let map = IdMap::from_offsets(&[0], 1, 1 << 22).unwrap();
    let rows = 1024;
    let e = block(
        &vec![0.0; rows],
        [rows, 1, 1],
        (&[0.0], [1, 1]),
        (&[0.0], [1, 1]),
        &vec![0; rows],
        &map,
        None,
        0.0,
    )
    .unwrap_err();
    assert_eq!(e.code(), "too-large");
}

#[test]
fn top_k_rejects_an_all_negative_infinity_row_like_the_dense_path() {
    // Base logits are finite, but W2 drives every biased candidate to -inf.
    let (vd, r) = (6, 1);
    let base = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
    let w1 = [1.0f32; 6];
    let w2 = [f32::NEG_INFINITY; 6];
    let map = IdMap::identity(vd).unwrap();
    for t in [0.0, 0.8] {
        let refused = |top_k| {
            let (w1, w2) = ((&w1[..], [6, r]), (&w2[..], [vd, r]));
            block(&base, [1, 1, vd], w1, w2, &[0], &map, top_k, t).unwrap_err()
        };
        let (dense, top_k) = (refused(None), refused(Some(3)));
        assert_eq!(dense.code(), "invalid-argument");
        assert_eq!(top_k.code(), dense.code(), "T {t}: {top_k} vs {dense}");
    }
}

#[test]
fn transposed_draft_tokens_are_a_shape_error() {
    let (b, k, v) = (2usize, 3usize, 5usize);
    let target = vec![0.5f32; b * (k + 1) * v];
    let drafts: Vec<i64> = vec![1; b * k];
    let t = || Rows3::new(Floats::F32(&target), [b, k + 1, v]).unwrap();
    let o = VerifyOptions::default();
    assert!(verify_slices(t(), Tokens::new(&drafts, [b, k]).unwrap(), None, &o).is_ok());
    let e = verify_slices(t(), Tokens::new(&drafts, [k, b]).unwrap(), None, &o).unwrap_err();
    assert_eq!(e.code(), "bad-shape");
    assert!(e.to_string().contains("transposed"), "{e}");
    // The tensor front keeps the shape too.
    let dev = Device::Cpu;
    let tt = Tensor::from_vec(target.clone(), (b, k + 1, v), &dev).unwrap();
    let kb = Tensor::from_vec(drafts.clone(), (k, b), &dev).unwrap();
    assert_eq!(verify(&tt, &kb, None, &o).unwrap_err().code(), "bad-shape");
    let flat = Tensor::from_vec(drafts, b * k, &dev).unwrap();
    assert_eq!(
        verify(&tt, &flat, None, &o).unwrap_err().code(),
        "bad-shape"
    );
}

#[test]
fn confidence_needs_the_documented_weight_shape_and_finite_inputs() {
    let (b, k, h) = (2usize, 2usize, 4usize);
    let hidden = vec![0.1f32; b * k * h];
    let rows = || Rows3::new(Floats::F32(&hidden), [b, k, h]).unwrap();
    let w = vec![0.2f32; h];
    let run = |shape: &[usize]| confidence_slices(rows(), None, Floats::F32(&w), shape, 0.0, None);
    assert!(run(&[4]).is_ok());
    assert!(run(&[1, 4]).is_ok());
    for shape in [&[2usize, 2][..], &[4, 1], &[1, 1, 4], &[]] {
        assert_eq!(run(shape).unwrap_err().code(), "bad-shape", "{shape:?}");
    }
    let mut bad = hidden.clone();
    bad[9] = f32::NAN;
    let e = confidence_slices(
        Rows3::new(Floats::F32(&bad), [b, k, h]).unwrap(),
        None,
        Floats::F32(&w),
        &[4],
        0.0,
        None,
    )
    .unwrap_err();
    assert_eq!(e.code(), "non-finite");
    assert!(e.to_string().contains("request 1, slot 0"), "{e}");
    let mut wi = w.clone();
    wi[0] = f32::INFINITY;
    let e = confidence_slices(rows(), None, Floats::F32(&wi), &[4], 0.0, None).unwrap_err();
    assert_eq!(e.code(), "non-finite");
    let prev = vec![f32::NEG_INFINITY; b * k];
    let w5 = vec![0.2f32; h + 1];
    let e = confidence_slices(rows(), Some(&prev), Floats::F32(&w5), &[5], 0.0, None).unwrap_err();
    assert_eq!(e.code(), "non-finite");
    assert!(e.to_string().contains("prev_embeddings"), "{e}");
    // Tensor front: a [2, 2] weight has the right count but the wrong shape.
    let dev = Device::Cpu;
    let ht = Tensor::from_vec(hidden.clone(), (b, k, h), &dev).unwrap();
    let w22 = Tensor::from_vec(w.clone(), (2, 2), &dev).unwrap();
    assert_eq!(
        confidence(&ht, None, &w22, None, None).unwrap_err().code(),
        "bad-shape"
    );
}

#[test]
fn zero_size_inputs_with_one_huge_dimension_do_not_allocate() {
    // confidence: [2^31, 1, 0] and [2^40, 2^40, 0] hidden states hold no values.
    let none: [f32; 0] = [];
    for dims in [[1usize << 31, 1, 0], [1 << 40, 1 << 40, 0], [1 << 33, 1, 0]] {
        let e = confidence_slices(
            Rows3 {
                data: Floats::F32(&none),
                dims,
            },
            None,
            Floats::F32(&none),
            &[0],
            0.0,
            None,
        )
        .unwrap_err();
        assert!(
            ["too-large", "bad-shape"].contains(&e.code()),
            "{dims:?}: {e}"
        );
    }
    // schedule_threshold: a [2^40, 0] confidence matrix.
    let e = threshold_lengths(&none, 1 << 40, 0, 0.5).unwrap_err();
    assert_eq!(e.code(), "too-large");
}

#[test]
fn catch_panic_turns_a_panic_into_an_internal_error() {
    let e: Error = catch_panic::<()>(|| panic!("boom {}", 7)).unwrap_err();
    assert_eq!(e.code(), "internal");
    assert_eq!(e.kind(), dspark::ErrorKind::Internal);
    assert!(e.to_string().contains("boom 7"), "{e}");
    let e = catch_panic::<()>(|| std::panic::panic_any(3u8)).unwrap_err();
    assert!(e.to_string().contains("non-string"), "{e}");
    let passthrough = catch_panic::<u8>(|| Err(Error::invalid("x", "y"))).unwrap_err();
    assert_eq!(passthrough.code(), "invalid-argument");
}
