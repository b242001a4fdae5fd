//! Bodies of a known pattern: sent by a client or an origin ([`PatternBody`]), checked as
//! they stream ([`PatternCheck`]), so a lost, repeated, reordered or changed byte is seen
//! anywhere in a transfer too large to keep.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};

/// Pattern blocks: 1 MiB of pseudo-random bytes whose first 8 bytes are the block's number,
/// so a lost, repeated or reordered block is seen, not only a changed byte.
const BLOCK: usize = 1 << 20;

fn base_block() -> &'static [u8] {
    static BASE: OnceLock<Vec<u8>> = OnceLock::new();
    BASE.get_or_init(|| {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        (0..BLOCK)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    })
}

fn block(n: u64) -> Bytes {
    let mut b = BytesMut::from(base_block());
    b[..8].copy_from_slice(&n.to_le_bytes());
    b.freeze()
}

/// A body of `total` pattern bytes, 1 MiB a frame; `exact` says its length up front
/// (Content-Length), else it goes chunked.
pub struct PatternBody {
    sent: u64,
    total: u64,
    exact: bool,
}

impl PatternBody {
    /// `total` bytes; with a length up front when `exact`.
    pub fn new(total: u64, exact: bool) -> PatternBody {
        PatternBody {
            sent: 0,
            total,
            exact,
        }
    }
}

impl Body for PatternBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sent >= self.total {
            return Poll::Ready(None);
        }
        let n = (self.total - self.sent).min(BLOCK as u64);
        let data = block(self.sent / BLOCK as u64).slice(..n as usize);
        self.sent += n;
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent >= self.total
    }

    fn size_hint(&self) -> SizeHint {
        if self.exact {
            SizeHint::with_exact(self.total - self.sent)
        } else {
            SizeHint::default()
        }
    }
}

/// Checks bytes against the pattern as they arrive.
#[derive(Default)]
pub struct PatternCheck {
    /// Bytes checked so far.
    pub seen: u64,
    /// The offset of the first byte that was not the pattern's.
    pub bad_at: Option<u64>,
}

impl PatternCheck {
    /// Checks the next bytes of the stream.
    pub fn feed(&mut self, mut data: &[u8]) {
        let base = base_block();
        while !data.is_empty() {
            let block = self.seen / BLOCK as u64;
            let within = (self.seen % BLOCK as u64) as usize;
            let n = data.len().min(BLOCK - within);
            let (now, rest) = data.split_at(n);
            let header = block.to_le_bytes();
            let ok = now
                .iter()
                .enumerate()
                .take(8usize.saturating_sub(within))
                .all(|(i, b)| *b == header[within + i])
                && {
                    let skip = 8usize.saturating_sub(within).min(n);
                    now[skip..] == base[within + skip..within + n]
                };
            if !ok && self.bad_at.is_none() {
                self.bad_at = Some(self.seen);
            }
            self.seen += n as u64;
            data = rest;
        }
    }
}

/// Reads a whole body through a [`PatternCheck`]: (bytes, first bad offset).
pub async fn check_body<B>(mut body: B) -> (u64, Option<u64>)
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let mut check = PatternCheck::default();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("body frame").into_data() {
            check.feed(&data);
        }
    }
    (check.seen, check.bad_at)
}
