//! The target distribution `p` of one verified row, and the draft distribution `q`.
//!
//! `p = softmax(logits / T)`, then top-k, then top-p, renormalized; built with one statistics
//! pass over the row (plus histogram passes only when a truncation is active).

use super::categorical::{BlockSum, RowStats, row_stats, sample_blocks, sample_cut};
use super::filter::{Cut, top_k_members, top_p_cut, top_p_of_sorted};
use crate::cpu::exp;
use crate::error::{Error, Result};
use crate::view::Floats;

/// A categorical distribution `∝ exp((x - max)·s)` over the tokens a cut keeps.
#[derive(Debug, Clone)]
pub(crate) struct Dist<'a> {
    /// The row of raw logits.
    pub row: Floats<'a>,
    /// Statistics of the row at scale `s`.
    pub stats: RowStats,
    /// `1/T`.
    pub s: f32,
    /// Truncation (`None`: every finite token).
    pub cut: Option<Cut>,
    /// Normalizer over the kept tokens.
    pub z: f64,
    /// With top-k: the kept tokens, value descending (sampling walks only these).
    pub members: Option<Vec<(f32, usize)>>,
}

/// Error for a row holding NaN or `+inf`.
pub(crate) fn non_finite(name: &str, what: String) -> Error {
    Error::NonFinite {
        name: name.to_string(),
        message: what,
    }
}

/// Where a row without a finite entry has none: the Markov sampler's valid vocabulary, or a
/// verified row once its mask is applied.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scope {
    /// `… in the valid vocabulary`.
    Vocabulary,
    /// `… (every token masked)`.
    Masked,
}

/// `non-finite` naming `name`: a NaN or `+inf` in the row `at` (e.g. `base logits (request 0,
/// slot 1)`).
pub(crate) fn nan_in(name: &str, at: &str) -> Error {
    non_finite(name, format!("NaN or +inf in {at}"))
}

/// `invalid-argument` naming `name`: the row `at` has no finite entry in `scope`.
pub(crate) fn no_finite(name: &str, at: &str, scope: Scope) -> Error {
    let message = match scope {
        Scope::Vocabulary => format!("{at} has no finite entry in the valid vocabulary"),
        Scope::Masked => format!("{at} has no finite entry (every token masked)"),
    };
    Error::invalid(name, message)
}

/// The row checks every kernel shares, in the fast path's order: [`nan_in`] when the row `at`
/// of `name` holds a NaN or `+inf` (`nan`), else [`no_finite`] when it has no finite entry
/// (`empty`).
pub(crate) fn check_row(
    name: &str,
    nan: bool,
    empty: bool,
    scope: Scope,
    at: impl FnOnce() -> String,
) -> Result<()> {
    if nan {
        return Err(nan_in(name, &at()));
    }
    if empty {
        return Err(no_finite(name, &at(), scope));
    }
    Ok(())
}

impl<'a> Dist<'a> {
    /// Build the distribution of `row` at scale `s` with optional top-k / top-p (`1.0` = off).
    /// `blocks` receives the row's block sums (needed later by [`Dist::sample`]).
    pub fn new(
        row: Floats<'a>,
        s: f32,
        top_k: Option<usize>,
        top_p: f32,
        blocks: &mut Vec<BlockSum>,
        name: &str,
        where_: impl Fn() -> String,
    ) -> Result<Self> {
        let stats = row_stats(row, s, blocks);
        check_row(
            name,
            stats.non_finite(),
            !stats.has_finite(),
            Scope::Masked,
            where_,
        )?;
        let mut cut = None;
        let mut z = stats.total;
        let mut members = None;
        if let Some(k) = top_k.filter(|&k| k < row.len()) {
            // Top-k first (a short sorted list), then top-p within it.
            let mut m = top_k_members(row, k);
            let kept = top_p_of_sorted(&m, stats.max, s, f64::from(top_p));
            if let Some(c) = kept.cut {
                m.retain(|&(v, id)| c.keeps(v, id));
            }
            cut = kept.cut;
            z = kept.mass;
            members = Some(m);
        } else if top_p < 1.0 {
            let kept = top_p_cut(row, stats.max, s, f64::from(top_p));
            cut = kept.cut;
            z = kept.mass;
        }
        Ok(Dist {
            row,
            stats,
            s,
            cut,
            z,
            members,
        })
    }

    /// Unnormalized weight of token `v` with raw value `x` (0 outside the kept set).
    #[inline(always)]
    pub fn weight(&self, x: f32, v: usize) -> f64 {
        if x > f32::NEG_INFINITY && self.cut.is_none_or(|c| c.keeps(x, v)) {
            f64::from(exp((x - self.stats.max) * self.s))
        } else {
            0.0
        }
    }

    /// `p(v)`.
    pub fn prob(&self, v: usize) -> f64 {
        self.weight(self.row.get(v), v) / self.z
    }

    /// Draw one token with uniform `u` (`blocks` from [`Dist::new`]).
    pub fn sample(&self, blocks: &[BlockSum], u: f64) -> usize {
        if let Some(m) = &self.members {
            let target = u * self.z;
            let mut acc = 0f64;
            for &(v, id) in m {
                acc += self.weight(v, id);
                if acc > target {
                    return id;
                }
            }
            return m.last().map_or(self.stats.argmax, |&(_, id)| id);
        }
        match &self.cut {
            None => sample_blocks(self.row, &self.stats, self.s, blocks, u),
            Some(c) => sample_cut(
                self.row,
                self.stats.max,
                self.s,
                c,
                self.z,
                u,
                self.stats.argmax,
            ),
        }
    }
}
