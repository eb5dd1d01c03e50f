//! One test of this binary run again in a child process under another kernel path: the
//! variable is read once per process, and candle's op counter is process-wide, so a path's
//! results (or counts) come from a process of their own. The child prints one line,
//! `{mark}{json}`, which the parent reads back.
use std::process::Command;

use dspark::device::{KERNEL_PATH_ENV, KernelPath, kernel_path};
use serde_json::Value;

/// The child's side: print `{mark}{json}` of what `counts` measures, for the parent to read
/// back (nothing on the host fast path, where nothing crosses: the parent asks for the tensor
/// path). Run alone, it passes too.
pub fn print_for_parent(mark: &str, counts: impl FnOnce() -> Value) {
    if kernel_path().unwrap() == KernelPath::Fast {
        return;
    }
    println!("\n{mark}{}", counts());
}

/// Run test `name` (its path in the binary, e.g. `counts::print_counts`) alone, on one thread,
/// with `DSPARK_KERNEL_PATH={path}`, and parse the JSON it printed after `mark`.
pub fn child_json(name: &str, path: KernelPath, mark: &str) -> Value {
    let exe = std::env::current_exe().unwrap();
    let child = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(KERNEL_PATH_ENV, path.as_str())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&child.stdout);
    assert!(child.status.success(), "child {name} failed: {stdout}");
    let line = stdout
        .lines()
        .find_map(|l| l.split_once(mark).map(|(_, json)| json))
        .unwrap_or_else(|| panic!("child {name} printed no `{mark}` line: {stdout}"));
    serde_json::from_str(line).unwrap()
}
