//! The Rust model of `kernels/fused_common.cuh`: the same exp, weights, keys, block
//! reductions and radix selection, operation for operation, so a kernel and its model agree
//! bit for bit.

use super::layout::{FX_ONE, THREADS, VfChunk};
use crate::cpu::{Fused, exp_with};
use crate::view::Floats;

/// `ds_exp`: [`exp_with`] with fused multiply-adds.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    exp_with::<Fused>(x)
}

/// `ds_weight`: the weight of `x` in a row with max `m` at scale `s`.
#[inline(always)]
pub(crate) fn weight(x: f32, m: f32, s: f32) -> f32 {
    exp((x - m) * s)
}

/// `ds_wfx`: the weight in fixed point (`2^40` per unit), truncated.
#[inline(always)]
pub(crate) fn wfx(x: f32, m: f32, s: f32) -> u64 {
    (weight(x, m, s) * FX_ONE) as u64
}

/// `ds_finite_logit`.
#[inline(always)]
pub(crate) fn finite(x: f32) -> bool {
    x > f32::NEG_INFINITY && x < f32::INFINITY
}

/// `ds_key`: orders values as `f32::total_cmp` does.
#[inline(always)]
pub(crate) fn key(x: f32) -> u32 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// `ds_from_key`.
#[inline(always)]
pub(crate) fn from_key(k: u32) -> f32 {
    f32::from_bits(if k & 0x8000_0000 != 0 {
        k & 0x7fff_ffff
    } else {
        !k
    })
}

/// `DsCut`: the last member of a value-descending, id-ascending prefix, compared by key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct KeyCut {
    pub key: u32,
    pub id: u32,
}

impl KeyCut {
    /// `ds_keeps`.
    #[inline(always)]
    pub fn keeps(&self, x: f32, v: u32) -> bool {
        let k = key(x);
        k > self.key || (k == self.key && v <= self.id)
    }
}

/// `ds_warp_sum` over the 32 lanes' values. The kernel's xor-butterfly leaves every lane with
/// the bits of lane 0 (each step adds two values whose sum is the same either way round), and
/// lane 0's value is this halving tree: lane `l` plus lane `l + 16`, then `+ 8`, ... `+ 1`.
fn warp_sum<T: Copy + std::ops::Add<Output = T>>(mut a: [T; 32]) -> T {
    let mut n = 32;
    while n > 1 {
        n /= 2;
        for l in 0..n {
            a[l] = a[l] + a[l + n];
        }
    }
    a[0]
}

/// `ds_block_sum` / the f64 variant: each warp's butterfly, then the butterfly over the warps'
/// sums with zeros in the missing lanes.
pub(crate) fn block_sum<T: Copy + Default + std::ops::Add<Output = T>>(v: &[T; THREADS]) -> T {
    let mut warps = [T::default(); 32];
    for (w, slot) in warps.iter_mut().enumerate().take(THREADS / 32) {
        let mut lanes = [T::default(); 32];
        lanes.copy_from_slice(&v[w * 32..(w + 1) * 32]);
        *slot = warp_sum(lanes);
    }
    warp_sum(warps)
}

/// The chunk statistics of `vf_chunk` / `dspark_sb_bias`: `len` values (`get(j)`) starting at
/// row index `start`, thread `t` of the block holding values `t, t + 256, ...` (so walking the
/// chunk in order walks each thread's values in its own order). Max (NaN-ignoring), its first
/// index, the NaN count, and with `sum` the block sum of `exp((x - max)·s)`.
pub(crate) fn chunk_stats(
    len: usize,
    get: impl Fn(usize) -> f32,
    start: usize,
    sum: bool,
    s: f32,
) -> VfChunk {
    const NONE: u32 = u32::MAX;
    let mut lmax = [f32::NEG_INFINITY; THREADS];
    let mut larg = [NONE; THREADS];
    let mut nans = 0u32;
    for j in 0..len {
        let (t, v) = (j % THREADS, get(j));
        if v.is_nan() {
            nans += 1;
        } else if v > lmax[t] {
            lmax[t] = v;
            larg[t] = (start + j) as u32;
        }
    }
    let m = lmax
        .iter()
        .fold(f32::NEG_INFINITY, |w, &x| if x > w { x } else { w });
    let am = (0..THREADS)
        .filter(|&t| lmax[t] == m && m > f32::NEG_INFINITY)
        .map(|t| larg[t])
        .min()
        .unwrap_or(start as u32);
    let mut total = 0.0f32;
    if sum && m > f32::NEG_INFINITY && m < f32::INFINITY {
        let mut acc = [0f32; THREADS];
        for j in 0..len {
            acc[j % THREADS] += weight(get(j), m, s);
        }
        total = block_sum(&acc);
    }
    VfChunk {
        max: m,
        argmax: am,
        nans,
        sum: total,
    }
}

/// `vf_merge` / the block sampler's pick: a row's chunks merged in order: max, first argmax,
/// NaNs, and (with `sum`) the normalizer `Σ sum_c · exp((max_c - max)·s)` in f64.
pub(crate) fn merge_chunks(chunks: &[VfChunk], sum: bool, s: f32) -> (f32, u32, u32, f64) {
    let (mut best, mut arg, mut nn) = (f32::NEG_INFINITY, 0u32, 0u32);
    for c in chunks {
        nn += c.nans;
        if c.max > best {
            best = c.max;
            arg = c.argmax;
        }
    }
    let mut total = 0f64;
    if sum && best > f32::NEG_INFINITY && best < f32::INFINITY {
        for c in chunks {
            if c.sum > 0.0 {
                total += f64::from(c.sum) * f64::from(weight(c.max, best, s));
            }
        }
    }
    (best, arg, nn, total)
}

/// The validity of a row from its max and NaN count: `nonfinite` (NaN or `+inf`), `nofinite`
/// (no finite value) or 0.
pub(crate) fn validity(m: f32, nans: u32, nonfinite: u32, nofinite: u32) -> u32 {
    if nans > 0 || m == f32::INFINITY {
        nonfinite
    } else if m == f32::NEG_INFINITY {
        nofinite
    } else {
        0
    }
}

/// The inverse-CDF walk of `vf_draw_id` / `sb_pick_dense` over sums in id order: the last part
/// with positive weight at or before the first whose running total (from `before`) exceeds
/// `target`, and the running total before it.
pub(crate) fn walk_parts(
    parts: impl Iterator<Item = f64>,
    before: f64,
    target: f64,
) -> (usize, f64) {
    let (mut acc, mut at, mut at_pre) = (before, 0usize, before);
    for (i, w) in parts.enumerate() {
        if w > 0.0 {
            (at, at_pre) = (i, acc);
            if acc + w > target {
                break;
            }
        }
        acc += w;
    }
    (at, at_pre)
}

/// Goal of a radix selection (`DS_GOAL_*`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Goal {
    /// The first `k` values.
    Count(u64),
    /// At least `top_p` of the eligible mass (`ceil(top_p · total)`).
    Fraction(f32),
    /// The first value whose cumulative mass exceeds `floor(u · total)`.
    Draw(f64),
}

/// `DsRadix`: the result of a radix selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Radix {
    pub cut: KeyCut,
    /// Fixed-point mass of the prefix (`Goal::Count`: 0).
    pub mass: u64,
    /// Fixed-point mass of every eligible value (`Goal::Count`: 0).
    pub total: u64,
}

/// `ds_radix`: over the eligible values of `row` (finite and kept by `prior`), in value order
/// (descending, ties by id), the shortest prefix that reaches `goal`, by its last member.
/// `None` when no value is eligible. Integer histograms: the kernel's per-warp copies and
/// their merge give the same counts in any order, so the model is a plain scan.
pub(crate) fn radix(
    row: Floats<'_>,
    prior: Option<KeyCut>,
    goal: Goal,
    m: f32,
    s: f32,
) -> Option<Radix> {
    let with_mass = !matches!(goal, Goal::Count(_));
    let eligible = |v: usize| -> Option<f32> {
        let x = row.get(v);
        (finite(x) && prior.is_none_or(|c| c.keeps(x, v as u32))).then_some(x)
    };
    let (mut prefix, mut exhausted) = (0u32, false);
    let (mut above_cnt, mut above_mass) = (0u64, 0u64);
    let mut goal_v = 0u64;
    let mut total_mass = 0u64;
    let mut last_cnt = [0u32; 256];
    let mut digit = 0usize;
    for pass in 0..4u32 {
        let shift = 24 - 8 * pass;
        let mut cnt = [0u32; 256];
        let mut mass = [0u64; 256];
        for v in 0..row.len() {
            let Some(x) = eligible(v) else { continue };
            let k = key(x);
            if pass > 0 && (k >> (shift + 8)) != prefix {
                continue;
            }
            let d = ((k >> shift) & 255) as usize;
            cnt[d] += 1;
            if with_mass {
                mass[d] = mass[d].wrapping_add(wfx(x, m, s));
            }
        }
        if pass == 0 {
            let tc: u32 = cnt.iter().sum();
            total_mass = mass.iter().fold(0u64, |a, &b| a.wrapping_add(b));
            if tc == 0 {
                return None;
            }
            goal_v = match goal {
                Goal::Count(k) => k,
                Goal::Fraction(p) => (f64::from(p) * total_mass as f64).ceil() as u64,
                Goal::Draw(u) => (u * total_mass as f64) as u64,
            };
        }
        let (mut chosen, mut lowest) = (None, None);
        let (mut acnt, mut amass) = (above_cnt, above_mass);
        for d in (0..256).rev() {
            let c = cnt[d];
            if c == 0 {
                continue;
            }
            if !exhausted {
                let reach = match goal {
                    Goal::Count(_) => acnt + u64::from(c),
                    _ => amass.wrapping_add(mass[d]),
                };
                let hit = match goal {
                    Goal::Draw(_) => reach > goal_v,
                    _ => reach >= goal_v,
                };
                if hit {
                    chosen = Some(d);
                    break;
                }
            }
            acnt += u64::from(c);
            amass = amass.wrapping_add(mass[d]);
            lowest = Some(d);
        }
        let d = match chosen {
            Some(d) => d,
            None => {
                let d = lowest.unwrap_or(0);
                if lowest.is_some() {
                    acnt -= u64::from(cnt[d]);
                    amass = amass.wrapping_sub(mass[d]);
                }
                exhausted = true;
                d
            }
        };
        above_cnt = acnt;
        above_mass = amass;
        digit = d;
        prefix = (prefix << 8) | d as u32;
        last_cnt = cnt;
    }
    let n_eq = u64::from(last_cnt[digit]);
    let wstar = wfx(from_key(prefix), m, s);
    let j = if exhausted {
        n_eq
    } else {
        match goal {
            Goal::Count(_) => goal_v - above_cnt,
            _ => {
                let rem = goal_v.wrapping_sub(above_mass);
                if wstar == 0 {
                    n_eq
                } else if matches!(goal, Goal::Draw(_)) {
                    rem / wstar + 1
                } else {
                    rem.div_ceil(wstar)
                }
            }
        }
    }
    .clamp(1, n_eq.max(1));
    let mut seen = 0u64;
    let mut id = 0u32;
    for v in 0..row.len() {
        if let Some(x) = eligible(v)
            && key(x) == prefix
        {
            seen += 1;
            if seen == j {
                id = v as u32;
                break;
            }
        }
    }
    Some(Radix {
        cut: KeyCut { key: prefix, id },
        mass: if with_mass {
            above_mass.wrapping_add(j.wrapping_mul(wstar))
        } else {
            0
        },
        total: total_mass,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_values_like_total_cmp() {
        let vals = [
            f32::NEG_INFINITY,
            -3.5,
            -1e-40,
            -0.0,
            0.0,
            1e-40,
            2.0,
            f32::INFINITY,
        ];
        for w in vals.windows(2) {
            assert!(key(w[0]) < key(w[1]), "{w:?}");
        }
        for &v in &vals {
            assert_eq!(from_key(key(v)).to_bits(), v.to_bits());
        }
    }

    /// Reference: the prefix by a full sort, in f64-free integer masses.
    fn sorted(row: &[f32]) -> Vec<(f32, usize)> {
        let mut idx: Vec<(f32, usize)> = row
            .iter()
            .enumerate()
            .filter(|(_, x)| finite(**x))
            .map(|(i, &x)| (x, i))
            .collect();
        idx.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        idx
    }

    #[test]
    fn radix_finds_the_prefix_a_sort_finds() {
        let mut row: Vec<f32> = (0..3000)
            .map(|i| ((i * 7919 % 613) as f32) / 57.0 - 4.0)
            .collect();
        row[17] = f32::NEG_INFINITY;
        row[400] = row[12]; // ties
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let order = sorted(&row);
        for k in [1u64, 2, 5, 100, 2999, 5000] {
            let r = radix(Floats::F32(&row), None, Goal::Count(k), m, 1.0).unwrap();
            let last = order[(k as usize).min(order.len()) - 1];
            assert_eq!((r.cut.key, r.cut.id), (key(last.0), last.1 as u32), "k {k}");
        }
        for (s, p) in [(1.0f32, 0.5f32), (0.7, 0.9), (2.0, 0.05), (1.0, 1.0)] {
            let r = radix(Floats::F32(&row), None, Goal::Fraction(p), m, s).unwrap();
            let total: u64 = order.iter().map(|&(x, _)| wfx(x, m, s)).sum();
            let goal = (f64::from(p) * total as f64).ceil() as u64;
            let mut acc = 0u64;
            let mut want = order[order.len() - 1];
            for &(x, i) in &order {
                acc += wfx(x, m, s);
                if acc >= goal {
                    want = (x, i);
                    break;
                }
            }
            assert_eq!((r.cut.key, r.cut.id), (key(want.0), want.1 as u32), "p {p}");
            assert_eq!(r.mass, acc.min(total));
            assert_eq!(r.total, total);
        }
        for u in [0.0, 0.3, 0.999_999] {
            let r = radix(Floats::F32(&row), None, Goal::Draw(u), m, 1.0).unwrap();
            let total: u64 = order.iter().map(|&(x, _)| wfx(x, m, 1.0)).sum();
            let goal = (u * total as f64) as u64;
            let mut acc = 0u64;
            let want = order
                .iter()
                .find(|&&(x, _)| {
                    acc += wfx(x, m, 1.0);
                    acc > goal
                })
                .copied()
                .unwrap_or(order[order.len() - 1]);
            assert_eq!((r.cut.key, r.cut.id), (key(want.0), want.1 as u32), "u {u}");
        }
        let none = vec![f32::NEG_INFINITY; 10];
        assert!(radix(Floats::F32(&none), None, Goal::Count(1), 0.0, 1.0).is_none());
    }

    /// The halving tree is lane 0 of the xor-butterfly, bit for bit.
    #[test]
    fn warp_sum_is_lane_zero_of_the_butterfly() {
        let mut rng = 0x1234_5678_u64;
        for _ in 0..200 {
            let a: [f32; 32] = std::array::from_fn(|_| {
                rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                f32::from_bits((rng >> 41) as u32 | 0x3f00_0000) * ((rng >> 20) % 1000) as f32
            });
            let mut b = a;
            for o in [16usize, 8, 4, 2, 1] {
                let c = b;
                for (l, x) in b.iter_mut().enumerate() {
                    *x = c[l] + c[l ^ o];
                }
            }
            assert!(b.iter().all(|x| x.to_bits() == b[0].to_bits()));
            assert_eq!(warp_sum(a).to_bits(), b[0].to_bits());
        }
    }

    #[test]
    fn block_sum_is_the_butterfly() {
        let v: [f32; THREADS] = std::array::from_fn(|i| 1.0 + (i as f32) * 1e-7);
        let s = block_sum(&v);
        let direct: f64 = v.iter().map(|&x| f64::from(x)).sum();
        assert!((f64::from(s) - direct).abs() < 1e-3);
        let ones = [1u32; THREADS];
        assert_eq!(block_sum(&ones), THREADS as u32);
    }
}
