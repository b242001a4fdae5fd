//! A request's end-of-answer accounting: once the request is finished with, whichever way
//! (answered whole, cut, given up, or its future dropped when the client went away), its
//! outcome is settled from how both bodies ended, the connection given back when both went
//! whole, and the exchange counted and reported.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use hyper::http::request::Parts;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Proxy;
use super::body::{Done, Ended, Upload};
use super::idle::Conn;
use crate::http::{Exchange, ExchangeOutcome, Report, Upstreams};

/// What is accounted once a request is finished with, whichever way: the access log's
/// exchange, the counters, and the connection given back when the answer went whole.
pub(crate) struct Finish<U: Upstreams> {
    proxy: Arc<Proxy<U>>,
    pub(super) exchange: Exchange<U::Server>,
    started: Instant,
    /// How the request's body went.
    pub(super) upload: Arc<Upload>,
    /// The server's connection the answer comes on (none once upgraded): given back when the
    /// exchange finished cleanly, else closed.
    pub(super) conn: Option<(U::Server, Conn)>,
    /// The balancer's lease, dropped once the request is finished with (unless an upgrade
    /// took it).
    pub(super) lease: Option<U::Lease>,
    pub(super) continued: Option<CancellationToken>,
    /// The client was given an answer's head.
    pub(super) answered: bool,
    /// Body bytes sent to the client.
    sent: u64,
    /// How the answer's body ended (`Cut` until it is known).
    ended: Ended,
}

impl<U: Upstreams> Finish<U> {
    pub(super) fn new(
        proxy: Arc<Proxy<U>>,
        client: std::net::SocketAddr,
        head: &Parts,
    ) -> Finish<U> {
        Finish {
            proxy,
            exchange: Exchange {
                client,
                method: head.method.clone(),
                uri: head.uri.clone(),
                status: None,
                server: None,
                to_server: 0,
                to_client: 0,
                duration: Duration::ZERO,
                outcome: ExchangeOutcome::Served,
            },
            started: Instant::now(),
            upload: Arc::default(),
            conn: None,
            lease: None,
            continued: None,
            answered: false,
            sent: 0,
            ended: Ended::Cut,
        }
    }
}

impl<U: Upstreams> Done for Finish<U> {
    fn done(mut self, sent: u64, ended: Ended) {
        self.sent = sent;
        self.ended = ended;
    }
}

impl<U: Upstreams> Drop for Finish<U> {
    /// Also when the request's future is dropped: the client went away before its answer.
    fn drop(&mut self) {
        let exchange = &mut self.exchange;
        exchange.to_server = self.upload.sent.load(Relaxed);
        exchange.to_client = self.sent;
        exchange.duration = self.started.elapsed();
        if !self.answered {
            exchange.status = None;
            exchange.outcome = ExchangeOutcome::Incomplete;
        } else if exchange.outcome == ExchangeOutcome::Served {
            exchange.outcome = match self.ended {
                Ended::Whole => ExchangeOutcome::Served,
                Ended::ServerSilent => ExchangeOutcome::ServerTimeout,
                Ended::Cut if self.upload.timed_out.load(Relaxed) => ExchangeOutcome::ClientTimeout,
                Ended::Cut => ExchangeOutcome::Incomplete,
            };
        }
        // Both messages framed and whole, the request's before the answer's end: else the
        // connection (dropped here) closes.
        let clean = self.ended == Ended::Whole && self.upload.is_finished();
        if let Some((server, conn)) = self.conn.take().filter(|_| clean) {
            Arc::clone(&self.proxy).give_back(server, conn);
        }
        self.proxy
            .stats
            .finished(exchange.status, exchange.duration, &exchange.outcome);
        self.proxy.upstreams.report(Report::Exchange(exchange));
    }
}
