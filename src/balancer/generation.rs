//! One generation of a balancer's configuration: its settings, its servers in order, the
//! policy's state over them and the TLS loaded for them ([`Generation`], [`GenerationTls`]).
//! The balancer holds the current generation behind an `ArcSwap`; a connection keeps the one it
//! started with, and a reload builds the next, carrying over the servers that stay.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use crate::balancer::Balancer;
use crate::balancer::rules::select::{Load, Selector};
use crate::balancer::server::Server;
use crate::config::{
    BalancerConfig, ServerConfig, balancer_secret_changes, plural, setting_changes,
};
use crate::tls::{Finding, Findings, Resumption, ServerTls, UpstreamTls, upstream::system_roots};

/// The servers of one configuration generation and the policy's state over them.
#[derive(Debug)]
pub struct Generation {
    /// The balancer's settings for this generation.
    pub config: BalancerConfig,
    /// The servers, in configuration order.
    pub servers: Vec<Arc<Server>>,
    /// The policy's state, and a scratch list of loads reused by every pick.
    pub(super) selector: Mutex<(Selector, Vec<Option<Load>>)>,
    /// TLS towards clients and servers, loaded for this generation.
    pub tls: Arc<GenerationTls>,
}

/// A balancer's TLS for one generation of its configuration, loaded from its `SSL_*` keys.
/// A reload loads it again (certificates renewed on disk are taken even when no key
/// changed); connections keep the generation they started with.
#[derive(Debug, Default)]
pub struct GenerationTls {
    /// Towards clients (`SSL_CERTIFICATE` and `SSL_KEY`); `None`: the port speaks plain TCP.
    pub server: Option<ServerTls>,
    /// Towards servers (`SSL_ENCRYPT_UPSTREAM=1`).
    pub upstream: Option<UpstreamTls>,
}

impl GenerationTls {
    /// Loads `config`'s TLS towards clients and servers (nothing when it has none), reading
    /// the system's trusted roots only when they are needed.
    pub(super) fn load(
        config: &BalancerConfig,
        resumption: Option<&Resumption>,
    ) -> Result<GenerationTls, Findings> {
        let server = config.tls.server(config.kind.is_http(), config.http.http2);
        let upstream = config.tls.upstream(config.kind.is_http());
        if server.is_none() && upstream.is_none() {
            return Ok(GenerationTls::default());
        }
        let roots = system_roots();
        let now = std::time::SystemTime::now();
        let server = match (server, resumption) {
            (Some(settings), Some(resumption)) => {
                Some(ServerTls::load(&settings, resumption, &roots.store, now)?)
            }
            (Some(settings), None) => {
                let fresh = Resumption::new().map_err(|e| Finding::Unexpected {
                    key: "SSL_CERTIFICATE",
                    detail: e.to_string(),
                })?;
                Some(ServerTls::load(&settings, &fresh, &roots.store, now)?)
            }
            (None, _) => None,
        };
        let upstream = upstream
            .map(|settings| UpstreamTls::load(&settings, &roots))
            .transpose()?;
        Ok(GenerationTls { server, upstream })
    }
}

impl Generation {
    /// True when the keys ask for TLS this generation could not load (the files changed
    /// between the doctor's check and the balancer's start): its clients are closed rather
    /// than served, or sent to their servers, without it.
    pub fn tls_missing(&self) -> bool {
        let keys = &self.config.tls;
        (keys.certificate.is_some() && self.tls.server.is_none())
            || (keys.encrypt_upstream && self.tls.upstream.is_none())
    }

    /// A generation over `servers` (built from `config.servers`, same order).
    pub(super) fn new(
        config: BalancerConfig,
        servers: Vec<Arc<Server>>,
        tls: Arc<GenerationTls>,
    ) -> Self {
        Generation {
            tls,
            selector: Mutex::new((
                Selector::new(config.sort_method, servers.len()),
                Vec::with_capacity(servers.len()),
            )),
            config,
            servers,
        }
    }

    /// The server of this generation that `config` names again (same id and `host:port`).
    fn same_server(&self, config: &ServerConfig) -> Option<&Arc<Server>> {
        let address = config.address();
        self.servers
            .iter()
            .find(|o| o.id == config.id && o.address.eq_ignore_ascii_case(&address))
    }

    /// The servers of the next generation, configured by `config`: those of this one it names
    /// again (same id and `host:port`), keeping their state and taking the file's new weight
    /// unless an operator's overrides it, and new ones; what changed goes to `changes`.
    fn carry_over(&self, config: &BalancerConfig, changes: &mut Vec<String>) -> Vec<Arc<Server>> {
        config
            .servers
            .iter()
            .map(|s| match self.same_server(s) {
                Some(server) => {
                    let overrides = server.lock_overrides();
                    server.file_weight.store(s.weight, Relaxed);
                    let weight = overrides.effective_weight(s.weight);
                    let was = server.weight.swap(weight, Relaxed);
                    if was != weight {
                        changes.push(format!(
                            "server {} weight {was} -> {weight}",
                            server.address
                        ));
                    } else if overrides.weight.is_some() {
                        changes.push(format!(
                            "server {} keeps the operator's weight {weight} (the file says {})",
                            server.address, s.weight
                        ));
                    }
                    drop(overrides);
                    Arc::clone(server)
                }
                None => {
                    changes.push(format!(
                        "server {} added as REMOTE_SERVER_{}",
                        s.address(),
                        s.id
                    ));
                    Arc::new(Server::new(s))
                }
            })
            .collect()
    }

    /// Tells, in `changes`, each server of this generation that `next` no longer holds.
    fn tell_removed(&self, next: &[Arc<Server>], changes: &mut Vec<String>) {
        for gone in self
            .servers
            .iter()
            .filter(|o| !next.iter().any(|n| Arc::ptr_eq(n, o)))
        {
            let open = gone.active.load(Relaxed) as usize;
            let finishing = if open == 0 {
                String::new()
            } else {
                format!("; its {} finish on their own", plural(open, "connection"))
            };
            changes.push(format!(
                "server {} (REMOTE_SERVER_{}) removed{finishing}",
                gone.address, gone.id
            ));
        }
    }
}

impl Balancer {
    /// Applies a reloaded configuration of this balancer. Servers that remain (same id and
    /// `host:port`) keep their state, counters and connections, taking the new weight; new
    /// ones start available; removed ones leave the generation, and their connections finish
    /// on their own. `tls` is the new generation's TLS ([`Balancer::load_tls`]): new handshakes
    /// use it, established connections keep theirs. Returns what changed, for the log.
    pub fn reconfigure(&self, config: BalancerConfig, tls: GenerationTls) -> Vec<String> {
        let old = self.generation();
        let mut changes = Vec::new();
        let servers = old.carry_over(&config, &mut changes);
        old.tell_removed(&servers, &mut changes);
        changes.extend(setting_changes(
            &config.kind.to_string(),
            &old.config.settings(),
            &config.settings(),
        ));
        changes.extend(balancer_secret_changes(
            &config.kind.to_string(),
            &old.config,
            &config,
        ));
        if let (Some(old), Some(new)) = (&old.tls.server, &tls.server)
            && old.certificate != new.certificate
        {
            changes.push(format!(
                "{} certificate {} (until {})",
                config.kind,
                new.certificate.subject,
                crate::tls::doctor::utc(new.certificate.not_after)
            ));
        }
        self.generation
            .store(Arc::new(Generation::new(config, servers, Arc::new(tls))));
        // The monitor reads the new interval and servers when it wakes.
        self.health_changed.notify_one();
        self.availability_changed();
        changes
    }

    /// Loads the TLS of `config` (this balancer's next generation) with the balancer's
    /// session resumption, so clients resume across the swap. Every finding when it cannot:
    /// the caller rejects the reload and everything stays as it was.
    pub fn load_tls(&self, config: &BalancerConfig) -> Result<GenerationTls, Findings> {
        GenerationTls::load(config, self.resumption.as_ref())
    }
}
