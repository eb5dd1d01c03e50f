//! Single-pass CPU versions of the drafter's elementwise chains: RMSNorm, rotary embedding,
//! scaled softmax and the SwiGLU gate; and the causal attention of the native target.
//!
//! Written as candle ops, each chain is 5–8 small tensors (an allocation and a thread-pool
//! dispatch apiece) for a few thousand values: at a drafter round's sizes that overhead, not the
//! arithmetic, is the cost. Each function here reads its contiguous f32 inputs straight from
//! storage, writes one output in one pass on the calling thread, and performs the same
//! operations in the same order per element as the candle chain it replaces (sums over a row
//! may associate differently). Each returns `None` when the inputs are not contiguous f32 CPU
//! tensors of the expected shapes; the callers in [`super::layers`] then use the candle chain.

use candle_core::{CpuStorage, DType, Storage, Tensor};

use crate::error::Result;
#[cfg(target_arch = "x86_64")]
use crate::sampling::fastmath::{Fused, has_avx2};
use crate::sampling::fastmath::{MulAdd, Unfused, exp_with};

/// Run `f` on the contiguous f32 values of CPU tensor `t`, or `None`.
fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
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
    let out = with_f32(x, |xs| {
        with_f32(weight, |ws| {
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
    let out = with_f32(x, |xs| {
        with_f32(cos, |cs| {
            with_f32(sin, |ss| {
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
    let out = with_f32(x, |xs| {
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

/// `silu(gate) ⊙ up` for two tensors of one shape.
pub(crate) fn silu_mul(gate: &Tensor, up: &Tensor) -> Option<Result<Tensor>> {
    if gate.dims() != up.dims() {
        return None;
    }
    let out = with_f32(gate, |gs| {
        with_f32(up, |us| {
            gs.iter()
                .zip(us)
                .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
                .collect::<Vec<f32>>()
        })
    })??;
    Some(like(gate, out))
}

/// `a · b` on two 8-lane accumulators with `M`'s multiply-add, reduced as a tree, then the
/// tail in order (the portable twin of [`dot_avx2`]).
#[inline(always)]
fn dot_tree<M: MulAdd>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let ((ca, ta), (cb, tb)) = (a[..n].as_chunks::<8>(), b[..n].as_chunks::<8>());
    let mut acc = [[0f32; 8]; 2];
    for (k, (x, y)) in ca.iter().zip(cb).enumerate() {
        for l in 0..8 {
            acc[k % 2][l] = M::mul_add(x[l], y[l], acc[k % 2][l]);
        }
    }
    let h: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
    let q = [h[0] + h[4], h[1] + h[5], h[2] + h[6], h[3] + h[7]];
    let mut t = (q[0] + q[2]) + (q[1] + q[3]);
    for (x, y) in ta.iter().zip(tb) {
        t = M::mul_add(*x, *y, t);
    }
    t
}

/// [`dot_tree`] in AVX2+FMA registers (the same per-lane operations; one score per cached
/// key makes this the attention's hot loop, which the compiler does not vectorize well).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::{
        _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_movehdup_ps, _mm_movehl_ps, _mm256_add_ps,
        _mm256_castps256_ps128, _mm256_extractf128_ps, _mm256_fmadd_ps, _mm256_loadu_ps,
        _mm256_setzero_ps,
    };
    let n = a.len().min(b.len());
    let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: `i + 16 <= n` keeps the four 8-float loads inside `a` and `b`.
        unsafe {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
            s1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                s1,
            );
        }
        i += 16;
    }
    if i + 8 <= n {
        // SAFETY: `i + 8 <= n` keeps both loads inside `a` and `b`.
        unsafe {
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), s0);
        }
        i += 8;
    }
    let s = _mm256_add_ps(s0, s1);
    let h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    let mut t = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
    for (x, y) in a[i..n].iter().zip(&b[i..n]) {
        t = x.mul_add(*y, t);
    }
    t
}

/// One query row `q: [heads·hd]` of causal attention over the first `visible` rows of
/// token-major `ks`, `vs` (`[S, kv_heads, hd]`), into `o: [heads·hd]` (zeroed); `scores` is
/// scratch of at least `visible` values. `shape` = `[visible, heads, kv_heads, hd]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_query_with<M: MulAdd>(
    dot: impl Fn(&[f32], &[f32]) -> f32,
    q: &[f32],
    ks: &[f32],
    vs: &[f32],
    shape: [usize; 4],
    scale: f32,
    scores: &mut [f32],
    o: &mut [f32],
) {
    let [visible, heads, kvh, hd] = shape;
    let groups = heads / kvh;
    let scores = &mut scores[..visible];
    for (hq, (qh, oh)) in q.chunks_exact(hd).zip(o.chunks_exact_mut(hd)).enumerate() {
        let kh = hq / groups;
        for (j, sc) in scores.iter_mut().enumerate() {
            *sc = dot(qh, &ks[(j * kvh + kh) * hd..][..hd]) * scale;
        }
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        for sc in scores.iter_mut() {
            *sc = exp_with::<M>(*sc - max);
        }
        let sum: f32 = scores.iter().sum();
        for (j, &p) in scores.iter().enumerate() {
            for (y, &x) in oh.iter_mut().zip(&vs[(j * kvh + kh) * hd..][..hd]) {
                *y = M::mul_add(p, x, *y);
            }
        }
        let inv = sum.recip();
        for y in oh.iter_mut() {
            *y *= inv;
        }
    }
}

/// [`attend_query_with`], in an AVX2+FMA build when the CPU has it.
fn attend_query(
    q: &[f32],
    ks: &[f32],
    vs: &[f32],
    shape: [usize; 4],
    scale: f32,
    scores: &mut [f32],
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        fn avx2(
            q: &[f32],
            ks: &[f32],
            vs: &[f32],
            shape: [usize; 4],
            scale: f32,
            scores: &mut [f32],
            o: &mut [f32],
        ) {
            attend_query_with::<Fused>(|a, b| dot_avx2(a, b), q, ks, vs, shape, scale, scores, o);
        }
        if has_avx2() {
            // SAFETY: `has_avx2` checked that this CPU supports AVX2 and FMA.
            return unsafe { avx2(q, ks, vs, shape, scale, scores, o) };
        }
    }
    attend_query_with::<Unfused>(dot_tree::<Unfused>, q, ks, vs, shape, scale, scores, o);
}

/// Work (multiply-adds) from which [`causal_attention`] splits its queries over the pool.
const ATTN_PAR_MIN: usize = 1 << 22;

/// Causal grouped-query attention of `q: [Q, heads, hd]` against token-major `k`, `v:
/// [S, kv_heads, hd]` (`S >= Q`; query `i` sees keys `0 ..= S − Q + i`), giving
/// `[Q, heads·hd]`: per query and head one pass of scaled dot products, a max-subtracted
/// softmax and the weighted sum of values, straight from storage (no score tensors).
pub(crate) fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
) -> Option<Result<Tensor>> {
    use rayon::prelude::*;
    let &[q_len, heads, hd] = q.dims() else {
        return None;
    };
    let &[s, kvh, khd] = k.dims() else {
        return None;
    };
    if v.dims() != k.dims() || khd != hd || hd == 0 || s < q_len || kvh == 0 {
        return None;
    }
    if heads == 0 || !heads.is_multiple_of(kvh) {
        return None;
    }
    let (past, scale) = (s - q_len, scale as f32);
    let out = with_f32(q, |qs| {
        with_f32(k, |ks| {
            with_f32(v, |vs| {
                let one = |i: usize, o: &mut [f32], scores: &mut Vec<f32>| {
                    scores.resize(s, 0.0);
                    let q = &qs[i * heads * hd..][..heads * hd];
                    let shape = [past + i + 1, heads, kvh, hd];
                    attend_query(q, ks, vs, shape, scale, scores, o);
                };
                let mut out = vec![0f32; q_len * heads * hd];
                let work = q_len.saturating_mul(s).saturating_mul(heads * hd);
                if work >= ATTN_PAR_MIN && crate::threads::use_pool(work) {
                    out.par_chunks_mut(heads * hd)
                        .enumerate()
                        .for_each_init(Vec::new, |scores, (i, o)| one(i, o, scores));
                } else {
                    let mut scores = Vec::new();
                    for (i, o) in out.chunks_exact_mut(heads * hd).enumerate() {
                        one(i, o, &mut scores);
                    }
                }
                out
            })
        })
    })???;
    Some(Tensor::from_vec(out, (q_len, heads * hd), q.device()).map_err(Into::into))
}
