//! Graceful shutdown: the signal that starts it, and the bound on how long it takes.
//!
//! On SIGTERM or SIGINT the server stops accepting connections and requests (503 with
//! `Retry-After` on connections still open), the engine keeps stepping until its requests
//! finish or `--shutdown-timeout` passes, then aborts the rest (their streams end with
//! `finish_reason: "abort"` and `[DONE]`). The process exits 0 once the connections have
//! closed, or a little after the timeout in any case.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::state::AppState;

/// Extra time, past the engine's deadline, for the last responses to reach their clients.
pub const DRAIN_MARGIN: Duration = Duration::from_secs(2);

/// The first SIGTERM or SIGINT (Ctrl-C); its name.
pub async fn signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            },
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(
                    "cannot listen for SIGTERM/SIGINT ({e}): stop the server with SIGKILL"
                );
                std::future::pending().await
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}

/// The shutdown sequence's two halves: `begin` (stop admitting, give the engine its
/// deadline, tell the HTTP server to drain) and what waits on it.
#[derive(Clone)]
pub struct Shutdown {
    started: watch::Sender<bool>,
    timeout: Duration,
}

impl Shutdown {
    /// A shutdown whose in-flight requests get `timeout` to finish.
    pub fn new(timeout: Duration) -> Self {
        Self {
            started: watch::Sender::new(false),
            timeout,
        }
    }

    /// Start shutting down (idempotent).
    pub fn begin(&self, state: &AppState) {
        if !self.started.send_replace(true) {
            state.engine.shutdown(Instant::now() + self.timeout);
        }
    }

    /// Resolves once shutdown has begun.
    pub fn started(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.started.subscribe();
        async move {
            let _ = rx.wait_for(|&s| s).await;
        }
    }

    /// Resolves once shutdown has begun and its bound (the timeout plus [`DRAIN_MARGIN`]) has
    /// passed.
    pub fn expired(&self) -> impl Future<Output = ()> + Send + 'static {
        let started = self.started();
        let bound = self.timeout + DRAIN_MARGIN;
        async move {
            started.await;
            tokio::time::sleep(bound).await;
        }
    }
}
