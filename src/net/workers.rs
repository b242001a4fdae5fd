//! The data path's threads: one per core, each with its own single-threaded tokio runtime
//! and, on Linux, its own listening socket per balancer (SO_REUSEPORT), so a connection is
//! accepted, relayed and closed on one thread: no work stealing and no wake-ups across
//! threads for each exchange, as nginx's workers. Control work (signals, reloads, the
//! monitor, sampling) runs on the main thread's runtime. Each runtime can be asked to tick
//! ([`Workers::ticks`]): a supervised broker's heartbeats, which stop when a runtime is stuck.

use std::cell::Cell;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Where connection work can be spawned: one handle per worker thread.
#[derive(Debug, Clone)]
pub struct Workers {
    handles: Arc<Vec<Handle>>,
}

impl Workers {
    /// The workers' runtime handles, in order; never empty.
    pub fn handles(&self) -> &[Handle] {
        &self.handles
    }

    /// How many listening sockets each balancer gets: one per worker where the kernel spreads
    /// connections across several sockets on one port (SO_REUSEPORT, Linux), else one.
    pub fn listeners_per_balancer(&self) -> usize {
        if crate::net::sys::REUSEPORT_SPREADS {
            self.handles.len()
        } else {
            1
        }
    }

    /// Every `period`, each worker's index from a task on that worker's own runtime (the
    /// first at once), until the receiver is dropped: proof that each event loop still turns.
    /// A runtime blocked by a deadlock or a busy loop sends nothing, while the others go on;
    /// a tick that finds the channel full is dropped (the receiver is the one behind).
    pub fn ticks(&self, period: Duration) -> mpsc::Receiver<usize> {
        let (tick, ticks) = mpsc::channel(self.handles.len() * 4);
        for (index, handle) in self.handles.iter().enumerate() {
            let tick = tick.clone();
            handle.spawn(async move {
                let mut every = tokio::time::interval(period);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    every.tick().await;
                    if let Err(mpsc::error::TrySendError::Closed(_)) = tick.try_send(index) {
                        return;
                    }
                }
            });
        }
        ticks
    }
}

thread_local! {
    /// The worker thread this is, if it is one.
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Which worker thread the caller runs on (`None` off the workers: the control thread, or a
/// test's runtime). What is bound to one worker's runtime (an HTTP server connection's
/// driver) is best used from that worker alone.
pub fn current() -> Option<usize> {
    WORKER.with(Cell::get)
}

/// How many worker threads `WORKERS=count` starts (0: one per CPU this process may run on).
pub fn thread_count(count: usize) -> usize {
    match count {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

/// How many listening sockets each balancer gets with `WORKERS=count`, as
/// [`Workers::listeners_per_balancer`] says once they run: for a supervisor that binds them
/// before any worker exists.
pub fn listeners_for(count: usize) -> usize {
    if crate::net::sys::REUSEPORT_SPREADS {
        thread_count(count)
    } else {
        1
    }
}

/// The worker threads themselves, stopped and joined by [`WorkerThreads::stop`].
#[derive(Debug)]
pub struct WorkerThreads {
    workers: Workers,
    threads: Vec<JoinHandle<()>>,
    stop: CancellationToken,
}

impl WorkerThreads {
    /// Starts `count` worker threads (0: one per CPU this process may run on).
    pub fn start(count: usize) -> io::Result<WorkerThreads> {
        let count = thread_count(count);
        let stop = CancellationToken::new();
        let mut handles = Vec::with_capacity(count);
        let mut threads = Vec::with_capacity(count);
        for index in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let stop = stop.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("appbroker-{index}"))
                    .spawn(move || {
                        WORKER.with(|worker| worker.set(Some(index)));
                        runtime.block_on(stop.cancelled());
                    })?,
            );
        }
        Ok(WorkerThreads {
            workers: Workers {
                handles: Arc::new(handles),
            },
            threads,
            stop,
        })
    }

    /// The handles to spawn on.
    pub fn workers(&self) -> Workers {
        self.workers.clone()
    }

    /// Stops every worker (tasks still running there are dropped) and waits for the threads.
    pub fn stop(self) {
        self.stop.cancel();
        for thread in self.threads {
            let _ = thread.join();
        }
    }

    /// Stops every worker without waiting for the threads to end.
    pub fn detach(self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_blocked_runtime_stops_ticking_while_the_others_go_on() {
        let threads = WorkerThreads::start(2).expect("two workers");
        let workers = threads.workers();
        // Worker 1's runtime is blocked (as by a deadlock) until `release` is sent.
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        workers.handles()[1].spawn(async move {
            let _ = blocked.recv();
        });
        let mut ticks = workers.ticks(Duration::from_millis(5));
        let mut from = [0usize; 2];
        while from[0] < 20 {
            let index = ticks.recv().await.expect("ticks");
            from[index] += 1;
        }
        // Its first tick may have come before the block took hold: none since.
        assert!(from[1] <= 1, "{from:?}");
        release.send(()).expect("release");
        while from[1] < 3 {
            let index = ticks.recv().await.expect("ticks");
            from[index] += 1;
        }
        drop(ticks);
        threads.stop();
    }
}
