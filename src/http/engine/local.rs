//! A request the balancer answers itself (the query interface): made the balancer's own
//! [`LocalRequest`] (its bytes copied: only such requests pay for it), its body read whole
//! within [`MOST_LOCAL_BODY`] and `HTTP_BODY_TIMEOUT`, handed to [`Upstreams::intercept`],
//! which may await, and its [`LocalAnswer`] written by the engine's one formatter within
//! [`WRITE_TIMEOUT`].

use std::future::poll_fn;
use std::time::Duration;

use hyper::StatusCode;

use super::client::Next;
use super::exchange::InHand;
use super::own::{self, CONTINUE};
use crate::http::h1::{Body, BodyReader, Part, Version};
use crate::http::refusal::Refusal;
use crate::http::{
    ClientHead, ExchangeOutcome, LocalAnswer, LocalBody, LocalRequest, MOST_LOCAL_BODY, Upstreams,
};
use crate::net::stream::Stream;

/// How long a client may take to read the balancer's answer (a status page of some tens of
/// KiB): past it the connection is closed, so a client that never reads holds no query place
/// for longer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a body was not read whole.
enum BodyFault {
    /// The client closed or failed: the connection closes without a word.
    Gone,
    /// Its chunks are malformed: 400.
    Malformed,
    /// It stopped coming for `HTTP_BODY_TIMEOUT`: 408.
    Silent,
}

impl<C: Stream, U: Upstreams> InHand<'_, C, U> {
    /// The balancer's own answer to this request; the connection goes on after it when the
    /// client wants it, its body was read whole, no drain is on and the balancer did not end
    /// it (a query place given up, a query connection past its life).
    #[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
    pub(super) fn intercepted(mut self) -> impl Future<Output = Next<U>> {
        async move {
            let mut request = self.local_request();
            let expects = self.head.expects_continue(self.buf.filled());
            // The request is the balancer's now: the buffer keeps what follows its head.
            self.buf.consume(self.head.len());
            // A client that waits before sending its body is told to send it: the balancer's
            // answer may need it.
            let waits = expects && self.buf.len() == 0 && self.head.version() == Version::Http11;
            if waits && self.head.body() != Body::Empty && !self.client.write(CONTINUE).await {
                return Next::Close;
            }
            let whole = match self.head.body() {
                Body::Empty | Body::Length(0) => true,
                body => match self.local_body(body).await {
                    Ok(body) => {
                        let whole = body != LocalBody::TooLarge;
                        request.body = body;
                        whole
                    }
                    Err(BodyFault::Gone) => return Next::Close,
                    Err(BodyFault::Malformed) => return self.refuse(Refusal::Body).await,
                    Err(BodyFault::Silent) => {
                        self.record.exchange.outcome = ExchangeOutcome::ClientTimeout;
                        return self.page(StatusCode::REQUEST_TIMEOUT, None, false).await;
                    }
                },
            };
            let upstreams = &self.engine.upstreams;
            let answer: LocalAnswer = upstreams.intercept(request, self.admission).await;
            if answer.unanswered {
                // Reported with no status: the client was sent nothing.
                return Next::Close;
            }
            let mut ending = self.own_ending();
            ending.close = !self.head.keep_alive()
                || !whole
                || answer.close
                || self.client.closing.is_cancelled();
            self.record.exchange.outcome = ExchangeOutcome::Local;
            self.record.answered_code(answer.status);
            if !ending.head_only {
                self.record.exchange.to_client = answer.body.len() as u64;
            }
            self.record.report();
            let bytes = own::local(&answer, ending);
            drop(answer);
            let written = tokio::time::timeout(WRITE_TIMEOUT, self.client.write(&bytes)).await;
            let written = written.unwrap_or(false);
            if written && !ending.close {
                return self.next(0);
            }
            self.closed(written, whole).await
        }
    }

    /// The request as the balancer's own type: its method, target and lines copied, and
    /// what its head measured.
    fn local_request(&self) -> LocalRequest {
        let view = ClientHead::new(&self.head, self.buf.filled());
        let peer = &self.client.peer;
        let target = view.path_and_query();
        let mut request = LocalRequest::new(view.method_bytes(), target, peer.peer, peer.tls);
        for (_, field) in view.fields() {
            request.push_field(field.name, field.value);
        }
        request.via = self.client.via;
        request.front_off_host = peer.front_off_host;
        let line = self.buf.filled().iter().position(|&b| b == b'\n');
        request.line_len = line.map_or(self.head.len(), |end| end + 1);
        request.head_len = self.head.len();
        request
    }

    /// The request's body, from the start of the buffer on (its head consumed), read whole
    /// when it is [`MOST_LOCAL_BODY`] or less; the buffer keeps what follows it (a pipelined
    /// request). Each silence is bounded by `HTTP_BODY_TIMEOUT`.
    async fn local_body(&mut self, body: Body) -> Result<LocalBody, BodyFault> {
        let mut reader = BodyReader::new(body);
        let mut data = Vec::new();
        loop {
            let mut used = 0;
            while used < self.buf.len() && !reader.is_done() {
                let input = &self.buf.filled()[used..];
                let step = reader.step(input).map_err(|_| BodyFault::Malformed)?;
                if step.part == Part::Data {
                    if data.len() + step.len > MOST_LOCAL_BODY {
                        return Ok(LocalBody::TooLarge);
                    }
                    data.extend_from_slice(&input[..step.len]);
                }
                used += step.len;
            }
            self.buf.consume(used);
            if reader.is_done() {
                return Ok(LocalBody::Whole(data));
            }
            let (buf, io) = (&mut self.buf, &mut *self.client.io);
            let read = poll_fn(|cx| buf.poll_read_from(cx, io));
            match tokio::time::timeout(self.settings.body_timeout, read).await {
                Ok(Ok(0) | Err(_)) => return Err(BodyFault::Gone),
                Ok(Ok(_)) => {}
                Err(_) => return Err(BodyFault::Silent),
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::http::{Choice, ConnectFailure, Downstream, Engine, Report, Settings};

    /// A balancer with no server, that answers the requests for `/own...` itself, saying what
    /// it was given (for the engine's other tests too).
    pub(in crate::http::engine) struct Echo;

    #[derive(Debug, thiserror::Error)]
    #[error("no server")]
    pub(in crate::http::engine) struct NoServer;

    impl ConnectFailure for NoServer {
        fn try_next(&self) -> bool {
            true
        }
    }

    impl Upstreams for Echo {
        type Server = SocketAddr;
        type Lease = ();
        type Stream = TcpStream;
        type ConnectError = NoServer;
        type ClientHold = ();
        type Admission = ();

        fn hold_client(&self, _: &Downstream) -> Option<()> {
            Some(())
        }

        fn admit(&self, _: &Downstream, (): &mut ()) -> bool {
            true
        }

        fn choose(
            &self,
            _: &ClientHead<'_>,
            _: &Downstream,
            _: &[SocketAddr],
        ) -> Option<Choice<Self>> {
            None
        }

        async fn connect(&self, _: &SocketAddr, _: &Downstream) -> Result<TcpStream, NoServer> {
            Err(NoServer)
        }

        fn report(&self, _: Report<'_, SocketAddr>) {}

        fn intercepts(&self, target: &[u8]) -> bool {
            target.starts_with(b"/own")
        }

        async fn intercept(&self, request: LocalRequest, (): &mut ()) -> LocalAnswer {
            // An answer that awaits, as one checking a password elsewhere would.
            tokio::task::yield_now().await;
            let body = match &request.body {
                LocalBody::Whole(body) => format!("{} bytes: {}", body.len(), body.escape_ascii()),
                LocalBody::TooLarge => "too large".to_string(),
            };
            let said = format!(
                "{} {} {:?} host={}\n{body}",
                String::from_utf8_lossy(request.method()),
                String::from_utf8_lossy(request.target()),
                request.client,
                String::from_utf8_lossy(request.value("HOST").unwrap_or_default()),
            );
            LocalAnswer::new(200, said).with("Content-Type", "text/plain")
        }
    }

    /// Sends `bytes` on a new connection to an engine over [`Echo`] and reads until it closes
    /// or `done` says what came is enough: what came back.
    async fn exchange(bytes: &[u8], done: impl Fn(&str) -> bool) -> String {
        let mut client = echo_client().await;
        client.write_all(bytes).await.unwrap();
        read_until(&mut client, done).await
    }

    /// A new connection to an engine over [`Echo`].
    async fn echo_client() -> TcpStream {
        let (client, serving) = echo_connection().await;
        tokio::spawn(serving);
        client
    }

    /// A loopback connection: its client's end, and the future of an engine over [`Echo`]
    /// serving its other end (for the engine's other tests too).
    pub(in crate::http::engine) async fn echo_connection()
    -> (TcpStream, impl Future<Output = ()> + Send) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, peer) = listener.accept().await.unwrap();
        let engine = Engine::new(Arc::new(Echo), Settings::default());
        let downstream = Downstream {
            peer: peer.into(),
            front_off_host: false,
            tls: false,
            local: None,
            check: false,
        };
        let (closing, cut) = (CancellationToken::new(), CancellationToken::new());
        (client, engine.serve(accepted, downstream, closing, cut, ()))
    }

    /// What `client` reads until it closes or `done` says it is enough.
    async fn read_until(client: &mut TcpStream, done: impl Fn(&str) -> bool) -> String {
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        let read = async {
            loop {
                if done(&String::from_utf8_lossy(&got)) {
                    break;
                }
                match client.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&chunk[..n]),
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), read)
            .await
            .unwrap();
        String::from_utf8_lossy(&got).into_owned()
    }

    #[tokio::test]
    async fn a_body_is_read_whole_chunked_or_not_and_the_connection_goes_on() {
        let request = b"POST /own/form HTTP/1.1\r\nHost: b\r\nContent-Length: 7\r\n\r\naction=\
            POST /own/chunked HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n\
            3\r\nx=1\r\n4\r\n&y=2\r\n0\r\n\r\n\
            GET /own/last HTTP/1.1\r\nHost: b\r\n\r\n";
        let got = exchange(request, |got| got.ends_with("0 bytes: ")).await;
        assert!(got.contains("POST /own/form Known("), "{got}");
        assert!(got.contains("host=b\n7 bytes: action="), "{got}");
        assert!(got.contains("7 bytes: x=1&y=2"), "{got}");
        assert!(got.contains("GET /own/last"), "{got}");
        assert!(!got.contains("Connection: close"), "{got}");
    }

    #[tokio::test]
    async fn a_body_over_the_bound_is_not_read_and_the_connection_closes() {
        let mut request = format!(
            "POST /own/big HTTP/1.1\r\nHost: b\r\nContent-Length: {}\r\n\r\n",
            MOST_LOCAL_BODY + 1
        )
        .into_bytes();
        request.extend(std::iter::repeat_n(b'z', MOST_LOCAL_BODY + 1));
        let got = exchange(&request, |_| false).await;
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
        assert!(got.contains("Connection: close\r\n"), "{got}");
        assert!(got.ends_with("too large"), "{got}");
    }

    #[tokio::test]
    async fn a_malformed_chunk_is_refused_before_the_balancer_sees_it() {
        let request =
            b"POST /own/x HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
        let got = exchange(request, |_| false).await;
        assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
        assert!(!got.contains("POST /own/x"), "{got}");
    }

    #[tokio::test]
    async fn a_client_that_expects_100_continue_is_told_to_send_its_body() {
        let mut client = echo_client().await;
        let head = b"POST /own/form HTTP/1.1\r\nHost: b\r\nContent-Length: 3\r\n\
            Expect: 100-continue\r\n\r\n";
        client.write_all(head).await.unwrap();
        let interim = read_until(&mut client, |got| got.ends_with("\r\n\r\n")).await;
        assert_eq!(interim, "HTTP/1.1 100 Continue\r\n\r\n");
        client.write_all(b"a=1").await.unwrap();
        let got = read_until(&mut client, |got| got.ends_with("a=1")).await;
        assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    }
}
