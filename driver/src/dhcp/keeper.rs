//! Keeps a lease while the pod runs: renew at T1 (unicast to the server), retry at half the
//! time left until T2 (at least [`MIN_RETRY`] apart, RFC 2131 §4.4.5), rebind at T2
//! (broadcast) likewise until the lease runs out. Time comes from a [`Clock`], so the tests
//! run the whole schedule in virtual time, and every wait is for a wall-clock instant, so a
//! schedule restored from the checkpoint after a driver restart continues where it was.

use std::future::Future;
use std::io;
use std::time::Duration;

use super::client::{self, Failure, Transport};
use super::{Lease, Next};

/// Retries of a renewal or rebinding are at least this far apart.
pub const MIN_RETRY: u64 = 10;

/// Wall-clock time and sleeping until an instant of it.
pub trait Clock: Send + Sync {
    /// Seconds since the Unix epoch.
    fn now(&self) -> u64;
    /// Returns at `unix` (at once when it has passed).
    fn sleep_until(&self, unix: u64) -> impl Future<Output = ()> + Send;
}

/// The real clock.
pub struct WallClock;

impl Clock for WallClock {
    fn now(&self) -> u64 {
        super::now_unix()
    }

    async fn sleep_until(&self, unix: u64) {
        let now = self.now();
        if unix > now {
            tokio::time::sleep(Duration::from_secs(unix - now)).await;
        }
    }
}

/// Opens a transport for one exchange (the socket is not kept between renewals).
pub trait Opener: Send + Sync {
    /// The transport.
    type T: Transport;
    /// Opens it.
    fn open(&self) -> impl Future<Output = io::Result<Self::T>> + Send;
}

/// Why keeping the lease ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Neither the server nor any other renewed it in time; the address must go.
    Expired(Lease),
    /// A server refused the renewal; the address must go.
    Refused(Lease, Failure),
}

/// Renews `lease` for as long as it can, calling `renewed` with every new lease (to
/// checkpoint it and update the status). Returns only when the lease is lost; the caller
/// cancels it (drops the future) on detach.
pub async fn keep<C: Clock, O: Opener>(
    mut lease: Lease,
    clock: &C,
    opener: &O,
    attempt_timeout: Duration,
    mut renewed: impl FnMut(&Lease) + Send,
) -> Ended {
    loop {
        let (at, rebind) = match lease.next(clock.now()) {
            Next::Never => return std::future::pending().await,
            Next::Expire(_) => return Ended::Expired(lease),
            Next::Renew(at) => (at, false),
            Next::Rebind(at) => (at, true),
        };
        clock.sleep_until(at).await;
        // Re-read: the sleep may have overshot into the next phase.
        let rebind = rebind || clock.now() >= lease.rebind_unix();
        if clock.now() >= lease.expires_unix() {
            return Ended::Expired(lease);
        }
        let outcome = match opener.open().await {
            Ok(mut t) => client::renew(&mut t, &lease, rebind, attempt_timeout, clock.now()).await,
            Err(e) => Err(Failure::Io(e.to_string())),
        };
        match outcome {
            Ok(new) => {
                tracing::info!(address = %new.address, server = %new.server,
                    lease_seconds = new.lease_seconds, rebind, "DHCP lease renewed");
                lease = new;
                renewed(&lease);
            }
            Err(f @ Failure::Nak { .. }) => return Ended::Refused(lease, f),
            Err(f) => {
                let now = clock.now();
                let until = if rebind {
                    lease.expires_unix()
                } else {
                    lease.rebind_unix()
                };
                let wait = (until.saturating_sub(now) / 2).max(MIN_RETRY);
                tracing::warn!(address = %lease.address, error = %f, retry_in = wait, rebind,
                    "DHCP renewal failed; retrying");
                clock.sleep_until((now + wait).min(until)).await;
            }
        }
    }
}
