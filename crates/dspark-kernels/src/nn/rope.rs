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

/// Positions the host tables of a [`Rope`] cover at most (2^15: 32 MiB for both at 128
/// rotated dims); past it, rows are evaluated per call.
pub const HOST_TABLE_MAX: usize = 1 << 15;

/// Host `(cos, sin)` rows for positions `0 .. len` (row-major, `rotary_dim` values each),
/// grown by doubling, so that a pass copies its rows instead of evaluating a sine and a cosine
/// per rotated pair: building a 96-token prompt's tables took 0.13-0.16 ms (EPYC Zen 4), paid by
/// each target prefill and each drafter context catch-up. A row holds the values
/// [`Rope::tables`] evaluates for its position, so where it comes from changes no bit.
#[derive(Debug, Default)]
struct HostTables {
    len: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// Rotary position embedding tables for one head dimension.
#[derive(Debug, Clone)]
pub struct Rope {
    /// Rotated dims per head (even, `<= head_dim`).
    rotary_dim: usize,
    head_dim: usize,
    /// `rotary_dim / 2` inverse frequencies (already divided by a linear scaling factor).
    inv_freq: Vec<f64>,
    /// The rows evaluated so far (shared by clones: the same parameters).
    host: Arc<Mutex<HostTables>>,
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
            host: Arc::default(),
        })
    }

    /// `(cos, sin)` tables `[N, rotary_dim]` for the given absolute positions (angles in `f64`,
    /// stored as `f32`; each half of the row repeats the frequencies, NeoX style), copied from
    /// the host rows kept so far (evaluated past [`HOST_TABLE_MAX`]).
    pub fn tables(&self, positions: &[usize], device: &Device) -> Result<(Tensor, Tensor)> {
        let rd = self.rotary_dim;
        let n = positions.len();
        let mut cos = Vec::with_capacity(n * rd);
        let mut sin = Vec::with_capacity(n * rd);
        let max = positions.iter().copied().max().unwrap_or(0);
        if max < HOST_TABLE_MAX {
            let mut t = self.host.lock().unwrap_or_else(PoisonError::into_inner);
            if t.len <= max {
                let len = (max + 1).next_power_of_two().max(FIRST_TABLE);
                let HostTables {
                    len: have,
                    cos: c,
                    sin: s,
                } = &mut *t;
                self.evaluate(*have..len, c, s);
                *have = len;
            }
            for &p in positions {
                cos.extend_from_slice(&t.cos[p * rd..(p + 1) * rd]);
                sin.extend_from_slice(&t.sin[p * rd..(p + 1) * rd]);
            }
        } else {
            self.evaluate(positions.iter().copied(), &mut cos, &mut sin);
        }
        Ok((
            crate::trace::upload(cos, (n, rd), device)?,
            crate::trace::upload(sin, (n, rd), device)?,
        ))
    }

    /// Append the rows of `positions` to `cos` and `sin` (of equal lengths): each rotated pair's
    /// angle in `f64`, its cosine and sine rounded to `f32`, the half repeated.
    fn evaluate(
        &self,
        positions: impl Iterator<Item = usize>,
        cos: &mut Vec<f32>,
        sin: &mut Vec<f32>,
    ) {
        let half = self.rotary_dim / 2;
        for p in positions {
            let start = cos.len();
            for f in &self.inv_freq[..half] {
                let a = p as f64 * f;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
            cos.extend_from_within(start..start + half);
            sin.extend_from_within(start..start + half);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_rows_equal_evaluated_ones_in_any_order_and_past_the_kept_range() {
        let spec = RopeSpec::neox(1e6);
        let rope = Rope::new(&spec, 64, "test").unwrap();
        let eval = |positions: &[usize]| {
            let (mut c, mut s) = (Vec::new(), Vec::new());
            rope.evaluate(positions.iter().copied(), &mut c, &mut s);
            (c, s)
        };
        let host = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // Unordered, repeated, growing the rows kept twice, and one past HOST_TABLE_MAX.
        for positions in [
            vec![5, 0, 3, 3],
            vec![700, 2, 299],
            vec![4095, 1],
            vec![HOST_TABLE_MAX + 3, 7],
        ] {
            let (cos, sin) = rope.tables(&positions, &Device::Cpu).unwrap();
            assert_eq!(cos.dims(), [positions.len(), 64]);
            let (c, s) = eval(&positions);
            assert_eq!(host(cos), c, "{positions:?}");
            assert_eq!(host(sin), s, "{positions:?}");
        }
        // NeoX: each row's halves repeat; position 0 is (1, 0).
        let (c, s) = eval(&[0, 9]);
        assert_eq!(c[..32], c[32..64]);
        assert_eq!(s[64..96], s[96..128]);
        assert!(c[..64].iter().all(|&x| x == 1.0) && s[..64].iter().all(|&x| x == 0.0));
    }
}
