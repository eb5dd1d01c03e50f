//! Rotary position embeddings: NeoX rotate-half layout, partial rotary factor, `default` and
//! `linear` scaling.

use candle_core::{D, Device, Tensor};

use super::fused;
use crate::config::RopeSpec;
use crate::error::{Error, Result};

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
