//! Build script: with the `cuda` feature, compile `kernels/*.cu` to PTX in `OUT_DIR`.
//!
//! Each `kernels/NAME.cu` becomes `$OUT_DIR/NAME.ptx` (`nvcc --ptx -arch=compute_CAP`, CAP from
//! `CUDA_COMPUTE_CAP`, default 90), which `sampling::cuda_ptx` embeds with `include_str!` and
//! the driver JIT-compiles for the running GPU. nvcc comes from `NVCC`, else `CUDA_ROOT/bin`,
//! else `PATH` (`scripts/cuda_env.sh` sets all three). Without the feature it does nothing.

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
    for src in &sources {
        println!("cargo:rerun-if-changed={}", src.display());
        let stem = src
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or_else(|| format!("bad kernel file name {}", src.display()))?;
        compile(&nvcc, src, &out.join(format!("{stem}.ptx")), cap)?;
    }
    Ok(())
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

fn compile(nvcc: &Path, src: &Path, ptx: &Path, cap: u32) -> Result<(), String> {
    let mut cmd = Command::new(nvcc);
    cmd.arg("--ptx")
        .arg(format!("-arch=compute_{cap}"))
        .args(["-O3", "-std=c++17", "-o"])
        .arg(ptx)
        .arg(src);
    if let Some(ccbin) = env::var_os("NVCC_CCBIN") {
        cmd.arg("-ccbin").arg(ccbin);
    }
    let output = cmd
        .output()
        .map_err(|e| format!("running {} failed: {e}", nvcc.display()))?;
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
