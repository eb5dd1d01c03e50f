//! Single-pass CPU versions of the layers' elementwise chains: RMSNorm, rotary embedding,
//! scaled softmax and the SwiGLU gate (the attention entries are in `attention/host.rs`).
//!
//! Written as candle ops, each chain is 5–8 small tensors (an allocation and a thread-pool
//! dispatch apiece) for a few thousand values: at a drafter round's sizes that overhead, not the
//! arithmetic, is the cost. Each function here reads its contiguous f32 inputs straight from
//! storage, writes one output in one pass on the calling thread, and performs the same
//! operations in the same order per element as the candle chain it replaces (sums over a row
//! may associate differently). Each returns `None` when the inputs are not contiguous f32 CPU
//! tensors of the expected shapes, or when the tensor path is forced on the CPU
//! ([`crate::device::host_fast`]); the callers (the fronts in [`super`]) then use the candle chain.

use candle_core::{CpuStorage, DType, Storage, Tensor};

#[cfg(target_arch = "x86_64")]
use crate::cpu::exp_with;
use crate::device::host_fast;
use crate::error::Result;

/// Run `f` on the contiguous f32 values of CPU tensor `t`, or `None`.
pub fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if !t.device().is_cpu() || t.dtype() != DType::F32 {
        return None;
    }
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(CpuStorage::F32(all)) = &*storage else {
        return None;
    };
    let (lo, hi) = layout.contiguous_offsets()?;
    Some(f(&all[lo..hi]))
}

/// [`with_f32`] for the single-pass chains: `None` also when [`host_fast`] says the tensor
/// path is forced (`DSPARK_KERNEL_PATH=tensor`), so the callers run their candle chains.
pub(crate) fn fast_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if !host_fast(t) {
        return None;
    }
    with_f32(t, f)
}

/// A new tensor of `x`'s shape and device holding `values`.
fn like(x: &Tensor, values: Vec<f32>) -> Result<Tensor> {
    Ok(Tensor::from_vec(values, x.shape(), x.device())?)
}

/// `x · rsqrt(mean(x², last dim) + eps) · weight` for `weight: [H]`, `x: [.., H]`.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Option<Result<Tensor>> {
    let h = *x.dims().last()?;
    if h == 0 || weight.dims() != [h] {
        return None;
    }
    let eps = eps as f32;
    let out = fast_f32(x, |xs| {
        fast_f32(weight, |ws| {
            let mut out = vec![0f32; xs.len()];
            for (row, o) in xs.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
                let ss: f32 = row.iter().map(|v| v * v).sum();
                let inv = ((ss / h as f32) + eps).sqrt().recip();
                for ((o, &v), &w) in o.iter_mut().zip(row).zip(ws) {
                    *o = v * inv * w;
                }
            }
            out
        })
    })??;
    Some(like(x, out))
}

/// NeoX rotary embedding of `x: [N, heads, head_dim]` with tables `cos`, `sin: [N, rd]`; dims
/// from `rd` on pass through.
pub(crate) fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Option<Result<Tensor>> {
    let &[n, heads, hd] = x.dims() else {
        return None;
    };
    let &[cn, rd] = cos.dims() else {
        return None;
    };
    if cn != n || sin.dims() != [n, rd] || rd == 0 || rd % 2 != 0 || rd > hd {
        return None;
    }
    let half = rd / 2;
    let out = fast_f32(x, |xs| {
        fast_f32(cos, |cs| {
            fast_f32(sin, |ss| {
                let mut out = xs.to_vec();
                for (i, (row, o)) in xs
                    .chunks_exact(hd)
                    .zip(out.chunks_exact_mut(hd))
                    .enumerate()
                {
                    let t = i / heads;
                    let (c, s) = (&cs[t * rd..(t + 1) * rd], &ss[t * rd..(t + 1) * rd]);
                    for j in 0..half {
                        let (x1, x2) = (row[j], row[half + j]);
                        o[j] = x1 * c[j] + -x2 * s[j];
                        o[half + j] = x2 * c[half + j] + x1 * s[half + j];
                    }
                }
                out
            })
        })
    })???;
    Some(like(x, out))
}

/// `softmax(scale · x)` over the last dimension.
pub(crate) fn scaled_softmax(x: &Tensor, scale: f64) -> Option<Result<Tensor>> {
    let w = *x.dims().last()?;
    if w == 0 {
        return None;
    }
    let scale = scale as f32;
    let out = fast_f32(x, |xs| {
        let mut out = vec![0f32; xs.len()];
        for (row, o) in xs.chunks_exact(w).zip(out.chunks_exact_mut(w)) {
            let mut max = f32::NEG_INFINITY;
            for (o, &v) in o.iter_mut().zip(row) {
                *o = v * scale;
                max = max.max(*o);
            }
            let mut sum = 0f32;
            for o in o.iter_mut() {
                *o = (*o - max).exp();
                sum += *o;
            }
            for o in o.iter_mut() {
                *o /= sum;
            }
        }
        out
    })?;
    Some(like(x, out))
}

crate::cpu::multiversion! {
    /// `out[i] = silu(g[i]) · u[i]` (vectorized, AVX2+FMA where the CPU has it).
    fn silu_mul_into<M>(g: &[f32], u: &[f32], out: &mut [f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + exp_with::<M>(-g)) * u;
        }
    }
}

/// `silu(gate) ⊙ up` for two tensors of one shape.
pub(crate) fn silu_mul(gate: &Tensor, up: &Tensor) -> Option<Result<Tensor>> {
    if gate.dims() != up.dims() {
        return None;
    }
    let out = fast_f32(gate, |gs| {
        fast_f32(up, |us| {
            let mut out = vec![0f32; gs.len().min(us.len())];
            silu_mul_into(gs, us, &mut out);
            out
        })
    })??;
    Some(like(gate, out))
}
