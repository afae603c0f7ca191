//! A [`Kernel`] that times the namespace moves of the kernel it wraps, so a benchmark can tell
//! knic's own cost from the kernel's: a move waits for an RCU grace period under RTNL
//! (`rcu_barrier()` in `__dev_change_net_namespace`), which no executor can avoid. The executor
//! runs unchanged on top of it; every other call is passed through untouched.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use knic_driver::error::Result;
use knic_driver::netns::{Kernel, LinkChange, LinkState, NewChild, Ns, Session, VfState};
use knic_proto::netconfig::{Cidr, Route};

/// `inner`, with the time spent inside `move_link` summed across all its sessions.
#[derive(Debug, Clone)]
pub struct MoveTimed<K> {
    inner: K,
    spent: Arc<AtomicU64>,
}

impl<K> MoveTimed<K> {
    /// Wraps `inner`; nothing spent yet.
    pub fn new(inner: K) -> Self {
        MoveTimed {
            inner,
            spent: Arc::default(),
        }
    }

    /// Time spent inside `move_link` since the last call, and starts again from zero.
    pub fn take(&self) -> Duration {
        Duration::from_nanos(self.spent.swap(0, Ordering::Relaxed))
    }
}

/// A session of [`MoveTimed`].
#[derive(Debug)]
pub struct TimedSession<S> {
    inner: S,
    spent: Arc<AtomicU64>,
}

impl<K: Kernel> Kernel for MoveTimed<K> {
    type Session = TimedSession<K::Session>;

    async fn open(&self, ns: &Ns) -> Result<Option<Self::Session>> {
        Ok(self.inner.open(ns).await?.map(|inner| TimedSession {
            inner,
            spent: Arc::clone(&self.spent),
        }))
    }
}

impl<S: Session> Session for TimedSession<S> {
    fn link(&mut self, name: &str) -> impl Future<Output = Result<Option<LinkState>>> + Send {
        self.inner.link(name)
    }

    fn links(&mut self) -> impl Future<Output = Result<Vec<LinkState>>> + Send {
        self.inner.links()
    }

    async fn move_link(&mut self, name: &str, to: &Ns, change: &LinkChange) -> Result<()> {
        let start = Instant::now();
        let result = self.inner.move_link(name, to, change).await;
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.spent.fetch_add(nanos, Ordering::Relaxed);
        result
    }

    fn set_link(
        &mut self,
        name: &str,
        change: &LinkChange,
    ) -> impl Future<Output = Result<()>> + Send {
        self.inner.set_link(name, change)
    }

    fn add_address(
        &mut self,
        name: &str,
        address: Cidr,
    ) -> impl Future<Output = Result<()>> + Send {
        self.inner.add_address(name, address)
    }

    fn add_route(&mut self, name: &str, route: &Route) -> impl Future<Output = Result<()>> + Send {
        self.inner.add_route(name, route)
    }

    fn set_sysctls(
        &mut self,
        name: &str,
        sysctls: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<()>> + Send {
        self.inner.set_sysctls(name, sysctls)
    }

    fn add_child(
        &mut self,
        parent: &str,
        child: NewChild<'_>,
        to: &Ns,
        change: &LinkChange,
    ) -> impl Future<Output = Result<()>> + Send {
        self.inner.add_child(parent, child, to, change)
    }

    fn del_link(&mut self, name: &str) -> impl Future<Output = Result<()>> + Send {
        self.inner.del_link(name)
    }

    fn vf_state(
        &mut self,
        pf: &str,
        index: u32,
    ) -> impl Future<Output = Result<Option<VfState>>> + Send {
        self.inner.vf_state(pf, index)
    }

    fn set_vf(
        &mut self,
        pf: &str,
        index: u32,
        state: &VfState,
    ) -> impl Future<Output = Result<()>> + Send {
        self.inner.set_vf(pf, index, state)
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
        async fn link(&mut self, _name: &str) -> Result<Option<LinkState>> {
            Ok(None)
        }
        async fn links(&mut self) -> Result<Vec<LinkState>> {
            Ok(vec![])
        }
        async fn move_link(&mut self, _: &str, _: &Ns, _: &LinkChange) -> Result<()> {
            tokio::time::sleep(MOVE).await;
            Ok(())
        }
        async fn set_link(&mut self, _: &str, _: &LinkChange) -> Result<()> {
            tokio::time::sleep(SET).await;
            Ok(())
        }
        async fn add_address(&mut self, _: &str, _: Cidr) -> Result<()> {
            Ok(())
        }
        async fn add_route(&mut self, _: &str, _: &Route) -> Result<()> {
            Ok(())
        }
        async fn set_sysctls(&mut self, _: &str, _: &BTreeMap<String, String>) -> Result<()> {
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
        async fn vf_state(&mut self, _: &str, _: u32) -> Result<Option<VfState>> {
            Ok(None)
        }
        async fn set_vf(&mut self, _: &str, _: u32, _: &VfState) -> Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn only_moves_count_summed_over_sessions_and_take_resets() {
        let k = MoveTimed::new(Slow);
        let mut a = k.open(&Ns::Host).await.unwrap().unwrap();
        let mut b = k.open(&Ns::Host).await.unwrap().unwrap();
        let change = LinkChange::default();
        a.move_link("x", &Ns::Host, &change).await.unwrap();
        a.set_link("x", &change).await.unwrap();
        b.move_link("y", &Ns::Host, &change).await.unwrap();
        let spent = k.take();
        assert!(spent >= 2 * MOVE && spent < SET, "{spent:?}");
        assert_eq!(k.take(), Duration::ZERO);
        b.set_link("y", &change).await.unwrap();
        assert_eq!(k.take(), Duration::ZERO);
    }
}
