//! `dspark serve` from Python: the Rust server (`dspark_server::run_cli`), run on the calling
//! thread with the GIL released until it stops.

use std::path::PathBuf;

use pyo3::prelude::*;

/// Run `dspark serve` with `argv` (the arguments after `serve`) and `bundled` (the bundled
/// pair's directory in the installed package); returns the exit code (0 served and stopped,
/// 1 could not start, 2 usage). SIGTERM and Ctrl-C stop it gracefully.
#[pyfunction]
#[pyo3(signature = (argv, bundled = None))]
pub fn serve(py: Python<'_>, argv: Vec<String>, bundled: Option<PathBuf>) -> i32 {
    let args = std::iter::once("dspark serve".to_owned()).chain(argv);
    py.detach(|| dspark_server::run_cli(args, bundled.as_deref()))
}
