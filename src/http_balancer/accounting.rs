//! A finished request and an ended tunnel accounted for: the server's traffic, its requests
//! that time out in a row (every `HTTP_TIMEOUTS_TO_QUARANTINE` of them quarantine it), the
//! 503s counted, the event, the access log's line (`LOG_REQUESTS`); and the figures a query
//! of the balancer shows (its sessions, requests and pooled connections).

use std::sync::{Arc, Weak};

use tokio::time::Instant;
use tracing::{info, warn};

use crate::balancer::events::{Event, Unserved};
use crate::balancer::rules::health::Reason;
use crate::balancer::{Closed, Server};
use crate::config::show_duration;
use crate::http::{Exchange, ExchangeOutcome, Tunnel};
use crate::http_balancer::{HttpBalancer, ServerTarget};
use crate::query::snapshot::{HttpFigures, SESSION_AGES_SHOWN, ServerSessions, SessionFigures};

impl HttpBalancer {
    /// A finished request: the server's traffic and its timeouts, the 503 counted, the
    /// access-log line.
    pub(super) fn exchanged(&self, exchange: &Exchange<ServerTarget>) {
        if let Some(server) = &exchange.server {
            server.0.add_traffic(exchange.to_server, exchange.to_client);
            self.count_timeouts(&server.0, &exchange.outcome);
        }
        let (balancer, span) = (&self.balancer, &self.span);
        let unserved = match exchange.outcome {
            ExchangeOutcome::NoServer => Some(Unserved::NoServer),
            ExchangeOutcome::BrokerFault => Some(Unserved::BrokerFault),
            _ => None,
        };
        if let Some(why) = unserved {
            span.in_scope(|| balancer.unserved(exchange.client.or_unspecified(), why));
        }
        if exchange.outcome == ExchangeOutcome::ClientTimeout
            && let Some(suppressed) = self.body_timeouts_log.allow()
        {
            let timeout = show_duration(balancer.generation().config.http.body_timeout);
            span.in_scope(|| {
                warn!(
                    more_since_last_line = suppressed,
                    client = %exchange.client,
                    "a client's request body stopped arriving for HTTP_BODY_TIMEOUT={timeout}; \
                     answered 408 (or its connection closed, when the answer had begun)"
                );
            });
        }
        balancer.events().emit(|| Event::Request {
            balancer: balancer.kind(),
            client: exchange.client.or_unspecified(),
            method: exchange.method.to_string(),
            path: exchange.uri.to_string(),
            status: exchange.status.map(|s| s.as_u16()),
            server: exchange.server.as_ref().map(|s| s.0.address.clone()),
        });
        if balancer.generation().config.http.log_requests {
            span.in_scope(|| access_line(exchange));
        }
    }

    /// A server's requests that time out in a row: the first of a run is logged, every
    /// `HTTP_TIMEOUTS_TO_QUARANTINE` of them quarantine it (0: never), and an answer ends the
    /// run (logged when one was running). A failure of the client's, or a client gone before
    /// the answer, says nothing of the server.
    fn count_timeouts(&self, server: &Server, outcome: &ExchangeOutcome) {
        match outcome {
            // In the balancer's span only when a line may be written: entering it costs a
            // request some 300 instructions (docs/benchmarks.md).
            ExchangeOutcome::ServerTimeout => self.span.in_scope(|| {
                let keys = &self.balancer.generation().config.http;
                let in_a_row = server.timed_out();
                let timeout = show_duration(keys.response_timeout);
                if in_a_row == 1 {
                    warn!(
                        "server {} did not answer within HTTP_RESPONSE_TIMEOUT={timeout}; its \
                         requests are answered 504 (or cut, when the answer had begun)",
                        server.address
                    );
                }
                let limit = keys.timeouts_to_quarantine;
                if limit > 0 && in_a_row.is_multiple_of(limit) {
                    let words = format!("did not answer {limit} requests within {timeout}");
                    self.balancer.quarantine(server, Reason::Timeout, &words);
                }
            }),
            ExchangeOutcome::Served | ExchangeOutcome::ServerFailed(_) => {
                let run = server.answered();
                if run > 0 {
                    self.span.in_scope(|| {
                        info!(
                            "server {} answering again after {run} requests timed out in a row",
                            server.address
                        );
                    });
                }
            }
            _ => {}
        }
    }

    /// An upgraded connection ended: its closing line, as a relayed connection's. Its bytes
    /// are the server's traffic through its request's exchange, reported next.
    pub(super) fn tunnel_ended(&self, tunnel: &Tunnel<ServerTarget>) {
        let closed = Closed {
            client: tunnel.client.or_unspecified(),
            duration: tunnel.duration,
            to_server: tunnel.to_server,
            to_client: tunnel.to_client,
            end: &tunnel.end,
        };
        let generation = self.balancer.generation();
        self.balancer
            .ended(&tunnel.server.0, &generation, &closed, &self.span);
    }
    /// The figures a query of this balancer shows.
    pub(super) fn figures(&self) -> HttpFigures {
        let Some(proxy) = self.proxy.get().and_then(Weak::upgrade) else {
            return HttpFigures::default();
        };
        let pools = proxy.pool_figures();
        let generation = self.balancer.generation();
        let sessions = {
            let mut table = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            table.expire(now, generation.config.http.session_timeout);
            self.count_sessions(&table, &generation.servers);
            SessionFigures {
                live: table.len() as u64,
                total: table.total(),
                peak: table.peak(),
                moved: table.moved_count(),
                servers: generation
                    .servers
                    .iter()
                    .map(|s| {
                        let figures = ServerSessions {
                            live: table.count(s.id),
                            peak: table.peak_of(s.id),
                            ages: table.ages(s.id, now, SESSION_AGES_SHOWN),
                        };
                        (s.address.clone(), figures)
                    })
                    .collect(),
            }
        };
        HttpFigures {
            sessions,
            requests: proxy.stats().figures(),
            pools: self
                .balancer
                .generation()
                .servers
                .iter()
                .map(|s| {
                    let figures = pools
                        .iter()
                        .find(|(t, _)| Arc::ptr_eq(&t.0, s))
                        .map(|(_, f)| *f)
                        .unwrap_or_default();
                    (s.address.clone(), figures)
                })
                .collect(),
        }
    }
}

/// The access log's line for one request (`LOG_REQUESTS`): who, what, the answer, the bytes
/// each way, how long, which server, in which HTTP version (`http/1.1`, `h2`).
fn access_line(exchange: &Exchange<ServerTarget>) {
    let status = exchange
        .status
        .map_or_else(|| "-".to_string(), |s| s.as_u16().to_string());
    let server = exchange
        .server
        .as_ref()
        .map_or_else(|| "-".to_string(), ToString::to_string);
    let error: Option<std::borrow::Cow<'_, str>> = match &exchange.outcome {
        ExchangeOutcome::ServerFailed(error) => Some(error.as_str().into()),
        ExchangeOutcome::ServerTimeout => {
            Some("the server was silent past HTTP_RESPONSE_TIMEOUT".into())
        }
        ExchangeOutcome::BrokerFault => {
            Some("the broker itself could not connect to a server".into())
        }
        ExchangeOutcome::Incomplete => Some("answer incomplete".into()),
        ExchangeOutcome::ClientFailed => Some("request body broken off".into()),
        ExchangeOutcome::ClientTimeout => {
            Some("the request body was silent past HTTP_BODY_TIMEOUT".into())
        }
        ExchangeOutcome::TunnelBroken(end) => Some(format!("the tunnel ended: {end}").into()),
        _ => None,
    };
    info!(
        client = %exchange.client,
        method = %exchange.method,
        path = %exchange.uri,
        status = %status,
        bytes_from_client = exchange.to_server,
        bytes_to_client = exchange.to_client,
        duration = %format_args!("{:.3}s", exchange.duration.as_secs_f64()),
        server = %server,
        protocol = exchange.protocol.name(),
        error = error.as_deref(),
        "request"
    );
}
