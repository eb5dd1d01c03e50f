//! Borrowed, zero-copy views of kernel inputs and the small parameter types the kernels share.
//!
//! Every kernel's core works on these views so that the Python glue can hand over DLPack/numpy
//! memory without copying; the candle-`Tensor` fronts build the same views over tensor storage.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use crate::error::{Error, Result};

/// Widen bf16 to f32 (a shift; vectorizes).
#[inline(always)]
pub(crate) fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
    for (o, v) in dst.iter_mut().zip(src) {
        *o = f32::from_bits(u32::from(v.to_bits()) << 16);
    }
}

/// Run `f` on the values of `t` where they lie: `Some` when `t` is a contiguous f32, bf16 or
/// f16 CPU tensor, `None` (nothing run, nothing copied) otherwise.
pub(crate) fn borrow_floats<R>(t: &Tensor, f: impl FnOnce(Floats<'_>) -> R) -> Option<R> {
    if !t.device().is_cpu() {
        return None;
    }
    let (storage, layout) = t.storage_and_layout();
    let (lo, hi) = layout.contiguous_offsets()?;
    let floats = match &*storage {
        Storage::Cpu(CpuStorage::F32(all)) => Floats::F32(&all[lo..hi]),
        Storage::Cpu(CpuStorage::BF16(all)) => Floats::BF16(&all[lo..hi]),
        Storage::Cpu(CpuStorage::F16(all)) => Floats::F16(&all[lo..hi]),
        _ => return None,
    };
    Some(f(floats))
}

/// Run `f` on the values of `t` (named `name` in errors) as host floats: borrowed where they
/// lie (see [`borrow_floats`]), else copied to the host once, contiguous (f32, bf16 and f16 in
/// their dtype, f64 narrowed to f32). Integer tensors are `unsupported-dtype`.
pub fn with_floats<R>(
    t: &Tensor,
    name: &str,
    f: impl FnOnce(Floats<'_>) -> Result<R>,
) -> Result<R> {
    let host;
    let t = match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16
            if t.device().is_cpu() && t.layout().is_contiguous() =>
        {
            t
        }
        DType::F32 | DType::F16 | DType::BF16 => {
            host = t.to_device(&Device::Cpu)?.contiguous()?;
            &host
        }
        DType::F64 => {
            host = t
                .to_dtype(DType::F32)?
                .to_device(&Device::Cpu)?
                .contiguous()?;
            &host
        }
        other => {
            return Err(Error::UnsupportedDtype {
                name: name.to_string(),
                message: format!("{other:?} (need f32, f16 or bf16)"),
            });
        }
    };
    borrow_floats(t, f).unwrap_or_else(|| {
        Err(Error::Internal {
            message: format!("{name}: not contiguous host floats after a copy to the host"),
        })
    })
}

/// A contiguous, row-major run of floating-point values in one of the supported dtypes.
///
/// All kernel math is done in `f32`; `f16`/`bf16` inputs are widened block by block.
#[derive(Debug, Clone, Copy)]
pub enum Floats<'a> {
    /// 32-bit floats.
    F32(&'a [f32]),
    /// IEEE half precision.
    F16(&'a [f16]),
    /// bfloat16.
    BF16(&'a [bf16]),
}

impl<'a> Floats<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Floats::F32(s) => s.len(),
            Floats::F16(s) => s.len(),
            Floats::BF16(s) => s.len(),
        }
    }

    /// `true` when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size of one element in bytes.
    pub fn elem_bytes(&self) -> usize {
        match self {
            Floats::F32(_) => 4,
            Floats::F16(_) | Floats::BF16(_) => 2,
        }
    }

    /// The sub-view `[start, start + len)`. Panics if out of bounds: kernels only call it after
    /// validating shapes.
    #[inline]
    pub(crate) fn sub(&self, start: usize, len: usize) -> Floats<'a> {
        match self {
            Floats::F32(s) => Floats::F32(&s[start..start + len]),
            Floats::F16(s) => Floats::F16(&s[start..start + len]),
            Floats::BF16(s) => Floats::BF16(&s[start..start + len]),
        }
    }

    /// Element `i` as `f32`.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            Floats::F32(s) => s[i],
            Floats::F16(s) => s[i].to_f32(),
            Floats::BF16(s) => s[i].to_f32(),
        }
    }

    /// Append `[start, start + len)` widened to `f32` to `out`; `None` (nothing appended) when
    /// the range is outside the view.
    pub fn extend_f32(&self, start: usize, len: usize, out: &mut Vec<f32>) -> Option<()> {
        let end = start.checked_add(len).filter(|&e| e <= self.len())?;
        let at = out.len();
        out.resize(at + len, 0.0);
        self.read_into(start, &mut out[at..]);
        debug_assert_eq!(out.len(), at + end - start);
        Some(())
    }

    /// Every value widened to `f32`, in a new vector.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.len()];
        self.read_into(0, &mut out);
        out
    }

    /// Widen `[start, start + out.len())` into `out`.
    #[inline(always)]
    pub(crate) fn read_into(&self, start: usize, out: &mut [f32]) {
        let n = out.len();
        match self {
            Floats::F32(s) => out.copy_from_slice(&s[start..start + n]),
            Floats::F16(s) => s[start..start + n].convert_to_f32_slice(out),
            Floats::BF16(s) => widen_bf16(&s[start..start + n], out),
        }
    }
}

/// Block length used when walking a row: `f16`/`bf16` rows are widened this many values at a time.
pub(crate) const BLOCK: usize = 256;

/// Like [`for_each_block`], but expands the body in place (no closure), so that it is compiled
/// with the target features of the enclosing function. The body runs inside a `for` loop.
macro_rules! for_each_block_inline {
    ($row:expr, |$start:ident, $block:ident| $body:block) => {
        match $row {
            $crate::view::Floats::F32(s) => {
                for (i, c) in s.chunks($crate::view::BLOCK).enumerate() {
                    let $start = i * $crate::view::BLOCK;
                    let $block: &[f32] = c;
                    $body
                }
            }
            $crate::view::Floats::F16(s) => {
                let mut buf = [0f32; $crate::view::BLOCK];
                for (i, c) in s.chunks($crate::view::BLOCK).enumerate() {
                    let $start = i * $crate::view::BLOCK;
                    half::slice::HalfFloatSliceExt::convert_to_f32_slice(c, &mut buf[..c.len()]);
                    let $block: &[f32] = &buf[..c.len()];
                    $body
                }
            }
            $crate::view::Floats::BF16(s) => {
                let mut buf = [0f32; $crate::view::BLOCK];
                for (i, c) in s.chunks($crate::view::BLOCK).enumerate() {
                    let $start = i * $crate::view::BLOCK;
                    $crate::view::widen_bf16(c, &mut buf[..c.len()]);
                    let $block: &[f32] = &buf[..c.len()];
                    $body
                }
            }
        }
    };
}
pub(crate) use for_each_block_inline;

/// Call `f(start, block)` for consecutive blocks of at most [`BLOCK`] values of `row`, widened to
/// `f32` (zero-copy for `f32` rows).
#[inline(always)]
pub(crate) fn for_each_block(row: Floats<'_>, mut f: impl FnMut(usize, &[f32])) {
    match row {
        Floats::F32(s) => {
            for (i, c) in s.chunks(BLOCK).enumerate() {
                f(i * BLOCK, c);
            }
        }
        Floats::F16(s) => {
            let mut buf = [0f32; BLOCK];
            for (i, c) in s.chunks(BLOCK).enumerate() {
                let b = &mut buf[..c.len()];
                c.convert_to_f32_slice(b);
                f(i * BLOCK, b);
            }
        }
        Floats::BF16(s) => {
            let mut buf = [0f32; BLOCK];
            for (i, c) in s.chunks(BLOCK).enumerate() {
                let b = &mut buf[..c.len()];
                widen_bf16(c, b);
                f(i * BLOCK, b);
            }
        }
    }
}

/// `bad-shape` naming `name` unless `len` values (`unit`s) fill `dims`; the message counts an
/// overflowing product as `usize::MAX` (`saturate`) or in words.
fn check_len(name: &str, dims: &[usize], len: usize, unit: &str, saturate: bool) -> Result<()> {
    let want = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if want == Some(len) {
        return Ok(());
    }
    let need = match want {
        Some(w) => w.to_string(),
        None if saturate => usize::MAX.to_string(),
        None => "an overflowing number of".to_string(),
    };
    Err(Error::bad_shape(
        name,
        format!("dims {dims:?} need {need} {unit}, got {len}"),
    ))
}

/// A `[B, K, V]` row-major stack of rows (batch, slot, vocabulary or hidden).
#[derive(Debug, Clone, Copy)]
pub struct Rows3<'a> {
    /// The values, `B·K·V` of them.
    pub data: Floats<'a>,
    /// `[B, K, V]`.
    pub dims: [usize; 3],
}

impl<'a> Rows3<'a> {
    /// Wrap `data` as `[B, K, V]`; errors (`bad-shape`) when the length is not `B·K·V`.
    pub fn new(data: Floats<'a>, dims: [usize; 3]) -> Result<Self> {
        let r = Rows3 { data, dims };
        r.check("rows")?;
        Ok(r)
    }

    /// Validate the length against `dims`, naming the argument `name` in the error.
    pub fn check(&self, name: &str) -> Result<()> {
        check_len(name, &self.dims, self.data.len(), "values", false)
    }

    /// Row `(b, k)` as a view of `V` values.
    #[inline]
    pub fn row(&self, b: usize, k: usize) -> Floats<'a> {
        let v = self.dims[2];
        self.data.sub((b * self.dims[1] + k) * v, v)
    }
}

/// A `[rows, cols]` row-major matrix.
#[derive(Debug, Clone, Copy)]
pub struct Mat<'a> {
    /// The values, `rows·cols` of them.
    pub data: Floats<'a>,
    /// `[rows, cols]`.
    pub dims: [usize; 2],
}

impl<'a> Mat<'a> {
    /// Wrap `data` as `[rows, cols]`; errors (`bad-shape`) when the length is not `rows·cols`.
    pub fn new(data: Floats<'a>, dims: [usize; 2]) -> Result<Self> {
        let m = Mat { data, dims };
        m.check("matrix")?;
        Ok(m)
    }

    /// Validate the length against `dims`, naming the argument `name` in the error.
    pub fn check(&self, name: &str) -> Result<()> {
        check_len(name, &self.dims, self.data.len(), "values", true)
    }

    /// Row `i` as a view of `cols` values.
    #[inline]
    pub fn row(&self, i: usize) -> Floats<'a> {
        self.data.sub(i * self.dims[1], self.dims[1])
    }
}

/// A `[rows, cols]` row-major matrix of token ids (e.g. `draft_tokens` `[B, K]`).
///
/// The shape travels with the ids so that a transposed `[K, B]` input (same element count)
/// is a `bad-shape` error rather than a silently misread batch.
#[derive(Debug, Clone, Copy)]
pub struct Tokens<'a> {
    /// The ids, `rows·cols` of them.
    pub data: &'a [i64],
    /// `[rows, cols]`.
    pub dims: [usize; 2],
}

impl<'a> Tokens<'a> {
    /// Wrap `data` as `[rows, cols]`; errors (`bad-shape`) when the length is not `rows·cols`.
    pub fn new(data: &'a [i64], dims: [usize; 2]) -> Result<Self> {
        let t = Tokens { data, dims };
        t.check("tokens")?;
        Ok(t)
    }

    /// Validate the length against `dims`, naming the argument `name` in the error.
    pub fn check(&self, name: &str) -> Result<()> {
        check_len(name, &self.dims, self.data.len(), "ids", true)
    }
}

/// Random seeds for a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seeds {
    /// One seed for the call: row `r` draws from stream `(seed, r)`.
    Scalar(u64),
    /// One seed per request: row `r` draws from stream `(seeds[r])`, independent of its row
    /// index, so results do not depend on batch order.
    PerRequest(Vec<u64>),
}

/// A parameter given once for the whole batch or once per request.
#[derive(Debug, Clone, PartialEq)]
pub enum PerRequest<T> {
    /// The same value for every request.
    All(T),
    /// One value per request (length must equal the batch size).
    Each(Vec<T>),
}

impl<T: Clone> PerRequest<T> {
    /// Expand to one value per request; errors (`bad-shape`) when an `Each` list has the wrong
    /// length.
    pub fn resolve(&self, batch: usize, name: &str) -> Result<Vec<T>> {
        match self {
            PerRequest::All(v) => Ok(vec![v.clone(); batch]),
            PerRequest::Each(vs) if vs.len() == batch => Ok(vs.clone()),
            PerRequest::Each(vs) => Err(Error::bad_shape(
                name,
                format!("{} per-request values for a batch of {batch}", vs.len()),
            )),
        }
    }
}
