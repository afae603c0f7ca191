//! A link's addresses and routes through rtnetlink: reading the addresses, adding addresses
//! and routes in one round trip, deleting routes.

use std::net::IpAddr;

use knic_proto::netconfig::{Cidr, Route};
use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage, AddressScope};
use netlink_packet_route::route::{RouteMessage, RouteScope};
use rtnetlink::{AddressMessageBuilder, RouteMessageBuilder};

use super::{RtnlSession, io, nl};
use crate::error::{Error, Result};

/// `ESRCH`: the route to delete is not there (a repeated live update).
const ESRCH: i32 = 3;

impl RtnlSession {
    pub(super) async fn read_addresses(&mut self, index: u32) -> Result<Vec<Cidr>> {
        self.sent(1);
        let dump = NetlinkMessage::from(RouteNetlinkMessage::GetAddress(AddressMessage::default()));
        let replies = self
            .wire
            .dump(dump)
            .map_err(nl(format!("reading addresses of link {index}")))?;
        let mut out = Vec::new();
        for reply in replies {
            let RouteNetlinkMessage::NewAddress(msg) = reply else {
                continue;
            };
            if msg.header.index != index || msg.header.scope != AddressScope::Universe {
                continue;
            }
            // IPv4 reports the interface address as IFA_LOCAL; IPv6 only has IFA_ADDRESS.
            let local = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(ip) => Some(*ip),
                _ => None,
            });
            let address = msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            });
            if let Some(addr) = local.or(address) {
                out.push(Cidr {
                    addr,
                    prefix_len: msg.header.prefix_len,
                });
            }
        }
        Ok(out)
    }

    pub(super) async fn add_addresses_now(&mut self, name: &str, addresses: &[Cidr]) -> Result<()> {
        if addresses.is_empty() {
            return Ok(());
        }
        let index = self.index(name).await?;
        let requests = addresses
            .iter()
            .map(|address| {
                let mut msg = match address.addr {
                    IpAddr::V4(ip) => AddressMessageBuilder::<std::net::Ipv4Addr>::new()
                        .index(index)
                        .address(ip, address.prefix_len)
                        .build(),
                    IpAddr::V6(ip) => AddressMessageBuilder::<std::net::Ipv6Addr>::new()
                        .index(index)
                        .address(ip, address.prefix_len)
                        .build(),
                };
                if address.addr.is_ipv6() {
                    // No duplicate address detection: the address is usable the moment the
                    // pod starts.
                    msg.attributes
                        .push(AddressAttribute::Flags(AddressFlags::Nodad));
                }
                (
                    RouteNetlinkMessage::NewAddress(msg),
                    format!("adding address {address} to {name}"),
                )
            })
            .collect();
        self.create_all(requests).await
    }

    pub(super) async fn add_routes_now(&mut self, name: &str, routes: &[Route]) -> Result<()> {
        if routes.is_empty() {
            return Ok(());
        }
        let index = self.index(name).await?;
        let requests = routes
            .iter()
            .map(|route| {
                (
                    RouteNetlinkMessage::NewRoute(route_message(index, route)),
                    format!("adding route {} via {name}", route.destination),
                )
            })
            .collect();
        self.create_all(requests).await
    }

    pub(super) async fn del_routes_now(&mut self, name: &str, routes: &[Route]) -> Result<()> {
        if routes.is_empty() {
            return Ok(());
        }
        let index = self.index(name).await?;
        let (messages, contexts): (Vec<_>, Vec<_>) = routes
            .iter()
            .map(|route| {
                let mut req = NetlinkMessage::from(RouteNetlinkMessage::DelRoute(route_message(
                    index, route,
                )));
                req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
                (
                    req,
                    format!("deleting route {} via {name}", route.destination),
                )
            })
            .unzip();
        self.sent(messages.len() as u64);
        let context = contexts.first().cloned().unwrap_or_default();
        let answers = self.wire.requests(messages).map_err(io(context))?;
        for (answer, context) in answers.into_iter().zip(contexts) {
            if let Err(refused) = answer
                && refused.errno != ESRCH
            {
                return Err(Error::io(context, refused.to_io()));
            }
        }
        Ok(())
    }
}

/// A route's metric and table, the same for both families.
fn metric_and_table<T>(mut b: RouteMessageBuilder<T>, route: &Route) -> RouteMessageBuilder<T> {
    if let Some(m) = route.metric {
        b = b.priority(m);
    }
    if let Some(t) = route.table {
        b = b.table_id(t);
    }
    b
}

/// The RTM_NEWROUTE of `route` through the link with ifindex `index`.
fn route_message(index: u32, route: &Route) -> RouteMessage {
    match route.destination.addr {
        IpAddr::V4(dst) => {
            let mut b = RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(dst, route.destination.prefix_len)
                .output_interface(index);
            if let Some(IpAddr::V4(gw)) = route.gateway {
                b = b.gateway(gw);
            } else {
                b = b.scope(RouteScope::Link);
            }
            if let Some(IpAddr::V4(src)) = route.source {
                b = b.pref_source(src);
            }
            metric_and_table(b, route).build()
        }
        IpAddr::V6(dst) => {
            let mut b = RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(dst, route.destination.prefix_len)
                .output_interface(index);
            if let Some(IpAddr::V6(gw)) = route.gateway {
                b = b.gateway(gw);
            }
            if let Some(IpAddr::V6(src)) = route.source {
                b = b.pref_source(src);
            }
            metric_and_table(b, route).build()
        }
    }
}
