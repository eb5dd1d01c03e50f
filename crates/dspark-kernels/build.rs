//! Build script: with the `cuda` feature, compile `kernels/*.cu` in `OUT_DIR`.
//!
//! - `kernels/fused_NAME.cu` (the fused sampling kernels) becomes `$OUT_DIR/fused_NAME.fatbin`:
//!   SASS for `sm_CAP` and PTX for `compute_CAP` (CAP from `CUDA_COMPUTE_CAP`, default 90),
//!   uncompressed, built without contraction (`--fmad=false`) or fast math so that the
//!   kernels evaluate their Rust models' arithmetic. `ptxas -v` reports each entry's
//!   registers, stack, spills and shared memory into `$OUT_DIR/fused_ptxas.txt`; a spill or a
//!   stack frame (local memory) in any fused entry fails the build.
//! - every other `kernels/NAME.cu` becomes `$OUT_DIR/NAME.ptx` (`nvcc --ptx
//!   -arch=compute_CAP`), which `sampling::cuda_ptx` embeds and the driver JIT-compiles.
//!
//! nvcc comes from `NVCC`, else `CUDA_ROOT/bin`, else `PATH` (`scripts/cuda_env.sh` sets all
//! three). Without the feature it does nothing.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    if let Err(msg) = build_ptx() {
        eprintln!("dspark build.rs: {msg}");
        eprintln!("hint: `source scripts/cuda_env.sh` prepares a CUDA 13.0 toolkit and its env");
        std::process::exit(1);
    }
}

fn build_ptx() -> Result<(), String> {
    for var in ["CUDA_COMPUTE_CAP", "NVCC", "CUDA_ROOT", "NVCC_CCBIN"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=kernels");
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| format!("OUT_DIR: {e}"))?);
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| format!("manifest dir: {e}"))?);
    let cap = compute_cap()?;
    let nvcc = nvcc_path();
    let mut sources: Vec<PathBuf> = std::fs::read_dir(manifest.join("kernels"))
        .map_err(|e| format!("reading kernels/: {e}"))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    for header in [
        "kernels/fused_common.cuh",
        "kernels/fused_verify.cuh",
        "kernels/emu/emu.h",
    ] {
        println!("cargo:rerun-if-changed={}", manifest.join(header).display());
    }
    let mut report = String::new();
    for src in &sources {
        println!("cargo:rerun-if-changed={}", src.display());
        let stem = src
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| format!("bad kernel file name {}", src.display()))?;
        if stem.starts_with("fused_") {
            report += &fatbin(&nvcc, src, &out.join(format!("{stem}.fatbin")), cap)?;
        } else {
            compile(&nvcc, src, &out.join(format!("{stem}.ptx")), cap)?;
        }
    }
    std::fs::write(out.join("fused_ptxas.txt"), report)
        .map_err(|e| format!("writing fused_ptxas.txt: {e}"))?;
    Ok(())
}

/// One fused entry's resources as `ptxas -v` reports them.
#[derive(Default)]
struct Entry {
    name: String,
    registers: u32,
    stack: u32,
    spill_stores: u32,
    spill_loads: u32,
    smem: u32,
}

/// The first integer before `unit` in `line` (`"48 bytes stack frame"` → 48).
fn number_before(line: &str, unit: &str) -> u32 {
    line.find(unit)
        .and_then(|at| line[..at].split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Parse `ptxas -v` output into its entries.
fn ptxas_entries(text: &str) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(Entry {
                name,
                ..Entry::default()
            });
        } else if let Some(e) = out.last_mut() {
            if line.contains("stack frame") {
                e.stack = number_before(line, "bytes stack frame");
                e.spill_stores = number_before(line, "bytes spill stores");
                e.spill_loads = number_before(line, "bytes spill loads");
            } else if line.contains("Used") && line.contains("registers") {
                e.registers = number_before(line, "registers");
                e.smem = number_before(line, "bytes smem");
            }
        }
    }
    out
}

/// Compile a fused kernel file to a fatbin, check `ptxas -v`, return its report lines.
fn fatbin(nvcc: &Path, src: &Path, out: &Path, cap: u32) -> Result<String, String> {
    let mut cmd = Command::new(nvcc);
    cmd.arg("--fatbin")
        .arg(format!("-gencode=arch=compute_{cap},code=sm_{cap}"))
        .arg(format!("-gencode=arch=compute_{cap},code=compute_{cap}"))
        .args([
            "--fmad=false",
            "--no-compress",
            "-O3",
            "-std=c++17",
            "-Xptxas",
            "-v",
        ])
        .arg("-o")
        .arg(out)
        .arg(src);
    let output = run_nvcc(nvcc, &mut cmd)?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        return Err(format!("nvcc failed on {}:\n{text}", src.display()));
    }
    let entries = ptxas_entries(&text);
    if entries.is_empty() {
        return Err(format!("no ptxas report for {}:\n{text}", src.display()));
    }
    let mut report = String::new();
    let mut bad = Vec::new();
    for e in &entries {
        report += &format!(
            "{} sm_{cap}: {} registers, {} bytes stack, {} / {} bytes spill stores / loads, \
             {} bytes smem\n",
            e.name, e.registers, e.stack, e.spill_stores, e.spill_loads, e.smem
        );
        if e.stack > 0 || e.spill_stores > 0 || e.spill_loads > 0 {
            bad.push(e.name.clone());
        }
    }
    if !bad.is_empty() {
        return Err(format!(
            "fused kernels with register spills or local memory: {}\n{report}",
            bad.join(", ")
        ));
    }
    Ok(report)
}

/// `CUDA_COMPUTE_CAP` as an integer (`90`, also accepts `9.0` and `sm_90`); 90 when unset.
fn compute_cap() -> Result<u32, String> {
    match env::var("CUDA_COMPUTE_CAP") {
        Err(_) => Ok(90),
        Ok(v) => {
            let digits: String = v.chars().filter(char::is_ascii_digit).collect();
            digits
                .parse()
                .map_err(|_| format!("CUDA_COMPUTE_CAP={v:?} is not a compute capability"))
        }
    }
}

fn nvcc_path() -> PathBuf {
    if let Some(p) = env::var_os("NVCC") {
        return PathBuf::from(p);
    }
    if let Some(root) = env::var_os("CUDA_ROOT") {
        let p = Path::new(&root).join("bin").join("nvcc");
        if p.exists() {
            return p;
        }
    }
    PathBuf::from("nvcc")
}

/// Run an nvcc command (with the host compiler of `NVCC_CCBIN`, when set); its output.
fn run_nvcc(nvcc: &Path, cmd: &mut Command) -> Result<std::process::Output, String> {
    if let Some(ccbin) = env::var_os("NVCC_CCBIN") {
        cmd.arg("-ccbin").arg(ccbin);
    }
    cmd.output()
        .map_err(|e| format!("running {} failed: {e}", nvcc.display()))
}

fn compile(nvcc: &Path, src: &Path, ptx: &Path, cap: u32) -> Result<(), String> {
    let mut cmd = Command::new(nvcc);
    cmd.arg("--ptx")
        .arg(format!("-arch=compute_{cap}"))
        .args(["-O3", "-std=c++17", "-o"])
        .arg(ptx)
        .arg(src);
    let output = run_nvcc(nvcc, &mut cmd)?;
    if !output.status.success() {
        return Err(format!(
            "nvcc failed on {}:\n{}{}",
            src.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(())
}
