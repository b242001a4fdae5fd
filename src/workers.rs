//! The data path's threads: one per core, each with its own single-threaded tokio runtime
//! and, on Linux, its own listening socket per balancer (SO_REUSEPORT), so a connection is
//! accepted, relayed and closed on one thread: no work stealing and no wake-ups across
//! threads for each exchange, as nginx's workers. Control work (signals, reloads, the
//! monitor, sampling) runs on the main thread's runtime.

use std::cell::Cell;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::runtime::Handle;
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
        if crate::sys::REUSEPORT_SPREADS {
            self.handles.len()
        } else {
            1
        }
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
    if crate::sys::REUSEPORT_SPREADS {
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
