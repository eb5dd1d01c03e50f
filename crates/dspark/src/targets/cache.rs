//! The rollback KV cache of the native target.
//!
//! Per request and layer, keys (normed and rotated at their positions) and values live in one
//! token-major buffer `[capacity, kv_heads, head_dim]` each. A forward writes its new rows in
//! place after the held ones (the buffer doubles when full, so appending costs the new rows,
//! not the whole context); [`Qwen3Cache::truncate`] only moves the length back. Writes are in
//! place, so the cache is not `Clone`: [`Qwen3Cache::try_clone`] copies its buffers.

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// Smallest buffer allocated, in tokens.
const MIN_CAPACITY: usize = 64;

/// One layer's buffers of one request: `[capacity, kv_heads, head_dim]` each.
#[derive(Debug)]
struct Kv {
    k: Tensor,
    v: Tensor,
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
    device: Device,
}

impl Qwen3Cache {
    /// An empty cache for `batch` requests of a model with this attention shape.
    pub(crate) fn new(
        batch: usize,
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        device: &Device,
    ) -> Self {
        Self {
            lengths: vec![0; batch],
            capacity: vec![0; batch],
            rows: (0..batch).map(|_| Vec::new()).collect(),
            num_layers,
            kv_heads,
            head_dim,
            device: device.clone(),
        }
    }

    /// A deep copy (buffers are written in place, so a copy must not share them).
    pub fn try_clone(&self) -> Result<Self> {
        let mut rows = Vec::with_capacity(self.rows.len());
        for layers in &self.rows {
            let mut copied = Vec::with_capacity(layers.len());
            for kv in layers {
                copied.push(Kv {
                    k: kv.k.copy()?,
                    v: kv.v.copy()?,
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
            device: self.device.clone(),
        })
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
        let new_cap = needed.max(cap.saturating_mul(2)).max(MIN_CAPACITY);
        let (kvh, hd) = (self.kv_heads, self.head_dim);
        crate::limits::output_elements("kv cache", &[new_cap as u64, kvh as u64, hd as u64])?;
        let len = self.lengths[b];
        let mut layers = Vec::with_capacity(self.num_layers);
        for li in 0..self.num_layers {
            let k = Tensor::zeros((new_cap, kvh, hd), DType::F32, &self.device)?;
            let v = Tensor::zeros((new_cap, kvh, hd), DType::F32, &self.device)?;
            if let Some(old) = self.rows[b].get(li)
                && len > 0
            {
                k.slice_set(&old.k.narrow(0, 0, len)?, 0, 0)?;
                v.slice_set(&old.v.narrow(0, 0, len)?, 0, 0)?;
            }
            layers.push(Kv { k, v });
        }
        self.rows[b] = layers;
        self.capacity[b] = new_cap;
        Ok(())
    }

    /// Write `k`, `v` (`[n, kv_heads, head_dim]`, contiguous) of request `b`'s new tokens into
    /// layer `layer` after its held rows, and return the keys and values of everything the
    /// request then sees (`[len + n, kv_heads, head_dim]`). Needs [`Qwen3Cache::reserve`] first;
    /// the length moves only with [`Qwen3Cache::advance`].
    pub(crate) fn write(
        &self,
        b: usize,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let kv = self.rows[b]
            .get(layer)
            .ok_or_else(|| Error::invalid("cache", format!("request {b} has no buffers")))?;
        let len = self.lengths[b];
        let n = k.dims().first().copied().unwrap_or(0);
        kv.k.slice_set(k, 0, len)?;
        kv.v.slice_set(v, 0, len)?;
        Ok((kv.k.narrow(0, 0, len + n)?, kv.v.narrow(0, 0, len + n)?))
    }

    /// Request `b` now holds `n` more tokens (written by [`Qwen3Cache::write`] in every layer).
    pub(crate) fn advance(&mut self, b: usize, n: usize) {
        self.lengths[b] += n;
    }
}
