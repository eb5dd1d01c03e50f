//! [`PanelKv`]: one layer's KV buffers of one request in host memory, laid out as the panel
//! products read them: every panel of keys and of values is one forward stream. The native
//! target's cache and the drafter's context cache keep their keys and values in it, written in
//! place as tokens arrive (a rollback only moves the length back).
//!
//! - **Keys** `[kv_heads, capacity / 16, head_dim, 16]`: head `h`'s panel `p` holds keys
//!   `16p .. 16p + 16`, dimension by dimension (16 keys side by side), so `Q·Kᵀ` reads a panel
//!   as `head_dim · 16` contiguous elements.
//! - **Values** `[kv_heads, ⌈head_dim / 16⌉, capacity, 16]`: head `h`'s panel `p` holds
//!   dimensions `16p .. 16p + 16` of every key, key by key, so `P·V` reads a panel as one
//!   stream of `capacity · 16` elements (lanes past `head_dim` are zeros, their outputs dropped).
//!
//! The elements are `f32`, `f16` or `bf16` ([`WeightDtype`], the cache's `kv_dtype`): a half
//! type halves the bytes a decode step reads at a long context. f16 is widened exactly as it
//! is loaded, so attention over an f16 cache gives the bits of f32 attention over the rounded
//! keys and values. bf16 pairs columns as every bf16 panel does ([`PanelElem::PAIR`]: a key
//! panel interleaves dimensions `2c, 2c + 1`, a value panel keys `2c, 2c + 1`), and its pair
//! rule rounds the queries and the probabilities to bf16 as well.
//!
//! A transposed key buffer (`[kv_heads, head_dim, capacity]`) and token-major values read one
//! 64-byte line per column at a stride of the capacity or of a token's row: at a long context
//! that is most of a decode step's attention time. A write scatters a new token's key and
//! value over the lanes of their panels.

use candle_core::{Device, Tensor};
use half::{bf16, f16};

use crate::error::Result;
use crate::nn::WeightDtype;
use crate::nn::attention::kernel as attention;
use crate::nn::packed::{PANEL, PanelElem};

/// Which keys each query sees in [`PanelKv::attend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visible {
    /// Query `i` of `Q` sees keys `0 ..= s − Q + i` (new tokens after a cached prefix).
    Causal,
    /// Every query sees all `s` keys (a drafter's block against its context and itself).
    All,
}

/// Keys and values of one request and layer in one element type (see the module docs); `cap`
/// is a multiple of 16.
#[derive(Debug, Clone)]
pub struct Buffers<T: PanelElem> {
    k: Vec<T>,
    v: Vec<T>,
}

/// One request's and layer's buffers in the cache's element type.
#[derive(Debug, Clone)]
pub enum PanelKv {
    /// 32-bit floats.
    F32(Buffers<f32>),
    /// IEEE half.
    F16(Buffers<f16>),
    /// bfloat16 (paired panels).
    BF16(Buffers<bf16>),
}

/// The buffers' shape: `(kv_heads, head_dim, capacity)`.
pub type Shape = (usize, usize, usize);

/// `f(buffers)` for whichever element type `kv` holds.
macro_rules! each {
    ($kv:expr, $b:ident => $body:expr) => {
        match $kv {
            PanelKv::F32($b) => $body,
            PanelKv::F16($b) => $body,
            PanelKv::BF16($b) => $body,
        }
    };
}

impl PanelKv {
    /// Zeroed buffers of `cap` tokens in `dtype`, holding the first `len` tokens of `old` (of
    /// `old_cap`, in the same dtype; another dtype's buffers are not copied).
    pub fn grown(
        dtype: WeightDtype,
        old: Option<&PanelKv>,
        shape: Shape,
        old_cap: usize,
        len: usize,
    ) -> Self {
        match (dtype, old) {
            (WeightDtype::F16, Some(PanelKv::F16(o))) => {
                Self::F16(Buffers::grown(Some(o), shape, old_cap, len))
            }
            (WeightDtype::F16, _) => Self::F16(Buffers::grown(None, shape, old_cap, 0)),
            (WeightDtype::BF16, Some(PanelKv::BF16(o))) => {
                Self::BF16(Buffers::grown(Some(o), shape, old_cap, len))
            }
            (WeightDtype::BF16, _) => Self::BF16(Buffers::grown(None, shape, old_cap, 0)),
            (WeightDtype::F32, Some(PanelKv::F32(o))) => {
                Self::F32(Buffers::grown(Some(o), shape, old_cap, len))
            }
            (WeightDtype::F32, _) => Self::F32(Buffers::grown(None, shape, old_cap, 0)),
        }
    }

    /// Write `n` new tokens at position `len`: `ks`, `vs` are `[n, kv_heads, head_dim]` (rounded
    /// to nearest even into a half type).
    pub fn write(&mut self, shape: Shape, len: usize, ks: &[f32], vs: &[f32]) {
        each!(self, b => b.write(shape, len, ks, vs))
    }

    /// Grouped-query attention of `q: [Q, heads, head_dim]` against the first `s` tokens,
    /// causal or not ([`Visible`]), giving `[Q, heads · head_dim]`; `None` when `s` exceeds the
    /// capacity or `Q` exceeds `s`.
    pub fn attend(
        &self,
        shape: Shape,
        q: &[f32],
        q_heads: (usize, usize),
        keys: (usize, Visible),
        scale: f32,
    ) -> Option<Vec<f32>> {
        each!(self, b => b.attend(shape, q, q_heads, keys, scale))
    }

    /// The buffers as the tensor path reads them, widened to f32: keys transposed `[kv_heads,
    /// head_dim, cap]` and values `[cap, kv_heads, head_dim]`.
    pub fn to_tensors(&self, shape: Shape, dev: &Device) -> Result<(Tensor, Tensor)> {
        each!(self, b => b.to_tensors(shape, dev))
    }
}

impl<T: PanelElem> Buffers<T> {
    /// Elements of one key panel (16 keys × `hd` rounded up to a pair).
    fn key_panel(hd: usize) -> usize {
        hd.next_multiple_of(T::PAIR) * PANEL
    }

    /// Where dimension `d` of the key in lane `lane` sits within its panel.
    fn key_at(d: usize, lane: usize) -> usize {
        (d / T::PAIR) * T::PAIR * PANEL + T::PAIR * lane + d % T::PAIR
    }

    /// Where key `j`'s lane `lane` sits within a value panel.
    fn value_at(j: usize, lane: usize) -> usize {
        (j / T::PAIR) * T::PAIR * PANEL + T::PAIR * lane + j % T::PAIR
    }

    fn grown(old: Option<&Self>, (kvh, hd, cap): Shape, old_cap: usize, len: usize) -> Self {
        let (dp, kp) = (hd.div_ceil(PANEL), Self::key_panel(hd));
        let mut k = vec![T::default(); kvh * (cap / PANEL) * kp];
        let mut v = vec![T::default(); kvh * dp * cap * PANEL];
        if let Some(old) = old {
            // Whole key panels: the live keys' panels, at the new head stride.
            let panels = len.div_ceil(PANEL) * kp;
            for h in 0..kvh {
                let (to, from) = (h * (cap / PANEL) * kp, h * (old_cap / PANEL) * kp);
                k[to..to + panels].copy_from_slice(&old.k[from..from + panels]);
            }
            // The live keys' columns (a pair's partner with them).
            let cols = len.next_multiple_of(T::PAIR).min(old_cap) * PANEL;
            for hp in 0..kvh * dp {
                let (to, from) = (hp * cap * PANEL, hp * old_cap * PANEL);
                v[to..to + cols].copy_from_slice(&old.v[from..from + cols]);
            }
        }
        Self { k, v }
    }

    fn write(&mut self, (kvh, hd, cap): Shape, len: usize, ks: &[f32], vs: &[f32]) {
        let (dp, kp) = (hd.div_ceil(PANEL), Self::key_panel(hd));
        let row = kvh * hd;
        for (i, (kr, vr)) in ks
            .chunks_exact(row.max(1))
            .zip(vs.chunks_exact(row.max(1)))
            .enumerate()
        {
            let j = len + i;
            let (p, lane) = (j / PANEL, j % PANEL);
            for h in 0..kvh {
                let panel = (h * (cap / PANEL) + p) * kp;
                for (d, &x) in kr[h * hd..(h + 1) * hd].iter().enumerate() {
                    self.k[panel + Self::key_at(d, lane)] = T::from_f32(x);
                }
                for (d, &x) in vr[h * hd..(h + 1) * hd].iter().enumerate() {
                    let (c, lane) = (d / PANEL, d % PANEL);
                    self.v[(h * dp + c) * cap * PANEL + Self::value_at(j, lane)] = T::from_f32(x);
                }
            }
        }
    }

    fn attend(
        &self,
        (kvh, hd, cap): Shape,
        q: &[f32],
        (q_len, heads): (usize, usize),
        (s, visible): (usize, Visible),
        scale: f32,
    ) -> Option<Vec<f32>> {
        if s > cap {
            return None;
        }
        let past = s.checked_sub(q_len)?;
        let dp = hd.div_ceil(PANEL);
        attention::panels(
            q,
            (q_len, heads, kvh, hd),
            (&self.k, &self.v),
            ((cap / PANEL) * Self::key_panel(hd), dp * cap * PANEL, cap),
            s,
            scale,
            |i| match visible {
                Visible::Causal => past + i + 1,
                Visible::All => s,
            },
        )
    }

    fn to_tensors(&self, (kvh, hd, cap): Shape, dev: &Device) -> Result<(Tensor, Tensor)> {
        let (dp, kp) = (hd.div_ceil(PANEL), Self::key_panel(hd));
        let mut kt = vec![0f32; kvh * hd * cap];
        let mut v = vec![0f32; cap * kvh * hd];
        for h in 0..kvh {
            for j in 0..cap {
                let (p, lane) = (j / PANEL, j % PANEL);
                for d in 0..hd {
                    let key = self.k[(h * (cap / PANEL) + p) * kp + Self::key_at(d, lane)];
                    kt[(h * hd + d) * cap + j] = key.to_f32();
                    let (c, vl) = (d / PANEL, d % PANEL);
                    let val = self.v[(h * dp + c) * cap * PANEL + Self::value_at(j, vl)];
                    v[(j * kvh + h) * hd + d] = val.to_f32();
                }
            }
        }
        Ok((
            Tensor::from_vec(kt, (kvh, hd, cap), dev)?,
            Tensor::from_vec(v, (cap, kvh, hd), dev)?,
        ))
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
        // growth from 32 to 64 tokens between them (an odd length: a bf16 value pair split),
        // in every element type; checked against the plain `[token, head, dim]` inputs rounded
        // to the type, independently of the panel code.
        let (kvh, hd) = (3, 20);
        let row = kvh * hd;
        let (ks, vs) = (values(37 * row, 5), values(37 * row, 6));
        for dtype in WeightDtype::ALL {
            let round = |x: &[f32]| -> Vec<f32> {
                x.iter()
                    .map(|&v| match dtype {
                        WeightDtype::F32 => v,
                        WeightDtype::F16 => f16::from_f32(v).to_f32(),
                        WeightDtype::BF16 => bf16::from_f32(v).to_f32(),
                    })
                    .collect()
            };
            let (kr, vr) = (round(&ks), round(&vs));
            let mut kv = PanelKv::grown(dtype, None, (kvh, hd, 32), 0, 0);
            kv.write((kvh, hd, 32), 0, &ks[..21 * row], &vs[..21 * row]);
            kv = PanelKv::grown(dtype, Some(&kv), (kvh, hd, 64), 32, 21);
            kv.write(
                (kvh, hd, 64),
                21,
                &ks[21 * row..30 * row],
                &vs[21 * row..30 * row],
            );
            kv.write((kvh, hd, 64), 30, &ks[30 * row..], &vs[30 * row..]);
            let (kt, v) = kv.to_tensors((kvh, hd, 64), &Device::Cpu).unwrap();
            let kt = kt.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let v = v.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for j in 0..37 {
                for h in 0..kvh {
                    for d in 0..hd {
                        assert_eq!(kt[(h * hd + d) * 64 + j], kr[j * row + h * hd + d]);
                        assert_eq!(v[j * row + h * hd + d], vr[j * row + h * hd + d]);
                    }
                }
            }
            // Attention over the panels against the f32 transposed kernel over the rounded
            // values, built by hand: the same bits where the element type is unpaired; bf16's
            // pair rule rounds the queries and the probabilities to bf16 too.
            let mut kt_hand = vec![0f32; row * 64];
            for j in 0..37 {
                for c in 0..row {
                    kt_hand[c * 64 + j] = kr[j * row + c];
                }
            }
            let mut v_hand = vr.clone();
            v_hand.resize(64 * row, 0.0);
            let (q_len, heads) = (4, 6);
            let q = values(q_len * heads * hd, 7);
            let got = kv
                .attend(
                    (kvh, hd, 64),
                    &q,
                    (q_len, heads),
                    (37, Visible::Causal),
                    0.3,
                )
                .unwrap();
            let want =
                causal_transposed(&q, q_len, heads, kvh, hd, (&kt_hand, &v_hand), 64, 37, 0.3)
                    .unwrap();
            if dtype == WeightDtype::BF16 {
                let d = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(d > 0.0 && d < 2e-3, "{dtype}: {d}");
            } else {
                assert_eq!(got, want, "{dtype}");
            }
            assert!(
                kv.attend(
                    (kvh, hd, 64),
                    &q,
                    (q_len, heads),
                    (65, Visible::Causal),
                    0.3
                )
                .is_none()
            );
        }
    }
}
