//! The confidence head on tensors: `c_k = sigmoid(w·[h_k ; e_k] + b)`, optionally calibrated
//! per slot with STS (`sigmoid(z_k / T_k)`), with the errors of
//! [`confidence_slices`](crate::sampling::confidence_slices).
//!
//! Two matrix-vector products (`[B·K, H]·w_h` and `[B·K, r]·w_e`), a bias, a per-slot division
//! and a sigmoid written as `1 / (1 + exp(−z))`: operations every candle backend has. Inputs
//! stay where they are; the only values read back are one scalar, `Σ 0·z` (plus the same
//! sum over the weight and bias when they were not checked on the host), which is NaN exactly
//! when a score (or parameter) is not finite. Only then are the offending rows copied to the
//! host, to name them the way the slice kernel does.

use candle_core::{DType, Device, Tensor};

use super::{
    Geometry, Scoring, StsCalibration, check_bias, check_prev, check_weight, geometry, hidden_dims,
    non_finite_row, one_value, temperatures,
};
use crate::device::same_device;
use crate::error::{Error, Result};
use crate::view::Floats;

/// The head's parameters as tensors on the inputs' device.
pub(crate) struct Head {
    /// `[H + r]` values, any float dtype.
    pub(crate) weight: Tensor,
    /// One value.
    pub(crate) bias: Tensor,
    /// `true` when the weight and bias were already checked finite on the host.
    pub(crate) checked: bool,
}

/// `NaN` when any value of `t` is not finite, else `0` (one `[]` f32 tensor): `x · 0` is `0`
/// for a finite `x` and NaN for ±inf or NaN, and a sum keeps a NaN on every backend.
fn poison(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F32)?.affine(0.0, 0.0)?.sum_all()?)
}

/// Confidences `[B, K]` (f32, on `hidden`'s device) for validated inputs: `hidden` `[B, K, H]`,
/// `prev` `[B, K, r]` (any float dtypes), the head, the geometry from [`geometry`].
pub(crate) fn scores(
    hidden: &Tensor,
    prev: Option<&Tensor>,
    head: &Head,
    g: Geometry,
    sts: Option<&StsCalibration>,
) -> Result<Tensor> {
    let (b_n, k_n, h) = hidden.dims3()?;
    let dev = hidden.device();
    let Geometry { rows, r } = g;
    let w = head.weight.to_dtype(DType::F32)?.flatten_all()?;
    let bias = head.bias.to_dtype(DType::F32)?.flatten_all()?;
    if rows == 0 {
        if !head.checked {
            let bad = (poison(&w)? + poison(&bias)?)?;
            if !bad.to_scalar::<f32>()?.is_finite() {
                check_bias(bias.to_vec1::<f32>()?.first().copied().unwrap_or(0.0))?;
                check_weight(&w.to_vec1::<f32>()?)?;
            }
        }
        return Ok(Tensor::zeros((b_n, k_n), DType::F32, dev)?);
    }
    let hid = hidden
        .to_dtype(DType::F32)?
        .reshape((rows, h))?
        .contiguous()?;
    let mut z = if h == 0 {
        Tensor::zeros((rows, 1), DType::F32, dev)?
    } else {
        hid.matmul(&w.narrow(0, 0, h)?.reshape((h, 1))?)?
    };
    let prev = match prev {
        Some(e) if r > 0 => Some(e.to_dtype(DType::F32)?.reshape((rows, r))?.contiguous()?),
        _ => None,
    };
    if let Some(e) = &prev {
        z = (z + e.matmul(&w.narrow(0, h, r)?.reshape((r, 1))?)?)?;
    }
    let mut bad = poison(&z)?;
    if !head.checked {
        bad = ((bad + poison(&w)?)? + poison(&bias)?)?;
    }
    if !bad.to_scalar::<f32>()?.is_finite() {
        return Err(explain(
            &hid,
            prev.as_ref(),
            &z,
            &w,
            &bias,
            head.checked,
            sts,
            k_n,
        ));
    }
    let z = z.reshape((b_n, k_n))?.broadcast_add(&bias)?;
    let z = match sts {
        None => z,
        Some(s) => {
            let t = Tensor::from_vec(temperatures(Some(s), k_n)?, (1, k_n), dev)?;
            z.broadcast_div(&t)?
        }
    };
    // sigmoid(z) = 1 / (1 + exp(−z)), as the slice kernel computes it.
    Ok((z.neg()?.exp()? + 1.0)?.recip()?)
}

/// The error of a call whose scores (or parameters) were not all finite, in the slice kernel's
/// order: bias, weight, a short STS table, then the first non-finite row. Copies to the host
/// only what it names.
#[allow(clippy::too_many_arguments)]
fn explain(
    hid: &Tensor,
    prev: Option<&Tensor>,
    z: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    checked: bool,
    sts: Option<&StsCalibration>,
    k_n: usize,
) -> Error {
    let found = || -> Result<Error> {
        if !checked {
            let b = bias.to_vec1::<f32>()?;
            check_bias(b.first().copied().unwrap_or(0.0))?;
            check_weight(&w.to_vec1::<f32>()?)?;
        }
        let zs = z.flatten_all()?.to_vec1::<f32>()?;
        let Some(i) = zs.iter().position(|v| !v.is_finite()) else {
            return Ok(Error::invalid(
                "hidden",
                "a non-finite sum was found but no non-finite score",
            ));
        };
        temperatures(sts, k_n)?;
        let row = hid.get(i)?.to_vec1::<f32>()?;
        let e = prev.map(|e| e.get(i)).transpose()?;
        let e = e.map(|e| e.to_vec1::<f32>()).transpose()?;
        Ok(non_finite_row(&row, e.as_deref(), i, k_n.max(1)))
    };
    match found() {
        Ok(e) | Err(e) => e,
    }
}

/// The tensor front of [`crate::sampling::confidence`] on the device-generic path: the same
/// arguments, checks and errors, everything kept on `hidden`'s device (`device-mismatch` for
/// an argument elsewhere).
pub(crate) fn confidence_tensor(
    hidden: &Tensor,
    prev_embeddings: Option<&Tensor>,
    weight: &Tensor,
    bias: Option<&Tensor>,
    sts: Option<&StsCalibration>,
) -> Result<Tensor> {
    let dims = hidden_dims(hidden)?;
    let dev = hidden.device();
    let mut on = vec![("weight", weight)];
    on.extend(bias.map(|b| ("bias", b)));
    on.extend(prev_embeddings.map(|p| ("prev_embeddings", p)));
    same_device(dev, &on)?;
    let bias = match bias {
        None => Tensor::zeros(1, DType::F32, dev)?,
        Some(t) => one_value(t)?,
    };
    if let Some(p) = prev_embeddings {
        check_prev(p, dims)?;
    }
    for (name, t) in [("hidden", hidden), ("weight", weight)] {
        if !matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
            return Err(Error::UnsupportedDtype {
                name: name.into(),
                message: format!("{:?} (need f32, f16 or bf16)", t.dtype()),
            });
        }
    }
    let g = geometry(
        dims,
        prev_embeddings.map(Tensor::elem_count),
        weight.elem_count(),
        weight.dims(),
    )?;
    let head = Head {
        weight: weight.flatten_all()?,
        bias,
        checked: false,
    };
    scores(hidden, prev_embeddings, &head, g, sts)
}

/// [`confidence_slices`] through the device-generic tensor path (a validated call): the
/// slices become CPU tensors (f16/bf16 kept as they are, widened by the tensor path).
pub(super) fn score_slices(call: &Scoring<'_>) -> Result<Vec<f32>> {
    let cpu = Device::Cpu;
    let ([b_n, k_n, h], r) = (call.hidden.dims, call.r);
    let t = match call.hidden.data {
        Floats::F32(v) => Tensor::from_slice(v, (b_n, k_n, h), &cpu)?,
        Floats::F16(v) => Tensor::from_slice(v, (b_n, k_n, h), &cpu)?,
        Floats::BF16(v) => Tensor::from_slice(v, (b_n, k_n, h), &cpu)?,
    };
    let prev = call
        .prev
        .map(|e| Tensor::from_slice(e, (b_n, k_n, r), &cpu))
        .transpose()?;
    let head = Head {
        weight: Tensor::from_slice(call.w, call.w.len(), &cpu)?,
        bias: Tensor::new(&[call.bias], &cpu)?,
        checked: true,
    };
    let g = Geometry { rows: b_n * k_n, r };
    let out = scores(&t, prev.as_ref(), &head, g, call.sts)?;
    Ok(out.flatten_all()?.to_vec1::<f32>()?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::sampling::{Floats, Rows3, confidence_slices};
    use candle_core::Device;

    use crate::test_values::values;

    /// `sigmoid((w·[h ; e] + b) / T_k)` in f64 for `rows` rows of `H` hidden values.
    fn reference(h: &[f32], e: Option<&[f32]>, w: &[f32], b: f32, temps: &[f32]) -> Vec<f64> {
        let rows = 6;
        let hs = h.len() / rows;
        let r = w.len() - hs;
        (0..rows)
            .map(|i| {
                let mut z: f64 = (0..hs)
                    .map(|j| f64::from(h[i * hs + j]) * f64::from(w[j]))
                    .sum();
                if let Some(e) = e {
                    z += (0..r)
                        .map(|j| f64::from(e[i * r + j]) * f64::from(w[hs + j]))
                        .sum::<f64>();
                }
                let z = (z + f64::from(b)) / f64::from(temps[i % temps.len()]);
                1.0 / (1.0 + (-z).exp())
            })
            .collect()
    }

    #[test]
    fn matches_the_reference_and_the_slice_kernel() -> Result<()> {
        let (b_n, k_n, h, r) = (2, 3, 40, 5);
        let cpu = Device::Cpu;
        let hid = values(b_n * k_n * h, 1);
        let e = values(b_n * k_n * r, 2);
        let w = values(h + r, 3);
        let temps = vec![0.7, 1.0, 1.6];
        let sts = StsCalibration::new(temps.clone())?;
        let want = reference(&hid, Some(&e), &w, 0.3, &temps);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let ht = Tensor::from_slice(&hid, (b_n, k_n, h), &cpu)?.to_dtype(dtype)?;
            let et = Tensor::from_slice(&e, (b_n, k_n, r), &cpu)?;
            let wt = Tensor::from_slice(&w, (1, h + r), &cpu)?;
            let bt = Tensor::new(&[0.3f32], &cpu)?;
            let got = confidence_tensor(&ht, Some(&et), &wt, Some(&bt), Some(&sts))?;
            assert_eq!(got.dims(), [b_n, k_n]);
            let got = got.flatten_all()?.to_vec1::<f32>()?;
            let tol = if dtype == DType::F32 { 1e-6 } else { 2e-2 };
            for (g, w) in got.iter().zip(&want) {
                assert!((f64::from(*g) - w).abs() < tol, "{dtype:?}: {g} vs {w}");
            }
            if dtype == DType::F32 {
                let slices = confidence_slices(
                    Rows3 {
                        data: Floats::F32(&hid),
                        dims: [b_n, k_n, h],
                    },
                    Some(&e),
                    Floats::F32(&w),
                    &[h + r],
                    0.3,
                    Some(&sts),
                )?;
                for (g, s) in got.iter().zip(&slices) {
                    assert!((g - s).abs() < 1e-6, "{g} vs {s}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn errors_are_those_of_the_slice_kernel() -> Result<()> {
        let (b_n, k_n, h) = (2, 3, 8);
        let cpu = Device::Cpu;
        let mut hid = values(b_n * k_n * h, 4);
        let w = Tensor::from_slice(&values(h, 5), h, &cpu)?;
        let code = |r: Result<Tensor>| r.err().map(|e| (e.code(), e.to_string()));
        let ht = Tensor::from_slice(&hid, (b_n, k_n, h), &cpu)?;
        // Parameters.
        let nan_w = Tensor::from_slice(&[1.0, f32::NAN, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], h, &cpu)?;
        let (c, m) = code(confidence_tensor(&ht, None, &nan_w, None, None)).unwrap();
        assert_eq!(c, "non-finite");
        assert!(m.contains("weight") && m.contains("index 1"), "{m}");
        let inf = Tensor::new(&[f32::INFINITY], &cpu)?;
        let (c, m) = code(confidence_tensor(&ht, None, &w, Some(&inf), None)).unwrap();
        assert_eq!(c, "non-finite");
        assert!(m.contains("bias"), "{m}");
        let two = Tensor::new(&[0f32, 1.0], &cpu)?;
        let (c, _) = code(confidence_tensor(&ht, None, &w, Some(&two), None)).unwrap();
        assert_eq!(c, "bad-shape");
        // A NaN in request 1, slot 2 of the hidden states.
        hid[(k_n + 2) * h + 3] = f32::NAN;
        let bad = Tensor::from_slice(&hid, (b_n, k_n, h), &cpu)?;
        let (c, m) = code(confidence_tensor(&bad, None, &w, None, None)).unwrap();
        assert_eq!(c, "non-finite");
        assert!(
            m.contains("hidden") && m.contains("request 1, slot 2"),
            "{m}"
        );
        // ... and in the Markov embeddings (weight [H + 2]).
        let w2 = Tensor::from_slice(&values(h + 2, 6), h + 2, &cpu)?;
        let mut e = values(b_n * k_n * 2, 7);
        e[1] = f32::NEG_INFINITY;
        let et = Tensor::from_slice(&e, (b_n, k_n, 2), &cpu)?;
        let (c, m) = code(confidence_tensor(&ht, Some(&et), &w2, None, None)).unwrap();
        assert_eq!(c, "non-finite");
        assert!(
            m.contains("prev_embeddings") && m.contains("request 0, slot 0"),
            "{m}"
        );
        // A short STS table; an integer hidden tensor; no rows.
        let sts = StsCalibration::new(vec![1.0, 1.0])?;
        let (c, _) = code(confidence_tensor(&ht, None, &w, None, Some(&sts))).unwrap();
        assert_eq!(c, "invalid-argument");
        let ints = ht.to_dtype(DType::U32)?;
        let (c, _) = code(confidence_tensor(&ints, None, &w, None, None)).unwrap();
        assert_eq!(c, "unsupported-dtype");
        let empty = Tensor::zeros((0, k_n, h), DType::F32, &cpu)?;
        assert_eq!(
            confidence_tensor(&empty, None, &w, None, None)?.dims(),
            [0, k_n]
        );
        Ok(())
    }
}
