//! The confidence head (with STS calibration) and the padded-column mask op.

use crate::sampling_common::TestRng;
use candle_core::{DType, Device, Tensor};
use dspark::sampling::{
    Floats, Rows3, StsCalibration, confidence, confidence_slices, mask_padded_rows,
    mask_padded_slice,
};

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

#[test]
fn confidence_is_sigmoid_of_w_dot_hidden_and_markov_embedding() {
    let mut rng = TestRng(1);
    let (b, k, h, r) = (2, 3, 40, 6);
    let hidden = rng.normals(b * k * h, 1.0);
    let prev = rng.normals(b * k * r, 1.0);
    let w = rng.normals(h + r, 0.3);
    let sts = StsCalibration::new(vec![1.0, 2.0, 0.5]).unwrap();
    let got = confidence_slices(
        Rows3::new(Floats::F32(&hidden), [b, k, h]).unwrap(),
        Some(&prev),
        Floats::F32(&w),
        &[h + r],
        0.25,
        Some(&sts),
    )
    .unwrap();
    let plain = confidence_slices(
        Rows3::new(Floats::F32(&hidden), [b, k, h]).unwrap(),
        None,
        Floats::F32(&w[..h]),
        &[h],
        0.25,
        None,
    )
    .unwrap();
    for i in 0..b * k {
        let zh: f64 = (0..h).map(|j| f64::from(w[j] * hidden[i * h + j])).sum();
        let ze: f64 = (0..r).map(|j| f64::from(w[h + j] * prev[i * r + j])).sum();
        let t = [1.0, 2.0, 0.5][i % k];
        assert!((f64::from(got[i]) - sigmoid((zh + ze + 0.25) / t)).abs() < 1e-5);
        assert!((f64::from(plain[i]) - sigmoid(zh + 0.25)).abs() < 1e-5);
    }
    // Tensor front: [1, H+r] weight, bf16 hidden, [1] bias.
    let dev = Device::Cpu;
    let ht = Tensor::from_vec(hidden.clone(), (b, k, h), &dev).unwrap();
    let et = Tensor::from_vec(prev.clone(), (b, k, r), &dev).unwrap();
    let wt = Tensor::from_vec(w.clone(), (1, h + r), &dev).unwrap();
    let bt = Tensor::from_vec(vec![0.25f32], 1, &dev).unwrap();
    let out = confidence(&ht, Some(&et), &wt, Some(&bt), Some(&sts)).unwrap();
    assert_eq!(out.dims(), &[b, k]);
    assert_eq!(out.flatten_all().unwrap().to_vec1::<f32>().unwrap(), got);
    let hb = ht.to_dtype(DType::BF16).unwrap();
    let out = confidence(&hb, Some(&et), &wt, Some(&bt), Some(&sts)).unwrap();
    let ob = out.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert!(ob.iter().zip(&got).all(|(a, b)| (a - b).abs() < 2e-2));
}

#[test]
fn confidence_rejects_bad_shapes_and_short_sts_tables() {
    let hidden = vec![0f32; 2 * 2 * 4];
    let rows = || Rows3::new(Floats::F32(&hidden), [2, 2, 4]).unwrap();
    let w = vec![0f32; 6];
    let code = |e: dspark::Error| e.code();
    assert_eq!(
        code(confidence_slices(rows(), None, Floats::F32(&w), &[6], 0.0, None).unwrap_err()),
        "bad-shape"
    );
    let prev = vec![0f32; 7];
    assert_eq!(
        code(confidence_slices(rows(), Some(&prev), Floats::F32(&w), &[6], 0.0, None).unwrap_err()),
        "bad-shape"
    );
    let sts = StsCalibration::new(vec![1.0]).unwrap();
    assert_eq!(
        code(
            confidence_slices(rows(), None, Floats::F32(&w[..4]), &[4], 0.0, Some(&sts))
                .unwrap_err()
        ),
        "invalid-argument"
    );
    assert_eq!(
        code(
            confidence_slices(rows(), None, Floats::F32(&w[..4]), &[1, 4], f32::NAN, None)
                .unwrap_err()
        ),
        "non-finite"
    );
}

#[test]
fn sts_loads_sglang_style_json() {
    let s =
        StsCalibration::from_json_str(r#"{"temperatures": [1.0, 1.5, 2], "ece": 0.01}"#).unwrap();
    assert_eq!(s.temperatures, vec![1.0, 1.5, 2.0]);
    for (text, key) in [
        (r#"{"temperatures": [1.0, 0.0]}"#, "temperatures[1]"),
        (r#"{"temperatures": [1.0, true]}"#, "temperatures[1]"),
        (r#"{"temperatures": "x"}"#, "temperatures"),
        (r#"{"temps": [1.0]}"#, "temperatures"),
        (r#"{"temperatures": []}"#, "temperatures"),
        ("[1.0]", "<root>"),
        ("{", "<root>"),
    ] {
        let e = StsCalibration::from_json_str(text).unwrap_err();
        assert_eq!(e.code(), "bad-config", "{text}");
        assert!(e.to_string().contains(key), "{text}: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sts.json");
    std::fs::write(&path, r#"{"temperatures": [0.9]}"#).unwrap();
    assert_eq!(
        StsCalibration::from_json_path(&path).unwrap().temperatures,
        vec![0.9]
    );
    let e = StsCalibration::from_json_path(dir.path().join("none.json")).unwrap_err();
    assert_eq!(e.code(), "missing-file");
    std::fs::write(&path, r#"{"temperatures": [-1]}"#).unwrap();
    let e = StsCalibration::from_json_path(&path).unwrap_err();
    assert!(e.to_string().contains("sts.json"), "{e}");
}

#[test]
fn mask_sets_padded_columns_to_negative_infinity() {
    let dev = Device::Cpu;
    let x = Tensor::arange(0f32, 24.0, &dev)
        .unwrap()
        .reshape((2, 3, 4))
        .unwrap();
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let m = mask_padded_rows(&x.to_dtype(dtype).unwrap(), 3).unwrap();
        assert_eq!(m.dtype(), dtype);
        let v = m
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for (i, &y) in v.iter().enumerate() {
            if i % 4 == 3 {
                assert_eq!(y, f32::NEG_INFINITY);
            } else {
                assert_eq!(y, i as f32);
            }
        }
    }
    // Non-contiguous input (a transpose) is made contiguous first.
    let t = Tensor::arange(0f32, 6.0, &dev)
        .unwrap()
        .reshape((2, 3))
        .unwrap()
        .t()
        .unwrap();
    let m = mask_padded_rows(&t, 1).unwrap().to_vec2::<f32>().unwrap();
    assert_eq!(
        m,
        vec![vec![0.0, f32::NEG_INFINITY]; 1]
            .into_iter()
            .chain([vec![1.0, f32::NEG_INFINITY], vec![2.0, f32::NEG_INFINITY],])
            .collect::<Vec<_>>()
    );
    assert_eq!(
        mask_padded_rows(&x, 5).unwrap_err().code(),
        "invalid-argument"
    );
    let same = mask_padded_rows(&x, 4).unwrap();
    assert_eq!(
        same.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        (0..24).map(|i| i as f32).collect::<Vec<_>>()
    );
    let i = Tensor::arange(0u32, 4, &dev).unwrap();
    assert_eq!(mask_padded_rows(&i, 2).unwrap_err().code(), "backend");
    let mut s = vec![1f32; 10];
    mask_padded_slice(&mut s, 5, 2).unwrap();
    assert_eq!(s.iter().filter(|v| v.is_finite()).count(), 4);
    assert_eq!(
        mask_padded_slice(&mut s, 3, 2).unwrap_err().code(),
        "bad-shape"
    );
}
