//! knic's DHCPv4 client, for claims whose config says `addressing: {mode: dhcp}`.
//!
//! The driver runs it itself, for the interface inside the pod's namespace (the pod has no
//! DHCP client of its own, and a per-pod daemon would have nothing to clean up after it when
//! it dies). The pieces: [`codec`] (messages as bytes), [`client`] (the exchanges), [`socket`]
//! (a UDP socket on port 68 opened *inside* the pod's namespace and bound to the interface)
//! and [`Lease`] with its schedule ([`Lease::next`]): renew at T1 unicast, rebind at T2
//! broadcast, expire at the lease time. The lease is checkpointed with the attachment, so a
//! restarted driver renews it on schedule and a detach (or an unprepare after a crash)
//! releases it: knic never leaves a lease behind to run out on the server.

pub mod attach;
pub mod client;
pub mod codec;
pub mod keeper;
pub mod socket;

use std::net::Ipv4Addr;
use std::time::Duration;

use knic_proto::netconfig::Cidr;
use serde::{Deserialize, Serialize};

use codec::{Message, opt};

/// Upper bound of `addressing.timeoutSeconds`, mirrored from the contract so an old
/// checkpoint's value can never make attach wait longer.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// Shortest lease knic accepts: below it renewals would come faster than a pod's status can
/// follow (and a server offering it is misconfigured).
pub const MIN_LEASE_SECONDS: u32 = 10;

/// A lease as granted, checkpointed with the attachment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The leased address.
    pub address: Ipv4Addr,
    /// From the subnet mask option (32 when the server sent none).
    pub prefix_len: u8,
    /// The server identifier: where renewals and the release go.
    pub server: Ipv4Addr,
    /// The first router, if the server named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router: Option<Ipv4Addr>,
    /// The interface MTU option, if sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// Lease time in seconds (`u32::MAX`: infinite).
    pub lease_seconds: u32,
    /// T1.
    pub renew_seconds: u32,
    /// T2.
    pub rebind_seconds: u32,
    /// When the ACK arrived, in seconds since the Unix epoch (wall clock, so the schedule
    /// survives a driver restart).
    pub acquired_unix: u64,
    /// The client's MAC (chaddr and client identifier of every later message).
    #[serde(with = "mac_text")]
    pub mac: [u8; 6],
}

mod mac_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(mac: &[u8; 6], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::netns::mac_text(mac))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 6], D::Error> {
        let text = String::deserialize(d)?;
        let mut mac = [0u8; 6];
        let parts: Vec<&str> = text.split(':').collect();
        if parts.len() != 6 {
            return Err(serde::de::Error::custom(format!("{text:?} is not a MAC")));
        }
        for (octet, part) in mac.iter_mut().zip(parts) {
            *octet = u8::from_str_radix(part, 16)
                .map_err(|_| serde::de::Error::custom(format!("{text:?} is not a MAC")))?;
        }
        Ok(mac)
    }
}

/// What the lease needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Renew (unicast to the server) at this Unix time.
    Renew(u64),
    /// Rebind (broadcast) at this Unix time.
    Rebind(u64),
    /// Expired at this Unix time: the address must go.
    Expire(u64),
    /// Infinite lease: nothing to do.
    Never,
}

impl Lease {
    /// The lease an ACK grants. T1 and T2 default to 50 % and 87.5 % of the lease (RFC 2131
    /// §4.4.5) and are put in order when a server sends them out of order.
    pub fn from_ack(
        ack: &Message,
        mac: [u8; 6],
        server: Ipv4Addr,
        now_unix: u64,
    ) -> Result<Lease, String> {
        let address = ack.yiaddr;
        if address.is_unspecified()
            || address.is_broadcast()
            || address.is_multicast()
            || address.is_loopback()
        {
            return Err(format!("{address} cannot be an interface address"));
        }
        let lease_seconds = ack
            .seconds(opt::LEASE_TIME)
            .map_err(|e| e.to_string())?
            .ok_or("no lease time (option 51)")?;
        if lease_seconds < MIN_LEASE_SECONDS {
            return Err(format!(
                "a lease of {lease_seconds} s is shorter than the {MIN_LEASE_SECONDS} s knic accepts"
            ));
        }
        let prefix_len = match ack.addr(opt::SUBNET_MASK).map_err(|e| e.to_string())? {
            None => 32,
            Some(mask) => {
                let bits = u32::from(mask);
                if bits.leading_ones() + bits.trailing_zeros() != 32 {
                    return Err(format!("subnet mask {mask} is not contiguous"));
                }
                // A /0 "subnet" would make the whole Internet on-link through the interface.
                if bits == 0 {
                    return Err(format!("subnet mask {mask} makes every address on-link"));
                }
                bits.leading_ones() as u8
            }
        };
        let router = ack.router().map_err(|e| e.to_string())?;
        let mtu = ack.mtu().map_err(|e| e.to_string())?;
        let default_t1 = lease_seconds / 2;
        let default_t2 = (u64::from(lease_seconds) * 7 / 8) as u32;
        let t2 = match ack
            .seconds(opt::REBINDING_TIME)
            .map_err(|e| e.to_string())?
        {
            Some(t2) if t2 > 0 && t2 < lease_seconds => t2,
            _ => default_t2,
        };
        let t1 = match ack.seconds(opt::RENEWAL_TIME).map_err(|e| e.to_string())? {
            Some(t1) if t1 > 0 && t1 < t2 => t1,
            _ => default_t1.min(t2),
        };
        Ok(Lease {
            address,
            prefix_len,
            server,
            router,
            mtu,
            lease_seconds,
            renew_seconds: t1,
            rebind_seconds: t2,
            acquired_unix: now_unix,
            mac,
        })
    }

    /// The address in interface form, as it goes onto the interface and into the status.
    pub fn cidr(&self) -> Cidr {
        Cidr {
            addr: self.address.into(),
            prefix_len: self.prefix_len,
        }
    }

    /// What to do next, seen at `now_unix`: the earliest step not yet due is returned when
    /// nothing is due; a step already due is returned with its (past) time.
    pub fn next(&self, now_unix: u64) -> Next {
        if self.lease_seconds == u32::MAX {
            return Next::Never;
        }
        let at = |s: u32| self.acquired_unix + u64::from(s);
        let expire = at(self.lease_seconds);
        if now_unix >= expire {
            Next::Expire(expire)
        } else if now_unix >= at(self.rebind_seconds) {
            Next::Rebind(now_unix)
        } else if now_unix >= at(self.renew_seconds) {
            Next::Renew(now_unix)
        } else {
            Next::Renew(at(self.renew_seconds))
        }
    }

    /// The Unix time the lease runs out.
    pub fn expires_unix(&self) -> u64 {
        self.acquired_unix + u64::from(self.lease_seconds)
    }

    /// The Unix time rebinding starts.
    pub fn rebind_unix(&self) -> u64 {
        self.acquired_unix + u64::from(self.rebind_seconds)
    }
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
