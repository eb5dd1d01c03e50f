//! Tensor primitives shared by the device-generic kernels, built only from candle operations
//! that every backend implements (compare, select, reduce, gather, small matmuls).
//!
//! Rows are `[R, Vp]` with `Vp` a multiple of [`BLK`] (see [`pad_rows`]): padded logits are
//! `-inf`, padded weights `0`. Nothing here sorts or scans the whole vocabulary densely:
//! - sums are blocked (`BLK` values in f32, then the block totals in f64), the fast path's
//!   accumulation order up to the order inside a block;
//! - inverse-CDF picks walk block totals (one `[nb, nb]` triangular matmul), then a single
//!   gathered block (one `[BLK, BLK]` triangular matmul), like the fast path's block walk;
//! - value thresholds (top-k, top-p, draws in value order) are found by bisection on values,
//!   in a log-like coordinate so that about 35 halvings separate any two adjacent f32 values,
//!   and ties at the threshold are resolved by id with one more pick.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;

/// Block length of the blocked sums and scans (the fast path's `view::BLOCK`).
pub(crate) const BLK: usize = 256;

/// Upper bound of bisection rounds (convergence is checked every few rounds).
const MAX_ROUNDS: usize = 72;

/// The block length of padded rows of `vp` columns (short rows are a single block).
fn blk(vp: usize) -> usize {
    vp.min(BLK)
}

/// `[R, V]` → `[R, Vp]`, the new columns set to `fill`: `Vp` is a multiple of [`BLK`], or for
/// `V <= BLK` the next power of two (one short block).
pub(crate) fn pad_rows(x: &Tensor, fill: f32) -> Result<Tensor> {
    let (r, v) = x.dims2()?;
    let vp = if v <= BLK {
        v.next_power_of_two()
    } else {
        v.div_ceil(BLK) * BLK
    };
    if vp == v {
        return Ok(x.contiguous()?);
    }
    let pad = Tensor::full(fill, (r, vp - v), x.device())?.to_dtype(x.dtype())?;
    Ok(Tensor::cat(&[x, &pad], 1)?.contiguous()?)
}

/// Column ids `[1, n]` (u32).
pub(crate) fn col_ids(n: usize, dev: &Device) -> Result<Tensor> {
    Ok(Tensor::arange(0u32, n as u32, dev)?.reshape((1, n))?)
}

/// A `[n, n]` matrix of `dtype` with ones where `row <= col` (inclusive prefix sums by `x·M`).
fn upper(n: usize, dev: &Device, dtype: DType) -> Result<Tensor> {
    let i = Tensor::arange(0u32, n as u32, dev)?;
    let rows = i.reshape((n, 1))?.broadcast_as((n, n))?;
    let cols = i.reshape((1, n))?.broadcast_as((n, n))?;
    Ok(rows.le(&cols)?.to_dtype(dtype)?)
}

/// Per-row checks of logits `[R, Vp]`: the row with NaN replaced by `-inf`, its max `[R, 1]`
/// (NaN-ignoring, `-inf` when nothing is finite) and its NaN count `[R, 1]` (f32).
pub(crate) fn clean_rows(x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let nan = x.ne(x)?;
    let nans = nan.to_dtype(DType::F32)?.sum_keepdim(1)?;
    let ninf = Tensor::full(f32::NEG_INFINITY, x.dims(), x.device())?;
    let clean = nan.where_cond(&ninf, x)?;
    let max = clean.max_keepdim(1)?;
    Ok((clean, max, nans))
}

/// `m` where it is finite, else `0` (keeps garbage rows, which are reported as errors, finite).
pub(crate) fn finite_or_zero(m: &Tensor) -> Result<Tensor> {
    let ok = m.abs()?.lt(f64::from(f32::MAX) * 2.0)?;
    Ok(ok.where_cond(m, &m.zeros_like()?)?)
}

/// The lowest column holding each row's `max` (`[R, 1]` u32; `Vp` when none does).
pub(crate) fn argmax_lowest(x: &Tensor, max: &Tensor) -> Result<Tensor> {
    let (r, vp) = x.dims2()?;
    let ids = col_ids(vp, x.device())?.broadcast_as((r, vp))?;
    let none = Tensor::full(vp as u32, (r, vp), x.device())?;
    Ok(x.broadcast_eq(max)?
        .where_cond(&ids, &none)?
        .min_keepdim(1)?)
}

/// `exp((x − max)·s)` of logits `[R, Vp]` with per-row `max` and `s` (`[R, 1]` f32).
pub(crate) fn weights(x: &Tensor, max: &Tensor, s: &Tensor) -> Result<Tensor> {
    Ok(x.broadcast_sub(&finite_or_zero(max)?)?
        .broadcast_mul(s)?
        .exp()?)
}

/// Block sums `[R, nb]` (f64) of weights `[R, Vp]`: f32 within a block of [`BLK`].
pub(crate) fn block_sums(w: &Tensor) -> Result<Tensor> {
    let (r, vp) = w.dims2()?;
    let n = blk(vp);
    Ok(w.reshape((r, vp / n, n))?.sum(2)?.to_dtype(DType::F64)?)
}

/// Blocked row sums `[R, 1]` (f64) of weights `[R, Vp]`.
pub(crate) fn row_sums(w: &Tensor) -> Result<Tensor> {
    Ok(block_sums(w)?.sum_keepdim(1)?)
}

/// Inverse-CDF pick in id order: per row the first column whose running weight exceeds
/// `target` (`[R, 1]` f64), or, when rounding leaves `target` at or past the end, the last
/// column with positive weight; `fallback` (`[R, 1]` u32) for rows without weight.
/// Returns `[R, 1]` u32.
pub(crate) fn pick(w: &Tensor, target: &Tensor, fallback: &Tensor) -> Result<Tensor> {
    let (r, vp) = w.dims2()?;
    let dev = w.device();
    let bl = blk(vp);
    let nb = vp / bl;
    let bs = block_sums(w)?; // [R, nb]
    let incl = bs.matmul(&upper(nb, dev, DType::F64)?)?;
    let excl = (&incl - &bs)?;
    let bids = col_ids(nb, dev)?.broadcast_as((r, nb))?;
    let nbt = Tensor::full(nb as u32, (r, nb), dev)?;
    let zeros = Tensor::zeros((r, nb), DType::U32, dev)?;
    let first = incl
        .broadcast_gt(target)?
        .where_cond(&bids, &nbt)?
        .min_keepdim(1)?;
    let last = bs.gt(0.0)?.where_cond(&bids, &zeros)?.max_keepdim(1)?;
    let past = first.eq(nb as u32)?;
    let b = past.where_cond(&last, &first)?; // [R, 1]
    let before = excl.gather(&b.contiguous()?, 1)?;
    let inf = Tensor::full(f64::INFINITY, (r, 1), dev)?;
    let rest = past.where_cond(&inf, &(target - &before)?)?;
    // The chosen block of each row, then its own prefix.
    let idx = b
        .reshape((r, 1, 1))?
        .broadcast_as((r, 1, bl))?
        .contiguous()?;
    let block = w
        .reshape((r, nb, bl))?
        .gather(&idx, 1)?
        .reshape((r, bl))?
        .to_dtype(DType::F64)?;
    let cum = block.matmul(&upper(bl, dev, DType::F64)?)?;
    let jids = col_ids(bl, dev)?.broadcast_as((r, bl))?;
    let blkt = Tensor::full(bl as u32, (r, bl), dev)?;
    let jzeros = Tensor::zeros((r, bl), DType::U32, dev)?;
    let j_first = cum
        .broadcast_gt(&rest)?
        .where_cond(&jids, &blkt)?
        .min_keepdim(1)?;
    let j_last = block.gt(0.0)?.where_cond(&jids, &jzeros)?.max_keepdim(1)?;
    let j = j_first.eq(bl as u32)?.where_cond(&j_last, &j_first)?;
    let tok = (b.affine(bl as f64, 0.0)? + j)?;
    let tok = tok.minimum((vp - 1) as u32)?;
    let empty = bs.sum_keepdim(1)?.le(0.0)?;
    Ok(empty.where_cond(fallback, &tok)?)
}

/// How [`prefix_cut`] states the mass the prefix must reach.
#[derive(Clone, Copy)]
pub(crate) enum Goal<'a> {
    /// This absolute mass per row (`[R, 1]` f64).
    Absolute(&'a Tensor),
    /// This fraction of each row's total mass (`[R, 1]` f64).
    Fraction(&'a Tensor),
}

/// The end of a value-descending, id-ascending prefix: the filter `(x > value) ∨ (x == value ∧
/// id <= id)` of the fast path's `Cut`.
pub(crate) struct Cut {
    /// `[R, 1]` f32.
    pub value: Tensor,
    /// `[R, 1]` u32.
    pub id: Tensor,
}

impl Cut {
    /// The tokens the cut keeps, `[R, Vp]` u8.
    pub fn keeps(&self, x: &Tensor) -> Result<Tensor> {
        let (r, vp) = x.dims2()?;
        let ids = col_ids(vp, x.device())?.broadcast_as((r, vp))?;
        let above = x.broadcast_gt(&self.value)?;
        let tie = x
            .broadcast_eq(&self.value)?
            .mul(&ids.broadcast_le(&self.id)?)?;
        Ok(above.maximum(&tie)?)
    }
}

/// `T(x) = sign(x)·ln(1 + |x|·1e45)` in f64: strictly increasing on f32 values, with adjacent
/// f32 values at least ~`2^-24` apart over the whole range (about `±192`).
fn to_log(x: &Tensor) -> Result<Tensor> {
    let x = x.to_dtype(DType::F64)?;
    Ok(x.sign()?.mul(&x.abs()?.affine(1e45, 1.0)?.log()?)?)
}

/// The inverse of [`to_log`], rounded to f32.
fn from_log(y: &Tensor) -> Result<Tensor> {
    let m = y.abs()?.exp()?.affine(1e-45, -1e-45)?;
    Ok(y.sign()?.mul(&m)?.to_dtype(DType::F32)?)
}

/// A value strictly between `lo` and `hi` (`[R, 1]` f32) halving the interval in the
/// [`to_log`] coordinate (or plainly, near convergence), and whether none exists (`u8`).
fn midpoint(lo: &Tensor, hi: &Tensor) -> Result<(Tensor, Tensor)> {
    let m1 = from_log(&((to_log(lo)? + to_log(hi)?)? * 0.5)?)?;
    let (l64, h64) = (lo.to_dtype(DType::F64)?, hi.to_dtype(DType::F64)?);
    let m2 = ((l64 + h64)? * 0.5)?.to_dtype(DType::F32)?;
    let inside = m1.gt(lo)?.mul(&m1.lt(hi)?)?;
    let mid = inside.where_cond(&m1, &m2)?;
    let done = m2.le(lo)?.maximum(&m2.ge(hi)?)?;
    Ok((mid, done))
}

/// The shortest prefix (value descending, id ascending) of the tokens with `x > -inf` whose
/// weight `w` reaches the goal: `>= goal`, or `> goal` when `strict` (an inverse-CDF draw in
/// value order). `x` and `w` are `[R, Vp]` (f32; `x = -inf` and `w = 0` outside the support,
/// `w` a non-increasing function of `x` on it). Returns the cut and the kept mass `[R, 1]` f64.
/// Rows without support give an arbitrary cut.
pub(crate) fn prefix_cut(
    x: &Tensor,
    w: &Tensor,
    goal: Goal<'_>,
    strict: bool,
) -> Result<(Cut, Tensor)> {
    let (r, vp) = x.dims2()?;
    let dev = x.device();
    let zeros = w.zeros_like()?;
    let mass =
        |t: &Tensor| -> Result<Tensor> { row_sums(&x.broadcast_ge(t)?.where_cond(w, &zeros)?) };
    let pinf = Tensor::full(f32::INFINITY, (r, vp), dev)?;
    let lo0 = x
        .gt(f64::NEG_INFINITY)?
        .where_cond(x, &pinf)?
        .min_keepdim(1)?;
    let max = x.max_keepdim(1)?;
    let step = max.abs()?.affine(1.0 / 1_048_576.0, 1e-37)?;
    let hi0 = (&max + step)?;
    let ok = lo0
        .abs()?
        .le(f64::from(f32::MAX))?
        .mul(&hi0.abs()?.le(f64::from(f32::MAX))?)?;
    let f0 = Tensor::zeros((r, 1), DType::F32, dev)?;
    let mut lo = ok.where_cond(&lo0, &f0)?;
    let mut hi = ok.where_cond(&hi0, &f0)?;
    let total = mass(&lo)?;
    let target = match goal {
        Goal::Absolute(t) => t.clone(),
        Goal::Fraction(f) => (f * &total)?,
    };
    let mut m_lo = total;
    let mut m_hi = Tensor::zeros((r, 1), DType::F64, dev)?;
    for round in 0..MAX_ROUNDS {
        let (mid, done) = midpoint(&lo, &hi)?;
        if round >= 24 && round % 4 == 0 {
            let left = done.to_dtype(DType::U32)?.sum_all()?.to_scalar::<u32>()?;
            if left as usize == r {
                break;
            }
        }
        let m = mass(&mid)?;
        let p = if strict {
            m.gt(&target)?
        } else {
            m.ge(&target)?
        };
        lo = p.where_cond(&mid, &lo)?;
        m_lo = p.where_cond(&m, &m_lo)?;
        hi = p.where_cond(&hi, &mid)?;
        m_hi = p.where_cond(&m_hi, &m)?;
    }
    // `lo` is the value where the prefix ends; ties there are taken lowest id first.
    let eq = x.broadcast_eq(&lo)?.to_dtype(DType::F32)?;
    let n_eq = eq.sum_keepdim(1)?.to_dtype(DType::F64)?;
    let w_eq = eq.mul(w)?.max_keepdim(1)?.to_dtype(DType::F64)?;
    let need = ((&target - &m_hi)? / &w_eq)?;
    let need = if strict {
        (need.floor()? + 1.0)?
    } else {
        need.ceil()?
    };
    let one = Tensor::ones((r, 1), DType::F64, dev)?;
    let need = need.maximum(&one)?.minimum(&n_eq.maximum(&one)?)?;
    // A NaN (no support) becomes 1 through the comparisons above only on some backends.
    let need = need.ge(1.0)?.where_cond(&need, &one)?;
    let last = Tensor::full((vp - 1) as u32, (r, 1), dev)?;
    let id = pick(&eq, &(need.clone() - 0.5)?, &last)?;
    let kept = (m_hi + need.mul(&w_eq)?)?;
    Ok((Cut { value: lo, id }, kept))
}

/// The top-`k` tokens (value descending, id ascending; finite values only) of logits `[R, Vp]`
/// with `k` per row (`[R, 1]` f64, `>= 1`); rows with no more than `k` finite values keep all.
pub(crate) fn top_k_cut(x: &Tensor, k: &Tensor) -> Result<Cut> {
    let ones = x.gt(f64::NEG_INFINITY)?.to_dtype(DType::F32)?;
    let n = row_sums(&ones)?;
    let k = k.minimum(&n)?;
    let (cut, _) = prefix_cut(x, &ones, Goal::Absolute(&k), false)?;
    Ok(cut)
}

/// One f32 per row, uploaded to `dev` as `[R, 1]`.
pub(crate) fn column_f32(v: &[f32], dev: &Device) -> Result<Tensor> {
    Ok(Tensor::from_slice(v, (v.len(), 1), dev)?)
}

/// One f64 per row, uploaded to `dev` as `[R, 1]`.
pub(crate) fn column_f64(v: &[f64], dev: &Device) -> Result<Tensor> {
    Ok(Tensor::from_slice(v, (v.len(), 1), dev)?)
}

/// Column ids `[1, n]` as f32 (exact below `2^24`; one-hot proposals).
pub(crate) fn ids_f32(n: usize, dev: &Device) -> Result<Tensor> {
    Ok(col_ids(n, dev)?.to_dtype(DType::F32)?)
}

/// `[R, 1]` u8 mask selecting rows by a host flag.
pub(crate) fn row_flags(flags: &[bool], dev: &Device) -> Result<Tensor> {
    let v: Vec<u8> = flags.iter().map(|&f| u8::from(f)).collect();
    Ok(Tensor::from_slice(&v, (v.len(), 1), dev)?)
}

/// Broadcast a `[R, 1]` mask to `[R, n]`.
pub(crate) fn widen(mask: &Tensor, n: usize) -> Result<Tensor> {
    let r = mask.dim(0)?;
    Ok(mask.broadcast_as((r, n))?.contiguous()?)
}
