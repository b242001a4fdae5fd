//! The least a TCP proxy on tokio does per connection, as appbroker's workers run it: one
//! current-thread runtime with its I/O and timer drivers, a task per client, a connect to the
//! server, bytes both ways with half-close (a read, then a write, each way), then close. No
//! sniff, no timeouts, no accounting, no HTTP: each port relays to its server as plain TCP (a
//! kept-alive HTTP connection's requests pass through as bytes). benches/callgrind.py counts it
//! beside appbroker (`--anchors tokio-floor`): the runtime's share of a connection.
//!
//!     tokio-floor LISTEN_PORT SERVER_PORT [LISTEN_PORT SERVER_PORT ...]

use std::net::{Ipv4Addr, SocketAddr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// A read's most, as appbroker's relay reads (`net::relay`'s `BUFFER_SIZE`).
const BUFFER: usize = 64 * 1024;

fn main() -> std::io::Result<()> {
    let ports: Vec<u16> = std::env::args()
        .skip(1)
        .map(|port| port.parse().expect("a port number"))
        .collect();
    assert!(
        !ports.is_empty() && ports.len() % 2 == 0,
        "usage: tokio-floor LISTEN_PORT SERVER_PORT [...]"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        for pair in ports.chunks(2) {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, pair[0])).await?;
            let server = SocketAddr::from((Ipv4Addr::LOCALHOST, pair[1]));
            tokio::spawn(accept(listener, server));
        }
        tokio::signal::ctrl_c().await.ok();
        Ok(())
    })
}

async fn accept(listener: TcpListener, server: SocketAddr) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            if let Ok(upstream) = TcpStream::connect(server).await {
                let _ = upstream.set_nodelay(true);
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = upstream.into_split();
                tokio::join!(
                    one_way(&mut from_client, &mut to_server),
                    one_way(&mut from_server, &mut to_client),
                );
            }
        });
    }
}

/// Bytes from `from` to `to` until `from` ends, then `to` shut for writing (half-close). The
/// buffer is not zeroed (`read_buf` reads into its spare room): appbroker's relay reuses its
/// buffers rather than zeroing one a connection.
async fn one_way(from: &mut OwnedReadHalf, to: &mut OwnedWriteHalf) {
    let mut buffer = Vec::with_capacity(BUFFER);
    loop {
        buffer.clear();
        match from.read_buf(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if to.write_all(&buffer).await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}
