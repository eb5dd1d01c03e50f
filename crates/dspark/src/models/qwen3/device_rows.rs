//! The native target's forward on the device-generic path (a GPU, or the CPU under
//! `DSPARK_KERNEL_PATH=tensor`): one upload per forward and one attention per layer.
//!
//! The forward's packed rows (request `b`'s `m_b` new tokens at `off_b`) are laid out as a
//! padded `[A, M]` batch of the `A` requests with new tokens (`M` = the largest `m_b`); one
//! upload carries the token ids, their positions and the two index maps between the layouts,
//! and the causal mask is built on the device from the query positions, once per forward
//! ([`causal_mask`]). Each layer then writes the new keys and values into every request's
//! cache and runs [`batched_attention`] over all of them. The host fast path keeps its
//! single-pass per-request kernels (`Qwen3Cache::attend_host`), which this path is tested
//! against.

use candle_core::Tensor;

use super::cache::Qwen3Cache;
use crate::error::{Error, Result};
use crate::nn::attention::{IotaCache, Keys, batched_attention, causal_mask};

/// What a device forward's attention needs, prepared once per forward.
pub(crate) struct DeviceRows {
    /// `u32 [N]` token ids of the packed rows.
    pub(crate) ids: Tensor,
    /// `u32 [N]` their absolute positions.
    pub(crate) positions: Tensor,
    /// Per request with new tokens: `(b, offset, m)`.
    active: Vec<(usize, usize, usize)>,
    /// `M`: the most new tokens of a request.
    m_max: usize,
    /// `S`: the most tokens a request sees (held + new).
    s_max: usize,
    /// `u32 [A·M]`: the packed row each padded slot reads (`None`: the packed rows are the
    /// padded layout already).
    pad: Option<Tensor>,
    /// `u32 [N]`: the padded slot of each packed row (`None` as `pad`).
    unpad: Option<Tensor>,
    /// `[A, 1, M, S]`.
    mask: Tensor,
}

impl DeviceRows {
    /// Lay out `rows` (`(offset, m)` per request) of `ids` at `positions`, for a cache whose
    /// requests hold `held[b]` tokens.
    pub(crate) fn new(
        ids: &[u32],
        positions: &[usize],
        rows: &[(usize, usize)],
        held: &[usize],
        key_index: &IotaCache,
        device: &candle_core::Device,
    ) -> Result<Self> {
        let n = ids.len();
        let active: Vec<(usize, usize, usize)> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.1 > 0)
            .map(|(b, &(off, m))| (b, off, m))
            .collect();
        let m_max = active.iter().map(|a| a.2).max().unwrap_or(0);
        let s_max = active
            .iter()
            .map(|&(b, _, m)| held[b] + m)
            .max()
            .unwrap_or(0);
        let a_n = active.len();
        let padded = active.iter().all(|a| a.2 == m_max);
        let u32_of =
            |x: usize| u32::try_from(x).map_err(|_| Error::too_large("positions", x, u32::MAX, ""));
        let mut up: Vec<u32> = Vec::with_capacity(2 * n + 2 * a_n * m_max + n);
        up.extend_from_slice(ids);
        for &p in positions {
            up.push(u32_of(p)?);
        }
        // Query positions of the padded slots (a padded slot repeats its request's last row).
        for &(b, _, m) in &active {
            for i in 0..m_max {
                up.push(u32_of(held[b] + i.min(m - 1))?);
            }
        }
        if !padded {
            for &(_, off, m) in &active {
                up.extend((0..m_max).map(|i| (off + i.min(m - 1)) as u32));
            }
            let mut unpad = vec![0u32; n];
            for (a, &(_, off, m)) in active.iter().enumerate() {
                for i in 0..m {
                    unpad[off + i] = u32_of(a * m_max + i)?;
                }
            }
            up.extend(unpad);
        }
        let len = up.len();
        let all = crate::trace::upload(up, len, device)?;
        let am = a_n * m_max;
        let qpos = all.narrow(0, 2 * n, am)?.reshape((a_n, m_max))?;
        let (pad, unpad) = if padded {
            (None, None)
        } else {
            (
                Some(all.narrow(0, 2 * n + am, am)?),
                Some(all.narrow(0, 2 * n + 2 * am, n)?),
            )
        };
        let mask = causal_mask(&qpos, &key_index.get(s_max, device)?)?;
        Ok(Self {
            ids: all.narrow(0, 0, n)?,
            positions: all.narrow(0, n, n)?,
            active,
            m_max,
            s_max,
            pad,
            unpad,
            mask,
        })
    }

    /// Layer `li`'s attention: write `k`, `v` (`[N, kv_heads, hd]`, packed) into every
    /// request's cache, then attend `q` (`[N, heads, hd]`) against them all. Returns
    /// `[N, heads·hd]`.
    pub(crate) fn attend(
        &self,
        cache: &mut Qwen3Cache,
        li: usize,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        scale: f64,
    ) -> Result<Tensor> {
        let (_, heads, hd) = q.dims3()?;
        let (a_n, m, s) = (self.active.len(), self.m_max, self.s_max);
        let mut kts = Vec::with_capacity(a_n);
        let mut vs = Vec::with_capacity(a_n);
        for &(b, off, rows) in &self.active {
            let live = cache.write(b, li, &k.narrow(0, off, rows)?, &v.narrow(0, off, rows)?)?;
            // Keys past a request's own length are masked (its queries sit before them); a
            // buffer shorter than S is padded.
            let cap = live.kt.dims().get(2).copied().unwrap_or(0);
            let (kt, vv) = if cap >= s {
                (live.kt.narrow(2, 0, s)?, live.v.narrow(0, 0, s)?)
            } else {
                let n = live.len;
                (
                    live.kt.narrow(2, 0, n)?.pad_with_zeros(2, 0, s - n)?,
                    live.v.narrow(0, 0, n)?.pad_with_zeros(0, 0, s - n)?,
                )
            };
            kts.push(kt);
            vs.push(vv.permute((1, 0, 2))?); // [kv, S, hd]
        }
        let (kt, vv) = if a_n == 1 {
            (
                kts.swap_remove(0).unsqueeze(0)?,
                vs.swap_remove(0).contiguous()?.unsqueeze(0)?,
            )
        } else {
            (Tensor::stack(&kts, 0)?, Tensor::stack(&vs, 0)?)
        };
        let q = match &self.pad {
            Some(idx) => q.index_select(idx, 0)?,
            None => q.clone(),
        }
        .reshape((a_n, m, heads, hd))?;
        let out = batched_attention(&q, Keys::Transposed(&kt), &vv, Some(&self.mask), scale)?;
        Ok(match &self.unpad {
            Some(idx) => out.index_select(idx, 0)?,
            None => out,
        })
    }
}
