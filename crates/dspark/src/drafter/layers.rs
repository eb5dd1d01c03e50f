//! The building blocks of a Qwen3-shaped draft layer, on candle tensors in `f32`: RMSNorm,
//! linear maps, rotary position embeddings (NeoX rotate-half layout, partial rotary factor,
//! `default` and `linear` scaling), grouped-query attention without a mask (the drafter) and
//! with a causal mask over a KV cache (the native target), and the SwiGLU MLP.
//!
//! A round multiplies a handful of rows (`B·K` block slots, `K + 1` verified tokens) by each
//! weight. General GEMM is a poor fit there: it repacks the whole weight on every call and
//! splits a few microseconds of work over the thread pool. On the CPU in f32, [`Linear`] keeps
//! its weight packed once, at load, for the panel kernel of [`super::packed`] (the output heads
//! get a packed copy, [`output_head`]; attention runs through the same kernel). [`matmul_t`]
//! remains for everything else: inputs of at most [`SMALL_ROWS`] rows (f32, CPU) go through the
//! register-blocked dot kernel of the Markov bias (each weight row read once, straight from the
//! tensor's storage; split over the pool by column chunks only for large weights, from
//! [`PAR_MIN_MACS`]), the rest through candle's matmul.
//!
//! Every host shortcut here (packing, the dot kernel, the single-pass `fused` chains) is taken
//! only for tensors that pass [`crate::device::host_fast`]: with `DSPARK_KERNEL_PATH=tensor`
//! the CPU runs the candle-op branch, the one a CUDA device runs (no cumsum or sort over the
//! vocabulary anywhere in it), so it is tested without a GPU.

use candle_core::{CpuStorage, D, DType, Device, Storage, Tensor};
use rayon::prelude::*;

use std::sync::Arc;

use super::fused;
use super::packed::PackedMatrix;
use crate::config::spec::RopeSpec;
use crate::device::host_fast;
use crate::error::{Error, Result};
use crate::sampling::{Floats, Mat, bias_block};

/// Input rows up to which [`matmul_t`] uses the dot kernel instead of GEMM.
pub const SMALL_ROWS: usize = 32;

/// Multiply-adds from which a small-row product is split over the thread pool (below, about
/// 0.2 ms of work on one core: less than a pool handoff costs on a busy machine).
pub const PAR_MIN_MACS: usize = 1 << 23;

/// Largest output head (elements) that a model also keeps packed for [`output_head`]: the
/// packed copy sits beside the stored head (which the embedding and a drafter may share), so
/// heads above 64 MiB of f32 keep the dot kernel instead of doubling their memory.
pub const PACKED_HEAD_MAX: usize = 1 << 24;

/// A packed copy of an output head `[V, H]` when it takes the host fast path
/// ([`crate::device::host_fast`]: CPU, f32, `DSPARK_KERNEL_PATH` not `tensor`) and is at most
/// [`PACKED_HEAD_MAX`] elements (see [`Linear`]); `None` otherwise.
pub fn output_head(head: &Tensor) -> Result<Option<Linear>> {
    let host = host_fast(head) && head.rank() == 2;
    if !host || head.elem_count() > PACKED_HEAD_MAX {
        return Ok(None);
    }
    Linear::new(head.clone(), None).map(Some)
}

/// `x · rsqrt(mean(x², last dim) + eps) · weight`, computed in `f32`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    if let Some(y) = fused::rms_norm(x, weight, eps) {
        return y;
    }
    let var = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (var + eps)?.sqrt()?.recip()?;
    Ok(x.broadcast_mul(&inv)?.broadcast_mul(weight)?)
}

/// A linear map `y = x · Wᵀ (+ b)` with `W` given `[out, in]` (PyTorch layout).
///
/// On the CPU in f32 the weight is kept in [`PackedMatrix`] panels (instead of, not beside,
/// the `[out, in]` tensor) and every product runs the panel kernel; elsewhere it stays a candle
/// tensor and goes through [`matmul_t`].
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Weight,
    /// `[out]`, if the layer has a bias.
    bias: Option<Tensor>,
}

#[derive(Debug, Clone)]
enum Weight {
    Tensor(Tensor),
    /// The packed weight and the bias on the host.
    Packed(Arc<PackedMatrix>, Option<Arc<Vec<f32>>>),
}

impl Linear {
    /// `weight: [out, in]`, `bias: [out]`. Errors: `bad-shape` for a weight that is not 2-D
    /// or a bias that is not `[out]`.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let &[out, d_in] = weight.dims() else {
            return Err(Error::bad_shape(
                "weight",
                format!("{:?}: a linear weight is [out, in]", weight.dims()),
            ));
        };
        if let Some(b) = bias.as_ref().filter(|b| b.dims() != [out]) {
            return Err(Error::bad_shape(
                "bias",
                format!("{:?} for a weight of {out} outputs", b.dims()),
            ));
        }
        if !host_fast(&weight) || bias.as_ref().is_some_and(|b| !host_fast(b)) {
            return Ok(Self {
                weight: Weight::Tensor(weight),
                bias,
            });
        }
        let w = weight.flatten_all()?.to_vec1::<f32>()?;
        let packed = PackedMatrix::pack(&w, out, d_in)
            .ok_or_else(|| Error::bad_shape("weight", "data does not fill [out, in]"))?;
        let b = bias
            .as_ref()
            .map(|b| b.to_vec1::<f32>().map(Arc::new))
            .transpose()?;
        Ok(Self {
            weight: Weight::Packed(Arc::new(packed), b),
            bias,
        })
    }

    /// Apply to `x` of shape `[.., in]`, giving `[.., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.weight {
            Weight::Packed(w, b) if host_fast(x) => {
                let dims = x.dims();
                let d_in = dims.last().copied().unwrap_or(0);
                if dims.len() < 2 || d_in != w.cols() {
                    return Err(Error::bad_shape(
                        "x",
                        format!("{dims:?} into a linear map of {} inputs", w.cols()),
                    ));
                }
                let n = dims[..dims.len() - 1].iter().product();
                let bias = b.as_deref().map(Vec::as_slice);
                // Read in place when contiguous (no copy of the activations), else one copy.
                let y = match fused::with_f32(x, |xs| w.matmul(xs, n, bias)) {
                    Some(y) => y,
                    None => w.matmul(&x.flatten_all()?.to_vec1::<f32>()?, n, bias),
                }
                .ok_or_else(|| Error::bad_shape("x", "does not fill [.., in]"))?;
                let mut shape = dims.to_vec();
                if let Some(last) = shape.last_mut() {
                    *last = w.rows();
                }
                Ok(Tensor::from_vec(y, shape, x.device())?)
            }
            Weight::Packed(..) => matmul_t(x, &self.weight()?, self.bias.as_ref()),
            Weight::Tensor(w) => {
                // Rows of any leading shape as one `[N, in]` product (candle's matmul does not
                // broadcast a 2-D weight over a batch), with the packed arm's shape errors.
                let dims = x.dims();
                let d_in = w.dims().get(1).copied().unwrap_or(0);
                if dims.len() < 2 || dims.last() != Some(&d_in) {
                    return Err(Error::bad_shape(
                        "x",
                        format!("{dims:?} into a linear map of {d_in} inputs"),
                    ));
                }
                if dims.len() == 2 {
                    return matmul_t(x, w, self.bias.as_ref());
                }
                let n: usize = dims[..dims.len() - 1].iter().product();
                let y = matmul_t(&x.reshape((n, d_in))?, w, self.bias.as_ref())?;
                let mut shape = dims.to_vec();
                if let Some(last) = shape.last_mut() {
                    *last = self.out_dim();
                }
                Ok(y.reshape(shape)?)
            }
        }
    }

    /// The weight as a `[out, in]` tensor (unpacked into a new tensor when packed).
    pub fn weight(&self) -> Result<Tensor> {
        Ok(match &self.weight {
            Weight::Tensor(t) => t.clone(),
            Weight::Packed(w, _) => {
                Tensor::from_vec(w.unpack(), (w.rows(), w.cols()), &Device::Cpu)?
            }
        })
    }

    /// The bias, if the layer has one.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        match &self.weight {
            Weight::Tensor(t) => t.dims().first().copied().unwrap_or(0),
            Weight::Packed(w, _) => w.rows(),
        }
    }
}

/// `x · wᵀ (+ bias)` for `x: [N, in]` and `w: [out, in]`, giving `[N, out]`: the dot kernel when
/// `N <= SMALL_ROWS` and everything is contiguous f32 on the CPU, candle's matmul otherwise
/// (any device or dtype, and its shape errors).
pub fn matmul_t(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if let Some(y) = matmul_t_small(x, w, bias)? {
        return Ok(y);
    }
    let y = x.matmul(&w.t()?)?;
    Ok(match bias {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    })
}

/// The dot-kernel path of [`matmul_t`]; `None` when it does not apply.
fn matmul_t_small(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Option<Tensor>> {
    let &[n, d_in] = x.dims() else {
        return Ok(None);
    };
    if n == 0
        || n > SMALL_ROWS
        || !host_fast(x)
        || !host_fast(w)
        || bias.is_some_and(|b| !host_fast(b))
    {
        return Ok(None);
    }
    let &[out, w_in] = w.dims() else {
        return Ok(None);
    };
    if w_in != d_in || out == 0 || d_in == 0 {
        return Ok(None);
    }
    let mut y = match bias {
        Some(b) if b.dims() == [out] => b.to_vec1::<f32>()?.repeat(n),
        Some(_) => return Ok(None),
        None => vec![0f32; n * out],
    };
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    let (storage, layout) = w.storage_and_layout();
    let (Storage::Cpu(CpuStorage::F32(all)), Some((lo, hi))) =
        (&*storage, layout.contiguous_offsets())
    else {
        return Ok(None);
    };
    let mat = Mat {
        data: Floats::F32(&all[lo..hi]),
        dims: [out, d_in],
    };
    if n * out * d_in >= PAR_MIN_MACS && crate::threads::use_pool(n * out * d_in) {
        // A large weight: column chunks of every row in parallel (each weight row still read
        // once, by one worker).
        let chunk = out.div_ceil(rayon::current_num_threads() * 4).max(16);
        let mut parts: Vec<Vec<&mut [f32]>> = (0..out.div_ceil(chunk))
            .map(|_| Vec::with_capacity(n))
            .collect();
        for row in y.chunks_mut(out) {
            for (c, part) in row.chunks_mut(chunk).enumerate() {
                parts[c].push(part);
            }
        }
        parts
            .into_par_iter()
            .enumerate()
            .for_each(|(c, mut dst)| bias_block(mat, c * chunk, &xs, &mut dst, 1.0));
    } else {
        let mut rows: Vec<&mut [f32]> = y.chunks_mut(out).collect();
        bias_block(mat, 0, &xs, &mut rows, 1.0);
    }
    drop(storage);
    Ok(Some(Tensor::from_vec(y, (n, out), x.device())?))
}

/// `softmax` over the last dimension, numerically stable.
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    if let Some(y) = fused::scaled_softmax(x, 1.0) {
        return y;
    }
    let max = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&s)?)
}

/// SwiGLU: `down(silu(gate(x)) ⊙ up(x))`.
pub fn swiglu(x: &Tensor, gate: &Linear, up: &Linear, down: &Linear) -> Result<Tensor> {
    let (g, u) = (gate.forward(x)?, up.forward(x)?);
    let h = match fused::silu_mul(&g, &u) {
        Some(h) => h?,
        None => (g.silu()? * u)?,
    };
    down.forward(&h)
}

/// Rotary position embedding tables for one head dimension.
#[derive(Debug, Clone)]
pub struct Rope {
    /// Rotated dims per head (even, `<= head_dim`).
    rotary_dim: usize,
    head_dim: usize,
    /// `rotary_dim / 2` inverse frequencies (already divided by a linear scaling factor).
    inv_freq: Vec<f64>,
}

impl Rope {
    /// Build from the config's RoPE parameters. Supported: NeoX layout, `default` and `linear`
    /// rope types, any partial rotary factor that gives an even number of rotated dims.
    pub fn new(spec: &RopeSpec, head_dim: usize, source: &str) -> Result<Self> {
        let bad = |key: &str, msg: String| Error::bad_config(source, key, msg);
        if !spec.neox_style {
            return Err(bad(
                "is_neox_style",
                "the candle drafter implements the NeoX (rotate-half) RoPE layout only".into(),
            ));
        }
        let rotary_dim = (head_dim as f64 * spec.partial_rotary_factor).round() as usize;
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            return Err(bad(
                "partial_rotary_factor",
                format!(
                    "{} of head_dim {head_dim} gives {rotary_dim} rotated dims (need an even \
                     number in (0, head_dim])",
                    spec.partial_rotary_factor
                ),
            ));
        }
        let scale = match spec.rope_type.as_str() {
            "default" => 1.0,
            "linear" => spec.factor.filter(|f| *f > 0.0).ok_or_else(|| {
                bad(
                    "rope_scaling.factor",
                    "linear RoPE scaling needs a positive factor".into(),
                )
            })?,
            other => {
                return Err(bad(
                    "rope_type",
                    format!("`{other}` is not supported by the candle drafter (default, linear)"),
                ));
            }
        };
        let inv_freq = (0..rotary_dim / 2)
            .map(|i| 1.0 / spec.theta.powf(2.0 * i as f64 / rotary_dim as f64) / scale)
            .collect();
        Ok(Self {
            rotary_dim,
            head_dim,
            inv_freq,
        })
    }

    /// `(cos, sin)` tables `[N, rotary_dim]` for the given absolute positions (angles in `f64`,
    /// stored as `f32`; each half of the row repeats the frequencies, NeoX style).
    pub fn tables(&self, positions: &[usize], device: &Device) -> Result<(Tensor, Tensor)> {
        let half = self.rotary_dim / 2;
        let mut cos = Vec::with_capacity(positions.len() * self.rotary_dim);
        let mut sin = Vec::with_capacity(positions.len() * self.rotary_dim);
        for &p in positions {
            for _ in 0..2 {
                for f in &self.inv_freq[..half] {
                    let a = p as f64 * f;
                    cos.push(a.cos() as f32);
                    sin.push(a.sin() as f32);
                }
            }
        }
        let n = positions.len();
        Ok((
            Tensor::from_vec(cos, (n, self.rotary_dim), device)?,
            Tensor::from_vec(sin, (n, self.rotary_dim), device)?,
        ))
    }

    /// Rotate `x` of shape `[N, heads, head_dim]` with tables for its `N` rows.
    pub fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        if let Some(y) = fused::rope(x, cos, sin) {
            return y;
        }
        let rd = self.rotary_dim;
        let half = rd / 2;
        let cos = cos.unsqueeze(1)?;
        let sin = sin.unsqueeze(1)?;
        let rot = x.narrow(D::Minus1, 0, rd)?;
        let x1 = rot.narrow(D::Minus1, 0, half)?;
        let x2 = rot.narrow(D::Minus1, half, half)?;
        let rotated_half = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
        let out = (rot.broadcast_mul(&cos)? + rotated_half.broadcast_mul(&sin)?)?;
        if rd == self.head_dim {
            Ok(out)
        } else {
            let pass = x.narrow(D::Minus1, rd, self.head_dim - rd)?;
            Ok(Tensor::cat(&[&out, &pass], D::Minus1)?)
        }
    }
}

/// Non-causal grouped-query attention for one request.
///
/// `q` is `[Q, heads, hd]`; `k`, `v` are `[kv_heads, S, hd]` (keys already normed and rotated).
/// Query head `h` reads key/value head `h / (heads / kv_heads)`. Returns `[Q, heads·hd]`.
pub fn gqa_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
    if let Some(y) = fused::gqa_attention(q, k, v, scale) {
        return y;
    }
    let (q_len, heads, hd) = q.dims3()?;
    let kv_heads = k.dims()[0];
    let groups = heads / kv_heads.max(1);
    // [Q, heads, hd] → [heads, Q, hd] → [kv, groups·Q, hd]
    let q = q
        .transpose(0, 1)?
        .contiguous()?
        .reshape((kv_heads, groups * q_len, hd))?;
    let mut outs = Vec::with_capacity(kv_heads);
    for h in 0..kv_heads {
        // [groups·Q, hd] · [S, hd]ᵀ, then [groups·Q, S] · ([S, hd]ᵀ as [hd, S])ᵀ.
        let (qh, kh) = (q.get(h)?, k.get(h)?);
        let scores = matmul_t(&qh, &kh, None)?;
        let probs = match fused::scaled_softmax(&scores, scale) {
            Some(p) => p?,
            None => softmax_last(&(scores * scale)?)?,
        };
        let vt = v.get(h)?.t()?.contiguous()?;
        outs.push(matmul_t(&probs, &vt, None)?);
    }
    let out = Tensor::stack(&outs, 0)?; // [kv, groups·Q, hd]
    Ok(out
        .reshape((heads, q_len, hd))?
        .transpose(0, 1)?
        .contiguous()?
        .reshape((q_len, heads * hd))?)
}

/// [`causal_gqa_attention`] against a cache that keeps its keys transposed, `kt: [kv_heads, hd,
/// cap]`, and its values token-major, `v: [cap, kv_heads, hd]`, of which the first `s` tokens
/// are live: on the CPU the keys are read where they lie (no per-call packing), elsewhere the
/// live keys are transposed back and [`causal_gqa_attention`] runs.
pub fn causal_gqa_attention_kt(
    q: &Tensor,
    kt: &Tensor,
    v: &Tensor,
    s: usize,
    scale: f64,
) -> Result<Tensor> {
    if let Some(y) = fused::causal_attention_kt(q, kt, v, s, scale) {
        return y;
    }
    let k = kt.narrow(2, 0, s)?.permute((2, 0, 1))?.contiguous()?;
    causal_gqa_attention(q, &k, &v.narrow(0, 0, s)?, scale)
}

/// Causal grouped-query attention of `Q` new tokens against a KV cache, for one request.
///
/// `q` is `[Q, heads, hd]`; `k`, `v` are token-major `[S, kv_heads, hd]` with `S >= Q` (keys
/// already normed and rotated): rows `0 .. S − Q` are the cached context, the last `Q` rows
/// the new tokens themselves. Query `i` sees keys `0 ..= S − Q + i`. Query head `h` reads
/// key/value head `h / (heads / kv_heads)`. Returns `[Q, heads·hd]`. Contiguous f32 CPU
/// inputs take the single-pass kernel; anything else a masked candle path.
pub fn causal_gqa_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
    if let Some(y) = fused::causal_attention(q, k, v, scale) {
        return y;
    }
    let (q_len, heads, hd) = q.dims3()?;
    let (s, kv_heads, _) = k.dims3()?;
    if s < q_len || kv_heads == 0 || !heads.is_multiple_of(kv_heads) || v.dims() != k.dims() {
        return Err(Error::bad_shape(
            "k",
            format!(
                "q {:?}, k {:?}, v {:?}: need [S >= Q, kv_heads | heads, hd]",
                q.dims(),
                k.dims(),
                v.dims()
            ),
        ));
    }
    let groups = heads / kv_heads;
    let past = s - q_len;
    let visible = |i: usize, j: usize| {
        if j <= past + i {
            0.0
        } else {
            f32::NEG_INFINITY
        }
    };
    let mask: Vec<f32> = (0..q_len)
        .flat_map(|i| (0..s).map(move |j| visible(i, j)))
        .collect();
    let mask = Tensor::from_vec(mask, (1, q_len, s), q.device())?.to_dtype(q.dtype())?;
    let mut outs = Vec::with_capacity(kv_heads);
    for h in 0..kv_heads {
        // [Q, groups, hd] → [groups, Q, hd] → [groups·Q, hd]
        let qh = q
            .narrow(1, h * groups, groups)?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((groups * q_len, hd))?;
        let kh = k.narrow(1, h, 1)?.squeeze(1)?.contiguous()?;
        let vh = v.narrow(1, h, 1)?.squeeze(1)?.contiguous()?;
        let scores = (matmul_t(&qh, &kh, None)? * scale)?
            .reshape((groups, q_len, s))?
            .broadcast_add(&mask)?;
        let probs = softmax_last(&scores)?.reshape((groups * q_len, s))?;
        outs.push(probs.matmul(&vh)?); // [groups·Q, hd]
    }
    let out = Tensor::stack(&outs, 0)?; // [kv, groups·Q, hd]
    Ok(out
        .reshape((heads, q_len, hd))?
        .transpose(0, 1)?
        .contiguous()?
        .reshape((q_len, heads * hd))?)
}

/// Ensure `t` is `f32` (the drafter's compute dtype).
pub fn f32_of(t: &Tensor) -> Result<Tensor> {
    Ok(if t.dtype() == DType::F32 {
        t.clone()
    } else {
        t.to_dtype(DType::F32)?
    })
}
