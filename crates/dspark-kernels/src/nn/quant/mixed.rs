//! Group products over parts of several quantized formats (a `Q4_K_M` file's Q4_K query and key
//! maps beside a Q6_K value map) in one pool dispatch, Q4_K and Q6_K sharing their activations
//! (Q6_K's are Q4_K's and 16-value offsets).

use super::group::{Blocks, dispatch, fits, runnable};
use super::q4k::{Q4KMatrix, Q8KRows};
use super::q6k::{Q6KMatrix, Q6KRows};
use super::{QuantKernel, QuantMatrix, QuantRows};

/// A quantized weight of any format, for [`matmul_mixed`].
#[derive(Debug, Clone, Copy)]
pub enum AnyQuant<'a> {
    /// Q8_0 blocks.
    Q8(&'a QuantMatrix),
    /// Q4_K super-blocks.
    Q4K(&'a Q4KMatrix),
    /// Q6_K super-blocks.
    Q6K(&'a Q6KMatrix),
}

impl AnyQuant<'_> {
    fn shape(&self) -> (usize, usize) {
        match self {
            Self::Q8(m) => m.shape(),
            Self::Q4K(m) => m.shape(),
            Self::Q6K(m) => m.shape(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Self::Q8(m) => Blocks::bytes(*m),
            Self::Q4K(m) => Blocks::bytes(*m),
            Self::Q6K(m) => Blocks::bytes(*m),
        }
    }
}

/// `y_i = x · W_iᵀ (+ bias_i)` for parts of any quantized formats, with the fastest body: each
/// format's activations quantized once (Q4_K reading Q6_K's when both are there), every part's
/// outputs in one pool dispatch, each the bits of its own product. `None` as [`super::group_with`].
pub fn matmul_mixed(
    parts: &[(AnyQuant<'_>, Option<&[f32]>)],
    x: &[f32],
    n: usize,
) -> Option<Vec<Vec<f32>>> {
    let shapes: Vec<_> = parts.iter().map(|(m, b)| (m.shape(), *b)).collect();
    let cols = fits(&shapes, x, n)?;
    let kernel = runnable(QuantKernel::best());
    let has = |f: fn(&AnyQuant<'_>) -> bool| parts.iter().any(|(m, _)| f(m));
    let q8 = has(|m| matches!(m, AnyQuant::Q8(_))).then(|| QuantRows::new(x, n, cols));
    let q6 = has(|m| matches!(m, AnyQuant::Q6K(_))).then(|| Q6KRows::new(x, n, cols));
    let q4 = match &q6 {
        None if has(|m| matches!(m, AnyQuant::Q4K(_))) => Some(Q8KRows::new(x, n, cols)),
        _ => None,
    };
    let k_acts = q6.as_ref().map(|q| &q.x).or(q4.as_ref());
    let rows: Vec<usize> = shapes.iter().map(|((r, _), _)| *r).collect();
    let biases: Vec<_> = parts.iter().map(|(_, b)| *b).collect();
    let bytes = parts.iter().map(|(m, _)| m.bytes()).sum();
    Some(dispatch(&rows, &biases, bytes, n, |p, o0, out| {
        match (parts[p].0, &q8, k_acts, &q6) {
            (AnyQuant::Q8(m), Some(q), _, _) => m.run(kernel, q, n, o0, out),
            (AnyQuant::Q4K(m), _, Some(q), _) => m.run(kernel, q, n, o0, out),
            (AnyQuant::Q6K(m), _, _, Some(q)) => m.run(kernel, q, n, o0, out),
            // Every format present had its activations quantized above.
            _ => {}
        }
    }))
}
