//! The `dspark-server` binary: `dspark serve` without Python
//! (`cargo run --release -p dspark-server -- --help`).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(dspark_server::run_cli(std::env::args_os(), None));
}
