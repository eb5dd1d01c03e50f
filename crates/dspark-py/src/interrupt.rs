//! Ctrl-C while the engine works with the GIL released.
//!
//! A signal that arrives while Rust code runs is only noted by CPython; its Python handler
//! (for SIGINT: raise `KeyboardInterrupt`) runs the next time the interpreter checks, which a
//! detached engine loop never does. [`Interrupts`] does that check from the loop's per-round
//! hook, at most once every [`CHECK_EVERY`] (taking the GIL only then), and returns the
//! handler's exception as the engine's [`dspark::Error::Callback`]: the loop stops at the end
//! of the round, unwinds its per-call state, and the exception reaches Python unchanged. A
//! signal arriving on a thread other than the main thread is checked by Python there, as
//! usual (`check_signals` is a no-op off the main thread).

use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::errors::callback_error;

/// How often a detached loop looks for a pending signal (Ctrl-C answers within a round plus
/// this). Short next to a second, long next to the cost of taking the GIL.
pub const CHECK_EVERY: Duration = Duration::from_millis(20);

/// The context named by an interrupt that stops an engine call.
const CONTEXT: &str = "interrupt";

/// A throttled check for pending signals, for one engine call.
pub struct Interrupts {
    next: Instant,
}

impl Default for Interrupts {
    fn default() -> Self {
        Self::new()
    }
}

impl Interrupts {
    /// The first check happens at the first [`Interrupts::poll`].
    pub fn new() -> Self {
        Self {
            next: Instant::now(),
        }
    }

    /// From a thread without the GIL: when [`CHECK_EVERY`] has passed since the last check,
    /// take the GIL and run the pending signal handlers; their exception (`KeyboardInterrupt`)
    /// is the error.
    pub fn poll(&mut self) -> dspark::Result<()> {
        if !self.due() {
            return Ok(());
        }
        Python::attach(|py| self.check(py))
    }

    /// The same check with the GIL already held (every time: it is free then).
    pub fn check(&mut self, py: Python<'_>) -> dspark::Result<()> {
        self.next = Instant::now() + CHECK_EVERY;
        py.check_signals().map_err(|e| callback_error(CONTEXT, e))
    }

    fn due(&self) -> bool {
        Instant::now() >= self.next
    }
}
