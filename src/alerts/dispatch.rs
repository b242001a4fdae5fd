//! Alerts from the broker's queue to their receivers: each alert routed by the running
//! configuration (its balancer's `ALERT_*`, or every balancer's for the broker's own events) to
//! each receiver, which has a queue of its own, bounded as the broker's is, and a task that
//! delivers from it: a webhook one alert at a time in order, commands up to
//! [`MAX_COMMANDS`] at once. A slow receiver fills its own queue, never the broker's, and holds
//! up nothing but itself; its failures are logged once per episode.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::command;
use super::message;
use super::webhook::Receiver;
use crate::balancer::alert_queue::{ALERT_QUEUE, Alert, AlertOutcome, AlertQueue, Popped};
use crate::balancer::events::{Event, Events};
use crate::config::{AlertEvent, AlertFormat, AlertSettings, Config, Language, Webhook};
use crate::tls::files::Passphrase;

/// Alert commands running at once, across every receiver: each is a process.
pub const MAX_COMMANDS: usize = 4;

/// Where an alert goes: one receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// `ALERT_WEBHOOK`, with how it is sent.
    Webhook {
        /// The URL.
        hook: Webhook,
        /// `ALERT_WEBHOOK_CA`.
        ca: Option<PathBuf>,
        /// `ALERT_WEBHOOK_FORMAT`.
        format: AlertFormat,
        /// `ALERT_TIMEOUT`.
        timeout: Duration,
        /// `LANGUAGE`, for the text format.
        language: Language,
    },
    /// `ALERT_COMMAND`.
    Command {
        /// The command line.
        command: Passphrase,
        /// `ALERT_TIMEOUT`.
        timeout: Duration,
    },
}

impl Destination {
    /// The receivers `settings` name.
    fn of(settings: &AlertSettings, language: Language) -> Vec<Destination> {
        let webhook = settings.webhook.clone().map(|hook| Destination::Webhook {
            hook,
            ca: settings.webhook_ca.clone(),
            format: settings.format,
            timeout: settings.timeout,
            language,
        });
        let command = settings
            .command
            .clone()
            .map(|command| Destination::Command {
                command,
                timeout: settings.timeout,
            });
        webhook.into_iter().chain(command).collect()
    }

    /// The receiver in a log line: `webhook https://host`, `ALERT_COMMAND`; never a secret.
    pub fn name(&self) -> String {
        match self {
            Destination::Webhook { hook, .. } => format!("webhook {}", hook.origin()),
            Destination::Command { .. } => "ALERT_COMMAND".into(),
        }
    }
}

/// The receivers `alert` goes to under `config`: its balancer's, when `ALERT_EVENTS` takes
/// it; for the broker's own events, every balancer's that takes it, each receiver once.
pub fn routes(config: &Config, alert: &Alert) -> Vec<Destination> {
    let mut found: Vec<Destination> = Vec::new();
    for b in &config.balancers {
        if alert.balancer.is_some_and(|kind| kind != b.kind)
            || !b.alerts.events.contains(alert.event)
        {
            continue;
        }
        for destination in Destination::of(&b.alerts, config.general.language) {
            if !found.contains(&destination) {
                found.push(destination);
            }
        }
    }
    found
}

/// Every receiver `config` names.
fn every_receiver(config: &Config) -> Vec<Destination> {
    let mut found: Vec<Destination> = Vec::new();
    for b in &config.balancers {
        for destination in Destination::of(&b.alerts, config.general.language) {
            if !found.contains(&destination) {
                found.push(destination);
            }
        }
    }
    found
}

/// What a receiver's task needs besides its queue.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The host name the alerts name (`broker`).
    pub broker: Arc<str>,
    /// Where the alerts dropped are told as an event.
    pub events: Option<Events>,
    /// The permits of [`MAX_COMMANDS`].
    pub commands: Arc<Semaphore>,
    /// Ends the receivers' tasks.
    pub stop: tokio_util::sync::CancellationToken,
}

impl Delivery {
    /// Counts what became of `alert` at a receiver, for METRICS.
    fn count(&self, alert: &Alert, outcome: AlertOutcome) {
        if let Some(events) = &self.events {
            events.figures().alert(alert, outcome);
        }
    }
}

/// One receiver: its queue and the task delivering from it.
struct AlertSink {
    destination: Destination,
    queue: Arc<AlertQueue>,
    task: JoinHandle<()>,
}

/// The receivers alerts are routed to, made as the configuration names them.
pub struct Sinks {
    sinks: Vec<AlertSink>,
    delivery: Delivery,
}

impl Sinks {
    /// No receiver yet.
    pub fn new(delivery: Delivery) -> Sinks {
        Sinks {
            sinks: Vec::new(),
            delivery,
        }
    }

    /// Queues `alert` for each receiver `config` routes it to (never waits); receivers the
    /// configuration no longer names go once their queue is empty.
    pub fn route(&mut self, config: &Config, alert: &Alert) {
        for destination in routes(config, alert) {
            let sink = match self.sinks.iter().position(|s| s.destination == destination) {
                Some(at) => &self.sinks[at],
                None => {
                    self.sinks.push(self.start(destination));
                    &self.sinks[self.sinks.len() - 1]
                }
            };
            sink.queue.push(alert.clone());
        }
        let named = every_receiver(config);
        self.sinks.retain(|sink| {
            let keep = named.contains(&sink.destination) || !sink.queue.is_idle();
            if !keep {
                sink.task.abort();
            }
            keep
        });
    }

    /// True when every receiver has delivered (or given up) everything it was given.
    pub fn idle(&self) -> bool {
        self.sinks.iter().all(|s| s.queue.is_idle())
    }

    fn start(&self, destination: Destination) -> AlertSink {
        let figures = self
            .delivery
            .events
            .as_ref()
            .map(|e| Arc::clone(e.figures()));
        let queue = Arc::new(AlertQueue::new(ALERT_QUEUE, figures));
        let task = tokio::spawn(deliver_from(
            destination.clone(),
            Arc::clone(&queue),
            self.delivery.clone(),
        ));
        AlertSink {
            destination,
            queue,
            task,
        }
    }
}

impl Drop for Sinks {
    fn drop(&mut self) {
        for sink in &self.sinks {
            sink.task.abort();
        }
    }
}

/// A receiver's failures, told once per episode: the first failure, then the first success.
#[derive(Debug, Default)]
struct Failing {
    failures: Mutex<u64>,
}

impl Failing {
    fn failed(&self, name: &str, event: AlertEvent, words: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        *failures += 1;
        if *failures == 1 {
            warn!(
                "alerts: {name} failed to take {} ({words}); further failures are not logged \
                 until it takes one again",
                event.as_str()
            );
        }
    }

    fn delivered(&self, name: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if *failures > 0 {
            info!(
                "alerts: {name} takes alerts again, after {} that failed",
                crate::config::plural(*failures as usize, "alert")
            );
            *failures = 0;
        }
    }
}

/// The alert a count of dropped ones becomes.
pub fn dropped(count: u64) -> Alert {
    Alert {
        dropped: Some(count),
        ..Alert::new(AlertEvent::AlertsDropped)
    }
}

/// A receiver's task: delivers what its queue gives, until aborted.
async fn deliver_from(destination: Destination, queue: Arc<AlertQueue>, delivery: Delivery) {
    let name = destination.name();
    let failing = Arc::new(Failing::default());
    let receiver = match &destination {
        Destination::Webhook {
            hook, ca, timeout, ..
        } => Some(Receiver::new(hook.clone(), ca.clone(), *timeout)),
        Destination::Command { .. } => None,
    };
    loop {
        let popped = tokio::select! {
            _ = delivery.stop.cancelled() => return,
            popped = queue.pop() => popped,
        };
        let alert = match popped {
            Popped::Alert(alert) => *alert,
            Popped::Dropped(count) => {
                warn!("alerts: {count} alert(s) for {name} dropped: it was too slow to take them");
                if let Some(events) = &delivery.events {
                    events.emit(|| Event::AlertsDropped { count });
                }
                dropped(count)
            }
        };
        match (&destination, &receiver) {
            (
                Destination::Webhook {
                    format, language, ..
                },
                Some(receiver),
            ) => {
                let body = body(&alert, &delivery.broker, *format, *language);
                let outcome = match receiver.deliver(&body).await {
                    Ok(_) => {
                        failing.delivered(&name);
                        AlertOutcome::Delivered
                    }
                    Err(failure) => {
                        failing.failed(&name, alert.event, failure.words());
                        AlertOutcome::Failed
                    }
                };
                delivery.count(&alert, outcome);
                queue.done();
            }
            (Destination::Command { command, timeout }, _) => {
                let Ok(permit) = Arc::clone(&delivery.commands).acquire_owned().await else {
                    return;
                };
                let (command, timeout) = (crate::config::command_text(command), *timeout);
                let (queue, failing, name) =
                    (Arc::clone(&queue), Arc::clone(&failing), name.clone());
                let delivery = delivery.clone();
                tokio::spawn(async move {
                    let broker = &delivery.broker;
                    let outcome =
                        run_command(&command, &alert, broker, timeout, &failing, &name).await;
                    delivery.count(&alert, outcome);
                    queue.done();
                    drop(permit);
                });
            }
            _ => queue.done(),
        }
    }
}

/// Delivers `alert` to `destination` once, with the webhook's retries, logging a failure:
/// for a process that runs no broker (the supervisor).
pub async fn deliver_once(destination: &Destination, alert: &Alert, broker: &str) {
    let name = destination.name();
    let failing = Failing::default();
    match destination {
        Destination::Webhook {
            hook,
            ca,
            format,
            timeout,
            language,
        } => {
            let receiver = Receiver::new(hook.clone(), ca.clone(), *timeout);
            let body = body(alert, broker, *format, *language);
            if let Err(failure) = receiver.deliver(&body).await {
                failing.failed(&name, alert.event, failure.words());
            }
        }
        Destination::Command { command, timeout } => {
            let command = crate::config::command_text(command);
            run_command(&command, alert, broker, *timeout, &failing, &name).await;
        }
    }
}

/// The request body of `alert` in `format`.
pub fn body(alert: &Alert, broker: &str, format: AlertFormat, language: Language) -> Vec<u8> {
    let value = match format {
        AlertFormat::Json => message::json(alert, broker),
        AlertFormat::Text => message::text_body(alert, broker, language),
    };
    serde_json::to_vec(&value).unwrap_or_default()
}

/// `ALERT_COMMAND` run for `alert`: its JSON on standard input, its fields as variables.
async fn run_command(
    command: &str,
    alert: &Alert,
    broker: &str,
    timeout: Duration,
    failing: &Failing,
    name: &str,
) -> AlertOutcome {
    let stdin = serde_json::to_vec(&message::json(alert, broker)).unwrap_or_default();
    let env = message::environment(alert, broker);
    let ran = command::run(command, Some(stdin), &env, timeout).await;
    if ran.succeeded() {
        failing.delivered(name);
        AlertOutcome::Delivered
    } else {
        let last = ran.output.rsplit(" | ").next().unwrap_or_default();
        let words = if last.is_empty() {
            ran.outcome
        } else {
            format!("{}; its last line: {last}", ran.outcome)
        };
        failing.failed(name, alert.event, &words);
        AlertOutcome::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        Config::from_text(text, std::path::Path::new("t.ini"))
            .expect("valid")
            .config
    }

    #[test]
    fn an_alert_goes_to_its_balancers_receivers_and_the_brokers_to_each_once() {
        let config = config(
            "[General]\nALERT_WEBHOOK=http://127.0.0.1:9/a\n\
             [BALANCE_SMART_CLIENT_DESKTOP]\nLOCAL_SERVER_PORT=5000\nREMOTE_SERVER_01=127.0.0.1 6001\n\
             [BALANCE_WEB_SERVICES]\nLOCAL_SERVER_PORT=5001\nREMOTE_SERVER_01=127.0.0.1 6001\n\
             ALERT_COMMAND=true\nALERT_EVENTS=quarantine_entered\n",
        );
        let desktop = config.balancers[0].kind;
        let web = config.balancers[1].kind;
        let entered = |kind| Alert::new(AlertEvent::QuarantineEntered).on(kind);
        assert_eq!(routes(&config, &entered(desktop)).len(), 1);
        let to_web = routes(&config, &entered(web));
        assert_eq!(to_web.len(), 2, "the inherited webhook and its own command");
        let left = Alert::new(AlertEvent::QuarantineLeft).on(web);
        assert!(
            routes(&config, &left).is_empty(),
            "ALERT_EVENTS leaves it out"
        );
        let started = routes(&config, &Alert::new(AlertEvent::BrokerStarted));
        assert_eq!(
            started.len(),
            1,
            "the one webhook, once; the command takes no broker_started"
        );
        assert_eq!(started[0].name(), "webhook http://127.0.0.1:9");
    }
}
