//! The engine made for an HTTP balancer, with its settings from the balancer's keys
//! ([`http::Settings::from_config`]), and a reload applied to it.

use std::sync::{Arc, Mutex, OnceLock};

use crate::balancer::shared::Shared;
use crate::balancer::{Balancer, Generation};
use crate::config::Language;
use crate::http::{self, Engine};
use crate::http_balancer::sessions::SessionSecrets;
use crate::http_balancer::sweep::expire_sessions;
use crate::http_balancer::{HttpBalancer, HttpProxy, ServerTarget};
use crate::query::Operators;
use crate::support::throttle::Throttle;

/// The engine of `balancer`, with its settings, its session cookies signed with
/// `session_secrets`, its queries' page of actions run by `operators`. Within a tokio runtime (its idle sweep and the sessions' expiry run
/// there).
pub fn proxy(
    balancer: &Arc<Balancer>,
    ctx: &Arc<Shared>,
    session_secrets: &Arc<SessionSecrets>,
    operators: &Arc<Operators>,
) -> Arc<HttpProxy> {
    let upstreams = Arc::new(HttpBalancer {
        balancer: Arc::clone(balancer),
        ctx: Arc::clone(ctx),
        session_secrets: Arc::clone(session_secrets),
        operators: Arc::clone(operators),
        proxy: OnceLock::new(),
        span: balancer.span(),
        sessions: Arc::default(),
        body_timeouts_log: Throttle::new(1000),
        moves: Mutex::default(),
        over_cap: Mutex::default(),
    });
    let generation = balancer.generation();
    let language = ctx.config.load().general.language;
    let head_memory = Arc::clone(&ctx.head_memory);
    let settings = http::Settings::from_config(&generation.config, language, head_memory);
    let proxy = Engine::new(Arc::clone(&upstreams), settings);
    let _ = upstreams.proxy.set(Arc::downgrade(&proxy));
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(expire_sessions(Arc::downgrade(&upstreams)));
    }
    proxy
}

/// A reload applied to the engine: the new settings, and the idle connections of servers
/// that left the generation (`old`) closed.
pub fn reconfigure(proxy: &HttpProxy, old: &Generation, new: &Generation, language: Language) {
    let head_memory = Arc::clone(&proxy.upstreams().ctx.head_memory);
    proxy.set_settings(http::Settings::from_config(
        &new.config,
        language,
        head_memory,
    ));
    for gone in old
        .servers
        .iter()
        .filter(|o| !new.servers.iter().any(|n| Arc::ptr_eq(n, o)))
    {
        proxy.forget(&ServerTarget(Arc::clone(gone)));
    }
}
