//! The rollback KV cache of the native target.
//!
//! Per request and layer, keys (normed and rotated at their positions) and values live in
//! buffers of a capacity that is a multiple of 16. On the CPU (fast kernel path, see
//! [`crate::device::fast_on`]) the buffers are plain host memory in panel layout (`nn::attention::PanelKv`:
//! keys as panels of 16 keys, values as panels of 16 dimensions, each panel one forward stream)
//! and `Qwen3Cache::attend_host` writes a forward's new rows and runs every request's
//! attention in one pass, reading keys and values where they lie (no per-step packing, no
//! tensor op per request), so a step's cost follows its token count. On other devices they are
//! tensors, keys transposed `[kv_heads, head_dim, capacity]` and values `[capacity, kv_heads,
//! head_dim]`, and `Qwen3Cache::write` hands them to [`crate::nn::causal_gqa_attention_kt`].
//! A forward writes its new rows in place after the held ones (the buffer doubles when full, so
//! appending costs the new rows, not the whole context); [`Qwen3Cache::truncate`] only moves
//! the length back. Writes are in place, so the cache is not `Clone`:
//! [`Qwen3Cache::try_clone`] copies its buffers.

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::nn::WeightDtype;
use crate::nn::attention::{PanelKv, Visible};
use crate::nn::fused::with_f32;
use crate::nn::packed::PANEL;

/// Smallest buffer allocated, in tokens.
const MIN_CAPACITY: usize = 64;

/// One layer's buffers of one request.
#[derive(Debug)]
enum Kv {
    /// On the CPU: host memory in panel layout, written and read in place.
    Host(PanelKv),
    /// Elsewhere: device tensors.
    Device { kt: Tensor, v: Tensor },
}

/// The buffers a forward's attention reads for one request and layer (see
/// [`Qwen3Cache::write`]).
#[derive(Debug)]
pub(crate) struct LiveKv {
    /// Keys, transposed: `[kv_heads, head_dim, capacity]`.
    pub(crate) kt: Tensor,
    /// Values: `[capacity, kv_heads, head_dim]`.
    pub(crate) v: Tensor,
    /// Tokens live in them (held plus the ones just written).
    pub(crate) len: usize,
}

/// The KV cache of a batch of requests for a [`super::Qwen3Target`]
/// (see [`crate::speculator::TargetModel::new_cache`]).
#[derive(Debug)]
pub struct Qwen3Cache {
    /// Tokens held per request.
    lengths: Vec<usize>,
    /// Buffer capacity per request (0 until the first forward).
    capacity: Vec<usize>,
    /// Per request, per layer (empty until the first forward).
    rows: Vec<Vec<Kv>>,
    num_layers: usize,
    kv_heads: usize,
    head_dim: usize,
    /// The element type keys and values are kept in (rounded to it as they are written).
    kv_dtype: WeightDtype,
    device: Device,
}

impl Qwen3Cache {
    /// An empty cache for `batch` requests of a model with this attention shape.
    pub(crate) fn new(
        batch: usize,
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        kv_dtype: WeightDtype,
        device: &Device,
    ) -> Self {
        Self {
            lengths: vec![0; batch],
            capacity: vec![0; batch],
            rows: (0..batch).map(|_| Vec::new()).collect(),
            num_layers,
            kv_heads,
            head_dim,
            kv_dtype,
            device: device.clone(),
        }
    }

    /// A deep copy (buffers are written in place, so a copy must not share them).
    pub fn try_clone(&self) -> Result<Self> {
        let mut rows = Vec::with_capacity(self.rows.len());
        for layers in &self.rows {
            let mut copied = Vec::with_capacity(layers.len());
            for kv in layers {
                copied.push(match kv {
                    Kv::Host(kv) => Kv::Host(kv.clone()),
                    Kv::Device { kt, v } => Kv::Device {
                        kt: kt.copy()?,
                        v: v.copy()?,
                    },
                });
            }
            rows.push(copied);
        }
        Ok(Self {
            lengths: self.lengths.clone(),
            capacity: self.capacity.clone(),
            rows,
            num_layers: self.num_layers,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            kv_dtype: self.kv_dtype,
            device: self.device.clone(),
        })
    }

    /// Append `n` empty rows (requests joining the batch; nothing is allocated until their
    /// first forward). Errors: `too-large` past [`crate::limits::MAX_BATCH`] rows.
    pub fn grow(&mut self, n: usize) -> Result<()> {
        let rows = self.lengths.len() as u64 + n as u64;
        crate::limits::at_most("batch", rows, crate::limits::MAX_BATCH)?;
        self.lengths.extend(std::iter::repeat_n(0, n));
        self.capacity.extend(std::iter::repeat_n(0, n));
        self.rows.extend((0..n).map(|_| Vec::new()));
        Ok(())
    }

    /// Keep the rows `b` with `keep[b]`, in order; the others' buffers are freed
    /// (`bad-shape` when `keep` does not have one entry per row).
    pub fn retain(&mut self, keep: &[bool]) -> Result<()> {
        if keep.len() != self.lengths.len() {
            return Err(Error::bad_shape(
                "keep",
                format!("{} values for {} rows", keep.len(), self.lengths.len()),
            ));
        }
        let mut it = keep.iter();
        self.lengths.retain(|_| it.next().copied().unwrap_or(false));
        let mut it = keep.iter();
        self.capacity
            .retain(|_| it.next().copied().unwrap_or(false));
        let mut it = keep.iter();
        self.rows.retain(|_| it.next().copied().unwrap_or(false));
        Ok(())
    }

    /// Number of requests.
    pub fn batch(&self) -> usize {
        self.lengths.len()
    }

    /// Tokens held per request.
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// Keep the first `lengths[b]` tokens of request `b` (`invalid-argument` when a request
    /// holds fewer, or the batch differs). Buffers keep their capacity.
    pub fn truncate(&mut self, lengths: &[usize]) -> Result<()> {
        if lengths.len() != self.lengths.len() {
            return Err(Error::bad_shape(
                "lengths",
                format!(
                    "{} lengths for a cache of {} requests",
                    lengths.len(),
                    self.lengths.len()
                ),
            ));
        }
        if let Some((b, (&want, &held))) = lengths
            .iter()
            .zip(&self.lengths)
            .enumerate()
            .find(|(_, (w, h))| w > h)
        {
            return Err(Error::invalid(
                "lengths",
                format!("request {b} holds {held} tokens, cannot truncate it to {want}"),
            ));
        }
        self.lengths.copy_from_slice(lengths);
        Ok(())
    }

    /// Whether this cache fits a model with this shape on `device`.
    pub(crate) fn fits(
        &self,
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        device: &Device,
    ) -> bool {
        (self.num_layers, self.kv_heads, self.head_dim) == (num_layers, kv_heads, head_dim)
            && self.device.same_device(device)
    }

    /// Make room for request `b` to hold `needed` tokens (allocates or doubles its buffers,
    /// copying the held rows). Bounded by [`crate::limits::MAX_OUTPUT_ELEMENTS`] per buffer.
    pub(crate) fn reserve(&mut self, b: usize, needed: usize) -> Result<()> {
        let cap = self.capacity[b];
        if needed <= cap {
            return Ok(());
        }
        let new_cap = needed
            .max(cap.saturating_mul(2))
            .max(MIN_CAPACITY)
            .checked_next_multiple_of(PANEL)
            .ok_or_else(|| Error::too_large("kv cache", needed, usize::MAX as u64, ""))?;
        let (kvh, hd) = (self.kv_heads, self.head_dim);
        crate::limits::output_elements("kv cache", &[new_cap as u64, kvh as u64, hd as u64])?;
        let len = self.lengths[b];
        let mut layers = Vec::with_capacity(self.num_layers);
        for li in 0..self.num_layers {
            let old = self.rows[b].get(li).filter(|_| len > 0);
            layers.push(if crate::device::fast_on(&self.device) {
                let old = match old {
                    Some(Kv::Host(kv)) => Some(kv),
                    _ => None,
                };
                Kv::Host(PanelKv::grown(
                    self.kv_dtype,
                    old,
                    (kvh, hd, new_cap),
                    cap,
                    len,
                ))
            } else {
                let kt = Tensor::zeros((kvh, hd, new_cap), DType::F32, &self.device)?;
                let v = Tensor::zeros((new_cap, kvh, hd), DType::F32, &self.device)?;
                if let Some(Kv::Device { kt: okt, v: ov }) = old {
                    kt.slice_set(&okt.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
                    v.slice_set(&ov.narrow(0, 0, len)?, 0, 0)?;
                }
                Kv::Device { kt, v }
            });
        }
        self.rows[b] = layers;
        self.capacity[b] = new_cap;
        Ok(())
    }

    /// Write `k`, `v` (`[n, kv_heads, head_dim]`) of request `b`'s new tokens into layer
    /// `layer` after its held rows, and return the buffers with everything the request then
    /// sees (`len + n` tokens), as tensors (a CPU cache copies its buffers into tensors: the
    /// forward uses [`Qwen3Cache::attend_host`] there instead). Needs [`Qwen3Cache::reserve`]
    /// first; the length moves only with [`Qwen3Cache::advance`].
    pub(crate) fn write(
        &mut self,
        b: usize,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<LiveKv> {
        let (len, cap) = (self.lengths[b], self.capacity[b]);
        let (kvh, hd) = (self.kv_heads, self.head_dim);
        let n = k.dims().first().copied().unwrap_or(0);
        let kv = self.rows[b]
            .get_mut(layer)
            .ok_or_else(|| Error::invalid("cache", format!("request {b} has no buffers")))?;
        match kv {
            Kv::Device { kt, v: vb } => {
                let (k, v) = (self.kv_dtype.round(k)?, self.kv_dtype.round(v)?);
                kt.slice_set(&k.permute((1, 2, 0))?.contiguous()?, 2, len)?;
                vb.slice_set(&v.contiguous()?, 0, len)?;
                Ok(LiveKv {
                    kt: kt.clone(),
                    v: vb.clone(),
                    len: len + n,
                })
            }
            Kv::Host(kv) => {
                let ks = k.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let vs = v.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                kv.write((kvh, hd, cap), len, &ks, &vs);
                let (kt, v) = kv.to_tensors((kvh, hd, cap), k.device())?;
                Ok(LiveKv {
                    kt,
                    v,
                    len: len + n,
                })
            }
        }
    }

    /// On a CPU cache: write every request's new keys and values (`k`, `v`: `[N, kv_heads,
    /// head_dim]`, request `b`'s `m` rows at `rows[b] = (offset, m)`) into layer `layer` and
    /// run causal grouped-query attention of `q: [N, heads, head_dim]` against each request's
    /// cache in one pass, giving `[N, heads · head_dim]`. `None` when the cache is not on the
    /// CPU or an input is not a contiguous f32 CPU tensor (the caller then goes through
    /// [`Qwen3Cache::write`]). Needs [`Qwen3Cache::reserve`] first.
    pub(crate) fn attend_host(
        &mut self,
        layer: usize,
        rows: &[(usize, usize)],
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        scale: f64,
    ) -> Option<Result<Tensor>> {
        let (kvh, hd) = (self.kv_heads, self.head_dim);
        let &[n, heads, qhd] = q.dims() else {
            return None;
        };
        let ok = rows.len() == self.lengths.len()
            && qhd == hd
            && kvh > 0
            && heads.is_multiple_of(kvh)
            && k.dims() == [n, kvh, hd]
            && v.dims() == [n, kvh, hd];
        if !ok {
            return None;
        }
        let out = with_f32(q, |qs| {
            with_f32(k, |ks| {
                with_f32(v, |vs| {
                    self.attend_rows(layer, rows, heads, qs, ks, vs, scale as f32)
                })
            })
        })????;
        Some(Tensor::from_vec(out, (n, heads * hd), q.device()).map_err(Into::into))
    }

    /// [`Qwen3Cache::attend_host`] on host slices; `None` when a buffer is not host memory.
    ///
    /// The requests are independent: where their caches together are worth a split
    /// ([`crate::threads::split_reads`]), they run as tasks of the pool (each request's heads may
    /// split again inside), each computing exactly what it computes alone.
    #[allow(clippy::too_many_arguments)]
    fn attend_rows(
        &mut self,
        layer: usize,
        rows: &[(usize, usize)],
        heads: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        scale: f32,
    ) -> Option<Vec<f32>> {
        use rayon::prelude::*;

        let (kvh, hd, elem) = (self.kv_heads, self.head_dim, self.kv_dtype.size());
        let (row_q, row_kv) = (heads * hd, kvh * hd);
        let n = q.len() / row_q.max(1);
        // The live requests: (offset, new rows, held rows, capacity, layers).
        let jobs: Vec<(usize, usize, usize, usize, &mut Vec<Kv>)> = rows
            .iter()
            .zip(&self.lengths)
            .zip(&self.capacity)
            .zip(self.rows.iter_mut())
            .map(|(((&(off, m), &len), &cap), layers)| (off, m, len, cap, layers))
            .filter(|job| job.1 > 0)
            .collect();
        // One request: write its new rows after its held ones, then attend over all of them.
        let one = |(off, m, len, cap, layers): (usize, usize, usize, usize, &mut Vec<Kv>)| {
            let Some(Kv::Host(kv)) = layers.get_mut(layer) else {
                return None;
            };
            let (ks, vs) = (
                &k[off * row_kv..(off + m) * row_kv],
                &v[off * row_kv..(off + m) * row_kv],
            );
            kv.write((kvh, hd, cap), len, ks, vs);
            let qs = &q[off * row_q..(off + m) * row_q];
            let o = kv.attend(
                (kvh, hd, cap),
                qs,
                (m, heads),
                (len + m, Visible::Causal),
                scale,
            )?;
            Some((off, o))
        };
        // Bytes of keys and values read: every live request's cache, new rows included.
        let bytes: usize = jobs
            .iter()
            .map(|&(_, m, len, ..)| (len + m) * row_kv * 2 * elem)
            .sum();
        let outs: Vec<(usize, Vec<f32>)> = if jobs.len() > 1 && crate::threads::split_reads(bytes) {
            jobs.into_par_iter().map(one).collect::<Option<_>>()?
        } else {
            jobs.into_iter().map(one).collect::<Option<_>>()?
        };
        let mut out = vec![0f32; n * row_q];
        for (off, o) in outs {
            out[off * row_q..off * row_q + o.len()].copy_from_slice(&o);
        }
        Some(out)
    }

    /// Request `b` now holds `n` more tokens (written by [`Qwen3Cache::write`] in every layer).
    pub(crate) fn advance(&mut self, b: usize, n: usize) {
        self.lengths[b] += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::causal_gqa_attention_kt;

    use crate::test_values::values;

    #[test]
    fn the_host_pass_equals_the_tensor_path_across_growth_and_rollback() {
        // Two requests, 2 kv heads of 16, 4 query heads: steps of ragged sizes (one request
        // idle in one step) that grow the buffers past 64 and 128 tokens, a rollback, then
        // more; every step through `attend_host` on one cache and `write` + the tensor
        // attention on a twin.
        let (kvh, hd, heads) = (2, 16, 4);
        let cpu = Device::Cpu;
        if !crate::device::fast_on(&cpu) {
            // DSPARK_KERNEL_PATH=tensor: the cache keeps tensors, there is no host pass.
            return;
        }
        // f16 gives the bits of f32 over the rounded values (bf16: `PanelKv`'s tests).
        for dtype in [WeightDtype::F32, WeightDtype::F16] {
            host_pass_equals_tensor_path(dtype, (kvh, hd, heads));
        }
    }

    fn host_pass_equals_tensor_path(dtype: WeightDtype, (kvh, hd, heads): (usize, usize, usize)) {
        let cpu = Device::Cpu;
        let mut fast = Qwen3Cache::new(2, 1, kvh, hd, dtype, &cpu);
        let mut slow = Qwen3Cache::new(2, 1, kvh, hd, dtype, &cpu);
        let steps: [[usize; 2]; 6] = [[70, 3], [9, 0], [1, 60], [0, 9], [50, 1], [9, 9]];
        for (t, sizes) in steps.iter().enumerate() {
            if t == 4 {
                fast.truncate(&[40, 50]).unwrap();
                slow.truncate(&[40, 50]).unwrap();
            }
            let n: usize = sizes.iter().sum();
            let mut rows = Vec::new();
            let mut off = 0;
            for (b, &m) in sizes.iter().enumerate() {
                rows.push((off, m));
                off += m;
                for c in [&mut fast, &mut slow] {
                    c.reserve(b, c.lengths()[b] + m).unwrap();
                }
            }
            let seed = t as u32 * 3;
            let q = Tensor::from_vec(values(n * heads * hd, seed), (n, heads, hd), &cpu).unwrap();
            let k = Tensor::from_vec(values(n * kvh * hd, seed + 1), (n, kvh, hd), &cpu).unwrap();
            let v = Tensor::from_vec(values(n * kvh * hd, seed + 2), (n, kvh, hd), &cpu).unwrap();
            let got = fast
                .attend_host(0, &rows, (&q, &k, &v), 0.25)
                .unwrap()
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let mut want = Vec::new();
            for (b, &(off, m)) in rows.iter().enumerate() {
                if m == 0 {
                    continue;
                }
                let live = slow
                    .write(
                        b,
                        0,
                        &k.narrow(0, off, m).unwrap(),
                        &v.narrow(0, off, m).unwrap(),
                    )
                    .unwrap();
                let q = q.narrow(0, off, m).unwrap();
                let o = causal_gqa_attention_kt(&q, &live.kt, &live.v, live.len, 0.25).unwrap();
                want.extend(o.flatten_all().unwrap().to_vec1::<f32>().unwrap());
            }
            assert_eq!(got, want, "step {t}");
            for (b, &(_, m)) in rows.iter().enumerate() {
                fast.advance(b, m);
                slow.advance(b, m);
            }
            assert!(fast.capacity.iter().all(|c| c % PANEL == 0));
        }
        assert_eq!(fast.lengths(), &[99, 60]);
        assert!(fast.capacity[0] >= 128);
    }

    #[test]
    fn requests_split_over_the_pool_give_the_bits_of_one_thread() {
        // Four requests with caches large enough to split (4 heads of 32, ~300 tokens each:
        // over 1 MiB of keys and values), one of them idle; the same steps on twin caches in a
        // 1-thread and a 2-thread pool.
        let (kvh, hd, heads) = (4, 32, 8);
        let cpu = Device::Cpu;
        if !crate::device::fast_on(&cpu) {
            return;
        }
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut cache = Qwen3Cache::new(4, 1, kvh, hd, WeightDtype::F32, &cpu);
                let mut outs = Vec::new();
                for (t, sizes) in [[300, 280, 0, 310], [1, 9, 5, 1]].iter().enumerate() {
                    let n: usize = sizes.iter().sum();
                    let (mut rows, mut off) = (Vec::new(), 0);
                    for (b, &m) in sizes.iter().enumerate() {
                        rows.push((off, m));
                        off += m;
                        cache.reserve(b, cache.lengths()[b] + m).unwrap();
                    }
                    let seed = 40 + t as u32 * 3;
                    let t3 = |len: usize, s: u32, w: usize| {
                        Tensor::from_vec(values(len * w * hd, s), (len, w, hd), &cpu).unwrap()
                    };
                    let (q, k, v) = (
                        t3(n, seed, heads),
                        t3(n, seed + 1, kvh),
                        t3(n, seed + 2, kvh),
                    );
                    let o = cache
                        .attend_host(0, &rows, (&q, &k, &v), 0.2)
                        .unwrap()
                        .unwrap();
                    outs.push(o.flatten_all().unwrap().to_vec1::<f32>().unwrap());
                    for (b, &m) in sizes.iter().enumerate() {
                        cache.advance(b, m);
                    }
                }
                outs
            })
        };
        let one = run(1);
        assert!(one.iter().flatten().all(|x| x.is_finite()));
        for _ in 0..3 {
            assert_eq!(run(2), one);
        }
    }
}
