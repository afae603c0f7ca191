//! A [`Kernel`] that times every request of the kernel it wraps, per operation, so a benchmark
//! can tell knic's own cost from the kernel's: a namespace move waits for an RCU grace period
//! under RTNL (`rcu_barrier()` in `__dev_change_net_namespace`), which no executor can avoid,
//! and a breakdown shows where the rest goes. The executor runs unchanged on top of it; every
//! call is passed through untouched.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use knic_driver::error::Result;
use knic_driver::netns::overlay::{FdbEntry, Segment};
use knic_driver::netns::routing::{Rule, Vrf, VrfLink};
use knic_driver::netns::{Kernel, LinkChange, LinkState, NewChild, Ns, Session, Tbf, VfState};
use knic_proto::netconfig::{Cidr, Route};

/// Calls and time spent per operation (`open(host)`, `open(pod)`, `move_link`, ...).
pub type Breakdown = BTreeMap<&'static str, (u32, Duration)>;

/// `inner`, with the calls and time of every operation summed across all its sessions.
#[derive(Debug, Clone)]
pub struct Timed<K> {
    inner: K,
    spent: Arc<Mutex<Breakdown>>,
}

fn record(spent: &Mutex<Breakdown>, op: &'static str, elapsed: Duration) {
    let mut spent = spent.lock().unwrap_or_else(PoisonError::into_inner);
    let entry = spent.entry(op).or_default();
    entry.0 += 1;
    entry.1 += elapsed;
}

async fn timed<T>(spent: &Mutex<Breakdown>, op: &'static str, call: impl Future<Output = T>) -> T {
    let start = Instant::now();
    let result = call.await;
    record(spent, op, start.elapsed());
    result
}

impl<K> Timed<K> {
    /// The wrapped kernel (e.g. to read its request count).
    pub fn inner(&self) -> &K {
        &self.inner
    }

    /// Wraps `inner`; nothing spent yet.
    pub fn new(inner: K) -> Self {
        Timed {
            inner,
            spent: Arc::default(),
        }
    }

    /// Calls and time per operation since the last call, and starts again from nothing.
    pub fn take(&self) -> Breakdown {
        std::mem::take(&mut *self.spent.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Time inside `op` in `breakdown` (zero when it was not called).
pub fn spent_in(breakdown: &Breakdown, op: &str) -> Duration {
    breakdown.get(op).map_or(Duration::ZERO, |(_, d)| *d)
}

/// Adds `more` into `total`.
pub fn add(total: &mut Breakdown, more: &Breakdown) {
    for (op, (calls, spent)) in more {
        let entry = total.entry(op).or_default();
        entry.0 += calls;
        entry.1 += *spent;
    }
}

/// `total` per operation as calls and mean time per `rounds` (one line per operation).
pub fn per_round(total: &Breakdown, rounds: usize) -> Vec<String> {
    let rounds = u32::try_from(rounds.max(1)).unwrap_or(u32::MAX);
    total
        .iter()
        .map(|(op, (calls, spent))| {
            format!(
                "{op:<11} {:>5.1} calls {:>10.3} ms",
                f64::from(*calls) / f64::from(rounds),
                (*spent / rounds).as_secs_f64() * 1e3
            )
        })
        .collect()
}

/// A session of [`Timed`].
#[derive(Debug)]
pub struct TimedSession<S> {
    inner: S,
    spent: Arc<Mutex<Breakdown>>,
}

impl<K: Kernel> Kernel for Timed<K> {
    type Session = TimedSession<K::Session>;

    async fn open(&self, ns: &Ns) -> Result<Option<Self::Session>> {
        // Apart: the host's session is opened in the process's own namespace, a pod's after
        // entering the pod's.
        let op = match ns {
            Ns::Host => "open(host)",
            Ns::Pod(_) => "open(pod)",
        };
        let opened = timed(&self.spent, op, self.inner.open(ns)).await?;
        Ok(opened.map(|inner| TimedSession {
            inner,
            spent: Arc::clone(&self.spent),
        }))
    }
}

impl<S: Session> Session for TimedSession<S> {
    async fn find_link(&mut self, name: &str) -> Result<Option<LinkState>> {
        timed(&self.spent, "find_link", self.inner.find_link(name)).await
    }

    async fn addresses(&mut self, index: u32) -> Result<Vec<Cidr>> {
        timed(&self.spent, "addresses", self.inner.addresses(index)).await
    }

    async fn links(&mut self) -> Result<Vec<LinkState>> {
        timed(&self.spent, "links", self.inner.links()).await
    }

    async fn move_link(&mut self, name: &str, to: &Ns, change: &LinkChange) -> Result<Option<u32>> {
        timed(
            &self.spent,
            "move_link",
            self.inner.move_link(name, to, change),
        )
        .await
    }

    fn remember(&mut self, name: &str, index: u32) {
        self.inner.remember(name, index);
    }

    async fn set_link(&mut self, name: &str, change: &LinkChange) -> Result<()> {
        timed(&self.spent, "set_link", self.inner.set_link(name, change)).await
    }

    async fn add_addresses(&mut self, name: &str, addresses: &[Cidr]) -> Result<()> {
        timed(
            &self.spent,
            "add_addresses",
            self.inner.add_addresses(name, addresses),
        )
        .await
    }

    async fn add_routes(&mut self, name: &str, routes: &[Route]) -> Result<()> {
        timed(
            &self.spent,
            "add_routes",
            self.inner.add_routes(name, routes),
        )
        .await
    }

    async fn del_routes(&mut self, name: &str, routes: &[Route]) -> Result<()> {
        timed(
            &self.spent,
            "del_routes",
            self.inner.del_routes(name, routes),
        )
        .await
    }

    async fn set_sysctls(&mut self, name: &str, sysctls: &BTreeMap<String, String>) -> Result<()> {
        timed(
            &self.spent,
            "set_sysctls",
            self.inner.set_sysctls(name, sysctls),
        )
        .await
    }

    async fn offload_sizes(
        &mut self,
        name: &str,
    ) -> Result<Option<knic_proto::netconfig::OffloadSizes>> {
        timed(&self.spent, "offload_sizes", self.inner.offload_sizes(name)).await
    }

    async fn set_neighbors(
        &mut self,
        name: &str,
        neighbors: &[knic_proto::netconfig::Neighbor],
    ) -> Result<()> {
        timed(
            &self.spent,
            "set_neighbors",
            self.inner.set_neighbors(name, neighbors),
        )
        .await
    }

    async fn add_child(
        &mut self,
        parent: &str,
        child: NewChild<'_>,
        to: &Ns,
        change: &LinkChange,
    ) -> Result<()> {
        timed(
            &self.spent,
            "add_child",
            self.inner.add_child(parent, child, to, change),
        )
        .await
    }

    async fn del_link(&mut self, name: &str) -> Result<()> {
        timed(&self.spent, "del_link", self.inner.del_link(name)).await
    }

    async fn ensure_segment(&mut self, segment: &Segment) -> Result<()> {
        timed(
            &self.spent,
            "ensure_segment",
            self.inner.ensure_segment(segment),
        )
        .await
    }

    async fn add_veth(
        &mut self,
        host: &str,
        bridge: &str,
        to: &Ns,
        mtu: u32,
        change: &LinkChange,
    ) -> Result<()> {
        let call = self.inner.add_veth(host, bridge, to, mtu, change);
        timed(&self.spent, "add_veth", call).await
    }

    async fn fdb(&mut self, vxlan: &str) -> Result<Vec<FdbEntry>> {
        timed(&self.spent, "fdb", self.inner.fdb(vxlan)).await
    }

    async fn set_fdb(&mut self, vxlan: &str, add: &[FdbEntry], remove: &[FdbEntry]) -> Result<()> {
        timed(
            &self.spent,
            "set_fdb",
            self.inner.set_fdb(vxlan, add, remove),
        )
        .await
    }

    async fn vf_state(&mut self, pf: &str, index: u32) -> Result<Option<VfState>> {
        timed(&self.spent, "vf_state", self.inner.vf_state(pf, index)).await
    }

    async fn set_vf(&mut self, pf: &str, index: u32, state: &VfState) -> Result<()> {
        timed(&self.spent, "set_vf", self.inner.set_vf(pf, index, state)).await
    }

    async fn add_rules(&mut self, rules: &[Rule]) -> Result<()> {
        timed(&self.spent, "add_rules", self.inner.add_rules(rules)).await
    }

    async fn del_rules(&mut self, rules: &[Rule]) -> Result<()> {
        timed(&self.spent, "del_rules", self.inner.del_rules(rules)).await
    }

    async fn vrf(&mut self, name: &str) -> Result<Option<VrfLink>> {
        timed(&self.spent, "vrf", self.inner.vrf(name)).await
    }

    async fn add_vrf(&mut self, vrf: &Vrf) -> Result<()> {
        timed(&self.spent, "add_vrf", self.inner.add_vrf(vrf)).await
    }

    async fn set_master(&mut self, name: &str, master: &str) -> Result<()> {
        timed(
            &self.spent,
            "set_master",
            self.inner.set_master(name, master),
        )
        .await
    }

    async fn set_egress_limit(&mut self, name: &str, tbf: &Tbf) -> Result<()> {
        timed(
            &self.spent,
            "set_egress_limit",
            self.inner.set_egress_limit(name, tbf),
        )
        .await
    }

    async fn clear_egress_limit(&mut self, name: &str) -> Result<()> {
        timed(
            &self.spent,
            "clear_egress_limit",
            self.inner.clear_egress_limit(name),
        )
        .await
    }

    async fn ethtool_state(
        &mut self,
        name: &str,
        asked: &knic_proto::netconfig::EthtoolSettings,
    ) -> Result<knic_driver::netns::ethtool::EthtoolState> {
        timed(
            &self.spent,
            "ethtool_state",
            self.inner.ethtool_state(name, asked),
        )
        .await
    }

    async fn set_ethtool(
        &mut self,
        name: &str,
        settings: &knic_proto::netconfig::EthtoolSettings,
    ) -> Result<()> {
        timed(
            &self.spent,
            "set_ethtool",
            self.inner.set_ethtool(name, settings),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call succeeds; moves take `MOVE`, link changes `SET`.
    #[derive(Debug, Clone, Copy)]
    struct Slow;
    struct SlowSession;

    const MOVE: Duration = Duration::from_millis(10);
    /// Far longer than the moves, so counting one would show whatever the scheduler adds.
    const SET: Duration = Duration::from_millis(300);

    impl Kernel for Slow {
        type Session = SlowSession;
        async fn open(&self, _ns: &Ns) -> Result<Option<SlowSession>> {
            Ok(Some(SlowSession))
        }
    }

    impl Session for SlowSession {
        async fn find_link(&mut self, _name: &str) -> Result<Option<LinkState>> {
            Ok(None)
        }
        async fn addresses(&mut self, _: u32) -> Result<Vec<Cidr>> {
            Ok(vec![])
        }
        async fn links(&mut self) -> Result<Vec<LinkState>> {
            Ok(vec![])
        }
        async fn move_link(&mut self, _: &str, _: &Ns, _: &LinkChange) -> Result<Option<u32>> {
            tokio::time::sleep(MOVE).await;
            Ok(None)
        }
        fn remember(&mut self, _: &str, _: u32) {}
        async fn set_link(&mut self, _: &str, _: &LinkChange) -> Result<()> {
            tokio::time::sleep(SET).await;
            Ok(())
        }
        async fn add_addresses(&mut self, _: &str, _: &[Cidr]) -> Result<()> {
            Ok(())
        }
        async fn add_routes(&mut self, _: &str, _: &[Route]) -> Result<()> {
            Ok(())
        }
        async fn del_routes(&mut self, _: &str, _: &[Route]) -> Result<()> {
            Ok(())
        }
        async fn set_sysctls(&mut self, _: &str, _: &BTreeMap<String, String>) -> Result<()> {
            Ok(())
        }
        async fn offload_sizes(
            &mut self,
            _: &str,
        ) -> Result<Option<knic_proto::netconfig::OffloadSizes>> {
            Ok(None)
        }
        async fn set_neighbors(
            &mut self,
            _: &str,
            _: &[knic_proto::netconfig::Neighbor],
        ) -> Result<()> {
            Ok(())
        }
        async fn add_child(
            &mut self,
            _: &str,
            _: NewChild<'_>,
            _: &Ns,
            _: &LinkChange,
        ) -> Result<()> {
            Ok(())
        }
        async fn del_link(&mut self, _: &str) -> Result<()> {
            Ok(())
        }
        async fn ensure_segment(&mut self, _: &Segment) -> Result<()> {
            Ok(())
        }
        async fn add_veth(
            &mut self,
            _: &str,
            _: &str,
            _: &Ns,
            _: u32,
            _: &LinkChange,
        ) -> Result<()> {
            Ok(())
        }
        async fn fdb(&mut self, _: &str) -> Result<Vec<FdbEntry>> {
            Ok(vec![])
        }
        async fn set_fdb(&mut self, _: &str, _: &[FdbEntry], _: &[FdbEntry]) -> Result<()> {
            Ok(())
        }
        async fn vf_state(&mut self, _: &str, _: u32) -> Result<Option<VfState>> {
            Ok(None)
        }
        async fn set_vf(&mut self, _: &str, _: u32, _: &VfState) -> Result<()> {
            Ok(())
        }
        async fn set_egress_limit(&mut self, _: &str, _: &Tbf) -> Result<()> {
            Ok(())
        }
        async fn clear_egress_limit(&mut self, _: &str) -> Result<()> {
            Ok(())
        }
        async fn add_rules(&mut self, _: &[Rule]) -> Result<()> {
            Ok(())
        }
        async fn del_rules(&mut self, _: &[Rule]) -> Result<()> {
            Ok(())
        }
        async fn vrf(&mut self, _: &str) -> Result<Option<VrfLink>> {
            Ok(None)
        }
        async fn add_vrf(&mut self, _: &Vrf) -> Result<()> {
            Ok(())
        }
        async fn set_master(&mut self, _: &str, _: &str) -> Result<()> {
            Ok(())
        }
        async fn ethtool_state(
            &mut self,
            _: &str,
            _: &knic_proto::netconfig::EthtoolSettings,
        ) -> Result<knic_driver::netns::ethtool::EthtoolState> {
            Ok(Default::default())
        }
        async fn set_ethtool(
            &mut self,
            _: &str,
            _: &knic_proto::netconfig::EthtoolSettings,
        ) -> Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn each_operation_is_counted_and_timed_across_sessions_and_take_resets() {
        let k = Timed::new(Slow);
        let mut a = k.open(&Ns::Host).await.unwrap().unwrap();
        let mut b = k
            .open(&Ns::Pod(std::path::PathBuf::from("/run/netns/knt-x")))
            .await
            .unwrap()
            .unwrap();
        let change = LinkChange::default();
        a.move_link("x", &Ns::Host, &change).await.unwrap();
        a.set_link("x", &change).await.unwrap();
        b.move_link("y", &Ns::Host, &change).await.unwrap();
        let first = k.take();
        assert_eq!(
            first.keys().copied().collect::<Vec<_>>(),
            ["move_link", "open(host)", "open(pod)", "set_link"]
        );
        assert_eq!(first["open(host)"].0, 1);
        assert_eq!(first["open(pod)"].0, 1);
        assert_eq!(first["move_link"].0, 2);
        let moves = spent_in(&first, "move_link");
        assert!(moves >= 2 * MOVE && moves < SET, "{moves:?}");
        assert!(spent_in(&first, "set_link") >= SET);
        assert_eq!(spent_in(&first, "add_child"), Duration::ZERO);
        assert!(k.take().is_empty());
        b.set_link("y", &change).await.unwrap();
        let second = k.take();
        assert_eq!(second.len(), 1);
        assert_eq!(second["set_link"].0, 1);
        let mut total = first.clone();
        add(&mut total, &second);
        assert_eq!(total["set_link"].0, 2);
        let lines = per_round(&total, 2);
        assert_eq!(lines.len(), 4);
        assert!(
            lines[0].starts_with("move_link     1.0 calls"),
            "{}",
            lines[0]
        );
    }
}
