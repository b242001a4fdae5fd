//! The supervisor's socket on the loop's side ([`super::upgrade`] says where it is, binds it
//! and asks on it): connections accepted, each one's request read in a task of its own
//! (bounded in time and size, so a silent client holds nothing up), an `upgrade` handed to
//! the loop, anything else answered and hung up on; the one answer line an `appbroker
//! upgrade` gets; and the socket's file removed when the supervisor stops for good.

use std::os::unix::net::UnixStream;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::mpsc;

use super::upgrade::REQUEST;

/// How long a connection has to send its request line, and an answer to be written: `appbroker
/// upgrade` sends its line at once, and reads its answer as soon as it comes.
const LINE_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest request line read: `upgrade` and its newline, with room to spare.
const MAX_REQUEST: u64 = 64;

/// The socket `appbroker upgrade` asks on, and the upgrades asked on it, read and waiting for
/// the loop.
pub(super) struct UpgradeSocket {
    /// `None` with `CONTROL_SOCKET=0`: nothing is accepted.
    listener: Option<UnixListener>,
    /// Where the reading tasks hand an `upgrade`'s connection.
    requests: mpsc::Sender<UnixStream>,
    /// The upgrades asked, in order; one waits at most (the loop takes it at once).
    asked: mpsc::Receiver<UnixStream>,
}

impl UpgradeSocket {
    /// The supervisor's socket (bound by [`super::upgrade::bind`], or handed over by the
    /// previous image), made ready for the loop's runtime.
    pub(super) fn new(listener: Option<std::os::unix::net::UnixListener>) -> std::io::Result<Self> {
        let listener = match listener {
            Some(listener) => {
                listener.set_nonblocking(true)?;
                Some(UnixListener::from_std(listener)?)
            }
            None => None,
        };
        let (requests, asked) = mpsc::channel(1);
        Ok(UpgradeSocket {
            listener,
            requests,
            asked,
        })
    }

    /// The listening socket, to hand down on an upgrade's re-execution.
    pub(super) fn listener(&self) -> Option<&UnixListener> {
        self.listener.as_ref()
    }

    /// The next `appbroker upgrade`'s connection, waiting for its answer. Accepts meanwhile,
    /// each connection's request read in a task of its own. Cancel-safe (the loop drops it
    /// whenever something else happens first); a failed accept stops accepting until it is
    /// called again, so a shortage of descriptors does not spin.
    pub(super) async fn asked(&mut self) -> UnixStream {
        let mut accepting = true;
        loop {
            let accepted = async {
                match (&self.listener, accepting) {
                    (Some(listener), true) => listener.accept().await.map(|(stream, _)| stream),
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                Some(client) = self.asked.recv() => return client,
                accepted = accepted => match accepted {
                    Ok(stream) => read_request(stream, self.requests.clone()),
                    Err(_) => accepting = false,
                },
            }
        }
    }

    /// Removes the socket's file: the supervisor stops for good (an upgrade's exec never
    /// comes back to this), so no one may take a stale file for a live supervisor.
    pub(super) fn remove(&self) {
        if let Some(listener) = &self.listener
            && let Ok(address) = listener.local_addr()
            && let Some(path) = address.as_pathname()
        {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Reads the one request line of a connection on the supervisor's socket (bounded in time
/// and size, in a task of its own so a silent client holds nothing up) and hands the
/// connection on to `requests` when it asks for an upgrade.
fn read_request(stream: tokio::net::UnixStream, requests: mpsc::Sender<UnixStream>) {
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut line = Vec::new();
        let mut reader = tokio::io::BufReader::new(stream).take(MAX_REQUEST);
        let read = tokio::time::timeout(
            LINE_TIMEOUT,
            tokio::io::AsyncBufReadExt::read_until(&mut reader, b'\n', &mut line),
        )
        .await;
        let Ok(stream) = reader.into_inner().into_inner().into_std() else {
            return;
        };
        if read.is_ok() && line.trim_ascii() == REQUEST.as_bytes() {
            let _ = stream.set_nonblocking(false);
            let _ = requests.send(stream).await;
        } else {
            answer(
                stream,
                "refused: unknown request (this socket takes `upgrade`)",
            );
        }
    });
}

/// Writes `line` to an `appbroker upgrade` and hangs up.
pub(super) fn answer(mut client: UnixStream, line: &str) {
    use std::io::Write;
    let _ = client.set_nonblocking(false);
    let _ = client.set_write_timeout(Some(LINE_TIMEOUT));
    let _ = client.write_all(format!("{line}\n").as_bytes());
}
