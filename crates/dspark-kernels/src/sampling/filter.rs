//! Top-k and top-p (nucleus) truncation without sorting the vocabulary.
//!
//! Tokens are ordered by value descending, ties by lower id. Both truncations keep a prefix of
//! that order, so the kept set is described by its last member, a [`Cut`]. To find it we bucket
//! the row by distance from its max (a histogram of counts and probability mass), locate the one
//! bucket where the prefix ends, and sort only that bucket's members.

use crate::cpu::exp;
use crate::view::{Floats, for_each_block};

/// The last kept token of a value-descending, id-ascending prefix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Cut {
    /// Its value.
    pub value: f32,
    /// Its id.
    pub id: usize,
}

impl Cut {
    /// Whether the token `(v, id)` is in the prefix.
    #[inline(always)]
    pub fn keeps(&self, v: f32, id: usize) -> bool {
        v > self.value || (v == self.value && id <= self.id)
    }
}

/// Largest number of histogram buckets (short rows use fewer) and the span of scaled distance
/// `(max - x)·s` they cover; the last bucket also holds everything further away.
const MAX_BUCKETS: usize = 1024;
const SPAN: f32 = 32.0;

/// The kept set of a truncation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kept {
    /// `None` when every finite token is kept.
    pub cut: Option<Cut>,
    /// `Σ exp((x - max)·s)` over the kept tokens.
    pub mass: f64,
}

/// Top-p over a whole row: the shortest prefix (value descending, id ascending; finite values)
/// whose probability mass, `∝ exp((x - max)·s)` with `s > 0`, is at least `top_p` of the total.
/// A histogram of mass by distance from `max` finds the bucket where the prefix ends; only that
/// bucket is sorted.
pub(crate) fn top_p_cut(row: Floats<'_>, max: f32, s: f32, top_p: f64) -> Kept {
    let buckets = row.len().next_power_of_two().clamp(8, MAX_BUCKETS);
    let mut count = vec![0u32; buckets];
    let mut mass = vec![0f64; buckets];
    let per = buckets as f32 / SPAN;
    let bucket = |v: f32| (((max - v) * s * per) as usize).min(buckets - 1);
    for_each_block(row, |_, block| {
        for &v in block {
            if v > f32::NEG_INFINITY {
                let b = bucket(v);
                count[b] += 1;
                mass[b] += f64::from(exp((v - max) * s));
            }
        }
    });
    let total: f64 = mass.iter().sum();
    if top_p >= 1.0 {
        return Kept {
            cut: None,
            mass: total,
        };
    }
    let target = top_p * total;
    let last_nonempty = (0..buckets).rev().find(|&b| count[b] > 0).unwrap_or(0);
    let mut cum = 0f64;
    let mut edge = last_nonempty;
    for b in 0..buckets {
        if count[b] > 0 && cum + mass[b] >= target {
            edge = b;
            break;
        }
        cum += mass[b];
    }
    // Sort only the edge bucket.
    let mut members: Vec<(f32, usize)> = Vec::with_capacity(count[edge] as usize);
    for_each_block(row, |start, block| {
        for (j, &v) in block.iter().enumerate() {
            if v > f32::NEG_INFINITY && bucket(v) == edge {
                members.push((v, start + j));
            }
        }
    });
    members.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut kept = cum;
    let mut last = members.first().copied().unwrap_or((max, 0));
    for &(v, id) in &members {
        last = (v, id);
        kept += f64::from(exp((v - max) * s));
        if kept >= target {
            break;
        }
    }
    Kept {
        cut: Some(Cut {
            value: last.0,
            id: last.1,
        }),
        mass: kept,
    }
}

/// Order of a prefix: value descending, then id ascending.
fn before(a: &(f32, usize), b: &(f32, usize)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// The `k` first tokens of `row` (finite values only), sorted by value descending then id
/// ascending. One pass with a rising threshold: a block whose max is below the threshold is
/// skipped after one vectorized max; survivors are buffered and the buffer is cut back to `k` by
/// partial selection whenever it reaches `2k` (no full sort of the vocabulary).
pub(crate) fn top_k_members(row: Floats<'_>, k: usize) -> Vec<(f32, usize)> {
    // Never more members than the row has (callers pass `k < len`; this keeps the buffer
    // bounded by the row for any `k`).
    let k = k.min(row.len());
    if k == 0 {
        return Vec::new();
    }
    let mut buf: Vec<(f32, usize)> = Vec::with_capacity(2 * k + crate::view::BLOCK);
    // Once the buffer has been cut, a token must beat `thr` strictly: ties with the k-th value
    // lose to it because they come later (higher id).
    let mut thr = f32::NEG_INFINITY;
    for_each_block(row, |start, block| {
        if crate::cpu::max_and_nans(block).0 <= thr {
            return;
        }
        for (j, &v) in block.iter().enumerate() {
            if v > thr {
                buf.push((v, start + j));
            }
        }
        if buf.len() >= 2 * k {
            buf.select_nth_unstable_by(k - 1, before);
            buf.truncate(k);
            thr = buf.iter().fold(f32::INFINITY, |m, x| m.min(x.0));
        }
    });
    buf.sort_unstable_by(before);
    buf.truncate(k);
    buf
}

/// Top-p over an already sorted candidate list (value descending, id ascending) at scale `s`:
/// the shortest prefix with mass `>= top_p` of the list's mass. Returns the cut and the kept mass
/// (relative to `max`).
pub(crate) fn top_p_of_sorted(members: &[(f32, usize)], max: f32, s: f32, top_p: f64) -> Kept {
    let w: Vec<f64> = members
        .iter()
        .map(|&(v, _)| f64::from(exp((v - max) * s)))
        .collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    for (i, &wi) in w.iter().enumerate() {
        acc += wi;
        if top_p < 1.0 && acc >= top_p * total {
            let (value, id) = members[i];
            return Kept {
                cut: Some(Cut { value, id }),
                mass: acc,
            };
        }
    }
    let cut = members.last().map(|&(value, id)| Cut { value, id });
    Kept { cut, mass: total }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference: full sort.
    fn reference(x: &[f32], s: f32, k: Option<usize>, p: f64) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..x.len()).filter(|&i| x[i] > f32::NEG_INFINITY).collect();
        idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
        if let Some(k) = k {
            idx.truncate(k);
        }
        let m = x[idx[0]];
        let w: Vec<f64> = idx
            .iter()
            .map(|&i| (f64::from(x[i] - m) * f64::from(s)).exp())
            .collect();
        let total: f64 = w.iter().sum();
        let mut acc = 0.0;
        let mut out = Vec::new();
        for (i, &id) in idx.iter().enumerate() {
            out.push(id);
            acc += w[i];
            if acc >= p * total {
                break;
            }
        }
        out.sort();
        out
    }

    fn kept(x: &[f32], s: f32, k: Option<usize>, p: f64) -> Vec<usize> {
        let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let row = Floats::F32(x);
        let cut = match k {
            Some(k) => top_p_of_sorted(&top_k_members(row, k), m, s, p).cut,
            None => top_p_cut(row, m, s, p).cut,
        };
        (0..x.len())
            .filter(|&i| x[i] > f32::NEG_INFINITY && cut.is_none_or(|c| c.keeps(x[i], i)))
            .collect()
    }

    #[test]
    fn matches_a_full_sort_with_ties() {
        // Values with many exact ties and a masked tail.
        let mut x: Vec<f32> = (0..900).map(|i| ((i * 31 % 17) as f32) * 0.25).collect();
        x[5] = f32::NEG_INFINITY;
        for &(k, p) in &[
            (None, 0.5),
            (Some(3), 1.0),
            (Some(40), 0.9),
            (Some(10_000), 0.3),
            (None, 0.999),
            (Some(1), 0.2),
        ] {
            for &s in &[1.0f32, 0.3, 4.0] {
                assert_eq!(
                    kept(&x, s, k, p),
                    reference(&x, s, k, p),
                    "k={k:?} p={p} s={s}"
                );
            }
        }
    }

    #[test]
    fn spread_out_values_use_many_buckets() {
        let x: Vec<f32> = (0..2000).map(|i| -((i * 7 % 2000) as f32) * 0.05).collect();
        for &p in &[0.1, 0.5, 0.95] {
            assert_eq!(kept(&x, 1.0, None, p), reference(&x, 1.0, None, p));
        }
        assert_eq!(
            kept(&x, 1.0, Some(77), 1.0),
            reference(&x, 1.0, Some(77), 1.0)
        );
    }
}
