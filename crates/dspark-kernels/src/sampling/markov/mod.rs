//! The sequential Markov block sampler.
//!
//! Slot `k`: `logits = scale·(base_k + W2·W1[x_{k-1}])` in draft space (`x_0` = anchor, `W1`
//! indexed by the previous token's TARGET id), padded columns `[V_t, V_d)` masked, then greedy
//! argmax (`T = 0`, ties → lowest id) or one inverse-CDF draw at temperature `T`; the draft id is
//! mapped to a target id and the next slot conditions on it. The exact distribution of each slot
//! is recorded in target space.
//!
//! Cost: per slot, `W2` is read once for the whole batch (a `[V_d, r] × [r, B]` product split over
//! column blocks across threads, see `cpu/dots.rs`); each column block is biased straight into its
//! destination and its statistics (max, argmax, sum-exp) are taken while it is hot, so a
//! sampled row is only touched again in the one block the draw lands in.
//!
//! `options.rs` holds the options, the outcome and the validation every path shares;
//! `mod.rs` the entry points;
//! `cpu.rs` is the host slice sampler (the reference), `device.rs` the device-generic tensor
//! sampler, `bias_op.rs` the Markov bias as a candle custom op (CPU and CUDA bodies).

mod bias_op;
mod cpu;
mod device;
pub(crate) mod options;

pub use bias_op::{MarkovBias, markov_bias};
pub use device::DeviceBlock;
pub use options::{BlockOptions, DraftBlock};
pub(crate) use options::{Geometry, HostInputs, Inputs, TensorInputs, validate_dims};

use candle_core::{Device, Tensor};

use super::args::{dims, ids};
use super::transfer::{self, check_float};
use crate::device::{KernelPath, kernel_path, same_device, use_fused, use_tensor_path};
use crate::error::{Error, Result};
use crate::view::{Floats, Mat, Rows3, with_floats};

/// Draw a block of `K` tokens per request.
///
/// `base` is `[B, K, V_d]`, `w1` is `[V_in, r]` (rows indexed by target id), `w2` is `[V_d, r]`,
/// `anchors` holds `B` target ids `< V_in`.
pub fn sample_block_slices(
    base: Rows3<'_>,
    w1: Mat<'_>,
    w2: Mat<'_>,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<DraftBlock> {
    on_kernel_path(&Inputs::new(base, w1, w2, anchors, opts))
}

/// [`sample_block_slices`] on the path [`crate::device::KERNEL_PATH_ENV`] names.
fn on_kernel_path(x: &HostInputs<'_>) -> Result<DraftBlock> {
    match kernel_path()? {
        KernelPath::Fast => on(None, x),
        KernelPath::Tensor => on(Some(&Device::Cpu), x),
        KernelPath::Fused => fused(x),
    }
}

/// [`sample_block_slices`] by the model of the fused kernels ([`crate::sampling::fused`]),
/// whatever [`crate::device::KERNEL_PATH_ENV`] says: the same validation and errors, the same
/// greedy drafts but where float rounding of the bias moves an argmax, sampled drafts equal
/// for the same seeds but where summation order moves a boundary. Shapes beyond the fused
/// kernels' limits (a rank over 512) take the tensor path.
pub fn sample_block_slices_fused(
    base: Rows3<'_>,
    w1: Mat<'_>,
    w2: Mat<'_>,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<DraftBlock> {
    fused(&Inputs::new(base, w1, w2, anchors, opts))
}

/// [`sample_block_slices_fused`] over a call's inputs.
fn fused(x: &HostInputs<'_>) -> Result<DraftBlock> {
    let g = x.validate()?;
    if !super::fused::fits_block(g.rank, g.valid) {
        return on(Some(&Device::Cpu), x);
    }
    let streams = x.opts.seeds.streams(g.batch, "seeds")?;
    if g.batch == 0 || g.slots == 0 {
        return cpu::run(&g, &streams, x);
    }
    super::fused::sample_block_host(&g, &streams, x)
}

/// [`sample_block_slices`] on an explicit kernel path: `None` runs the host slice kernel
/// (whatever [`crate::device::KERNEL_PATH_ENV`] says), `Some(device)` the device-generic tensor
/// kernel on `device` (the inputs are uploaded there). Validation and results are the same on
/// both.
pub fn sample_block_slices_on(
    device: Option<&Device>,
    base: Rows3<'_>,
    w1: Mat<'_>,
    w2: Mat<'_>,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<DraftBlock> {
    on(device, &Inputs::new(base, w1, w2, anchors, opts))
}

/// [`sample_block_slices_on`] over a call's inputs.
fn on(device: Option<&Device>, x: &HostInputs<'_>) -> Result<DraftBlock> {
    let g = x.validate()?;
    let streams = x.opts.seeds.streams(g.batch, "seeds")?;
    // An empty block has nothing to upload (its dims may not even form a tensor shape).
    if let Some(dev) = device.filter(|_| g.batch > 0 && g.slots > 0) {
        let up = |f: Floats<'_>, dims: &[usize]| transfer::upload(f, dims, dev);
        let (b, m1, m2) = (
            up(x.base.data, &x.base.dims)?,
            up(x.w1.data, &x.w1.dims)?,
            up(x.w2.data, &x.w2.dims)?,
        );
        let out = device::sample_block_tensors(&g, &streams, &x.with(&b, &m1, &m2))?;
        return out.to_host();
    }
    cpu::run(&g, &streams, x)
}

/// The shapes of a tensor call: `base` `[B, K, V_d]`, `w1` `[V_in, r]`, `w2` `[V_d, r]`.
type Shapes = ([usize; 3], [usize; 2], [usize; 2]);

/// The [`Shapes`] of a tensor call, or `bad-shape` naming the first input of another rank.
fn shapes(base: &Tensor, w1: &Tensor, w2: &Tensor) -> Result<Shapes> {
    Ok((
        dims::<3>(base, "base_logits", "[B, K, V_d]")?,
        dims::<2>(w1, "markov_w1", "[V_in, r]")?,
        dims::<2>(w2, "markov_w2", "[V_d, r]")?,
    ))
}

/// Run `f` over host views of `x`'s tensors (of shapes `s`; copied to the host where they are
/// not contiguous host floats already).
fn with_host<R>(
    x: &TensorInputs<'_>,
    s: Shapes,
    f: impl FnOnce(&HostInputs<'_>) -> Result<R>,
) -> Result<R> {
    let (bd, d1, d2) = s;
    with_floats(x.base, "base_logits", |b| {
        with_floats(x.w1, "markov_w1", |m1| {
            with_floats(x.w2, "markov_w2", |m2| {
                f(&x.with(
                    Rows3 { data: b, dims: bd },
                    Mat { data: m1, dims: d1 },
                    Mat { data: m2, dims: d2 },
                ))
            })
        })
    })
}

/// Tensor front of [`sample_block_slices`]: `base` `[B, K, V_d]`, `w1` `[V_in, r]`, `w2`
/// `[V_d, r]` (f32/f16/bf16), `anchors` `[B]` integer target ids.
pub fn sample_block(
    base: &Tensor,
    w1: &Tensor,
    w2: &Tensor,
    anchors: &Tensor,
    opts: &BlockOptions<'_>,
) -> Result<DraftBlock> {
    let s = shapes(base, w1, w2)?;
    let a = ids(anchors, "anchors")?;
    dims::<1>(anchors, "anchors", "[B]")?;
    let a: Vec<u32> = a
        .iter()
        .map(|&x| {
            u32::try_from(x).map_err(|_| Error::TokenOutOfRange {
                name: "anchors".into(),
                id: x,
                vocab_size: s.1[0],
            })
        })
        .collect::<Result<_>>()?;
    let x = Inputs::new(base, w1, w2, &a, opts);
    if use_tensor_path(base.device())? {
        return block_on_device(&x)?.to_host();
    }
    with_host(&x, s, on_kernel_path)
}

/// [`sample_block_on_device`] over a call's inputs (the fused kernels where they run).
fn block_on_device(x: &TensorInputs<'_>) -> Result<DeviceBlock> {
    let s = shapes(x.base, x.w1, x.w2)?;
    let dev = x.base.device();
    same_device(dev, &[("markov_w1", x.w1), ("markov_w2", x.w2)])?;
    check_float(x.base, "base_logits")?;
    check_float(x.w1, "markov_w1")?;
    check_float(x.w2, "markov_w2")?;
    let g = validate_dims(s.0, s.1, s.2, x.anchors, x.opts)?;
    let streams = x.opts.seeds.streams(g.batch, "seeds")?;
    let nonempty = g.batch > 0 && g.slots > 0;
    if nonempty && use_fused(dev)? && super::fused::fits_block(g.rank, g.valid) {
        #[cfg(feature = "cuda")]
        if dev.is_cuda() {
            return super::fused::sample_block_cuda(&g, &streams, x);
        }
        if dev.is_cpu() {
            let block = with_host(x, s, |h| super::fused::sample_block_host(&g, &streams, h))?;
            return DeviceBlock::from_host(block, dev);
        }
    }
    device::sample_block_tensors(&g, &streams, x)
}

/// [`sample_block`] on the device-generic path whatever the device, with the `[B, K, V_t]`
/// draft logits and the embeddings left on `base`'s device (only the tokens come back):
/// `anchors` are `B` target ids.
pub fn sample_block_on_device(
    base: &Tensor,
    w1: &Tensor,
    w2: &Tensor,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<DeviceBlock> {
    block_on_device(&Inputs::new(base, w1, w2, anchors, opts))
}
