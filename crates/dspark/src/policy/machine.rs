//! This machine's speed, for the cost model's prior ([`super::prior`]): how fast it reads memory
//! and how fast the packed kernels multiply, measured once and cached.
//!
//! A decode or verify forward of a few rows reads every weight once and does little work per
//! byte. A forward of many rows does the work of each row on the same bytes. Where one regime
//! gives way to the other is set by the machine's ratio of multiply rate to read bandwidth, so
//! the scheduler's table needs both before the first round. [`Machine::current`] gives them:
//! - from the cache file of this CPU model, thread count and build (debug builds time
//!   differently, and so does each packed kernel), in the user's cache directory ([`cache_dir`]);
//! - otherwise measured (a fifth of a second on a 2-core VM, half of it the first touch of the
//!   read buffer: a 64 MiB read over the pool, reads of a buffer a quarter of the last-level
//!   cache's size, and one packed product per weight dtype and quantized format, each the best
//!   of three) and written there.
//!
//! A model whose weights fit in half the last-level cache (a small target) reads them from the
//! cache every step, not from memory: the prior prices its reads at the cache's rate
//! ([`Machine::read_rate`]).
//!
//! A cache file that is corrupt, truncated or written for another machine is ignored and
//! rewritten, with a warning on stderr. A directory that cannot be written (read-only, a file
//! in the way) caches nothing and fails nothing. Measured once per process.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use half::bf16;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::nn::WeightDtype;
use crate::nn::packed::{PackedMatrix, PackedWeight};
use crate::nn::quant::Quant;
use crate::view::Floats;

/// The cache file's format version (a file of another version is measured again).
const FORMAT: u32 = 4;

/// Bytes read by the bandwidth measurement: past every cache level of the machines served.
const READ_BYTES: usize = 64 << 20;

/// Timed repeats of each measurement; the fastest counts (noise only ever slows a run).
const REPEATS: usize = 3;

/// The shape of the multiply measurement: a batch of verified rows against a weight that stays
/// in the last-level cache, so the multiplies bound it (smaller products reach a lower share
/// of the rate a model's own products do).
const GEMM_ROWS: usize = 64;
const GEMM_DIM: usize = 1024;

/// Plausible speeds: a value outside is a corrupt cache file.
const PLAUSIBLE: std::ops::RangeInclusive<f64> = 1e6..=1e17;

/// Passes over the cache-resident buffer in one timed run of the cache measurement (one pass
/// is tens of microseconds, near the pool's dispatch cost).
const CACHE_PASSES: usize = 8;

/// How fast this machine reads memory and multiplies (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Bytes per second read by every pool thread together.
    pub read_bytes_per_s: f64,
    /// Bytes of the last-level cache (0 where unknown).
    pub cache_bytes: f64,
    /// Bytes per second read by every pool thread together from a buffer that stays in the
    /// last-level cache (a quarter of it): the rate a model whose weights fit in half of it
    /// reads them at, step after step ([`Machine::read_rate`]).
    pub cache_read_bytes_per_s: f64,
    /// Floating-point operations per second (a multiply-add counts 2) of the packed f32
    /// kernel over the pool.
    pub flops_f32: f64,
    /// The same with 2-byte (bf16) weights.
    pub flops_bf16: f64,
    /// The same with Q8_0 weights (the integer kernels, the activations' quantization
    /// included).
    pub flops_q8_0: f64,
    /// The same with Q4_K weights.
    pub flops_q4_k: f64,
}

impl Machine {
    /// This machine, from the cache or measured (once per process; see the module docs).
    pub fn current() -> Machine {
        static CURRENT: OnceLock<Machine> = OnceLock::new();
        *CURRENT.get_or_init(|| cached_or_measured(cache_dir().as_deref(), &key(), measure))
    }

    /// A nominal accelerator (a current data-centre GPU): the cost model's prior for a target
    /// on a device, which its online timings then rescale.
    pub fn accelerator() -> Machine {
        Machine {
            read_bytes_per_s: 2.0e12,
            cache_bytes: 0.0,
            cache_read_bytes_per_s: 2.0e12,
            flops_f32: 5.0e13,
            flops_bf16: 2.0e14,
            // A device holds quantized maps as float32 tensors.
            flops_q8_0: 5.0e13,
            flops_q4_k: 5.0e13,
        }
    }

    /// The multiply rate with weights of `dtype` (f16 panels convert as bf16 ones do), or of
    /// the quantized format `quant` where there is one.
    pub fn flops(&self, dtype: WeightDtype, quant: Option<Quant>) -> f64 {
        match (quant, dtype) {
            (Some(Quant::Q8_0), _) => self.flops_q8_0,
            // Q6_K (part of a Q4_K_M file's mix) runs a K-quant body of the same shape.
            (Some(Quant::Q4K | Quant::Q6K), _) => self.flops_q4_k,
            (None, WeightDtype::F32) => self.flops_f32,
            (None, WeightDtype::BF16 | WeightDtype::F16) => self.flops_bf16,
        }
    }

    /// The rate `bytes` of weights are read at, every forward: from the last-level cache when
    /// they fit in half of it (the rest holds the caches, activations and a drafter), else
    /// from memory.
    pub fn read_rate(&self, bytes: f64) -> f64 {
        if bytes <= self.cache_bytes / 2.0 {
            self.cache_read_bytes_per_s
        } else {
            self.read_bytes_per_s
        }
    }

    fn plausible(&self) -> bool {
        (0.0..=1e12).contains(&self.cache_bytes)
            && [
                self.read_bytes_per_s,
                self.cache_read_bytes_per_s,
                self.flops_f32,
                self.flops_bf16,
                self.flops_q8_0,
                self.flops_q4_k,
            ]
            .iter()
            .all(|v| PLAUSIBLE.contains(v))
    }
}

/// Where dspark caches what it measures of the machine: `DSPARK_CACHE_DIR`, else the
/// platform's user cache directory (`$XDG_CACHE_HOME/dspark` or `~/.cache/dspark` on Linux,
/// `~/Library/Caches/dspark` on macOS, `%LOCALAPPDATA%\dspark\cache` on Windows); `None` when
/// none is known.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("DSPARK_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if cfg!(windows) {
        return var("LOCALAPPDATA").map(|d| PathBuf::from(d).join("dspark").join("cache"));
    }
    if cfg!(target_os = "macos") {
        return var("HOME").map(|h| PathBuf::from(h).join("Library/Caches/dspark"));
    }
    match var("XDG_CACHE_HOME") {
        Some(d) => Some(PathBuf::from(d).join("dspark")),
        None => var("HOME").map(|h| PathBuf::from(h).join(".cache/dspark")),
    }
}

/// What a cache file is valid for: the CPU model, the pool's threads and the build (with the
/// packed kernel it runs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Key {
    pub(crate) cpu: String,
    pub(crate) threads: usize,
    pub(crate) build: String,
}

/// This process's [`Key`].
fn key() -> Key {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    Key {
        cpu,
        threads: rayon::current_num_threads(),
        // The packed kernel too: AMX on or off (`DSPARK_AMX`) multiplies at other rates.
        build: format!(
            "{}-{}",
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            crate::nn::packed::Kernel::best().name()
        ),
    }
}

/// The cache file's contents.
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    format: u32,
    #[serde(flatten)]
    key: Key,
    #[serde(flatten)]
    machine: Machine,
}

/// The cache file for `key` in `dir`: one per key (FNV-1a of it in the name; the key inside).
fn file_of(dir: &Path, key: &Key) -> PathBuf {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let text = format!("{}\0{}\0{}", key.cpu, key.threads, key.build);
    for b in text.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut name = String::from("machine-");
    let _ = write!(name, "{h:016x}.json");
    dir.join(name)
}

/// The machine cached for `key` in `path`: `Ok(None)` when there is no file, `Err(why)` when
/// one is there but unusable.
fn load(path: &Path, key: &Key) -> std::result::Result<Option<Machine>, String> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    // The version first: a file of another version need not have this one's fields.
    #[derive(Deserialize)]
    struct Version {
        format: u32,
    }
    if let Ok(v) = serde_json::from_slice::<Version>(&text)
        && v.format != FORMAT
    {
        return Err(format!("format {} (this build writes {FORMAT})", v.format));
    }
    let entry: Entry =
        serde_json::from_slice(&text).map_err(|e| format!("not a cache file ({e})"))?;
    if entry.key != *key {
        return Err(format!(
            "written for {:?} with {} threads ({} build)",
            entry.key.cpu, entry.key.threads, entry.key.build
        ));
    }
    if !entry.machine.plausible() {
        return Err("implausible speeds".into());
    }
    Ok(Some(entry.machine))
}

/// Write `machine` for `key` to `path` (a temporary file renamed over it, so a reader never
/// sees half a file); `false` when it could not be written.
fn store(path: &Path, key: &Key, machine: Machine) -> bool {
    let entry = Entry {
        format: FORMAT,
        key: key.clone(),
        machine,
    };
    let Ok(text) = serde_json::to_vec_pretty(&entry) else {
        return false;
    };
    let Some(dir) = path.parent() else {
        return false;
    };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let ok = std::fs::create_dir_all(dir).is_ok()
        && std::fs::write(&tmp, text).is_ok()
        && std::fs::rename(&tmp, path).is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
    }
    ok
}

/// The machine for `key`: cached in `dir` when a valid file is there, otherwise `measure()`d
/// and written (see the module docs for what is tolerated).
pub(crate) fn cached_or_measured(
    dir: Option<&Path>,
    key: &Key,
    measure: impl FnOnce() -> Machine,
) -> Machine {
    let Some(dir) = dir else {
        return measure();
    };
    let path = file_of(dir, key);
    match load(&path, key) {
        Ok(Some(m)) => return m,
        Ok(None) => {}
        Err(why) => eprintln!(
            "dspark: warning: ignoring the machine cache {}: {why}; measuring again",
            path.display()
        ),
    }
    let machine = measure();
    store(&path, key, machine);
    machine
}

/// Time `f` [`REPEATS`] times; the fastest, in seconds (at least a nanosecond).
fn fastest(mut f: impl FnMut()) -> f64 {
    (0..REPEATS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
        .max(1e-9)
}

/// Bytes of the largest cache the first CPU reports (Linux's sysfs); `None` where unknown.
fn last_level_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.flatten()
        .filter_map(|e| {
            let size = std::fs::read_to_string(e.path().join("size")).ok()?;
            let size = size.trim();
            let (digits, unit) = match size.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
                Some((i, _)) => size.split_at(i),
                None => (size, ""),
            };
            let n: usize = digits.parse().ok()?;
            match unit {
                "" => Some(n),
                "K" => n.checked_mul(1 << 10),
                "M" => n.checked_mul(1 << 20),
                "G" => n.checked_mul(1 << 30),
                _ => None,
            }
        })
        .max()
}

/// The wrapping sum of `buf`, read in chunks of `chunk` words over the pool (a timed read).
fn sum_over_pool(buf: &[u64], chunk: usize) -> u64 {
    buf.par_chunks(chunk)
        .map(|c| c.iter().fold(0u64, |a, &v| a.wrapping_add(v)))
        .reduce(|| 0, u64::wrapping_add)
}

/// Measure this machine (see the module docs).
pub fn measure() -> Machine {
    let words = READ_BYTES / 8;
    // Allocated as the packed weights are (huge pages where the kernel gives them): a fresh
    // buffer's page faults would otherwise cost more than the reads.
    let buf: Vec<u64> = crate::cpu::pages::streamed_vec(words);
    let chunk = words
        .div_ceil(rayon::current_num_threads().max(1) * 4)
        .max(1);
    let mut sink = 0u64;
    let read = fastest(|| sink ^= sum_over_pool(&buf, chunk));
    std::hint::black_box(sink);
    let cache = last_level_cache_bytes().unwrap_or(0);
    let cache_read = match cache / 4 / 8 {
        0 => READ_BYTES as f64 / read,
        words => {
            let buf: Vec<u64> = (0..words as u64).collect();
            let chunk = words.div_ceil(rayon::current_num_threads().max(1)).max(1);
            // Once to bring it in, then timed.
            sink ^= sum_over_pool(&buf, chunk);
            let secs = fastest(|| {
                for _ in 0..CACHE_PASSES {
                    sink ^= sum_over_pool(&buf, chunk);
                }
            });
            std::hint::black_box(sink);
            (CACHE_PASSES * words * 8) as f64 / secs
        }
    };
    let x: Vec<f32> = (0..GEMM_ROWS * GEMM_DIM)
        .map(|i| (i % 7) as f32 * 0.125)
        .collect();
    let at = |o: usize, k: usize| ((o * 3 + k) % 11) as f32 * 0.0625;
    let flops = 2.0 * (GEMM_ROWS * GEMM_DIM * GEMM_DIM) as f64;
    let f32w = PackedMatrix::<f32>::pack_with(GEMM_DIM, GEMM_DIM, at);
    let bf16w =
        PackedMatrix::<bf16>::pack_with(GEMM_DIM, GEMM_DIM, |o, k| bf16::from_f32(at(o, k)));
    let f32s = fastest(|| {
        std::hint::black_box(f32w.matmul(&x, GEMM_ROWS, None));
    });
    let bf16s = fastest(|| {
        std::hint::black_box(bf16w.matmul(&x, GEMM_ROWS, None));
    });
    let values: Vec<f32> = (0..GEMM_DIM * GEMM_DIM)
        .map(|i| at(i / GEMM_DIM, i % GEMM_DIM) - 0.3)
        .collect();
    let quant = |q: Quant| match PackedWeight::quantize(Floats::F32(&values), GEMM_DIM, GEMM_DIM, q)
    {
        Some(w) => {
            flops
                / fastest(|| {
                    std::hint::black_box(w.matmul(&x, GEMM_ROWS, None));
                })
        }
        // Unreachable for these finite weights; the f32 rate is the nearest stand-in.
        None => flops / f32s,
    };
    Machine {
        read_bytes_per_s: READ_BYTES as f64 / read,
        cache_bytes: cache as f64,
        // A cache slower than memory is a measurement gone wrong (a preempted pass).
        cache_read_bytes_per_s: cache_read.max(READ_BYTES as f64 / read),
        flops_f32: flops / f32s,
        flops_bf16: flops / bf16s,
        flops_q8_0: quant(Quant::Q8_0),
        flops_q4_k: quant(Quant::Q4K),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key {
            cpu: "Test CPU".into(),
            threads: 2,
            build: "debug".into(),
        }
    }

    const M: Machine = Machine {
        read_bytes_per_s: 2e10,
        cache_bytes: 3.2e7,
        cache_read_bytes_per_s: 1.5e11,
        flops_f32: 1e11,
        flops_bf16: 8e10,
        flops_q8_0: 2e11,
        flops_q4_k: 1.5e11,
    };

    #[test]
    fn a_valid_cache_file_is_read_and_nothing_is_measured() {
        let dir = tempfile::tempdir().unwrap();
        let first = cached_or_measured(Some(dir.path()), &key(), || M);
        assert_eq!(first, M);
        assert!(file_of(dir.path(), &key()).exists());
        let again = cached_or_measured(Some(dir.path()), &key(), || panic!("measured again"));
        assert_eq!(again, M);
    }

    #[test]
    fn corrupt_truncated_and_foreign_files_are_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_of(dir.path(), &key());
        let other = Key {
            cpu: "Other CPU".into(),
            ..key()
        };
        let mut foreign = serde_json::to_string(&Entry {
            format: FORMAT,
            key: other,
            machine: M,
        })
        .unwrap();
        let good = serde_json::to_string(&Entry {
            format: FORMAT,
            key: key(),
            machine: M,
        })
        .unwrap();
        let implausible = good.replace("20000000000", "0");
        let future = good.replace(&format!("\"format\":{FORMAT}"), "\"format\":99");
        assert_ne!(future, good);
        // A file of an older version, without this version's fields: told by its version.
        let mut old: serde_json::Value = serde_json::from_str(&good).unwrap();
        old["format"] = (FORMAT - 1).into();
        old.as_object_mut().unwrap().remove("cache_bytes");
        std::fs::write(&path, old.to_string()).unwrap();
        let why = load(&path, &key()).unwrap_err();
        assert!(why.starts_with(&format!("format {}", FORMAT - 1)), "{why}");
        let old = old.to_string();
        let truncated = good[..good.len() / 2].to_string();
        foreign.push(' ');
        for bad in [
            "\u{0}\u{1}garbage".to_string(),
            truncated,
            foreign,
            implausible,
            future,
            old,
        ] {
            std::fs::write(&path, &bad).unwrap();
            assert!(load(&path, &key()).is_err(), "{bad}");
            let m = cached_or_measured(Some(dir.path()), &key(), || M);
            assert_eq!(m, M);
            assert_eq!(load(&path, &key()), Ok(Some(M)), "rewritten after {bad}");
        }
    }

    #[test]
    fn an_unwritable_directory_caches_nothing_and_fails_nothing() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the directory should be: nothing can be created under it (even as
        // root, where permission bits would not stop a write).
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "x").unwrap();
        let under = blocker.join("cache");
        let mut measured = 0;
        for _ in 0..2 {
            let m = cached_or_measured(Some(&under), &key(), || {
                measured += 1;
                M
            });
            assert_eq!(m, M);
        }
        assert_eq!(measured, 2, "nothing was cached, so each call measures");
        assert_eq!(cached_or_measured(None, &key(), || M), M);
    }

    #[test]
    fn files_are_per_key() {
        let dir = Path::new("/x");
        let threads = Key {
            threads: 4,
            ..key()
        };
        assert_ne!(file_of(dir, &key()), file_of(dir, &threads));
        assert_eq!(file_of(dir, &key()), file_of(dir, &key()));
    }

    #[test]
    fn a_measurement_is_plausible() {
        let t = std::time::Instant::now();
        let m = measure();
        eprintln!("measured in {:?}: {m:?}", t.elapsed());
        assert!(m.plausible(), "{m:?}");
    }
}
