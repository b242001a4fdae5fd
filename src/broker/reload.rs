//! A reload, applied without touching established connections: servers are matched by
//! identity (id and `host:port`) so their quarantine state and counters survive, a changed
//! listen address is bound before the old listener closes, a new balancer section starts, and
//! a removed one drains like a shutdown. An invalid file changes nothing.

use std::sync::Arc;

use tracing::{error, info, warn};

use super::ReloadError;
use super::control_loop::ControlLoop;
use super::running_balancer::RunningBalancer;
use crate::balancer::events::Reloaded;
use crate::balancer::{Balancer, GenerationTls};
use crate::config::{self, Config, plural, show_duration};
use crate::http_balancer;
use crate::net::listener;
use crate::query;
use crate::support::logging;

impl ControlLoop {
    /// Reads the configuration file again and applies it; an invalid file changes nothing.
    pub(super) async fn reload_file(&mut self) -> Result<Reloaded, ReloadError> {
        if let Some(why) = &self.no_file_reload {
            error!("reload rejected: {why}");
            return Err(ReloadError::Refused(why.clone()));
        }
        let path = self.shared.config.load().source.clone();
        info!("reloading {}", path.display());
        // Read on a blocking thread: this thread also handles signals and runs the monitors,
        // and a file on a hung network share would stop them all.
        let reading = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || Config::from_path(&path))
        };
        let loaded = match reading.await {
            Ok(Ok(loaded)) => loaded,
            Ok(Err(e)) => {
                for line in e.report().lines() {
                    error!("{}", line.trim());
                }
                error!("reload rejected: the running configuration stays");
                return Err(ReloadError::Invalid(e));
            }
            Err(e) => {
                error!(
                    "reload rejected: reading the file failed ({e}); the running configuration stays"
                );
                return Err(ReloadError::Read(e.to_string()));
            }
        };
        let file = path.display().to_string();
        for notice in loaded.notices.iter().chain(&loaded.warnings) {
            warn!("{}", notice.located(&file));
        }
        self.apply(loaded.config).await
    }

    /// Applies a new configuration: balancers removed first (their ports may be taken by
    /// others in this same reload), then those that stay (moved listeners, before new ones
    /// may need their old ports; new settings and servers), then the new ones. The TLS of the
    /// balancers that stay is loaded first: a certificate or key that does not load rejects
    /// the whole reload, and everything stays as it was.
    pub(super) async fn apply(&mut self, mut config: Config) -> Result<Reloaded, ReloadError> {
        let mut tls = self.load_tls(&config)?;
        // Removed balancers whose last connection has ended need no more waiting for.
        self.retired.retain(|running| !running.tasks.is_empty());
        let old = self.shared.config.load_full();
        if logging::settings_differ(&old.general, &config.general) {
            warn!(
                "the [General] logging keys changed; they take effect when appbroker is restarted"
            );
        }
        let admin = |g: &config::General| {
            (
                g.control_socket.clone(),
                g.control_group.clone(),
                g.state_file.clone(),
            )
        };
        if admin(&old.general) != admin(&config.general) {
            warn!(
                "CONTROL_SOCKET, CONTROL_GROUP or STATE_FILE changed; they take effect when \
                 appbroker is restarted"
            );
        }
        if old.general.workers != config.general.workers {
            warn!("WORKERS changed; it takes effect when appbroker is restarted");
        }
        let mut changes = config::setting_changes(
            "[General]",
            &old.general_settings(),
            &config.general_settings(),
        );
        changes.extend(config::secret_changes(&old.general, &config.general));
        self.session_secrets.configure(&config.general);
        let secret = self.session_secrets.in_force(&config.general);
        self.operators.configure(&config.general, secret);
        self.shared
            .head_memory
            .set_limit(config.general.http_head_memory);
        let mut reloaded = Reloaded {
            changes,
            errors: Vec::new(),
        };
        self.remove_gone(&config, &mut reloaded).await;
        self.update_staying(&mut config, &mut tls, &mut reloaded)
            .await;
        self.add_new(&config, &mut reloaded);
        self.publish(config);
        if reloaded.changes.is_empty() {
            info!("configuration reloaded: nothing changed");
        } else {
            info!("configuration reloaded: {}", reloaded.changes.join("; "));
        }
        Ok(reloaded)
    }

    /// The TLS of every balancer of `config` that runs now, loaded with its own session
    /// resumption, in `config`'s order (`None` for the new ones, which load their own).
    fn load_tls(&self, config: &Config) -> Result<Vec<Option<GenerationTls>>, ReloadError> {
        let mut loaded = Vec::with_capacity(config.balancers.len());
        let mut failed = Vec::new();
        for b in &config.balancers {
            let Some(running) = self.serving.iter().find(|r| r.balancer.kind() == b.kind) else {
                loaded.push(None);
                continue;
            };
            match running.balancer.load_tls(b) {
                Ok(tls) => loaded.push(Some(tls)),
                Err(findings) => failed.extend(
                    findings
                        .to_string()
                        .lines()
                        .map(|line| format!("{}: {line}", b.kind)),
                ),
            }
        }
        if failed.is_empty() {
            return Ok(loaded);
        }
        for line in &failed {
            error!("{line}");
        }
        error!("reload rejected: the running configuration stays");
        Err(ReloadError::Tls(failed.join("\n")))
    }

    /// Stops the balancers `config` no longer has: their listeners close at once, their
    /// connections may take `SHUTDOWN_TIMEOUT` to finish and are cut then.
    async fn remove_gone(&mut self, config: &Config, reloaded: &mut Reloaded) {
        let (stay, gone): (Vec<RunningBalancer>, Vec<RunningBalancer>) =
            std::mem::take(&mut self.serving)
                .into_iter()
                .partition(|r| config.balancers.iter().any(|b| b.kind == r.balancer.kind()));
        self.serving = stay;
        for mut running in gone {
            let kind = running.balancer.kind();
            running.stop_accepting(true).await;
            running.stop_background.cancel();
            let timeout = config.general.shutdown_timeout;
            info!(
                "{kind} removed: listener closed; its {} may take up to {} to finish",
                plural(running.tasks.len(), "connection"),
                show_duration(timeout)
            );
            let (tasks, cut) = (running.tasks.clone(), running.cut.clone());
            tokio::spawn(async move {
                if tokio::time::timeout(timeout, tasks.wait()).await.is_err() {
                    warn!(
                        "{kind} removed: cutting {} still open",
                        plural(tasks.len(), "connection")
                    );
                    cut.cancel();
                }
            });
            reloaded.changes.push(format!("{kind} removed"));
            self.retired.push(running);
        }
    }

    /// The balancers that stay: a moved listen address, new settings and servers.
    async fn update_staying(
        &mut self,
        config: &mut Config,
        tls: &mut [Option<GenerationTls>],
        reloaded: &mut Reloaded,
    ) {
        for (b, tls) in config.balancers.iter_mut().zip(tls) {
            let Some(running) = self
                .serving
                .iter_mut()
                .find(|r| r.balancer.kind() == b.kind)
            else {
                continue;
            };
            if running.configured != b.listen {
                let (change, error) = running.move_listener(&self.shared, &self.workers, b).await;
                reloaded.changes.push(change);
                reloaded.errors.extend(error);
            }
            let tls = tls.take().unwrap_or_default();
            let old = running.balancer.generation();
            reloaded
                .changes
                .extend(running.balancer.reconfigure(b.clone(), tls));
            let language = config.general.language;
            if let Some(proxy) = &running.http {
                http_balancer::reconfigure(proxy, &old, &running.balancer.generation(), language);
            }
            if let Some(engine) = &running.query {
                query::port::reconfigure(engine, language);
            }
        }
    }

    /// The balancers `config` adds: bound and started, or reported when they cannot be.
    fn add_new(&mut self, config: &Config, reloaded: &mut Reloaded) {
        for b in &config.balancers {
            if self.serving.iter().any(|r| r.balancer.kind() == b.kind) {
                continue;
            }
            match listener::bind(b, self.workers.listeners_per_balancer()) {
                Ok(listeners) => {
                    let balancer = Arc::new(Balancer::new(
                        b.clone(),
                        Arc::clone(&self.resolver),
                        self.events.clone(),
                    ));
                    let running = RunningBalancer::start(
                        balancer,
                        listeners,
                        &self.shared,
                        &self.session_secrets,
                        &self.operators,
                        &self.workers,
                        &self.stopping,
                    );
                    self.serving.push(running);
                    reloaded.changes.push(format!("{} added", b.kind));
                }
                Err(e) => {
                    let error = format!("{e}; {} is not started", b.kind);
                    error!("{error}");
                    reloaded.errors.push(error);
                    reloaded.changes.push(format!(
                        "{} not started (cannot listen on {})",
                        b.kind, b.listen
                    ));
                }
            }
        }
    }

    /// Makes `config` (but the balancers that do not run) the one every connection reads,
    /// with the balancers in its order, as the pages list them.
    fn publish(&mut self, mut config: Config) {
        self.serving.sort_by_key(|r| {
            config
                .balancers
                .iter()
                .position(|b| b.kind == r.balancer.kind())
        });
        config
            .balancers
            .retain(|b| self.serving.iter().any(|r| r.balancer.kind() == b.kind));
        self.resolver
            .set_listening(self.serving.iter().map(|r| r.listen).collect());
        self.resolver
            .set_max_lookups(config.general.dns_max_lookups as usize);
        self.shared.balancers.store(Arc::new(
            self.serving
                .iter()
                .map(|r| Arc::clone(&r.balancer))
                .collect(),
        ));
        self.shared.config.store(Arc::new(config));
        self.addrs.store(Arc::new(super::addresses(&self.serving)));
    }
}
