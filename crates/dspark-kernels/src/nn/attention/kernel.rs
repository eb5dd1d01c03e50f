//! Attention on the CPU as two panel products: scores `Q·Kᵀ`, then `P·V`.
//!
//! For one key/value head, every query row that reads it (all query heads of its group, all
//! new tokens) is one row of `Q: [M, hd]`. The keys are packed once per call into
//! [`PackedMatrix`] panels of 16 keys and the values into panels of 16 head dimensions, so
//! both products run the register-tiled kernel of [`crate::nn::packed`]: each key and value is read
//! once for up to 12 query rows, with no horizontal sums (a verification's `K + 1` queries ×
//! the group's heads share one pass over the cache). Rows are processed in chunks so the score
//! matrix stays small for long prefills.

use crate::cpu::exp_with;
use crate::nn::packed::{PANEL, PackedMatrix, PanelElem, PanelView};

/// Score values (rows × keys) per chunk of query rows at most.
const SCORES_PER_CHUNK: usize = 1 << 20;

/// One key/value head's cache, read as `[S, hd]` rows at a stride.
#[derive(Debug, Clone, Copy)]
pub struct HeadView<'a, T: PanelElem = f32> {
    /// Storage holding the rows (`row j` starts at `j · stride`).
    pub data: &'a [T],
    /// Values between consecutive rows.
    pub stride: usize,
    /// Rows (keys).
    pub rows: usize,
}

impl<'a, T: PanelElem> HeadView<'a, T> {
    /// Rows `j` at `data[offset + j · stride ..]`.
    pub fn new(data: &'a [T], offset: usize, stride: usize, rows: usize) -> Self {
        Self {
            data: &data[offset.min(data.len())..],
            stride,
            rows,
        }
    }
}

/// One key/value head as [`attend_head`] reads it, in `f32` or a half type widened as it is
/// read. Values as rows at a stride are read where they lie when their rows fit whole panels
/// (`hd` a multiple of 16, an unpaired element type), else packed.
#[derive(Debug, Clone, Copy)]
pub enum HeadKv<'a, T: PanelElem = f32> {
    /// Keys as rows at a stride, packed per call.
    Rows(HeadView<'a, T>, HeadView<'a, T>),
    /// Keys already in panel layout `K: [S, hd]` (a cache that keeps its keys transposed):
    /// nothing is packed.
    KeyPanels(PanelView<'a, T>, HeadView<'a, T>),
    /// Keys `K: [S, hd]` and values `Vᵀ: [hd, S]` both in panel layout where they lie (a cache
    /// kept in panels): nothing is packed, and every panel is read as one stream.
    Panels(PanelView<'a, T>, PanelView<'a, T>),
}

impl<T: PanelElem> HeadKv<'_, T> {
    /// Keys (and values) the head holds.
    fn keys(&self) -> usize {
        match self {
            Self::Rows(k, _) => k.rows,
            Self::KeyPanels(k, _) | Self::Panels(k, _) => k.rows(),
        }
    }
}

/// `softmax(scale · q·kᵀ) · v` for `m` query rows `q: [m, hd]` against the keys and values of
/// one head; row `i` sees the first `visible(i)` keys (at least one, at most `S`). Returns
/// `[m, hd]`. `kv` must hold `S` keys and values of `hd` values (callers check shapes). Every
/// layout gives the same bits.
pub fn attend_head<T: PanelElem>(
    q: &[f32],
    m: usize,
    hd: usize,
    kv: HeadKv<'_, T>,
    scale: f32,
    visible: impl Fn(usize) -> usize,
) -> Vec<f32> {
    let packed_keys;
    let (k, v) = match kv {
        HeadKv::Panels(k, vt) => return attend_panels(q, m, k, vt, scale, visible),
        HeadKv::Rows(k, v) => {
            packed_keys = PackedMatrix::pack_strided(k.data, k.stride, k.rows, hd);
            (packed_keys.view(), v)
        }
        HeadKv::KeyPanels(k, v) => (k, v),
    };
    let s = k.rows();
    let in_place = if hd.is_multiple_of(PANEL) && T::PAIR == 1 {
        PanelView::new(v.data, hd, s, PANEL, v.stride)
    } else {
        None
    };
    match in_place {
        Some(vt) => attend_panels(q, m, k, vt, scale, visible),
        None => {
            let vt = PackedMatrix::pack_transposed(v.data, v.stride, hd, s);
            attend_panels(q, m, k, vt.view(), scale, visible)
        }
    }
}

/// [`attend_head`] over keys `k: [S, hd]` and values `vt: Vᵀ [hd, S]` in panel layout.
fn attend_panels<T: PanelElem>(
    q: &[f32],
    m: usize,
    k: PanelView<'_, T>,
    vt: PanelView<'_, T>,
    scale: f32,
    visible: impl Fn(usize) -> usize,
) -> Vec<f32> {
    let (s, hd) = (k.rows(), vt.rows());
    let mut out = Vec::with_capacity(m * hd);
    let chunk = (SCORES_PER_CHUNK / s.max(1)).clamp(1, m.max(1));
    let mut i0 = 0;
    while i0 < m {
        let rows = chunk.min(m - i0);
        let qs = &q[i0 * hd..(i0 + rows) * hd];
        let mut scores = k.matmul(qs, rows, None).unwrap_or_default();
        for (r, row) in scores.chunks_exact_mut(s.max(1)).enumerate() {
            softmax_prefix(row, visible(i0 + r).min(s).max(usize::from(s > 0)), scale);
        }
        out.extend(vt.matmul(&scores, rows, None).unwrap_or_default());
        i0 += rows;
    }
    out
}

/// Grouped-query attention of `q: [Q, heads, hd]` (row-major): query head `h` reads key/value
/// head `h / (heads / kv_heads)`, whose cache `kv(head)` gives; query `i` sees the first
/// `visible(i)` keys. Returns `[Q, heads · hd]`. `heads` must be a multiple of `kv_heads`.
///
/// The key/value heads are independent: where their cache is large enough to be worth a split
/// ([`crate::threads::split_reads`]: a long context, or a decode step whose forward runs on the
/// pool), they run as tasks of the pool, each computing its head exactly as alone, so the bits do
/// not depend on the split. A decode step reads its whole cache here, once per layer: at a
/// thousand tokens of context that is a fifth of the memory-bound pair's weight bytes, and one
/// core alone reads at about half the machine's bandwidth.
#[allow(clippy::too_many_arguments)]
pub fn grouped<'a, T: PanelElem>(
    q: &[f32],
    q_len: usize,
    heads: usize,
    kv_heads: usize,
    hd: usize,
    kv: impl Fn(usize) -> HeadKv<'a, T> + Sync,
    scale: f32,
    visible: impl Fn(usize) -> usize + Sync,
) -> Vec<f32> {
    use rayon::prelude::*;

    let groups = heads / kv_heads.max(1);
    // One key/value head: its rows `(g, i)` (query `i` of head `kh·groups + g`), attended.
    let head = |kh: usize| {
        let mut rows = Vec::with_capacity(groups * q_len * hd);
        for g in 0..groups {
            for i in 0..q_len {
                let at = (i * heads + kh * groups + g) * hd;
                rows.extend_from_slice(&q[at..at + hd]);
            }
        }
        attend_head(&rows, groups * q_len, hd, kv(kh), scale, |r| {
            visible(r % q_len)
        })
    };
    // Bytes of keys and values the call reads (every head holds as many keys).
    let keys = if kv_heads > 0 { kv(0).keys() } else { 0 };
    let bytes = (kv_heads * keys * hd * 2).saturating_mul(std::mem::size_of::<T>());
    let outs: Vec<Vec<f32>> = if kv_heads > 1 && crate::threads::split_reads(bytes) {
        (0..kv_heads).into_par_iter().map(head).collect()
    } else {
        (0..kv_heads).map(head).collect()
    };
    let mut out = vec![0f32; q_len * heads * hd];
    for (kh, o) in outs.iter().enumerate() {
        for (r, src) in o.chunks_exact(hd).enumerate() {
            let (g, i) = (r / q_len, r % q_len);
            let at = (i * heads + kh * groups + g) * hd;
            out[at..at + hd].copy_from_slice(src);
        }
    }
    out
}

/// Causal grouped-query attention of `q: [Q, heads, hd]` against a cache that keeps its keys
/// transposed, `kt: [kv_heads, hd, cap]`, and its values token-major, `v: [cap, kv_heads, hd]`,
/// of which the first `s` tokens are live (query `i` sees keys `0 ..= s − Q + i`). The keys are
/// read where they lie as panels of 16 keys. Returns `[Q, heads · hd]`, or `None` when the last
/// key panel does not fit `kt` (`cap` must be a multiple of 16, `s <= cap`).
#[allow(clippy::too_many_arguments)]
pub fn causal_transposed(
    q: &[f32],
    q_len: usize,
    heads: usize,
    kv_heads: usize,
    hd: usize,
    (kt, v): (&[f32], &[f32]),
    cap: usize,
    s: usize,
    scale: f32,
) -> Option<Vec<f32>> {
    let keys = (0..kv_heads)
        .map(|h| PanelView::new(kt.get(h * hd * cap..)?, s, hd, PANEL, cap))
        .collect::<Option<Vec<_>>>()?;
    let kv = |h: usize| HeadKv::KeyPanels(keys[h], HeadView::new(v, h * hd, kv_heads * hd, s));
    let past = s.checked_sub(q_len)?;
    Some(grouped(q, q_len, heads, kv_heads, hd, kv, scale, |i| {
        past + i + 1
    }))
}

/// Causal grouped-query attention of `q: [Q, heads, hd]` against a cache kept in panels: head
/// `h`'s keys at `k[h · k_head ..]` as `[S / 16, hd, 16]` panels of 16 keys and its values at
/// `v[h · v_head ..]` as `[⌈hd / 16⌉, cap, 16]` panels of 16 dimensions, of which the first `s`
/// tokens are live (query `i` sees keys `0 ..= s − Q + i`). Returns `[Q, heads · hd]`, or `None`
/// when a panel does not fit its buffer or `Q > s`. In `f32`, the same bits as
/// [`causal_transposed`] on the same keys and values.
///
/// A paired element type (bf16, [`PanelElem::PAIR`] = 2) stores two columns' lanes
/// interleaved: a key panel holds dimensions `2c, 2c + 1` of its 16 keys side by side (`hd`
/// rounded up to even), a value panel keys `2c, 2c + 1` (`cap` even).
pub fn causal_panels<T: PanelElem>(
    q: &[f32],
    dims: (usize, usize, usize, usize),
    bufs: (&[T], &[T]),
    strides: (usize, usize, usize),
    s: usize,
    scale: f32,
) -> Option<Vec<f32>> {
    let past = s.checked_sub(dims.0)?;
    panels(q, dims, bufs, strides, s, scale, |i| past + i + 1)
}

/// [`causal_panels`] with any visibility: query `i` sees the first `visible(i)` keys (at least
/// one, at most `s`).
pub fn panels<T: PanelElem>(
    q: &[f32],
    (q_len, heads, kv_heads, hd): (usize, usize, usize, usize),
    (k, v): (&[T], &[T]),
    (k_head, v_head, cap): (usize, usize, usize),
    s: usize,
    scale: f32,
    visible: impl Fn(usize) -> usize + Sync,
) -> Option<Vec<f32>> {
    let slot = T::PAIR * PANEL;
    let key_panel = hd.next_multiple_of(T::PAIR) * PANEL;
    let kv = (0..kv_heads)
        .map(|h| {
            let keys = PanelView::new(k.get(h * k_head..)?, s, hd, key_panel, slot)?;
            let values = PanelView::new(v.get(h * v_head..)?, hd, s, cap * PANEL, slot)?;
            Some(HeadKv::Panels(keys, values))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(grouped(
        q,
        q_len,
        heads,
        kv_heads,
        hd,
        |h| kv[h],
        scale,
        visible,
    ))
}

/// `row[..n] = softmax(scale · row[..n])`, `row[n..] = 0`.
fn softmax_prefix(row: &mut [f32], n: usize, scale: f32) {
    let (live, masked) = row.split_at_mut(n);
    masked.fill(0.0);
    let max = live.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x)) * scale;
    exp_shifted(live, scale, max);
    let inv = live.iter().sum::<f32>().recip();
    for x in live.iter_mut() {
        *x *= inv;
    }
}

crate::cpu::multiversion! {
    /// `x = exp(x · scale − max)` in place (vectorized, AVX2+FMA where the CPU has it).
    fn exp_shifted<M>(x: &mut [f32], scale: f32, max: f32) {
        for v in x.iter_mut() {
            *v = exp_with::<M>(*v * scale - max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_values::values;

    #[test]
    fn heads_split_over_the_pool_give_the_bits_of_one_thread() {
        // A cache large enough to split (8 heads × 160 keys × 64 dims, keys and values: 640 KiB),
        // a verification's 5 queries of 4 heads per key/value head, causal.
        let (kvh, heads, hd, s, q_len) = (8, 32, 64, 160, 5);
        let (k, v, q) = (
            values(s * kvh * hd, 11),
            values(s * kvh * hd, 12),
            values(q_len * heads * hd, 13),
        );
        assert!(kvh * s * hd * 2 * 4 >= crate::threads::READS_POOL_MIN_BYTES);
        let (ks, vs) = (&k[..], &v[..]);
        let view = |d, kh: usize| HeadView::new(d, kh * hd, kvh * hd, s);
        let kv = |kh| HeadKv::Rows(view(ks, kh), view(vs, kh));
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| grouped(&q, q_len, heads, kvh, hd, kv, 0.125, |i| s - q_len + i + 1))
        };
        let one = run(1);
        for _ in 0..4 {
            assert_eq!(run(2), one);
        }
        assert!(one.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn matches_a_direct_softmax_with_strided_heads_and_causal_rows() {
        let (s, hd, stride, m) = (37, 24, 72, 5);
        let (k, v, q) = (
            values(s * stride, 1),
            values(s * stride, 2),
            values(m * hd, 3),
        );
        let off = 24; // the second of three heads
        fn kv(d: &[f32], off: usize, stride: usize, rows: usize) -> HeadView<'_> {
            HeadView {
                data: &d[off..],
                stride,
                rows,
            }
        }
        let past = s - m;
        let got = attend_head(
            &q,
            m,
            hd,
            HeadKv::Rows(kv(&k, off, stride, s), kv(&v, off, stride, s)),
            0.3,
            |i| past + i + 1,
        );
        for i in 0..m {
            let n = past + i + 1;
            let sc: Vec<f64> = (0..n)
                .map(|j| {
                    0.3 * (0..hd)
                        .map(|d| f64::from(q[i * hd + d]) * f64::from(k[off + j * stride + d]))
                        .sum::<f64>()
                })
                .collect();
            let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..hd {
                let want: f64 = (0..n)
                    .map(|j| e[j] / z * f64::from(v[off + j * stride + d]))
                    .sum();
                let g = f64::from(got[i * hd + d]);
                assert!((g - want).abs() < 1e-5, "row {i} dim {d}: {g} vs {want}");
            }
        }
    }

    #[test]
    fn long_prefills_are_chunked_without_changing_rows() {
        // Enough rows × keys to need several chunks of scores.
        let (s, hd) = (1100, 16);
        let m = s;
        let (k, v, q) = (values(s * hd, 4), values(s * hd, 5), values(m * hd, 6));
        fn view(data: &[f32]) -> HeadView<'_> {
            HeadView {
                data,
                stride: 16,
                rows: 1100,
            }
        }
        let kv = HeadKv::Rows(view(&k), view(&v));
        let all = attend_head(&q, m, hd, kv, 0.25, |i| i + 1);
        let last = attend_head(&q[(m - 1) * hd..], 1, hd, kv, 0.25, |_| s);
        assert_eq!(&all[(m - 1) * hd..], &last[..]);
        let first = attend_head(&q[..hd], 1, hd, kv, 0.25, |_| 1);
        assert_eq!(&all[..hd], &v[..hd]);
        assert_eq!(first, v[..hd].to_vec());
    }

    #[test]
    fn every_cache_layout_gives_the_same_bits() {
        // Two kv heads of hd = 32 interleaved token-major (values read in place), the same keys
        // transposed per head into a buffer of capacity 48 (keys as panel views), and both
        // packed per call: one result.
        let (s, hd, kvh, cap, m) = (37, 32, 2, 48, 7);
        let stride = kvh * hd;
        let (k, v, q) = (
            values(s * stride, 7),
            values(s * stride, 8),
            values(m * hd, 9),
        );
        let mut kt = vec![f32::NAN; kvh * hd * cap]; // lanes past S must not matter
        for j in 0..s {
            for h in 0..kvh {
                for d in 0..hd {
                    kt[(h * hd + d) * cap + j] = k[j * stride + h * hd + d];
                }
            }
        }
        let past = s - m;
        for h in 0..kvh {
            let rows = HeadKv::Rows(
                HeadView::new(&k, h * hd, stride, s),
                HeadView::new(&v, h * hd, stride, s),
            );
            let kp = PackedMatrix::pack_strided(&k[h * hd..], stride, s, hd);
            let vp = PackedMatrix::pack_transposed(&v[h * hd..], stride, hd, s);
            let want = attend_panels(&q, m, kp.view(), vp.view(), 0.2, |i| past + i + 1);
            let in_place = HeadKv::KeyPanels(
                PanelView::new(&kt[h * hd * cap..], s, hd, PANEL, cap).unwrap(),
                HeadView::new(&v, h * hd, stride, s),
            );
            assert!(want.iter().all(|x| x.is_finite()));
            assert_eq!(attend_head(&q, m, hd, rows, 0.2, |i| past + i + 1), want);
            assert_eq!(
                attend_head(&q, m, hd, in_place, 0.2, |i| past + i + 1),
                want
            );
        }
    }
}
