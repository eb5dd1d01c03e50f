//! Running a fused call's plan on a backend: the CUDA device (`fused/cuda.rs`) or the host
//! emulation of the kernels' source the tests use (`crates/dspark-kernel-emu`). Both get the
//! same parameter blocks and the same launches, in the plan's order.

use super::layout::{
    Dtype, SB_MAX_BATCH, SbParams, TokenKind, VF_MAX_STOPS, VfParams, VfReq, sb_chunks, vf_chunks,
    vf_out_words,
};
use super::plan::{BlockShape, Launch, VerifyShape, block_plan, verify_plan};
use crate::error::{Error, Result};

/// A parameter block passed by value to a kernel.
///
/// # Safety
/// Implementors are `#[repr(C)]` plain data that the kernels declare field for field.
pub unsafe trait KernelParams: Copy + Send + Sync + 'static {}

// SAFETY: `#[repr(C)]` plain data, declared as `VfParams` in kernels/fused_verify.cuh.
unsafe impl KernelParams for VfParams {}

// SAFETY: `#[repr(C)]` plain data, declared as `SbParams` in kernels/fused_block.cu.
unsafe impl KernelParams for SbParams {}

/// Where fused kernels run: device memory by address, launches, copies.
pub trait Backend {
    /// An allocation (freed when dropped).
    type Buffer;

    /// `bytes` of device memory and its address.
    fn alloc(&mut self, bytes: usize) -> Result<(Self::Buffer, u64)>;

    /// A copy of `data` in device memory and its address.
    fn upload(&mut self, data: &[u8]) -> Result<(Self::Buffer, u64)>;

    /// Launch `launch` with `params` by value.
    fn launch<P: KernelParams>(&mut self, launch: &Launch, params: &P) -> Result<()>;

    /// Copy `bytes` from `offset` bytes into `buf` to the host (waits for the work before it).
    fn download(&mut self, buf: &Self::Buffer, offset: usize, bytes: usize) -> Result<Vec<u8>>;
}

/// Device draft ids, or host ids the executor uploads.
#[derive(Debug, Clone, Copy)]
pub enum TokenSource<'a> {
    /// Device memory of `[B, K]` ids.
    Device {
        /// Address of the first id.
        addr: u64,
        /// Their element type.
        kind: TokenKind,
    },
    /// Host ids.
    Host(&'a [i64]),
}

/// The device inputs of a verification call.
#[derive(Debug, Clone, Copy)]
pub struct VerifyInputs<'a> {
    /// Address and dtype of the `[B, K+1, V]` target logits.
    pub target: (u64, Dtype),
    /// Address and dtype of the `[B, K, V]` draft logits.
    pub draft: Option<(u64, Dtype)>,
    /// The `[B, K]` draft ids.
    pub tokens: TokenSource<'a>,
}

fn params_of(
    shape: &VerifyShape,
    inputs: &VerifyInputs<'_>,
    tokens: (u64, TokenKind),
    stops: &[u32],
    stops_addr: u64,
) -> VfParams {
    let mut stop = [0u32; VF_MAX_STOPS];
    if stops_addr == 0 {
        stop[..stops.len()].copy_from_slice(stops);
    }
    VfParams {
        target: inputs.target.0,
        draft: inputs.draft.map_or(0, |d| d.0),
        tokens: tokens.0,
        stops: stops_addr,
        chunks: 0,
        rows: 0,
        resid: 0,
        out: 0,
        batch: 0,
        width: shape.width as u32,
        vocab: shape.vocab as u32,
        nchunks: vf_chunks(shape.vocab) as u32,
        dt_target: inputs.target.1 as u32,
        dt_draft: inputs.draft.map_or(0, |d| d.1 as u32),
        tok_kind: tokens.1 as u32,
        has_draft: u32::from(inputs.draft.is_some()),
        nstops: stops.len() as u32,
        pad: [0; 3],
        stop,
        req: [VfReq::default(); super::layout::VF_MAX_BATCH],
    }
}

fn bytes_of<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: plain integers, read as bytes for the length of the slice.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Run a validated verification on `backend`: every request's output words (see
/// [`super::verify::decode`]). `dims` is `[B, K+1, V]`, `reqs` one per request, `stops`
/// sorted. The group's pointers are offset to its requests; one download at the end.
pub fn run_verify<B: Backend>(
    backend: &mut B,
    dims: [usize; 3],
    inputs: &VerifyInputs<'_>,
    reqs: &[VfReq],
    stops: &[u32],
) -> Result<Vec<i64>> {
    let [batch, width, vocab] = dims;
    if reqs.len() != batch || width == 0 {
        return Err(Error::Internal {
            message: format!(
                "fused verify: {} requests for a batch of {batch}",
                reqs.len()
            ),
        });
    }
    if batch == 0 {
        return Ok(Vec::new());
    }
    let k = width - 1;
    let shape = VerifyShape {
        batch,
        width,
        vocab,
        has_draft: inputs.draft.is_some(),
        host_tokens: matches!(inputs.tokens, TokenSource::Host(_)),
        stops: stops.len(),
    };
    let plan = verify_plan(shape);
    let mut keep = Vec::new();
    let tokens = match inputs.tokens {
        TokenSource::Device { addr, kind } => (addr, kind),
        TokenSource::Host(ids) => {
            let (buf, addr) = backend.upload(bytes_of(ids))?;
            keep.push(buf);
            (addr, TokenKind::I64)
        }
    };
    let stops_addr = if stops.len() > VF_MAX_STOPS {
        let (buf, addr) = backend.upload(bytes_of(stops))?;
        keep.push(buf);
        addr
    } else {
        0
    };
    let (scratch, base) = backend.alloc(plan.scratch.bytes)?;
    let mut p = params_of(&shape, inputs, tokens, stops, stops_addr);
    let (t_size, d_size) = (
        inputs.target.1.size() as u64,
        inputs.draft.map_or(0, |d| d.1.size() as u64),
    );
    let tok_size = match tokens.1 {
        TokenKind::I64 => 8u64,
        TokenKind::I32 | TokenKind::U32 => 4,
    };
    let words = vf_out_words(width) as u64;
    for (g, launches) in plan.groups.iter().zip(plan.launches.chunks(4)) {
        let s = g.start as u64;
        p.batch = g.len as u32;
        p.target = inputs.target.0 + s * (width * vocab) as u64 * t_size;
        p.draft = inputs
            .draft
            .map_or(0, |d| d.0 + s * (k * vocab) as u64 * d_size);
        p.tokens = tokens.0 + s * k as u64 * tok_size;
        p.chunks = base + plan.scratch.chunks as u64;
        p.rows = base + plan.scratch.rows as u64;
        p.resid = base + plan.scratch.resid as u64;
        p.out = base + plan.scratch.out as u64 + s * words * 8;
        p.req = [VfReq::default(); super::layout::VF_MAX_BATCH];
        p.req[..g.len].copy_from_slice(&reqs[g.start..g.start + g.len]);
        for l in launches {
            backend.launch(l, &p)?;
        }
    }
    let raw = backend.download(&scratch, plan.scratch.out, batch * words as usize * 8)?;
    drop(keep);
    Ok(raw
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

/// The device buffers of a block-sampler call.
#[derive(Debug, Clone, Copy)]
pub struct BlockInputs<'a> {
    /// `[B, K, V_d]` base logits.
    pub base: (u64, Dtype),
    /// `[V_in, r]` Markov W1.
    pub w1: (u64, Dtype),
    /// `[V_d, r]` Markov W2.
    pub w2: (u64, Dtype),
    /// The target id of each draft id (host; uploaded), `None` for the identity.
    pub table: Option<&'a [u32]>,
    /// `[B, K, V_t]` f32 draft logits to write.
    pub out: u64,
    /// `[B, K, r]` f32 embeddings to write.
    pub emb: u64,
}

/// The settings of a validated block-sampler call.
#[derive(Debug, Clone, Copy)]
pub struct BlockSettings<'a> {
    /// `[B, K, V_d]`.
    pub dims: [usize; 3],
    /// `V_t`.
    pub target_vocab: usize,
    /// Draft columns that may be drawn.
    pub valid: usize,
    /// Markov rank.
    pub rank: usize,
    /// Greedy drafting.
    pub greedy: bool,
    /// `logit_scale` (over the temperature when sampling).
    pub mult: f32,
    /// Top-k candidates.
    pub top_k: Option<usize>,
    /// `B` stream keys.
    pub streams: &'a [u64],
    /// `B` anchors (target ids).
    pub anchors: &'a [u32],
}

/// What a block-sampler call returns to the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockWords {
    /// `[B, K]` drafted target ids.
    pub tokens: Vec<u32>,
    /// `[B, K]` status words.
    pub status: Vec<u32>,
    /// `[B]` witness hashes.
    pub witness: Vec<u64>,
}

/// Run a validated block-sampler call on `backend` (outputs written where `inputs` say).
pub fn run_block<B: Backend>(
    backend: &mut B,
    inputs: &BlockInputs<'_>,
    set: &BlockSettings<'_>,
) -> Result<BlockWords> {
    let [batch, slots, vocab_d] = set.dims;
    if set.streams.len() != batch || set.anchors.len() != batch {
        return Err(Error::Internal {
            message: format!(
                "fused block: {} streams for a batch of {batch}",
                set.streams.len()
            ),
        });
    }
    if batch == 0 || slots == 0 {
        return Ok(BlockWords {
            tokens: Vec::new(),
            status: Vec::new(),
            witness: vec![0; batch],
        });
    }
    let plan = block_plan(BlockShape {
        batch,
        slots,
        target_vocab: set.target_vocab,
        valid: set.valid,
        rank: set.rank,
        greedy: set.greedy,
        table: inputs.table.is_some(),
        top_k: set.top_k,
    });
    let mut keep = Vec::new();
    let table = match inputs.table {
        Some(t) => {
            let (buf, addr) = backend.upload(bytes_of(t))?;
            keep.push(buf);
            addr
        }
        None => 0,
    };
    let (scratch, base) = backend.alloc(plan.scratch.bytes)?;
    let sc = plan.scratch;
    let mut p = SbParams {
        base: 0,
        w1: inputs.w1.0,
        w2: inputs.w2.0,
        table,
        out: 0,
        emb: 0,
        tokens: 0,
        prev: base + sc.prev as u64,
        stats: base + sc.stats as u64,
        cand: base + sc.cand as u64,
        ncand: base + sc.ncand as u64,
        status: 0,
        witness: 0,
        batch: 0,
        slots: slots as u32,
        vocab_d: vocab_d as u32,
        vocab_t: set.target_vocab as u32,
        valid: set.valid as u32,
        rank: set.rank as u32,
        nchunks: sb_chunks(set.valid) as u32,
        slot: 0,
        dt_base: inputs.base.1 as u32,
        dt_w1: inputs.w1.1 as u32,
        dt_w2: inputs.w2.1 as u32,
        greedy: u32::from(set.greedy),
        top_k: set.top_k.map_or(0, |k| k as u32),
        has_table: u32::from(inputs.table.is_some()),
        pad: [0; 2],
        mult: set.mult,
        pad2: 0,
        stream: [0; SB_MAX_BATCH],
        anchor: [0; SB_MAX_BATCH],
    };
    let esize = inputs.base.1.size() as u64;
    for (g, launches) in plan
        .groups
        .iter()
        .zip(plan.launches.chunks(plan.per_group.max(1)))
    {
        let s = g.start as u64;
        let bk = s * slots as u64;
        p.batch = g.len as u32;
        p.base = inputs.base.0 + bk * vocab_d as u64 * esize;
        p.out = inputs.out + bk * set.target_vocab as u64 * 4;
        p.emb = inputs.emb + bk * set.rank as u64 * 4;
        p.tokens = base + sc.tokens as u64 + bk * 4;
        p.status = base + sc.status as u64 + bk * 4;
        p.witness = base + sc.witness as u64 + s * 8;
        p.stream = [0; SB_MAX_BATCH];
        p.anchor = [0; SB_MAX_BATCH];
        p.stream[..g.len].copy_from_slice(&set.streams[g.start..g.start + g.len]);
        p.anchor[..g.len].copy_from_slice(&set.anchors[g.start..g.start + g.len]);
        for (l, slot) in launches {
            p.slot = slot.unwrap_or(0) as u32;
            backend.launch(l, &p)?;
        }
    }
    let raw = backend.download(&scratch, 0, sc.result_bytes)?;
    drop(keep);
    let u32s = |at: usize, n: usize| -> Vec<u32> {
        raw[at..at + 4 * n]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let bk = batch * slots;
    Ok(BlockWords {
        tokens: u32s(sc.tokens, bk),
        status: u32s(sc.status, bk),
        witness: raw[sc.witness..sc.witness + 8 * batch]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
    })
}
