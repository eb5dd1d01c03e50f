//! Top-k and top-p (nucleus) truncation without sorting the vocabulary.
//!
//! Tokens are ordered by value descending, ties by lower id. Both truncations keep a prefix of
//! that order, so the kept set is described by its last member, a [`Cut`]. To find it we bucket
//! the row by distance from its max (a histogram of counts and probability mass), locate the one
//! bucket where the prefix ends, and sort only that bucket's members.

use super::fastmath::exp;
use super::view::{Floats, for_each_block};

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

/// What the prefix must reach.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Goal {
    /// The `k` first tokens.
    Count(usize),
    /// The shortest prefix whose probability mass is at least this fraction of the total.
    Mass(f64),
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

/// Find the prefix of `row` (among tokens that `within` keeps, and finite ones) that meets
/// `goal`, with probabilities `∝ exp((x - max)·s)` (`s > 0`).
pub(crate) fn find_cut(row: Floats<'_>, max: f32, s: f32, within: Option<Cut>, goal: Goal) -> Kept {
    let buckets = row.len().next_power_of_two().clamp(8, MAX_BUCKETS);
    let mut count = vec![0u32; buckets];
    let mut mass = vec![0f64; buckets];
    let per = buckets as f32 / SPAN;
    let bucket = |v: f32| (((max - v) * s * per) as usize).min(buckets - 1);
    let inside = |v: f32, id: usize| v > f32::NEG_INFINITY && within.is_none_or(|c| c.keeps(v, id));
    for_each_block(row, |start, block| {
        for (j, &v) in block.iter().enumerate() {
            if inside(v, start + j) {
                let b = bucket(v);
                count[b] += 1;
                mass[b] += f64::from(exp((v - max) * s));
            }
        }
    });
    let total_mass: f64 = mass.iter().sum();
    let total_count: u64 = count.iter().map(|&c| u64::from(c)).sum();
    // Locate the bucket where the goal is met.
    let (mut cum_count, mut cum_mass) = (0u64, 0f64);
    let mut edge = None;
    match goal {
        Goal::Count(k) => {
            if (k as u64) < total_count {
                for b in 0..buckets {
                    if cum_count + u64::from(count[b]) >= k as u64 {
                        edge = Some(b);
                        break;
                    }
                    cum_count += u64::from(count[b]);
                    cum_mass += mass[b];
                }
            }
        }
        Goal::Mass(frac) => {
            if frac < 1.0 {
                let target = frac * total_mass;
                let last_nonempty = (0..buckets).rev().find(|&b| count[b] > 0);
                for b in 0..buckets {
                    if count[b] > 0 && (cum_mass + mass[b] >= target || Some(b) == last_nonempty) {
                        edge = Some(b);
                        break;
                    }
                    cum_count += u64::from(count[b]);
                    cum_mass += mass[b];
                }
            }
        }
    }
    let Some(edge) = edge else {
        return Kept {
            cut: None,
            mass: total_mass,
        };
    };
    // Sort only the edge bucket.
    let mut members: Vec<(f32, usize)> = Vec::with_capacity(count[edge] as usize);
    for_each_block(row, |start, block| {
        for (j, &v) in block.iter().enumerate() {
            if inside(v, start + j) && bucket(v) == edge {
                members.push((v, start + j));
            }
        }
    });
    members.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut kept_mass = cum_mass;
    let mut last = members[0];
    for (taken, &(v, id)) in members.iter().enumerate() {
        last = (v, id);
        kept_mass += f64::from(exp((v - max) * s));
        let done = match goal {
            Goal::Count(k) => cum_count + taken as u64 + 1 >= k as u64,
            Goal::Mass(frac) => kept_mass >= frac * total_mass,
        };
        if done {
            break;
        }
    }
    Kept {
        cut: Some(Cut {
            value: last.0,
            id: last.1,
        }),
        mass: kept_mass,
    }
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
        let within = k.and_then(|k| find_cut(row, m, s, None, Goal::Count(k)).cut);
        let cut = find_cut(row, m, s, within, Goal::Mass(p)).cut.or(within);
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
