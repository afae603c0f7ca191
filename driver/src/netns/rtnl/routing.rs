//! Rules (RTM_NEWRULE / RTM_DELRULE) and VRF devices over rtnetlink.

use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVrf, LinkAttribute, LinkInfo, LinkMessage,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::{LinkUnspec, LinkVrf};

use super::super::routing::{Family, Rule, Vrf, VrfLink, describe};
use super::{EOPNOTSUPP, RtnlSession, io, nl};
use crate::error::{Error, Result};

/// `ENOENT`: the kernel's answer to deleting a rule that is not there.
const ENOENT: i32 = 2;

/// The RTM_NEWRULE (and, with the same attributes, RTM_DELRULE) of `rule`: `FR_ACT_TO_TBL`
/// with the table in the header when it fits a byte and always in `FRA_TABLE` (as iproute2
/// sends it), the priority always explicit so a repeated add finds the same rule.
pub(crate) fn rule_message(rule: &Rule) -> RuleMessage {
    let mut msg = RuleMessage::default();
    msg.header.family = match rule.family {
        Family::Ipv4 => AddressFamily::Inet,
        Family::Ipv6 => AddressFamily::Inet6,
    };
    msg.header.action = RuleAction::ToTable;
    msg.header.table = u8::try_from(rule.table).unwrap_or(0);
    let attrs = &mut msg.attributes;
    attrs.push(RuleAttribute::Priority(rule.priority));
    if let Some(from) = rule.from {
        msg.header.src_len = from.prefix_len;
        attrs.push(RuleAttribute::Source(from.addr));
    }
    if let Some(to) = rule.to {
        msg.header.dst_len = to.prefix_len;
        attrs.push(RuleAttribute::Destination(to.addr));
    }
    if let Some(iif) = &rule.iif {
        attrs.push(RuleAttribute::Iifname(iif.clone()));
    }
    if let Some(oif) = &rule.oif {
        attrs.push(RuleAttribute::Oifname(oif.clone()));
    }
    if let Some(mark) = rule.fwmark {
        attrs.push(RuleAttribute::FwMark(mark));
    }
    if let Some(mask) = rule.fwmask {
        attrs.push(RuleAttribute::FwMask(mask));
    }
    attrs.push(RuleAttribute::Table(rule.table));
    msg
}

/// The RTM_NEWLINK creating `vrf`, up, in the socket's namespace.
pub(crate) fn vrf_message(vrf: &Vrf) -> LinkMessage {
    LinkVrf::new(&vrf.name, vrf.table).up().build()
}

/// The RTM_NEWLINK enslaving the link `index` to `master`.
pub(crate) fn master_message(index: u32, master: u32) -> LinkMessage {
    LinkUnspec::new_with_index(index).controller(master).build()
}

/// The table of a VRF link, from its `IFLA_LINKINFO`; `None` when it is not a VRF.
fn vrf_table(link: &LinkMessage) -> Option<u32> {
    let infos = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => Some(infos),
        _ => None,
    })?;
    if !infos.contains(&LinkInfo::Kind(InfoKind::Vrf)) {
        return None;
    }
    infos.iter().find_map(|i| match i {
        LinkInfo::Data(InfoData::Vrf(data)) => data.iter().find_map(|d| match d {
            InfoVrf::TableId(t) => Some(*t),
            _ => None,
        }),
        _ => None,
    })
}

fn name_of(link: &LinkMessage) -> Option<&str> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.as_str()),
        _ => None,
    })
}

impl RtnlSession {
    pub(super) async fn add_rules_now(&mut self, rules: &[Rule]) -> Result<()> {
        if rules.is_empty() {
            return Ok(());
        }
        let requests = rules
            .iter()
            .map(|rule| {
                (
                    RouteNetlinkMessage::NewRule(rule_message(rule)),
                    format!("adding {} in {}", describe(rule), self.describe()),
                )
            })
            .collect();
        self.create_all(requests).await
    }

    pub(super) async fn del_rules_now(&mut self, rules: &[Rule]) -> Result<()> {
        if rules.is_empty() {
            return Ok(());
        }
        let (messages, contexts): (Vec<_>, Vec<_>) = rules
            .iter()
            .map(|rule| {
                let mut req =
                    NetlinkMessage::from(RouteNetlinkMessage::DelRule(rule_message(rule)));
                req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
                (
                    req,
                    format!("deleting {} in {}", describe(rule), self.describe()),
                )
            })
            .unzip();
        self.sent(messages.len() as u64);
        let context = contexts.first().cloned().unwrap_or_default();
        let answers = self.wire.requests(messages).map_err(io(context))?;
        for (answer, context) in answers.into_iter().zip(contexts) {
            if let Err(refused) = answer
                && refused.errno != ENOENT
            {
                return Err(Error::io(context, refused.to_io()));
            }
        }
        Ok(())
    }

    /// One dump: the VRF's own message and the links whose `IFLA_MASTER` is its index.
    pub(super) async fn vrf_now(&mut self, name: &str) -> Result<Option<VrfLink>> {
        self.sent(1);
        let dump = NetlinkMessage::from(RouteNetlinkMessage::GetLink(LinkMessage::default()));
        let replies = self
            .wire
            .dump(dump)
            .map_err(nl(format!("listing links to find VRF {name}")))?;
        let links: Vec<&LinkMessage> = replies
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(l),
                _ => None,
            })
            .collect();
        let Some(vrf) = links.iter().find(|l| name_of(l) == Some(name)) else {
            return Ok(None);
        };
        let index = vrf.header.index;
        self.indexes.insert(name.to_owned(), index);
        let members = links
            .iter()
            .filter(|l| l.attributes.contains(&LinkAttribute::Controller(index)))
            .filter_map(|l| name_of(l).map(str::to_owned))
            .collect();
        Ok(Some(VrfLink {
            table: vrf_table(vrf),
            members,
        }))
    }

    pub(super) async fn add_vrf_now(&mut self, vrf: &Vrf) -> Result<()> {
        let what = format!(
            "creating VRF {} (table {}) in {}",
            vrf.name,
            vrf.table,
            self.describe()
        );
        match self.exchange(super::change(RouteNetlinkMessage::NewLink(vrf_message(
            vrf,
        )))) {
            Ok(_) => Ok(()),
            Err(e) if e.errno() == Some(EOPNOTSUPP) => Err(Error::kernel(
                self.describe(),
                what,
                "the kernel has no vrf support (module vrf)",
            )),
            Err(e) => Err(Error::io(what, e.into_io())),
        }
    }

    pub(super) async fn set_master_now(&mut self, name: &str, master: &str) -> Result<()> {
        let index = self.index(name).await?;
        let master_index = self.index(master).await?;
        let mut req = NetlinkMessage::from(RouteNetlinkMessage::SetLink(master_message(
            index,
            master_index,
        )));
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        self.exchange(req).map(|_| ()).map_err(nl(format!(
            "enslaving {name} to {master} in {}",
            self.describe()
        )))
    }
}

#[cfg(test)]
#[path = "routing_tests.rs"]
mod tests;
