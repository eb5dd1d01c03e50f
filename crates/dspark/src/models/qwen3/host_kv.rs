//! One layer's KV buffers of one request in host memory, laid out as the panel products read
//! them: every panel of keys and of values is one forward stream.
//!
//! - **Keys** `[kv_heads, capacity / 16, head_dim, 16]`: head `h`'s panel `p` holds keys
//!   `16p .. 16p + 16`, dimension by dimension (16 keys side by side), so `Q·Kᵀ` reads a panel
//!   as `head_dim · 64` contiguous bytes.
//! - **Values** `[kv_heads, ⌈head_dim / 16⌉, capacity, 16]`: head `h`'s panel `p` holds
//!   dimensions `16p .. 16p + 16` of every key, key by key, so `P·V` reads a panel as one
//!   stream of `capacity · 64` bytes (lanes past `head_dim` are zeros, their outputs dropped).
//!
//! A transposed key buffer (`[kv_heads, head_dim, capacity]`) and token-major values read one
//! 64-byte line per column at a stride of the capacity or of a token's row: at a long context
//! that is most of a decode step's attention time. A write scatters a new key's values over
//! its panel (as the transposed buffer did); a value is 16-value runs.

use candle_core::{Device, Tensor};

use crate::error::Result;
use crate::nn::attention::kernel as attention;
use crate::nn::packed::PANEL;

/// Keys and values of one request and layer (see the module docs); `cap` is a multiple of 16.
#[derive(Debug, Clone)]
pub(super) struct HostKv {
    k: Vec<f32>,
    v: Vec<f32>,
}

/// The buffers' shape: `(kv_heads, head_dim, capacity)`.
pub(super) type Shape = (usize, usize, usize);

impl HostKv {
    /// Zeroed buffers of `cap` tokens, holding the first `len` tokens of `old` (of `old_cap`).
    pub(super) fn grown(
        old: Option<&HostKv>,
        (kvh, hd, cap): Shape,
        old_cap: usize,
        len: usize,
    ) -> Self {
        let dp = hd.div_ceil(PANEL);
        let mut k = vec![0f32; kvh * hd * cap];
        let mut v = vec![0f32; kvh * dp * cap * PANEL];
        if let Some(old) = old {
            // Whole key panels: the live keys' panels, at the new head stride.
            let panels = len.div_ceil(PANEL) * hd * PANEL;
            for h in 0..kvh {
                let (to, from) = (h * hd * cap, h * hd * old_cap);
                k[to..to + panels].copy_from_slice(&old.k[from..from + panels]);
            }
            for hp in 0..kvh * dp {
                let (to, from) = (hp * cap * PANEL, hp * old_cap * PANEL);
                v[to..to + len * PANEL].copy_from_slice(&old.v[from..from + len * PANEL]);
            }
        }
        Self { k, v }
    }

    /// Write `n` new tokens at position `len`: `ks`, `vs` are `[n, kv_heads, head_dim]`.
    pub(super) fn write(&mut self, (kvh, hd, cap): Shape, len: usize, ks: &[f32], vs: &[f32]) {
        let dp = hd.div_ceil(PANEL);
        let row = kvh * hd;
        for (i, (kr, vr)) in ks
            .chunks_exact(row.max(1))
            .zip(vs.chunks_exact(row.max(1)))
            .enumerate()
        {
            let j = len + i;
            let (p, lane) = (j / PANEL, j % PANEL);
            for h in 0..kvh {
                let panel = h * hd * cap + p * hd * PANEL + lane;
                for (d, &x) in kr[h * hd..(h + 1) * hd].iter().enumerate() {
                    self.k[panel + d * PANEL] = x;
                }
                for (c, run) in vr[h * hd..(h + 1) * hd].chunks(PANEL).enumerate() {
                    let at = ((h * dp + c) * cap + j) * PANEL;
                    self.v[at..at + run.len()].copy_from_slice(run);
                }
            }
        }
    }

    /// Causal grouped-query attention of `q: [Q, heads, head_dim]` against the first `s`
    /// tokens (query `i` sees keys `0 ..= s − Q + i`), giving `[Q, heads · head_dim]`; `None`
    /// when `s` exceeds the capacity or `Q` exceeds `s`.
    pub(super) fn attend(
        &self,
        (kvh, hd, cap): Shape,
        q: &[f32],
        (q_len, heads): (usize, usize),
        s: usize,
        scale: f32,
    ) -> Option<Vec<f32>> {
        if s > cap {
            return None;
        }
        let dp = hd.div_ceil(PANEL);
        attention::causal_panels(
            q,
            (q_len, heads, kvh, hd),
            (&self.k, &self.v),
            (hd * cap, dp * cap * PANEL, cap),
            s,
            scale,
        )
    }

    /// The buffers as the tensor path reads them: keys transposed `[kv_heads, head_dim, cap]`
    /// and values `[cap, kv_heads, head_dim]` (copies).
    pub(super) fn to_tensors(
        &self,
        (kvh, hd, cap): Shape,
        dev: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let dp = hd.div_ceil(PANEL);
        let kt = Tensor::from_slice(&self.k, (kvh, cap / PANEL, hd, PANEL), dev)?
            .permute((0, 2, 1, 3))?
            .contiguous()?
            .reshape((kvh, hd, cap))?;
        let v = Tensor::from_slice(&self.v, (kvh, dp, cap, PANEL), dev)?
            .permute((2, 0, 1, 3))?
            .contiguous()?
            .reshape((cap, kvh, dp * PANEL))?
            .narrow(2, 0, hd)?
            .contiguous()?;
        Ok((kt, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::attention::kernel::causal_transposed;
    use crate::test_values::values;

    #[test]
    fn writes_land_where_the_tensor_layout_and_the_transposed_kernel_expect_them() {
        // 3 heads of 20 dimensions (a partial value panel), 37 tokens written in 3 runs with a
        // growth from 32 to 64 tokens between them; checked against the plain
        // `[token, head, dim]` inputs, independently of the panel code.
        let (kvh, hd) = (3, 20);
        let row = kvh * hd;
        let (ks, vs) = (values(37 * row, 5), values(37 * row, 6));
        let mut kv = HostKv::grown(None, (kvh, hd, 32), 0, 0);
        kv.write((kvh, hd, 32), 0, &ks[..20 * row], &vs[..20 * row]);
        kv = HostKv::grown(Some(&kv), (kvh, hd, 64), 32, 20);
        kv.write(
            (kvh, hd, 64),
            20,
            &ks[20 * row..30 * row],
            &vs[20 * row..30 * row],
        );
        kv.write((kvh, hd, 64), 30, &ks[30 * row..], &vs[30 * row..]);
        let (kt, v) = kv.to_tensors((kvh, hd, 64), &Device::Cpu).unwrap();
        let kt = kt.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let v = v.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for j in 0..37 {
            for h in 0..kvh {
                for d in 0..hd {
                    assert_eq!(kt[(h * hd + d) * 64 + j], ks[j * row + h * hd + d]);
                    assert_eq!(v[j * row + h * hd + d], vs[j * row + h * hd + d]);
                }
            }
        }
        // Attention over the panels equals the transposed kernel over buffers built by hand.
        let mut kt_hand = vec![0f32; row * 64];
        for j in 0..37 {
            for c in 0..row {
                kt_hand[c * 64 + j] = ks[j * row + c];
            }
        }
        let mut v_hand = vs.clone();
        v_hand.resize(64 * row, 0.0);
        let (q_len, heads) = (4, 6);
        let q = values(q_len * heads * hd, 7);
        let got = kv
            .attend((kvh, hd, 64), &q, (q_len, heads), 37, 0.3)
            .unwrap();
        let want =
            causal_transposed(&q, q_len, heads, kvh, hd, (&kt_hand, &v_hand), 64, 37, 0.3).unwrap();
        assert_eq!(got, want);
        assert!(
            kv.attend((kvh, hd, 64), &q, (q_len, heads), 65, 0.3)
                .is_none()
        );
    }
}
