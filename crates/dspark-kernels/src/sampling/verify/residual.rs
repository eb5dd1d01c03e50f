//! Sampling from the residual `norm(max(p − q, 0))` after a rejected draft.
//!
//! One vectorized pass computes the residual mass of every block of [`BLOCK`] tokens (f32 lanes,
//! the same `exp` as the row statistics); the draw then walks those block sums and scans a single
//! block. A rejection therefore costs one pass over the two rows, not two scalar passes.

use crate::cpu::{exp_with, multiversion, zip_lanes};
use crate::sampling::categorical::{Check, SideCheck};
use crate::sampling::dist::Dist;
use crate::view::{BLOCK, Floats};

/// The proposal a rejected draft was drawn from.
pub(crate) enum Proposal<'a, 'b> {
    /// One-hot at the rejected token (no draft logits were given).
    OneHot(usize),
    /// A recorded draft distribution.
    Dist(&'b Dist<'a>),
}

/// Residual mass below which the residual counts as empty (sampling then falls back to `p`).
/// The rejection probability equals this mass, so the fallback changes the output law by at
/// most this much.
const EMPTY_RESIDUAL: f64 = 1e-9;

/// `v ↦ exp((x_v − max)·s) / z` for one distribution, with its truncation applied by the caller.
#[derive(Clone, Copy)]
struct Scale {
    max: f32,
    s: f32,
    inv_z: f32,
}

impl Scale {
    fn of(d: &Dist<'_>) -> Self {
        Scale {
            max: d.stats.max,
            s: d.s,
            inv_z: (1.0 / d.z) as f32,
        }
    }
}

impl Scale {
    fn lanes(self) -> [f32; 3] {
        [self.max, self.s, self.inv_z]
    }
}

/// The proposal scale of a one-hot block: `q_v = exp((y_v − 0)·1)·1`.
const ONE_HOT: Scale = Scale {
    max: 0.0,
    s: 1.0,
    inv_z: 1.0,
};

multiversion! {
    /// `Σ max(p_v − q_v, 0)` over a block of raw values `x` (target) and `y` (proposal), both
    /// already set to `-inf` outside their kept sets. Portable reference of
    /// [`block_residual`].
    fn block_residual_portable<M>(x: &[f32], y: &[f32], p: Scale, q: Scale) -> f32 {
        let lane = |s: f32, a: f32, b: f32| {
            let pv = exp_with::<M>((a - p.max) * p.s) * p.inv_z;
            let qv = exp_with::<M>((b - q.max) * q.s) * q.inv_z;
            let r = pv - qv;
            s + if r > 0.0 { r } else { 0.0 }
        };
        zip_lanes(x, y, lane, |a, b| residual_at::<M>(a, b, p, q))
    }
}

/// `Σ max(p_v − q_v, 0)` over a block (explicit AVX2 when the CPU has it: the same bits as the
/// portable code compiled for AVX2+FMA).
fn block_residual(x: &[f32], y: &[f32], p: Scale, q: Scale) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx512() {
            // SAFETY: AVX2, FMA and AVX-512 F/VL are available (checked at run time).
            return unsafe { crate::cpu::x86::residual_sum_512(x, y, p.lanes(), q.lanes()) };
        }
        if crate::cpu::has_avx2() {
            // SAFETY: AVX2 and FMA are available (checked at run time).
            return unsafe { crate::cpu::x86::residual_sum(x, y, p.lanes(), q.lanes()) };
        }
    }
    block_residual_portable(x, y, p, q)
}

/// [`block_residual`] against a proposal that is zero on the whole block.
fn block_mass(x: &[f32], p: Scale, y: &mut [f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::cpu::has_avx512() {
            // SAFETY: AVX2, FMA and AVX-512 F/VL are available (checked at run time).
            return unsafe { crate::cpu::x86::scaled_exp_sum_512(x, p.lanes()) };
        }
        if crate::cpu::has_avx2() {
            // SAFETY: AVX2 and FMA are available (checked at run time).
            return unsafe { crate::cpu::x86::scaled_exp_sum(x, p.lanes()) };
        }
    }
    let y = &mut y[..x.len()];
    y.fill(f32::NEG_INFINITY);
    block_residual_portable(x, y, p, ONE_HOT)
}

#[inline(always)]
fn residual_at<M: crate::cpu::MulAdd>(x: f32, y: f32, p: Scale, q: Scale) -> f32 {
    let r = exp_with::<M>((x - p.max) * p.s) * p.inv_z - exp_with::<M>((y - q.max) * q.s) * q.inv_z;
    if r > 0.0 { r } else { 0.0 }
}

/// Fill `out` with the raw values of `d`'s row at `start..`, `-inf` outside its kept set.
fn load(d: &Dist<'_>, start: usize, out: &mut [f32]) {
    d.row.read_into(start, out);
    if let Some(cut) = d.cut {
        for (j, x) in out.iter_mut().enumerate() {
            if !cut.keeps(*x, start + j) {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}

/// The raw values of `d`'s row at `start..start + n`, `-inf` outside its kept set: borrowed
/// from the row when it is f32 and untruncated, else copied into `buf`.
fn block_of<'b, 'r: 'b>(d: &Dist<'r>, start: usize, n: usize, buf: &'b mut [f32]) -> &'b [f32] {
    match (d.row, d.cut) {
        (Floats::F32(row), None) => &row[start..start + n],
        _ => {
            load(d, start, &mut buf[..n]);
            &buf[..n]
        }
    }
}

/// Raw proposal values of a block and their scale: the recorded draft row, or for a one-hot
/// proposal `0.0` at the rejected token and `-inf` elsewhere (so `q_v = exp(0)·1 = 1` there).
fn load_proposal(q: &Proposal<'_, '_>, start: usize, out: &mut [f32]) -> Scale {
    match q {
        Proposal::Dist(d) => {
            load(d, start, out);
            Scale::of(d)
        }
        Proposal::OneHot(t) => {
            out.fill(f32::NEG_INFINITY);
            if (start..start + out.len()).contains(t) {
                out[t - start] = 0.0;
            }
            ONE_HOT
        }
    }
}

/// Draw from `norm(max(p − q, 0))` with uniform `u`; `None` when the residual is empty. A `side`
/// row of the same length is validated in the same pass (its [`Check`] is returned).
pub(crate) fn sample_residual(
    p: &Dist<'_>,
    q: &Proposal<'_, '_>,
    u: f64,
    side: Option<Floats<'_>>,
) -> (Option<usize>, Option<Check>) {
    let len = p.row.len();
    let mut side = side.and_then(|r| SideCheck::new(r, len));
    let draw = draw_residual(p, q, u, len, &mut side);
    (draw, side.map(|c| c.check))
}

fn draw_residual(
    p: &Dist<'_>,
    q: &Proposal<'_, '_>,
    u: f64,
    len: usize,
    side: &mut Option<SideCheck<'_>>,
) -> Option<usize> {
    let ps = Scale::of(p);
    let (mut xb, mut yb) = ([0f32; BLOCK], [0f32; BLOCK]);
    let mut sums = Vec::with_capacity(len.div_ceil(BLOCK));
    let mut total = 0f64;
    for start in (0..len).step_by(BLOCK) {
        let n = BLOCK.min(len - start);
        let x = block_of(p, start, n, &mut xb);
        let s = match q {
            Proposal::OneHot(t) if !(start..start + n).contains(t) => block_mass(x, ps, &mut yb),
            Proposal::Dist(d) => {
                block_residual(x, block_of(d, start, n, &mut yb), ps, Scale::of(d))
            }
            Proposal::OneHot(_) => {
                let qs = load_proposal(q, start, &mut yb[..n]);
                block_residual(x, &yb[..n], ps, qs)
            }
        };
        if let Some(c) = side {
            c.step(start, n);
        }
        let s = f64::from(s);
        sums.push(s);
        total += s;
    }
    if total <= EMPTY_RESIDUAL {
        return None;
    }
    // Walk the block sums, then scan the chosen block token by token.
    let target = u * total;
    let mut acc = 0f64;
    let mut chosen = None;
    for (b, &s) in sums.iter().enumerate() {
        if s > 0.0 {
            chosen = Some((b, acc));
            if acc + s > target {
                break;
            }
        }
        acc += s;
    }
    let (b, before) = chosen?;
    let start = b * BLOCK;
    let n = BLOCK.min(len - start);
    load(p, start, &mut xb[..n]);
    let qs = load_proposal(q, start, &mut yb[..n]);
    let (mut acc, mut last) = (before, None);
    for j in 0..n {
        let r = f64::from(residual_at::<crate::cpu::Unfused>(xb[j], yb[j], ps, qs));
        if r > 0.0 {
            acc += r;
            last = Some(start + j);
            if acc > target {
                return last;
            }
        }
    }
    // Rounding between the block sum and the token scan: the last positive token of the block.
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::categorical::BlockSum;
    use crate::view::Floats;

    fn dist<'a>(row: &'a [f32], blocks: &mut Vec<BlockSum>) -> Dist<'a> {
        Dist::new(Floats::F32(row), 1.0, None, 1.0, blocks, "x", String::new).unwrap()
    }

    /// The sampler's law equals `norm(max(p − q, 0))` computed directly in f64.
    #[test]
    fn matches_direct_residual() {
        let v = 700; // several blocks and a ragged tail
        let x: Vec<f32> = (0..v).map(|i| ((i * 37 % 101) as f32) * 0.05).collect();
        let y: Vec<f32> = (0..v).map(|i| ((i * 53 % 97) as f32) * 0.05).collect();
        let (mut b1, mut b2) = (Vec::new(), Vec::new());
        let (p, q) = (dist(&x, &mut b1), dist(&y, &mut b2));
        let pz: f64 = x.iter().map(|&a| f64::from(a).exp()).sum();
        let qz: f64 = y.iter().map(|&a| f64::from(a).exp()).sum();
        let r: Vec<f64> = (0..v)
            .map(|i| (f64::from(x[i]).exp() / pz - f64::from(y[i]).exp() / qz).max(0.0))
            .collect();
        let total: f64 = r.iter().sum();
        // Inverse CDF at many uniforms: the drawn token's CDF interval contains u.
        let mut cdf = vec![0f64; v + 1];
        for i in 0..v {
            cdf[i + 1] = cdf[i] + r[i] / total;
        }
        for k in 0..2000 {
            let u = (f64::from(k) + 0.5) / 2000.0;
            let t = sample_residual(&p, &Proposal::Dist(&q), u, None).0.unwrap();
            assert!(r[t] > 0.0, "token {t} has no residual mass");
            assert!(
                cdf[t] - 1e-5 <= u && u <= cdf[t + 1] + 1e-5,
                "u {u} drew {t}"
            );
        }
    }

    /// The AVX2 block kernels give the bits of the portable code compiled for AVX2+FMA
    /// (`block_residual_portable` dispatches to that build on such a CPU).
    #[test]
    fn avx2_block_kernels_are_bit_identical() {
        if !crate::cpu::has_avx2() {
            return;
        }
        let mut x: Vec<f32> = (0..300)
            .map(|i| ((i * 37 % 101) as f32) * 0.07 - 3.0)
            .collect();
        let mut y: Vec<f32> = (0..300)
            .map(|i| ((i * 53 % 97) as f32) * 0.06 - 2.0)
            .collect();
        x[5] = f32::NEG_INFINITY;
        y[9] = f32::NEG_INFINITY;
        x[200] = -200.0;
        let p = Scale {
            max: 4.0,
            s: 0.8,
            inv_z: 0.013,
        };
        let q = Scale {
            max: 3.8,
            s: 1.0,
            inv_z: 0.011,
        };
        let none = vec![f32::NEG_INFINITY; 300];
        for len in [0, 7, 16, 33, 256, 300] {
            let (a, b) = (&x[..len], &y[..len]);
            let fast = block_residual(a, b, p, q);
            assert_eq!(
                fast.to_bits(),
                block_residual_portable(a, b, p, q).to_bits(),
                "len {len}"
            );
            let mut buf = [0f32; BLOCK * 2];
            let mass = block_mass(a, p, &mut buf);
            let want = block_residual_portable(a, &none[..len], p, ONE_HOT);
            assert_eq!(mass.to_bits(), want.to_bits(), "len {len}");
            // The AVX2-only builds too (the dispatch above may have taken AVX-512).
            // SAFETY: AVX2 and FMA checked above.
            let (r2, m2) = unsafe {
                (
                    crate::cpu::x86::residual_sum(a, b, p.lanes(), q.lanes()),
                    crate::cpu::x86::scaled_exp_sum(a, p.lanes()),
                )
            };
            assert_eq!(
                (r2.to_bits(), m2.to_bits()),
                (fast.to_bits(), mass.to_bits())
            );
            assert!(len < 16 || mass > fast);
        }
    }

    #[test]
    fn one_hot_removes_the_token_and_empty_is_none() {
        let x = [0.0f32, 0.0, 0.0, 0.0];
        let mut b = Vec::new();
        let p = dist(&x, &mut b);
        for k in 0..100 {
            let t = sample_residual(&p, &Proposal::OneHot(2), f64::from(k) / 100.0, None)
                .0
                .unwrap();
            assert_ne!(t, 2);
        }
        let only = [0.0f32, f32::NEG_INFINITY];
        let mut b = Vec::new();
        let p = dist(&only, &mut b);
        assert!(
            sample_residual(&p, &Proposal::OneHot(0), 0.5, None)
                .0
                .is_none()
        );
        assert!(
            sample_residual(&p, &Proposal::Dist(&p), 0.5, None)
                .0
                .is_none()
        );
    }
}
