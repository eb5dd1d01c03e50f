//! Compile `crates/dspark-kernels/kernels/emu/launch.cpp`: the fused kernels' CUDA source as host C++
//! under the emulator header, with the compiler kept from contracting or reassociating float
//! operations (the arithmetic the device performs without fast math).

fn main() {
    let kernels =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../dspark-kernels/kernels");
    println!("cargo:rerun-if-changed={}", kernels.display());
    for entry in std::fs::read_dir(&kernels).into_iter().flatten().flatten() {
        println!("cargo:rerun-if-changed={}", entry.path().display());
    }
    println!("cargo:rerun-if-changed={}", kernels.join("emu").display());
    cc::Build::new()
        .cpp(true)
        .file(kernels.join("emu/launch.cpp"))
        .include(&kernels)
        .std("c++20")
        .opt_level(2)
        .flag("-ffp-contract=off")
        .flag("-fno-fast-math")
        .flag("-Wno-unknown-pragmas")
        .flag("-Wno-unused-parameter")
        .warnings(true)
        .compile("dspark_kernel_emu");
}
