//! Who may query, and what they may see: `QUERY_ENABLED` and `QUERY_ALLOW` of each balancer,
//! asked again at every request (a reload may change them), and the configuration as a client
//! may see it on CFG.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::labels;
use crate::balancer::Generation;
use crate::balancer::shared::Shared;
use crate::config::Config;

/// What a query is told when every `QUERY_MAX_CONNECTIONS` place is busy (a 503).
pub(super) const BUSY: &str =
    "too many queries at once (QUERY_MAX_CONNECTIONS); try again shortly\n";

/// Why `peer` may not query the balancer of `generation` now (the 403's text), or `None` when
/// it may.
pub(super) fn refusal(generation: &Generation, peer: SocketAddr) -> Option<String> {
    let query = &generation.config.query;
    let section = generation.config.kind.section();
    if !query.enabled {
        return Some(format!(
            "403 Forbidden: queries are turned off on this port (QUERY_ENABLED=0 in [{section}])\n"
        ));
    }
    if query.allow.iter().any(|c| c.contains(peer.ip())) {
        return None;
    }
    Some(format!(
        "403 Forbidden: {} is not in QUERY_ALLOW of [{section}]\n",
        peer.ip()
    ))
}

/// Why a client a trusted proxy's `X-Forwarded-For` left unknown may not query the balancer of
/// `generation` (the 403's text): never, whatever `QUERY_ALLOW` says (its default admits
/// every address, and an unknown client could be any of them, the proxy's own included).
pub(super) fn unknown_refusal(generation: &Generation) -> String {
    let section = generation.config.kind.section();
    format!(
        "403 Forbidden: the client is unknown (the X-Forwarded-For of a proxy in \
         HTTP_TRUSTED_PROXIES of [{section}] names no usable address), and QUERY_ALLOW admits \
         no unknown client\n"
    )
}

/// The configuration as `peer` may see it: the sections of the balancers whose `QUERY_ALLOW`
/// admits it, and the file paths (the configuration's, `ConsoleFile`) only when every
/// balancer does, as those belong to the process as a whole.
pub(super) fn visible_config(shared: &Shared, peer: SocketAddr) -> Config {
    let mut config = Config::clone(&shared.config.load());
    let balancers = shared.balancers.load();
    let may_query = |kind| {
        balancers
            .iter()
            .find(|b| b.kind() == kind)
            .is_some_and(|b| refusal(&b.generation(), peer).is_none())
    };
    let everywhere = config.balancers.iter().all(|b| may_query(b.kind));
    config.balancers.retain(|b| may_query(b.kind));
    if !everywhere {
        let hidden = PathBuf::from(labels::of(config.general.language).hidden);
        config.source = hidden.clone();
        if config.general.console_file.is_some() {
            config.general.console_file = Some(hidden);
        }
    }
    config
}
