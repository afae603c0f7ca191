//! The egress limit of a pod's interface: a token bucket filter (`tbf`) as the interface's
//! root qdisc, sized from the plan's [`Bandwidth`] and the interface's MTU.
//!
//! TBF because it is in every distribution kernel (this host has it but no police action or
//! matchall filter) and limits one device without classes. It is set on the interface inside
//! the pod, before the link goes up, so the first packet already meets the limit; that works
//! alike for a moved device and for a child knic created. netlink-packet-route has no TBF
//! types, so the options are encoded here as pure functions, checked attribute by attribute.

use knic_proto::netconfig::Bandwidth;
use netlink_packet_core::{
    DefaultNla, NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcOption};

use super::Ns;
use crate::error::{Error, Result};

/// `TCA_TBF_PARMS`: `struct tc_tbf_qopt`.
pub const TCA_TBF_PARMS: u16 = 1;
/// `TCA_TBF_RATE64`: the rate in bytes/s when it does not fit the 32-bit field.
pub const TCA_TBF_RATE64: u16 = 4;
/// `TCA_TBF_BURST`: the bucket in bytes (the kernel derives its time from it and the rate).
pub const TCA_TBF_BURST: u16 = 6;
/// `TC_LINKLAYER_ETHERNET`: with it the kernel needs no rate table (`TCA_TBF_RTAB`).
const LINKLAYER_ETHERNET: u8 = 1;
/// The qdisc kind.
pub const KIND: &str = "tbf";
/// `sizeof(struct tc_tbf_qopt)`: two 12-byte rate specs and three `u32`s.
pub const QOPT_LEN: usize = 36;

/// A frame's bytes beyond its MTU the bucket must hold: an Ethernet header with one 802.1Q
/// tag. A bucket smaller than one full frame drops every such frame, so it is refused.
pub const LINK_HEADER: u32 = 18;
/// The smallest bucket knic picks itself: room for a 64 KiB GSO burst at any rate.
pub const MIN_DEFAULT_BURST: u32 = 64 * 1024;
/// How much of a second's worth of bytes knic's own bucket holds (10 ms): enough for the
/// scheduler's timer slack at high rates without letting much pass at line rate.
const BURST_DIVISOR: u64 = 100;
/// How long a packet may queue behind the bucket (50 ms at the rate) before it is dropped.
const QUEUE_DIVISOR: u64 = 20;
/// `PSCHED_SHIFT`: the kernel's scheduler ticks are 64 ns.
const PSCHED_SHIFT: u32 = 6;

/// A TBF's parameters as the kernel takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tbf {
    /// Bytes per second.
    pub rate: u64,
    /// Bucket size in bytes.
    pub burst: u32,
    /// Bytes that may queue behind the bucket.
    pub limit: u32,
}

/// The rate the kernel enforces for `egress` bit/s: whole bytes per second, so a rate that is
/// not a multiple of 8 is rounded down (never above what was asked). The claim status
/// reports this.
pub fn enforced_egress(bandwidth: &Bandwidth) -> u64 {
    bandwidth.egress / 8 * 8
}

impl Tbf {
    /// The bucket for `bandwidth` on an interface with `mtu`: the operator's burst, else the
    /// larger of 10 ms at the rate, 64 KiB and one full frame. Refuses an operator's burst
    /// below one full frame of `ifname` in `ns`.
    pub fn for_link(bandwidth: &Bandwidth, mtu: u32, ns: &Ns, ifname: &str) -> Result<Tbf> {
        let rate = (bandwidth.egress / 8).max(1);
        let frame = mtu.saturating_add(LINK_HEADER);
        let burst = match bandwidth.burst {
            Some(burst) if burst < frame => {
                return Err(Error::kernel(
                    ns,
                    format!("limiting the egress of {ifname}"),
                    format!(
                        "bandwidth.burst {burst} bytes is less than one full frame (MTU {mtu} + \
                         {LINK_HEADER} bytes of header = {frame}); every such frame would be \
                         dropped"
                    ),
                ));
            }
            Some(burst) => burst,
            None => {
                let tenth = u32::try_from(rate / BURST_DIVISOR).unwrap_or(u32::MAX);
                tenth.max(MIN_DEFAULT_BURST).max(frame)
            }
        };
        let queue = u32::try_from(rate / QUEUE_DIVISOR).unwrap_or(u32::MAX);
        Ok(Tbf {
            rate,
            burst,
            limit: burst.saturating_add(queue),
        })
    }

    /// `struct tc_tbf_qopt`, native-endian as the kernel reads it: the rate spec (32-bit rate,
    /// saturated: `TCA_TBF_RATE64` carries the real one), no peak rate, the queue limit, and
    /// the bucket as time in scheduler ticks for kernels that ignore `TCA_TBF_BURST`.
    pub fn qopt(&self) -> [u8; QOPT_LEN] {
        let mut out = [0u8; QOPT_LEN];
        // tc_ratespec: cell_log u8, linklayer u8, overhead u16, cell_align i16, mpu u16, rate u32.
        out[1] = LINKLAYER_ETHERNET;
        let rate32 = u32::try_from(self.rate).unwrap_or(u32::MAX);
        out[8..12].copy_from_slice(&rate32.to_ne_bytes());
        // Peak rate spec (12..24) stays zero: no peak rate.
        out[24..28].copy_from_slice(&self.limit.to_ne_bytes());
        out[28..32].copy_from_slice(&self.buffer_ticks().to_ne_bytes());
        // mtu (32..36) is only used with a peak rate.
        out
    }

    /// The bucket's size as the time it takes to fill at the rate, in 64 ns ticks.
    fn buffer_ticks(&self) -> u32 {
        let nanos = u128::from(self.burst) * 1_000_000_000 / u128::from(self.rate.max(1));
        u32::try_from(nanos >> PSCHED_SHIFT).unwrap_or(u32::MAX)
    }
}

/// `RTM_NEWQDISC` with `NLM_F_CREATE | NLM_F_REPLACE` for the root of link `index`: creates
/// the TBF, replaces a qdisc of another kind, or changes knic's own TBF in place, so a
/// repeated hook is idempotent.
pub fn replace_message(index: u32, tbf: &Tbf) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut message = TcMessage::with_index(i32::try_from(index).unwrap_or(i32::MAX));
    message.header.parent = TcHandle::ROOT;
    message.attributes.push(TcAttribute::Kind(KIND.into()));
    message.attributes.push(TcAttribute::Options(vec![
        TcOption::Other(DefaultNla::new(TCA_TBF_PARMS, tbf.qopt().to_vec())),
        TcOption::Other(DefaultNla::new(
            TCA_TBF_RATE64,
            tbf.rate.to_ne_bytes().to_vec(),
        )),
        TcOption::Other(DefaultNla::new(
            TCA_TBF_BURST,
            tbf.burst.to_ne_bytes().to_vec(),
        )),
    ]));
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::NewQueueDiscipline(message));
    request.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
    request
}

/// `RTM_DELQDISC` of the root of link `index` if it is a TBF (the kernel refuses the kind
/// check on any other, and answers ENOENT when only the default qdisc is there).
pub fn delete_message(index: u32) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut message = TcMessage::with_index(i32::try_from(index).unwrap_or(i32::MAX));
    message.header.parent = TcHandle::ROOT;
    message.attributes.push(TcAttribute::Kind(KIND.into()));
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::DelQueueDiscipline(message));
    request.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    request
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{NetlinkPayload, Nla, NlasIterator};

    use super::*;

    fn bandwidth(egress: u64, burst: Option<u32>) -> Bandwidth {
        Bandwidth { egress, burst }
    }

    /// Emitted to bytes and parsed back, as the kernel would read it.
    fn wire(request: NetlinkMessage<RouteNetlinkMessage>) -> (u16, RouteNetlinkMessage) {
        let mut request = request;
        request.finalize();
        let mut bytes = vec![0u8; request.buffer_len()];
        request.serialize(&mut bytes);
        let parsed = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes).expect("parses");
        match parsed.payload {
            NetlinkPayload::InnerMessage(m) => (parsed.header.flags, m),
            other => panic!("not a route message: {other:?}"),
        }
    }

    fn u32_at(bytes: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
    }

    /// TCA_OPTIONS of a parsed message, split into its nested attributes as the kernel's
    /// `nla_parse_nested` does (netlink-packet-route keeps an unknown kind's options whole).
    fn options(message: &TcMessage) -> Vec<(u16, Vec<u8>)> {
        let nested = message
            .attributes
            .iter()
            .find_map(|a| match a {
                TcAttribute::Options(o) => Some(o.clone()),
                _ => None,
            })
            .expect("TCA_OPTIONS");
        let [TcOption::Other(whole)] = nested.as_slice() else {
            panic!("an unknown kind's options are kept whole: {nested:?}");
        };
        let mut value = vec![0u8; whole.value_len()];
        whole.emit_value(&mut value);
        NlasIterator::new(value.as_slice())
            .map(|nla| {
                let nla = nla.expect("a well-formed nested attribute");
                (nla.kind(), nla.value().to_vec())
            })
            .collect()
    }

    #[test]
    fn the_replace_request_carries_every_tbf_attribute() {
        let tbf = Tbf::for_link(
            &bandwidth(2_000_000_000, Some(256 * 1024)),
            1500,
            &Ns::Host,
            "net1",
        )
        .expect("valid");
        assert_eq!(
            tbf,
            Tbf {
                rate: 250_000_000,
                burst: 262_144,
                limit: 262_144 + 12_500_000
            }
        );
        let (flags, message) = wire(replace_message(7, &tbf));
        assert_eq!(
            flags,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
            "replace-or-create, acknowledged"
        );
        let RouteNetlinkMessage::NewQueueDiscipline(m) = message else {
            panic!("not RTM_NEWQDISC: {message:?}");
        };
        assert_eq!(m.header.index, 7);
        assert_eq!(m.header.parent, TcHandle::ROOT);
        assert_eq!(
            m.header.handle,
            TcHandle::UNSPEC,
            "the kernel picks the handle"
        );
        assert!(m.attributes.contains(&TcAttribute::Kind("tbf".into())));
        let options = options(&m);
        let kinds: Vec<u16> = options.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, [TCA_TBF_PARMS, TCA_TBF_RATE64, TCA_TBF_BURST]);
        let qopt = &options[0].1;
        assert_eq!(qopt.len(), QOPT_LEN);
        assert_eq!(qopt[0], 0, "cell_log");
        assert_eq!(
            qopt[1], LINKLAYER_ETHERNET,
            "linklayer: no rate table needed"
        );
        assert_eq!(u32_at(qopt, 8), 250_000_000, "rate, bytes/s");
        assert!(qopt[12..24].iter().all(|b| *b == 0), "no peak rate");
        assert_eq!(u32_at(qopt, 24), 262_144 + 12_500_000, "limit");
        // 262144 bytes at 250 MB/s is 1048576 ns, 16384 ticks of 64 ns.
        assert_eq!(u32_at(qopt, 28), 16_384, "buffer in ticks");
        assert_eq!(u32_at(qopt, 32), 0, "mtu: only with a peak rate");
        assert_eq!(
            options[1].1,
            250_000_000u64.to_ne_bytes().to_vec(),
            "TCA_TBF_RATE64"
        );
        assert_eq!(
            options[2].1,
            262_144u32.to_ne_bytes().to_vec(),
            "TCA_TBF_BURST"
        );
    }

    #[test]
    fn rates_beyond_32_bits_go_in_rate64() {
        // 100 Tbit/s: 12.5e12 bytes/s does not fit the 32-bit field.
        let tbf = Tbf::for_link(
            &bandwidth(100_000_000_000_000, None),
            9000,
            &Ns::Host,
            "net1",
        )
        .expect("valid");
        let (_, RouteNetlinkMessage::NewQueueDiscipline(m)) = wire(replace_message(3, &tbf)) else {
            panic!("not RTM_NEWQDISC");
        };
        let options = options(&m);
        assert_eq!(u32_at(&options[0].1, 8), u32::MAX, "saturated 32-bit rate");
        assert_eq!(options[1].1, 12_500_000_000_000u64.to_ne_bytes().to_vec());
        assert_eq!(tbf.burst, u32::MAX, "10 ms at that rate, capped");
        assert_eq!(tbf.limit, u32::MAX);
    }

    #[test]
    fn the_delete_request_names_the_root_tbf() {
        let (flags, message) = wire(delete_message(9));
        assert_eq!(flags, NLM_F_REQUEST | NLM_F_ACK);
        let RouteNetlinkMessage::DelQueueDiscipline(m) = message else {
            panic!("not RTM_DELQDISC: {message:?}");
        };
        assert_eq!((m.header.index, m.header.parent), (9, TcHandle::ROOT));
        assert_eq!(m.attributes, vec![TcAttribute::Kind("tbf".into())]);
    }

    #[test]
    fn knic_sizes_the_bucket_from_rate_and_mtu() {
        // Slow: the 64 KiB floor.
        let slow =
            Tbf::for_link(&bandwidth(1_000_000, None), 1500, &Ns::Host, "net1").expect("valid");
        assert_eq!(
            slow,
            Tbf {
                rate: 125_000,
                burst: 65_536,
                limit: 65_536 + 6_250
            }
        );
        // Fast: 10 ms at the rate.
        let fast = Tbf::for_link(&bandwidth(10_000_000_000, None), 1500, &Ns::Host, "net1")
            .expect("valid");
        assert_eq!(fast.burst, 12_500_000);
        // Jumbo frames beyond 64 KiB: one whole frame.
        let jumbo =
            Tbf::for_link(&bandwidth(8_000, None), 65_535, &Ns::Host, "net1").expect("valid");
        assert_eq!((jumbo.rate, jumbo.burst), (1_000, 65_553));
        // Not a multiple of 8: whole bytes, rounded down, and so reported.
        assert_eq!(enforced_egress(&bandwidth(1_001, None)), 1_000);
        assert_eq!(
            enforced_egress(&bandwidth(2_000_000_000, None)),
            2_000_000_000
        );
    }

    #[test]
    fn a_burst_below_one_frame_is_refused() {
        let err = Tbf::for_link(
            &bandwidth(1_000_000_000, Some(1_000)),
            1500,
            &Ns::Host,
            "net1",
        )
        .expect_err("too small")
        .to_string();
        assert_eq!(
            err,
            "host: limiting the egress of net1: bandwidth.burst 1000 bytes is less than one full \
             frame (MTU 1500 + 18 bytes of header = 1518); every such frame would be dropped"
        );
        Tbf::for_link(
            &bandwidth(1_000_000_000, Some(1_518)),
            1500,
            &Ns::Host,
            "net1",
        )
        .expect("one frame");
    }
}
