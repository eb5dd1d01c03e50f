//! Shared helpers of the sampling integration tests: a seeded test RNG, a chi-square check with
//! a tight critical value, and f64 reference distributions.
#![allow(dead_code)]

pub mod appendix_a;
pub mod held;

/// SplitMix64: deterministic test data.
pub struct TestRng(pub u64);

impl TestRng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Roughly normal (sum of uniforms), scaled.
    pub fn normal(&mut self, std: f32) -> f32 {
        let s: f64 = (0..12).map(|_| self.uniform()).sum::<f64>() - 6.0;
        s as f32 * std
    }

    pub fn normals(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal(std)).collect()
    }
}

/// Upper critical value of chi-square with `df` degrees of freedom at alpha = 1e-4
/// (Wilson–Hilferty; conservative for small df).
pub fn chi2_critical(df: usize) -> f64 {
    let z = 3.719_016; // standard normal upper 1e-4 quantile
    let k = df as f64;
    let a = 2.0 / (9.0 * k);
    k * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Chi-square statistic and degrees of freedom of `counts` against `probs`; categories with
/// expected count < 5 are pooled. Panics if a zero-probability category was observed.
pub fn chi_square(counts: &[u64], probs: &[f64]) -> (f64, usize) {
    assert_eq!(counts.len(), probs.len());
    let n: u64 = counts.iter().sum();
    let total_p: f64 = probs.iter().sum();
    assert!((total_p - 1.0).abs() < 1e-9, "probs sum to {total_p}");
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
    for (i, (&o, &p)) in counts.iter().zip(probs).enumerate() {
        if p == 0.0 {
            assert_eq!(
                o, 0,
                "category {i} has probability 0 but was observed {o} times"
            );
            continue;
        }
        let e = p * n as f64;
        if e < 5.0 {
            pool_o += o as f64;
            pool_e += e;
        } else {
            stat += (o as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    if pool_e > 0.0 {
        stat += (pool_o - pool_e).powi(2) / pool_e.max(1e-300);
        cells += 1;
    }
    (stat, cells.saturating_sub(1).max(1))
}

/// Assert that `counts` are a plausible sample of `probs` (alpha = 1e-4).
pub fn assert_follows(counts: &[u64], probs: &[f64], label: &str) {
    let (stat, df) = chi_square(counts, probs);
    let crit = chi2_critical(df);
    assert!(
        stat < crit,
        "{label}: chi-square {stat:.2} >= critical {crit:.2} (df {df})\ncounts {counts:?}\nprobs {probs:?}"
    );
}

/// Assert that `counts` are clearly NOT a sample of `probs`.
pub fn assert_differs(counts: &[u64], probs: &[f64], label: &str) {
    let (stat, df) = chi_square(counts, probs);
    assert!(
        stat > 10.0 * chi2_critical(df),
        "{label}: chi-square {stat:.2} too small (df {df})"
    );
}

/// Reference target distribution: softmax(l / T) → top-k → top-p (ties by lower id), in f64;
/// T == 0 → one-hot argmax (lowest id).
pub fn reference_probs(l: &[f32], t: f32, top_k: Option<usize>, top_p: f32) -> Vec<f64> {
    let mut order: Vec<usize> = (0..l.len()).filter(|&i| l[i] > f32::NEG_INFINITY).collect();
    order.sort_by(|&a, &b| l[b].total_cmp(&l[a]).then(a.cmp(&b)));
    let mut p = vec![0.0; l.len()];
    if t == 0.0 {
        p[order[0]] = 1.0;
        return p;
    }
    if let Some(k) = top_k {
        order.truncate(k);
    }
    let m = f64::from(l[order[0]]);
    let w: Vec<f64> = order
        .iter()
        .map(|&i| ((f64::from(l[i]) - m) / f64::from(t)).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut acc = 0.0;
    let mut kept = 0;
    for &wi in &w {
        acc += wi;
        kept += 1;
        if acc >= f64::from(top_p) * total {
            break;
        }
    }
    let z: f64 = w[..kept].iter().sum();
    for (j, &i) in order[..kept].iter().enumerate() {
        p[i] = w[j] / z;
    }
    p
}

/// Softmax of a recorded logits row in f64 (`-inf` → 0).
pub fn softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = l
        .iter()
        .map(|&x| (f64::from(x) - f64::from(m)).exp())
        .collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|x| x / z).collect()
}

/// Count occurrences of values `0..n`.
pub fn histogram(values: impl IntoIterator<Item = usize>, n: usize) -> Vec<u64> {
    let mut h = vec![0u64; n];
    for v in values {
        h[v] += 1;
    }
    h
}
