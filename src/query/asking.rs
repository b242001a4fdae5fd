//! One query as a command answers it ([`Query`]): the request, who asks, of which balancer,
//! and what every answer reads of it: the balancer's state now, and the page's language.

use std::net::SocketAddr;

use super::access::refusal;
use super::language::{self, Chosen};
use super::snapshot::{HttpFigures, Snapshot};
use crate::balancer::Balancer;
use crate::balancer::shared::Shared;
use crate::config::{Language, ValueOrigin};
use crate::http::LocalRequest;

/// One query as a command answers it: the request, who asks, of which balancer.
pub(super) struct Query<'a> {
    /// The broker's shared state: the other balancers, the configuration, the shutdown state.
    pub(super) shared: &'a Shared,
    pub(super) balancer: &'a Balancer,
    pub(super) peer: SocketAddr,
    pub(super) request: &'a LocalRequest,
    /// The balancer's HTTP figures, on an HTTP balancer, for the pages that show them.
    pub(super) http: Option<HttpFigures>,
    /// The host name the client used (its `Host`), for the links to the other balancers.
    pub(super) host: String,
    /// What follows the command in the path, decoded (`SERVERSTATUS`'s `<host>:<port>`).
    pub(super) argument: &'a str,
}

impl Query<'_> {
    /// The balancer's state now, with the other balancers this client may query.
    pub(super) fn snapshot(&self) -> Snapshot {
        let others = self
            .shared
            .balancers
            .load()
            .iter()
            .filter(|b| !std::ptr::eq(b.as_ref(), self.balancer))
            // A link to a balancer this client may not query would give its address away.
            .filter(|b| refusal(&b.generation(), self.peer).is_none())
            .map(|b| {
                let generation = b.generation();
                (generation.config.kind, generation.config.listen)
            })
            .collect();
        let chosen = self.language();
        let mut snapshot = Snapshot::take(
            self.balancer,
            chosen.language,
            self.shared.started_wall_ms,
            self.peer,
            self.shared.shutdown.is_draining(),
            others,
        );
        snapshot.language_asked = chosen.asked;
        snapshot.http = self.http.clone();
        snapshot
    }

    /// The language of this request's page: `?lang=`, else `LANGUAGE` where the file sets
    /// it, else the browser's `Accept-Language`, else `LANGUAGE`'s default.
    pub(super) fn language(&self) -> Chosen {
        let config = self.shared.config.load();
        let set_in_file = config.origins.get("GENERAL", "LANGUAGE") != ValueOrigin::Default;
        let browser = self.request.values("accept-language");
        let query = self
            .request
            .query()
            .and_then(|q| std::str::from_utf8(q).ok());
        language::choose(
            query,
            set_in_file.then_some(config.general.language),
            browser,
            Language::English,
        )
    }
}

/// `%XX` escapes of a path decoded; a malformed escape is kept as it is (and then names
/// nothing), and bytes that are not UTF-8 are replaced.
pub(super) fn percent_decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(hi), Some(lo)) if hex(hi).is_some() && hex(lo).is_some() => {
                out.push((hex(hi).unwrap_or(0) * 16 + hex(lo).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
