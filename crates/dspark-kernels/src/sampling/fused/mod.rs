//! The fused sampling kernels: each kernel as a few CUDA launches that read their rows once,
//! take per-request settings by value and return a few words, with a Rust model of each
//! launch (its `cpu_fwd`).
//!
//! - `kernels/fused_verify.cu` verifies a block in four launches ([`plan::verify_plan`]), its
//!   records and walk in `fused_verify.cuh`; `verify` is its model.
//! - `kernels/fused_block.cu` drafts a block (the Markov sampler) in at most `2K + 1`
//!   launches ([`plan::block_plan`]); `block` is its model.
//! - `kernels/fused_common.cuh` holds what they share (the CPU's exp, the counter-based
//!   uniforms, fixed-order block reductions, radix selection); [`math`] is its model.
//! - [`layout`] is the memory both sides agree on, [`plan`] what a call launches as a pure
//!   function of its shapes, [`exec`] how a plan runs on a [`exec::Backend`]: the CUDA
//!   device (`cuda`, with the `cuda` feature) or the host emulation of the kernels' source
//!   that `crates/dspark-kernel-emu` tests against the models.
//!
//! Shapes beyond the kernels' limits (a vocabulary over [`layout::MAX_VOCAB`], a Markov rank
//! over [`layout::SB_MAX_RANK`]) take the tensor path instead ([`fits_verify`],
//! [`fits_block`]).
//!
//! On a CUDA device the kernels run fused unless `DSPARK_KERNEL_PATH=tensor`; on the CPU,
//! `DSPARK_KERNEL_PATH=fused` runs the models ([`crate::device::use_fused`]). The models are
//! written in the kernels' reduction order, so the GPU matches them bit for bit. Against the
//! fast path they give the same greedy results and errors, and the same sampled results for
//! the same seed but where float summation order moves a boundary.

mod block;
#[cfg(feature = "cuda")]
mod cuda;
pub mod exec;
pub mod layout;
mod math;
pub mod plan;
mod verify;

use crate::error::Result;
use crate::sampling::verify::request::{HostRows, Plan as Validated, Verification};
use crate::view::Rows3;

pub use exec::{
    Backend, BlockInputs, BlockSettings, BlockWords, KernelParams, TokenSource, VerifyInputs,
    run_block, run_verify,
};
pub use plan::{BlockPlan, BlockShape, Launch, VerifyPlan, VerifyShape, block_plan, verify_plan};

use crate::idmap::IdMap;
#[cfg(feature = "cuda")]
use crate::sampling::markov::options::TensorInputs;
use crate::sampling::markov::options::{DraftBlock, Geometry, HostInputs, Inputs};
use crate::sampling::rng::Stream;
use crate::view::Mat;

/// Whether a verification of vocabulary `vocab` fits the fused kernels (their fixed-point
/// masses of a whole row fit a `u64`).
pub(crate) fn fits_verify(vocab: usize) -> bool {
    vocab <= layout::MAX_VOCAB
}

/// Whether a block-sampler call fits the fused kernels (rank and vocabulary).
pub(crate) fn fits_block(rank: usize, valid: usize) -> bool {
    rank <= layout::SB_MAX_RANK && valid <= layout::MAX_VOCAB
}

fn table(map: &IdMap, valid: usize) -> Option<&[u32]> {
    map.table().map(|t| &t[..valid.min(t.len())])
}

/// A block call's settings as the kernels take them (`dims` its `[B, K, V_d]`, `streams` its
/// stream keys).
fn settings<'a, B, M>(
    g: &Geometry,
    x: &Inputs<'a, B, M>,
    streams: &'a [u64],
    dims: [usize; 3],
) -> BlockSettings<'a> {
    let (greedy, mult) = x.opts.draft_mult();
    BlockSettings {
        dims,
        target_vocab: g.target_vocab,
        valid: g.valid,
        rank: g.rank,
        greedy,
        mult,
        top_k: x.opts.top_k.filter(|&k| k < g.valid),
        streams,
        anchors: x.anchors,
    }
}

/// The fused block sampler's model over host inputs (`DSPARK_KERNEL_PATH=fused` on the CPU).
pub(crate) fn sample_block_host(
    g: &Geometry,
    streams: &[Stream],
    x: &HostInputs<'_>,
) -> Result<DraftBlock> {
    let raw: Vec<u64> = streams.iter().map(Stream::raw).collect();
    let set = settings(g, x, &raw, x.base.dims);
    let table = table(x.opts.id_map, g.valid);
    let out = block::run(&block::Call::new(x.base, x.w1, x.w2, &set, table));
    block::decode(&out.status, g.batch, g.slots)?;
    Ok(DraftBlock::new(g, out.tokens, out.out, out.emb))
}

/// Load the fused kernels on a CUDA device (once per context): a GPU or driver that cannot run
/// them is `device-unavailable`, naming the GPU, its compute capability and the build's targets.
#[cfg(feature = "cuda")]
pub(crate) fn check_device(device: &candle_core::Device) -> Result<()> {
    cuda::CudaBackend::new(device)?.load_all()
}

/// What `ptxas -v` reported for each fused entry when this build compiled them (registers,
/// stack, spills, shared memory; the build fails on any spill or stack frame).
#[cfg(feature = "cuda")]
pub const PTXAS_REPORT: &str = include_str!(concat!(env!("OUT_DIR"), "/fused_ptxas.txt"));

/// The fused block sampler on a CUDA device: the draft logits and embeddings stay there.
#[cfg(feature = "cuda")]
pub(crate) fn sample_block_cuda(
    g: &Geometry,
    streams: &[Stream],
    x: &TensorInputs<'_>,
) -> Result<crate::sampling::DeviceBlock> {
    let dev = x.base.device();
    let raw: Vec<u64> = streams.iter().map(Stream::raw).collect();
    let (b, k) = (g.batch, g.slots);
    let out = cuda::uninit_f32(dev, &[b, k, g.target_vocab])?;
    let emb = cuda::uninit_f32(dev, &[b, k, g.rank])?;
    let (base_c, w1_c, w2_c) = (x.base.contiguous()?, x.w1.contiguous()?, x.w2.contiguous()?);
    let inputs = BlockInputs {
        base: cuda::input(&base_c, "base_logits")?,
        w1: cuda::input(&w1_c, "markov_w1")?,
        w2: cuda::input(&w2_c, "markov_w2")?,
        table: table(x.opts.id_map, g.valid),
        out: crate::cuda_interop::device_ptr(&out)?,
        emb: crate::cuda_interop::device_ptr(&emb)?,
    };
    let set = settings(g, x, &raw, x.base.dims3()?.into());
    let mut backend = cuda::CudaBackend::new(dev)?;
    let words = run_block(&mut backend, &inputs, &set)?;
    block::decode(&words.status, b, k)?;
    Ok(crate::sampling::DeviceBlock::new(g, words.tokens, out, emb))
}

/// The per-request parameter entries and sorted stop ids of a validated call.
fn requests(plan: &Validated) -> Vec<layout::VfReq> {
    let vocab = plan.dims[2];
    plan.requests
        .iter()
        .map(|r| verify::vf_req(r, vocab))
        .collect()
}

/// The fused verification's model over host rows (`DSPARK_KERNEL_PATH=fused` on the CPU).
pub(crate) fn verify_host(plan: &Validated, rows: HostRows<'_>) -> Result<Verification> {
    let [b, w, v] = plan.dims;
    let words = model_words(rows, &requests(plan), &plan.stops);
    verify::decode(&words, b, w, v)
}

/// The verification model's output words for `rows` with these parameter entries and stops.
fn model_words(rows: HostRows<'_>, reqs: &[layout::VfReq], stops: &[u32]) -> Vec<i64> {
    verify::run(&verify::Call {
        target: rows.target,
        draft: rows.draft,
        tokens: rows.tokens,
        reqs,
        stops,
    })
}

/// The fused verification on a CUDA device: `target` (and `draft`) contiguous on `device`,
/// the draft ids where `tokens` says.
#[cfg(feature = "cuda")]
pub(crate) fn verify_cuda(
    device: &candle_core::Device,
    plan: &Validated,
    target: &candle_core::Tensor,
    tokens: TokenSource<'_>,
    draft: Option<&candle_core::Tensor>,
) -> Result<Verification> {
    let [b, w, v] = plan.dims;
    let reqs = requests(plan);
    let target_c = target.contiguous()?;
    let draft_c = draft.map(candle_core::Tensor::contiguous).transpose()?;
    let inputs = VerifyInputs {
        target: cuda::input(&target_c, "target_logits")?,
        draft: draft_c
            .as_ref()
            .map(|d| cuda::input(d, "draft_logits"))
            .transpose()?,
        tokens,
    };
    let mut backend = cuda::CudaBackend::new(device)?;
    let words = run_verify(&mut backend, [b, w, v], &inputs, &reqs, &plan.stops)?;
    verify::decode(&words, b, w, v)
}

/// What the kernels' host emulation (`crates/dspark-kernel-emu`) needs to compare the CUDA
/// source with its models. Not a stable API.
#[doc(hidden)]
pub mod testing {
    use super::*;
    use crate::sampling::VerifyOptions;
    use crate::view::Tokens;

    /// A validated call's parameter entries, stop ids and its model's output words.
    pub struct VerifyCase {
        /// One parameter entry per request.
        pub reqs: Vec<layout::VfReq>,
        /// Sorted stop ids.
        pub stops: Vec<u32>,
        /// The model's output words.
        pub words: Vec<i64>,
    }

    /// Check a call's shapes and settings as the fronts do (the draft ids are left to the
    /// kernels) and run the model.
    pub fn verify_model(
        target: Rows3<'_>,
        tokens: Tokens<'_>,
        draft: Option<Rows3<'_>>,
        opts: &VerifyOptions,
    ) -> Result<VerifyCase> {
        // The settings are checked here; the draft ids by the kernels (and their model).
        let plan = crate::sampling::verify::request::prepare_params(
            target.dims,
            tokens.dims,
            draft.map(|d| d.dims),
            opts,
        )?;
        let reqs = requests(&plan);
        let rows = HostRows::new(target, tokens.data, draft);
        let words = model_words(rows, &reqs, &plan.stops);
        Ok(VerifyCase {
            reqs,
            stops: plan.stops,
            words,
        })
    }

    /// [`verify::decode`].
    pub fn decode(words: &[i64], batch: usize, width: usize, vocab: usize) -> Result<Verification> {
        verify::decode(words, batch, width, vocab)
    }

    /// The block sampler's model: its returned words and its outputs (draft logits,
    /// embeddings), for inputs already validated by the caller.
    #[allow(clippy::too_many_arguments)]
    pub fn block_model(
        base: Rows3<'_>,
        w1: Mat<'_>,
        w2: Mat<'_>,
        set: &BlockSettings<'_>,
        table: Option<&[u32]>,
    ) -> (BlockWords, Vec<f32>, Vec<f32>) {
        let o = block::run(&block::Call::new(base, w1, w2, set, table));
        (
            BlockWords {
                tokens: o.tokens,
                status: o.status,
                witness: o.witness,
            },
            o.out,
            o.emb,
        )
    }

    /// [`block::decode`].
    pub fn block_decode(status: &[u32], batch: usize, slots: usize) -> Result<()> {
        block::decode(status, batch, slots)
    }
}
