//! The building blocks of a Qwen3-shaped draft layer, on candle tensors in `f32`: RMSNorm,
//! linear maps, rotary position embeddings (NeoX rotate-half layout, partial rotary factor,
//! `default` and `linear` scaling), grouped-query attention without a mask, and the SwiGLU MLP.

use candle_core::{D, DType, Device, Tensor};

use crate::config::spec::RopeSpec;
use crate::error::{Error, Result};

/// `x · rsqrt(mean(x², last dim) + eps) · weight`, computed in `f32`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let var = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (var + eps)?.sqrt()?.recip()?;
    Ok(x.broadcast_mul(&inv)?.broadcast_mul(weight)?)
}

/// A linear map `y = x · Wᵀ (+ b)` with `W` stored `[out, in]` (PyTorch layout).
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Tensor,
    /// `[out]`, if the layer has a bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// Apply to `x` of shape `[N, in]` (2-D), giving `[N, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&self.weight.t()?)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        self.weight.dims().first().copied().unwrap_or(0)
    }
}

/// `softmax` over the last dimension, numerically stable.
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&s)?)
}

/// SwiGLU: `down(silu(gate(x)) ⊙ up(x))`.
pub fn swiglu(x: &Tensor, gate: &Linear, up: &Linear, down: &Linear) -> Result<Tensor> {
    let g = gate.forward(x)?.silu()?;
    down.forward(&(g * up.forward(x)?)?)
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
    let (q_len, heads, hd) = q.dims3()?;
    let kv_heads = k.dims()[0];
    let groups = heads / kv_heads.max(1);
    // [Q, heads, hd] → [heads, Q, hd] → [kv, groups·Q, hd]
    let q = q
        .transpose(0, 1)?
        .contiguous()?
        .reshape((kv_heads, groups * q_len, hd))?;
    let scores = (q.matmul(&k.t()?)? * scale)?;
    let probs = softmax_last(&scores)?;
    let out = probs.matmul(v)?; // [kv, groups·Q, hd]
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
