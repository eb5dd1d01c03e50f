//! Rotary position embeddings: NeoX rotate-half layout, partial rotary factor, `default` and
//! `linear` scaling.

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{D, Device, Tensor};

use super::fused;
use crate::config::RopeSpec;
use crate::error::{Error, Result};

/// `(cos, sin)` tables for positions `0 .. len`, kept on a device so that a pass looks its rows
/// up with one gather instead of building and uploading tables per call; grown by doubling.
#[derive(Debug, Clone, Default)]
pub struct RopeCache(Arc<Mutex<Option<(usize, Tensor, Tensor)>>>);

/// Positions the first device table covers.
const FIRST_TABLE: usize = 256;

/// Positions a [`RopeCache`] covers at most (2^17: 64 MiB per table at 128 rotated dims);
/// past it, tables are built per call.
pub const ROPE_CACHE_MAX: usize = 1 << 17;

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
            crate::trace::upload(cos, (n, self.rotary_dim), device)?,
            crate::trace::upload(sin, (n, self.rotary_dim), device)?,
        ))
    }

    /// [`Self::tables`] for `positions` (the same values as `host`, uploaded as a `u32` tensor
    /// `[N]` on the tables' device), gathered from `cache`'s device tables: no upload unless
    /// the cache grows to cover the largest position (to the next power of two). Positions
    /// past [`ROPE_CACHE_MAX`] build their tables on the host instead, as [`Self::tables`].
    pub fn tables_at(
        &self,
        cache: &RopeCache,
        positions: &Tensor,
        host: &[usize],
    ) -> Result<(Tensor, Tensor)> {
        let device = positions.device();
        let max_position = host.iter().copied().max().unwrap_or(0);
        if max_position >= ROPE_CACHE_MAX {
            return self.tables(host, device);
        }
        let mut slot = cache.0.lock().unwrap_or_else(PoisonError::into_inner);
        let fits = slot
            .as_ref()
            .is_some_and(|(len, c, _)| *len > max_position && c.device().same_device(device));
        if !fits {
            let len = (max_position + 1).next_power_of_two().max(FIRST_TABLE);
            let all: Vec<usize> = (0..len).collect();
            let (cos, sin) = self.tables(&all, device)?;
            *slot = Some((len, cos, sin));
        }
        let Some((_, cos, sin)) = slot.as_ref() else {
            return Err(Error::Internal {
                message: "the rope cache lost its tables".into(),
            });
        };
        Ok((
            cos.index_select(positions, 0)?,
            sin.index_select(positions, 0)?,
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
