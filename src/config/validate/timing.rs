//! The timing doctor: settings of one balancer that contradict each other in time. The rule
//! comes from a failover that stalled for two hours (a WebSphere messaging engine's lock held
//! by a dead holder, in the seeds): whoever takes over must wait longer than it takes to
//! notice that the old holder is gone. Each contradiction is a warning (a notice), one line
//! with both values and what to change; the configuration still loads.

use std::time::Duration;

use crate::config::value::show_duration as show;
use crate::config::{BalancerConfig, Keepalive, Monitoring};

/// How long a SmartClient whose network dropped keeps trying to reconnect through the broker:
/// about 180 s. TDN (the TOTVS broker's documentation, <https://tdn.totvs.com/x/tImkFw>): from
/// broker DLL 2.1.11 reconnection is time-based, about 180 s, "the interval the application
/// server holds a connection without network activity" (the AppServer's `ConnectionTimeout`).
pub const SMARTCLIENT_RECONNECT_WINDOW: Duration = Duration::from_secs(180);

/// A contradiction: the key the line is about, and the message.
type Contradiction = (&'static str, String);

/// The contradictions in `b`'s timings: (the key the line is about, the message).
pub fn contradictions(b: &BalancerConfig) -> Vec<Contradiction> {
    [
        quarantine_outran_by_checks(b),
        keepalive_past_reconnect(&b.keepalive),
        user_timeout_before_probes(&b.keepalive),
        attempts_outlast_quarantine(b),
        restart_never_due(b),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// A quarantine shorter than the passing checks that would release it.
fn quarantine_outran_by_checks(b: &BalancerConfig) -> Option<Contradiction> {
    let checks = b.monitor_interval * b.monitor_rise;
    (b.monitoring != Monitoring::Disabled && b.quarantine_time < checks).then(|| {
        (
            "QUARANTINE_TIME",
            format!(
                "{} is shorter than MONITOR_INTERVAL x MONITOR_RISE ({} x {} = {}): a quarantine \
                 runs out before passing checks could ever release it, so a failed server gets \
                 clients again untested; lengthen QUARANTINE_TIME past {}, or shorten \
                 MONITOR_INTERVAL",
                show(b.quarantine_time),
                show(b.monitor_interval),
                b.monitor_rise,
                show(checks),
                show(checks)
            ),
        )
    })
}

/// A restart that is never due: without checks, nothing moves a quarantine's end out, so a
/// quarantine no longer than `RESTART_AFTER` ends before it.
fn restart_never_due(b: &BalancerConfig) -> Option<Contradiction> {
    let r = &b.restarts;
    (r.command.is_some() && b.monitoring == Monitoring::Disabled && r.after >= b.quarantine_time)
        .then(|| {
            (
                "RESTART_AFTER",
                format!(
                    "{} is not shorter than QUARANTINE_TIME ({}) and MONITORING_TYPE is \
                     DISABLED: no check moves a quarantine's end out, so it ends before \
                     RESTART_COMMAND is due (unless clients' connects keep failing); turn the \
                     monitor on, or shorten RESTART_AFTER below {}",
                    show(r.after),
                    show(b.quarantine_time),
                    show(b.quarantine_time)
                ),
            )
        })
}

/// Keepalive that notices a dead peer only after a SmartClient has given up reconnecting.
fn keepalive_past_reconnect(k: &Keepalive) -> Option<Contradiction> {
    (k.enabled() && k.dead_after() > SMARTCLIENT_RECONNECT_WINDOW).then(|| {
        (
            "KEEPALIVE_TIME",
            format!(
                "a dead peer is noticed after KEEPALIVE_TIME + KEEPALIVE_INTERVAL x \
                 KEEPALIVE_COUNT ({} + {} x {} = {}), longer than the {} a SmartClient keeps \
                 reconnecting (TOTVS broker DLL 2.1.11 and later): the broker holds a dead \
                 client's server connection past the time its user gave up; lower them to at \
                 most {} in all",
                show(k.time),
                show(k.interval),
                k.count,
                show(k.dead_after()),
                show(SMARTCLIENT_RECONNECT_WINDOW),
                show(SMARTCLIENT_RECONNECT_WINDOW)
            ),
        )
    })
}

/// A TCP_USER_TIMEOUT that drops the connection before the keepalive probes could count.
fn user_timeout_before_probes(k: &Keepalive) -> Option<Contradiction> {
    let user_timeout = k.user_timeout?;
    (k.enabled() && !user_timeout.is_zero() && user_timeout < k.time).then(|| {
        (
            "TCP_USER_TIMEOUT",
            format!(
                "{} is below KEEPALIVE_TIME ({}): Linux drops a connection whose first keepalive \
                 probe goes unanswered once TCP_USER_TIMEOUT has passed, so KEEPALIVE_INTERVAL \
                 and KEEPALIVE_COUNT never count; set it to at least KEEPALIVE_TIME + \
                 KEEPALIVE_INTERVAL x KEEPALIVE_COUNT ({}), or leave it out",
                show(user_timeout),
                show(k.time),
                show(k.dead_after())
            ),
        )
    })
}

/// A client's connect attempts that outlast the quarantines its own failures started.
fn attempts_outlast_quarantine(b: &BalancerConfig) -> Option<Contradiction> {
    let attempts = b.connect_timeout * b.max_attempts;
    (attempts > b.quarantine_time).then(|| {
        (
            "MAX_ATTEMPTS",
            format!(
                "CONNECT_TIMEOUT x MAX_ATTEMPTS ({} x {} = {}) is longer than QUARANTINE_TIME \
                 ({}): a client still trying servers outlasts the quarantines its own failed \
                 connects started, and meets the same dead servers again; shorten \
                 CONNECT_TIMEOUT or MAX_ATTEMPTS, or lengthen QUARANTINE_TIME past {}",
                show(b.connect_timeout),
                b.max_attempts,
                show(attempts),
                show(b.quarantine_time),
                show(attempts)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BalancerKind;

    #[test]
    fn a_restart_without_checks_is_due_only_within_the_quarantine() {
        let mut b = BalancerConfig::defaults(BalancerKind::SmartClientDesktop);
        b.monitoring = Monitoring::Disabled;
        assert!(
            restart_never_due(&b).is_none(),
            "no RESTART_COMMAND: nothing to say"
        );
        b.restarts.command = Some(crate::tls::files::Passphrase::new("true"));
        let (key, message) = restart_never_due(&b).expect("120s is not below 120s");
        assert_eq!(key, "RESTART_AFTER");
        assert!(message.contains("QUARANTINE_TIME (120s)"), "{message}");
        b.restarts.after = Duration::from_secs(60);
        assert!(restart_never_due(&b).is_none());
        b.restarts.after = Duration::from_secs(600);
        b.monitoring = Monitoring::Connection;
        assert!(restart_never_due(&b).is_none(), "checks move the end out");
    }
}
