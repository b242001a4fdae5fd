//! What the command line does only on Unix, where there are Unix sockets, descriptors to hand
//! down and signals to forward: the supervised mode and the upgrade, and the broker's control
//! socket and its part under a supervisor. Elsewhere `cli/elsewhere.rs` stands in for each
//! item, under the same name.
//!
//! - [`supervise`]: `--supervise`: the supervisor's start, and its socket for `upgrade`.
//! - [`upgrade`]: `appbroker upgrade`, and `--handover-version`, which a supervisor asks of
//!   the binary it would re-execute.
//! - [`control_socket`]: the broker's control socket, bound and served.
//! - [`supervised`]: the broker's side under a supervisor: the listeners handed down, the
//!   heartbeats, READY, and reloads that go through the supervisor.

mod control_socket;
mod supervise;
mod supervised;
mod upgrade;

pub use control_socket::{bind_control_socket, serve_control_socket};
pub use supervise::supervise;
pub use supervised::{Supervision, inherited, takes_over};
pub use upgrade::{handover_version, upgrade};
