//! The balancing policies (`SORT_METHOD`): given each server's weight and load, which one gets
//! the next client. Pure logic; the caller decides which servers are eligible.

use crate::config::SortMethod;

/// What a policy needs to know of one eligible server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// Configured weight, at least 1 (weight-0 servers are never eligible).
    pub weight: u32,
    /// Connections counted against the server right now (for SESSION, plus its live
    /// sessions).
    pub active: u64,
}

/// A policy and the little state it keeps between picks.
#[derive(Debug, Clone)]
pub struct Selector {
    method: SortMethod,
    /// Index chosen last: CONNECTION breaks ties by taking the first after it.
    last: Option<usize>,
    /// Smooth weighted round robin's running value per server.
    current: Vec<i64>,
}

impl Selector {
    /// A selector for `servers` servers, in configuration order.
    pub fn new(method: SortMethod, servers: usize) -> Self {
        Selector {
            method,
            last: None,
            current: vec![0; servers],
        }
    }

    /// Picks among the eligible servers (`None` marks one that is not). Returns its index.
    pub fn pick(&mut self, servers: &[Option<Load>]) -> Option<usize> {
        let chosen = match self.method {
            // The caller counts a server's live sessions into its load for SESSION.
            SortMethod::Connection | SortMethod::Session => self.least_connections(servers),
            SortMethod::RoundRobin => self.smooth_round_robin(servers),
        }?;
        self.last = Some(chosen);
        Some(chosen)
    }

    /// Fewest active connections per unit of weight (`a.active * b.weight` against
    /// `b.active * a.weight`, exact in integers); among equals the first after the server
    /// chosen last, in configuration order.
    fn least_connections(&self, servers: &[Option<Load>]) -> Option<usize> {
        let n = servers.len();
        let start = self.last.map_or(0, |last| (last + 1) % n.max(1));
        let mut best: Option<(usize, Load)> = None;
        for offset in 0..n {
            let i = (start + offset) % n;
            let Some(load) = servers[i] else { continue };
            let lighter = match best {
                None => true,
                Some((_, b)) => {
                    u128::from(load.active) * u128::from(b.weight)
                        < u128::from(b.active) * u128::from(load.weight)
                }
            };
            if lighter {
                best = Some((i, load));
            }
        }
        best.map(|(i, _)| i)
    }

    /// nginx's smooth weighted round robin: every eligible server's value grows by its weight,
    /// the largest wins (first in configuration order on a tie) and gives back the total.
    fn smooth_round_robin(&mut self, servers: &[Option<Load>]) -> Option<usize> {
        if self.current.len() != servers.len() {
            self.current = vec![0; servers.len()];
        }
        let mut total: i64 = 0;
        let mut best: Option<usize> = None;
        for (i, load) in servers.iter().enumerate() {
            let Some(load) = load else { continue };
            let weight = i64::from(load.weight);
            self.current[i] += weight;
            total += weight;
            if best.is_none_or(|b| self.current[i] > self.current[b]) {
                best = Some(i);
            }
        }
        let best = best?;
        self.current[best] -= total;
        Some(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `picks` picks where every chosen connection stays open.
    fn held(method: SortMethod, weights: &[u32], picks: usize) -> (Vec<usize>, Vec<u64>) {
        let mut selector = Selector::new(method, weights.len());
        let mut active = vec![0u64; weights.len()];
        let mut order = Vec::new();
        for _ in 0..picks {
            let loads: Vec<Option<Load>> = weights
                .iter()
                .zip(&active)
                .map(|(&weight, &active)| (weight > 0).then_some(Load { weight, active }))
                .collect();
            let i = selector.pick(&loads).expect("an eligible server");
            active[i] += 1;
            order.push(i);
        }
        (order, active)
    }

    #[test]
    fn connection_spreads_by_weight() {
        let (_, active) = held(SortMethod::Connection, &[1, 1, 2], 40);
        assert_eq!(active, vec![10, 10, 20]);
    }

    #[test]
    fn connection_breaks_ties_after_the_last_chosen() {
        let (order, _) = held(SortMethod::Connection, &[1, 1, 1], 6);
        assert_eq!(order, vec![0, 1, 2, 0, 1, 2]);
        // With connections that end at once, everyone is always equal: still a rotation.
        let mut selector = Selector::new(SortMethod::Connection, 3);
        let idle = [Some(Load {
            weight: 1,
            active: 0,
        }); 3];
        let order: Vec<usize> = (0..5).map(|_| selector.pick(&idle).unwrap()).collect();
        assert_eq!(order, vec![0, 1, 2, 0, 1]);
    }

    #[test]
    fn round_robin_is_smooth_and_weighted() {
        let (order, _) = held(SortMethod::RoundRobin, &[1, 3], 8);
        assert_eq!(order, vec![1, 0, 1, 1, 1, 0, 1, 1]);
        // nginx's documented example: weights 5, 1, 1 give a a b a c a a.
        let (order, _) = held(SortMethod::RoundRobin, &[5, 1, 1], 7);
        assert_eq!(order, vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn weight_zero_and_ineligible_servers_get_nothing() {
        for method in [SortMethod::Connection, SortMethod::RoundRobin] {
            let (_, active) = held(method, &[1, 0, 2], 30);
            assert_eq!(active, vec![10, 0, 20], "{method:?}");
        }
        let mut selector = Selector::new(SortMethod::RoundRobin, 2);
        assert_eq!(selector.pick(&[None, None]), None);
        assert_eq!(Selector::new(SortMethod::Connection, 0).pick(&[]), None);
    }

    #[test]
    fn large_pools_and_loads_do_not_overflow() {
        let loads: Vec<Option<Load>> = (0..1296)
            .map(|i| {
                Some(Load {
                    weight: 1000,
                    active: u64::MAX - i,
                })
            })
            .collect();
        let mut selector = Selector::new(SortMethod::Connection, loads.len());
        assert_eq!(selector.pick(&loads), Some(1295));
    }
}
