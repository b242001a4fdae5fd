//! Checks across balancers: two balancers cannot share a port, and a server cannot be the
//! broker itself (an address on one of its own listeners). They look at every balancer
//! section, those with errors of their own too, so that every error is reported at once.

use std::net::{IpAddr, SocketAddr};

use super::super::{BalancerConfig, BalancerKind, ConfigError, Host};
use super::{ReadBalancer, Section, Validator, ValueOrigin};
use crate::config::self_loop;

impl Validator {
    /// The checks across every balancer section as read (`sections`), whatever errors they
    /// hold: where each listens is known when its listening address was read, and its servers
    /// are those whose lines were valid.
    pub(super) fn across(&mut self, sections: &[(BalancerKind, &Section)], read: &[ReadBalancer]) {
        let listening: Vec<&BalancerConfig> = read
            .iter()
            .filter(|b| b.listen_read)
            .map(|b| &b.config)
            .collect();
        let all: Vec<&BalancerConfig> = read.iter().map(|b| &b.config).collect();
        self.shared_ports(sections, &listening);
        self.self_loops(&all, &listening);
    }

    /// Two balancers on one port (one of them on every address counts too).
    fn shared_ports(
        &mut self,
        sections: &[(BalancerKind, &Section)],
        balancers: &[&BalancerConfig],
    ) {
        for (i, a) in balancers.iter().enumerate() {
            for b in &balancers[..i] {
                if a.listen.port() == b.listen.port()
                    && (a.listen.ip() == b.listen.ip()
                        || a.listen.ip().is_unspecified()
                        || b.listen.ip().is_unspecified())
                {
                    // The line of the clashing LOCAL_SERVER_PORT (it was parsed, so it is there).
                    let line = sections
                        .iter()
                        .find(|(k, _)| *k == a.kind)
                        .and_then(|(_, s)| s.entries.iter().find(|e| e.key == "LOCAL_SERVER_PORT"))
                        .map_or(0, |e| e.line);
                    self.errors.push(ConfigError::new(
                        line,
                        a.kind.section(),
                        Some("LOCAL_SERVER_PORT"),
                        format!(
                            "{} is also the port of {}; each balancer needs its own port",
                            a.listen, b.kind
                        ),
                    ));
                }
            }
        }
    }

    /// Servers of `balancers` whose address is one of the broker's own listening addresses
    /// (`listening`): each client sent there would come back into the broker, in a loop
    /// (crate::config::self_loop). Only addresses are checked here; a name that resolves to one is
    /// refused at connect time.
    fn self_loops(&mut self, balancers: &[&BalancerConfig], listening: &[&BalancerConfig]) {
        let mut machine: Option<Vec<IpAddr>> = None;
        for b in balancers {
            for server in &b.servers {
                let Host::Ip(ip) = server.host else {
                    continue;
                };
                let destination = SocketAddr::new(ip, server.port);
                for listener in listening {
                    if listener.listen.port() != server.port {
                        continue;
                    }
                    let machine = machine.get_or_insert_with(self_loop::interface_addresses);
                    if !self_loop::reaches(destination, listener.listen, |ip| machine.contains(&ip))
                    {
                        continue;
                    }
                    let key = format!("REMOTE_SERVER_{}", server.id);
                    let line = match self.origins.get(b.kind.section(), &key) {
                        ValueOrigin::Section(line) | ValueOrigin::General(line) => line,
                        ValueOrigin::Default => 0,
                    };
                    self.errors.push(ConfigError::new(
                        line,
                        b.kind.section(),
                        Some(&key),
                        format!(
                            "`{} {}` is this broker's own address: {} listens on {}, so every \
                             client sent there would come back into the broker, in a loop; give \
                             the address of an application server",
                            server.host, server.port, listener.kind, listener.listen
                        ),
                    ));
                    break;
                }
            }
        }
    }
}
