//! The machinery of the contract suite: running forwards of token lists and comparing their
//! outputs on the host.

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::models::{LogitRows, TargetInput, TargetModel};

/// A bad forward: what is wrong (or the expected code), tokens, width, num_tokens, capture ids.
pub(super) type Case<'a> = (&'a str, &'a [u32], usize, &'a [usize], &'a [usize]);

/// A violation of check `check`.
pub(super) fn fail(check: &str, message: impl std::fmt::Display) -> Error {
    Error::invalid("target", format!("contract check `{check}`: {message}"))
}

/// `r`, with an unexpected error turned into a violation of `check`.
pub(super) fn expect<R>(check: &str, what: &str, r: Result<R>) -> Result<R> {
    r.map_err(|e| fail(check, format!("{what} failed: [{}] {e}", e.code())))
}

/// `n` deterministic token ids in `[0, vocab)`.
pub(super) fn tokens(vocab: usize, seed: u64, n: usize) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

/// A forward's outputs on the host, as f32.
pub(super) struct Out {
    pub(super) logits: Vec<f32>,
    pub(super) hidden: Vec<f32>,
    /// Logit rows per request (`S` or 1), feature rows per request (`S`), `V`, `L·H`.
    pub(super) dims: [usize; 4],
    pub(super) dtype: DType,
}

impl Out {
    pub(super) fn logit(&self, b: usize, j: usize) -> &[f32] {
        let [s, _, v, _] = self.dims;
        &self.logits[(b * s + j) * v..][..v]
    }

    pub(super) fn hid(&self, b: usize, j: usize) -> &[f32] {
        let [_, s, _, w] = self.dims;
        &self.hidden[(b * s + j) * w..][..w]
    }
}

pub(super) fn host(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

/// [`close`] on both the logits and the hidden states of position `j` of request `b`, for
/// `(output, b, j)` on each side.
pub(super) fn close_at(
    check: &str,
    what: &str,
    (x, xb, xj): (&Out, usize, usize),
    (y, yb, yj): (&Out, usize, usize),
    tol: f32,
) -> Result<()> {
    close(
        check,
        &format!("{what}: logits"),
        x.logit(xb, xj),
        y.logit(yb, yj),
        tol,
    )?;
    close(
        check,
        &format!("{what}: hidden"),
        x.hid(xb, xj),
        y.hid(yb, yj),
        tol,
    )
}

/// `max |a − b| <= tol · max(1, max |b|)`, or a violation of `check` describing `what`.
pub(super) fn close(check: &str, what: &str, a: &[f32], b: &[f32], tol: f32) -> Result<()> {
    let scale = b.iter().fold(1f32, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| if x == y { 0.0 } else { (x - y).abs() })
        .fold(
            0f32,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        );
    if a.len() != b.len() || diff > tol * scale {
        return Err(fail(
            check,
            format!(
                "{what}: max |diff| {diff} exceeds {tol} x {scale} (lengths {} and {})",
                a.len(),
                b.len()
            ),
        ));
    }
    Ok(())
}

pub(super) struct Suite<'a, T: TargetModel> {
    pub(super) t: &'a T,
    pub(super) vocab: usize,
}

impl<T: TargetModel> Suite<'_, T> {
    /// A cache for `batch` requests.
    pub(super) fn cache(&self, check: &str, batch: usize) -> Result<T::Cache> {
        expect(check, "new_cache", self.t.new_cache(batch))
    }

    /// Forward `rows` (one token list per request, padded to the longest) and check the
    /// output shapes and that real positions are finite.
    pub(super) fn run(
        &self,
        check: &str,
        cache: &mut T::Cache,
        rows: &[&[u32]],
        logits: LogitRows<'_>,
        capture: &[usize],
    ) -> Result<Out> {
        let width = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        let mut flat = vec![0u32; rows.len() * width];
        for (b, r) in rows.iter().enumerate() {
            flat[b * width..b * width + r.len()].copy_from_slice(r);
        }
        let num: Vec<usize> = rows.iter().map(|r| r.len()).collect();
        let input = TargetInput {
            tokens: &flat,
            width,
            num_tokens: &num,
            logits,
        };
        let before = self.t.cache_lengths(cache);
        let out = expect(check, "forward", self.t.forward(cache, &input, capture))?;
        let s = logits.rows(width);
        let w = capture.len() * self.t.hidden_size();
        let (b_n, v) = (rows.len(), self.vocab);
        if out.logits.dims() != [b_n, s, v] || out.hidden_states.dims() != [b_n, width, w] {
            return Err(fail(
                check,
                format!(
                    "output shapes logits {:?}, hidden_states {:?}; expected [{b_n}, {s}, {v}] \
                     and [{b_n}, {width}, {w}]",
                    out.logits.dims(),
                    out.hidden_states.dims()
                ),
            ));
        }
        let after = self.t.cache_lengths(cache);
        let grown: Vec<usize> = before.iter().zip(&num).map(|(l, n)| l + n).collect();
        if after != grown {
            return Err(fail(
                check,
                format!("cache lengths {after:?} after a forward of {num:?} onto {before:?}"),
            ));
        }
        let o = Out {
            logits: expect(check, "reading logits", host(&out.logits))?,
            hidden: expect(check, "reading hidden_states", host(&out.hidden_states))?,
            dims: [s, width, v, w],
            dtype: out.logits.dtype(),
        };
        for (b, &n) in num.iter().enumerate() {
            // Every row asked for must be finite (Last rows with no token: arbitrary but finite).
            let real = match logits {
                LogitRows::All => n,
                LogitRows::Last => 1,
                LogitRows::Tail(t) => t[b],
            };
            for j in 0..real {
                if o.logit(b, j).iter().any(|x| !x.is_finite()) {
                    return Err(fail(
                        check,
                        format!("non-finite logits at row {b}, position {j}"),
                    ));
                }
            }
            for j in 0..n {
                if o.hid(b, j).iter().any(|x| !x.is_finite()) {
                    return Err(fail(
                        check,
                        format!("non-finite hidden states at row {b}, position {j}"),
                    ));
                }
            }
        }
        Ok(o)
    }

    /// The error of a forward that must fail, and that it left the cache alone.
    pub(super) fn refuse(
        &self,
        check: &str,
        cache: &mut T::Cache,
        input: &TargetInput<'_>,
        capture: &[usize],
    ) -> Result<()> {
        let before = self.t.cache_lengths(cache);
        if self.t.forward(cache, input, capture).is_ok() {
            return Err(fail(check, "the forward succeeded"));
        }
        if self.t.cache_lengths(cache) != before {
            return Err(fail(check, "a failed forward changed the cache lengths"));
        }
        Ok(())
    }
}
