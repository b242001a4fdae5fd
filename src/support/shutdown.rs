//! The broker's shutdown state, and signals to actions for the binary: SIGTERM or SIGINT
//! starts a graceful shutdown (a second one exits at once with code 1), SIGHUP reloads the
//! configuration and is never fatal. A library user asks for these through the broker's
//! handle instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// The broker's shutdown request, shared by the signal handler, the broker and (for PING) the
/// query interface.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    requested: CancellationToken,
    draining: Arc<AtomicBool>,
    /// Another broker serves the ports now (a supervisor's handover): this one's stop is no
    /// news, and it tells of none.
    handed_over: Arc<AtomicBool>,
}

impl Shutdown {
    /// A shutdown not yet requested.
    pub fn new() -> Self {
        Shutdown::default()
    }

    /// Asks the broker to shut down gracefully.
    pub fn request(&self) {
        self.requested.cancel();
    }

    /// Asks the broker to shut down gracefully because another broker took over its ports
    /// (its supervisor's upgrade, or a reload that moved them): the same drain, without
    /// `broker_stopping`, since nothing stops serving.
    pub fn hand_over(&self) {
        self.handed_over.store(true, Relaxed);
        self.request();
    }

    /// True when the shutdown is a [`Shutdown::hand_over`].
    pub fn is_handed_over(&self) -> bool {
        self.handed_over.load(Relaxed)
    }

    /// True once a shutdown was asked for.
    pub fn is_requested(&self) -> bool {
        self.requested.is_cancelled()
    }

    /// Completes when a shutdown is asked for.
    pub async fn requested(&self) {
        self.requested.cancelled().await;
    }

    /// True from the shutdown request on: PING answers 503 so a front load balancer takes
    /// the broker out of rotation before its listeners close.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Relaxed)
    }

    pub(crate) fn set_draining(&self) {
        self.draining.store(true, Relaxed);
    }
}

/// Listens for signals for the rest of the process's life; SIGHUP calls `reload`.
#[cfg(unix)]
pub fn handle_signals(
    shutdown: Shutdown,
    reload: impl Fn() + Send + 'static,
) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        loop {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
                _ = hup.recv() => {
                    info!("received SIGHUP: reloading the configuration");
                    reload();
                    continue;
                }
            };
            if shutdown.is_requested() {
                error!("received {name} again: exiting at once");
                std::process::exit(1);
            }
            info!("received {name}: shutting down gracefully (send it again to exit at once)");
            shutdown.request();
        }
    });
    Ok(())
}

/// Ctrl-C is the one signal a Windows console sends (no reload there yet).
#[cfg(not(unix))]
pub fn handle_signals(
    shutdown: Shutdown,
    _reload: impl Fn() + Send + 'static,
) -> std::io::Result<()> {
    tokio::spawn(async move {
        loop {
            if tokio::signal::ctrl_c().await.is_err() {
                return;
            }
            if shutdown.is_requested() {
                error!("received Ctrl-C again: exiting at once");
                std::process::exit(1);
            }
            info!("received Ctrl-C: shutting down gracefully (press it again to exit at once)");
            shutdown.request();
        }
    });
    Ok(())
}
