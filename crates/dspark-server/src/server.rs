//! Serving a router on a listener until shutdown, within the shutdown bound.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::routes::router;
use crate::shutdown::Shutdown;
use crate::state::AppState;

/// Serve `state` on `listener` until `stop` resolves, then shut down gracefully: stop
/// admitting, let requests finish for `timeout`, abort the rest, wait for connections to
/// close (at most `timeout` plus a margin).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    stop: impl Future<Output = ()> + Send + 'static,
    timeout: Duration,
) -> std::io::Result<()> {
    let shutdown = Shutdown::new(timeout);
    let trigger = shutdown.clone();
    let trigger_state = state.clone();
    tokio::spawn(async move {
        stop.await;
        trigger.begin(&trigger_state);
    });
    let app = router(state.clone());
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.started())
        .into_future();
    let result = tokio::select! {
        r = server => r,
        () = shutdown.expired() => {
            tracing::warn!("connections still open after the shutdown timeout: closing them");
            Ok(())
        }
    };
    // Also when the server failed: the engine thread must stop.
    shutdown.begin(&state);
    result
}

/// A server running on a background task (tests, embedding).
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// Start serving `state` on `addr` (port 0: any free port).
    pub async fn start(
        state: AppState,
        addr: SocketAddr,
        timeout: Duration,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(
            listener,
            state,
            async move {
                let _ = stopped.await;
            },
            timeout,
        ));
        Ok(Self {
            addr,
            stop: Some(stop),
            task,
        })
    }

    /// Begin the graceful shutdown (as SIGTERM does) and wait for the server to stop.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?
    }
}
