//! The client and its schedule against a scripted server; the real kernel and dnsmasq run in
//! `real_tests`.

use std::collections::VecDeque;
use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::client::{self, Failure, Transport};
use super::codec::{BOOTREPLY, Message, MessageType, opt};
use super::keeper::{self, Clock, Ended, Opener};
use super::{Lease, Next};

const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x10];
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const OFFERED: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 59);

/// How the scripted server answers one request.
type Script = Arc<dyn Fn(&Message) -> Vec<Vec<u8>> + Send + Sync>;

/// What the client sent: message, destination, virtual time.
type Log = Arc<Mutex<Vec<(Message, Ipv4Addr, u64)>>>;

struct Fake {
    script: Script,
    inbox: VecDeque<Vec<u8>>,
    log: Log,
    clock: Arc<AtomicU64>,
}

impl Transport for Fake {
    async fn send(&mut self, bytes: &[u8], to: Ipv4Addr) -> io::Result<()> {
        let m = Message::decode(bytes).map_err(io::Error::other)?;
        self.inbox.extend((self.script)(&m));
        self.log
            .lock()
            .unwrap()
            .push((m, to, self.clock.load(Ordering::SeqCst)));
        Ok(())
    }

    async fn recv(&mut self) -> io::Result<Vec<u8>> {
        match self.inbox.pop_front() {
            Some(b) => Ok(b),
            None => std::future::pending().await,
        }
    }
}

fn fake(script: Script) -> (Fake, Log) {
    let log: Log = Arc::default();
    (
        Fake {
            script,
            inbox: VecDeque::new(),
            log: log.clone(),
            clock: Arc::default(),
        },
        log,
    )
}

/// A reply of `kind` to `req` from SERVER, with `lease` seconds.
fn answer(req: &Message, kind: MessageType, lease: u32) -> Vec<u8> {
    let mut m = Message::request(kind, req.xid, req.chaddr)
        .with(opt::SERVER_ID, SERVER.octets().to_vec())
        .with(opt::LEASE_TIME, lease.to_be_bytes().to_vec())
        .with(opt::SUBNET_MASK, vec![255, 255, 255, 0])
        .with(opt::ROUTER, SERVER.octets().to_vec())
        .with(opt::MTU, 1400u16.to_be_bytes().to_vec());
    m.op = BOOTREPLY;
    m.yiaddr = OFFERED;
    m.encode()
}

/// dnsmasq's behaviour: OFFER a DISCOVER, ACK a REQUEST.
fn server(lease: u32) -> Script {
    Arc::new(move |req| {
        let kind = match req.message_type().unwrap() {
            MessageType::Discover => MessageType::Offer,
            MessageType::Request => MessageType::Ack,
            _ => return vec![],
        };
        vec![answer(req, kind, lease)]
    })
}

fn kinds(log: &Log) -> Vec<MessageType> {
    log.lock()
        .unwrap()
        .iter()
        .map(|(m, ..)| m.message_type().unwrap())
        .collect()
}

#[tokio::test]
async fn dora_gets_a_lease() {
    let (mut t, log) = fake(server(120));
    let lease = client::acquire(&mut t, MAC, Duration::from_secs(5), 1000)
        .await
        .unwrap();
    assert_eq!(
        lease,
        Lease {
            address: OFFERED,
            prefix_len: 24,
            server: SERVER,
            router: Some(SERVER),
            mtu: Some(1400),
            lease_seconds: 120,
            renew_seconds: 60,
            rebind_seconds: 105,
            acquired_unix: 1000,
            mac: MAC,
        }
    );
    assert_eq!(kinds(&log), [MessageType::Discover, MessageType::Request]);
    let log = log.lock().unwrap();
    let (request, to, _) = &log[1];
    assert_eq!(*to, Ipv4Addr::BROADCAST);
    assert_eq!(
        request.option(opt::REQUESTED_IP),
        Some(&OFFERED.octets()[..])
    );
    assert_eq!(request.option(opt::SERVER_ID), Some(&SERVER.octets()[..]));
    assert_eq!(
        request.option(opt::CLIENT_ID),
        Some(&[1, 2, 0, 0, 0, 0, 0x10][..])
    );
    assert_eq!(request.flags, super::codec::FLAG_BROADCAST);
    assert_eq!(log[0].0.xid, request.xid, "one transaction");
}

#[tokio::test]
async fn no_offer_fails_within_the_bound_with_the_reason() {
    let (mut t, log) = fake(Arc::new(|_| vec![]));
    let started = std::time::Instant::now();
    let e = client::acquire(&mut t, MAC, Duration::from_millis(300), 0)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.to_string(), "no DHCPOFFER (sent DHCPDISCOVER 1 times)");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(kinds(&log), [MessageType::Discover]);
}

#[tokio::test]
async fn a_nak_fails_at_once_with_the_servers_message() {
    let script: Script = Arc::new(|req| match req.message_type().unwrap() {
        MessageType::Discover => vec![answer(req, MessageType::Offer, 120)],
        _ => {
            let mut m = Message::request(MessageType::Nak, req.xid, req.chaddr)
                .with(opt::SERVER_ID, SERVER.octets().to_vec())
                .with(opt::MESSAGE, b"address in use".to_vec());
            m.op = BOOTREPLY;
            vec![m.encode()]
        }
    });
    let (mut t, _) = fake(script);
    let e = client::acquire(&mut t, MAC, Duration::from_secs(30), 0)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "server 10.77.0.1 refused the request (DHCPNAK): \"address in use\""
    );
}

#[tokio::test]
async fn malformed_and_foreign_replies_are_skipped_and_reported() {
    let script: Script = Arc::new(|req| {
        let mut foreign = answer(req, MessageType::Offer, 120);
        foreign[4] ^= 0xff; // another transaction
        let mut bad = answer(req, MessageType::Offer, 120);
        bad[236] = 0; // no cookie
        vec![foreign, bad]
    });
    let (mut t, _) = fake(script);
    let e = client::acquire(&mut t, MAC, Duration::from_millis(200), 0)
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "no DHCPOFFER (sent DHCPDISCOVER 1 times); a reply was refused: no DHCP magic cookie (found [0, 130, 83, 99])"
    );
}

#[tokio::test]
async fn unusable_acks_are_refused() {
    for (lease, want) in [(
        5,
        "unusable DHCPACK: a lease of 5 s is shorter than the 10 s knic accepts",
    )] {
        let (mut t, _) = fake(server(lease));
        let e = client::acquire(&mut t, MAC, Duration::from_secs(1), 0)
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), want);
    }
    let no_lease_time: Script = Arc::new(|req| {
        let kind = match req.message_type().unwrap() {
            MessageType::Discover => MessageType::Offer,
            _ => MessageType::Ack,
        };
        let mut m = Message::request(kind, req.xid, req.chaddr)
            .with(opt::SERVER_ID, SERVER.octets().to_vec())
            .with(opt::SUBNET_MASK, vec![255, 0, 255, 0]);
        m.op = BOOTREPLY;
        m.yiaddr = OFFERED;
        vec![m.encode()]
    });
    let (mut t, _) = fake(no_lease_time);
    let e = client::acquire(&mut t, MAC, Duration::from_secs(1), 0)
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "unusable DHCPACK: no lease time (option 51)");
}

#[tokio::test]
async fn release_goes_to_the_server_with_the_address() {
    let (mut t, log) = fake(server(120));
    let lease = client::acquire(&mut t, MAC, Duration::from_secs(1), 0)
        .await
        .unwrap();
    client::release(&mut t, &lease).await.unwrap();
    let log = log.lock().unwrap();
    let (m, to, _) = log.last().unwrap();
    assert_eq!(m.message_type().unwrap(), MessageType::Release);
    assert_eq!((*to, m.ciaddr), (SERVER, OFFERED));
    assert_eq!(m.option(opt::SERVER_ID), Some(&SERVER.octets()[..]));
}

fn lease_at(acquired: u64) -> Lease {
    Lease {
        address: OFFERED,
        prefix_len: 24,
        server: SERVER,
        router: None,
        mtu: None,
        lease_seconds: 120,
        renew_seconds: 60,
        rebind_seconds: 105,
        acquired_unix: acquired,
        mac: MAC,
    }
}

#[test]
fn schedule_follows_t1_t2_and_expiry() {
    let l = lease_at(1000);
    assert_eq!(l.next(1000), Next::Renew(1060));
    assert_eq!(l.next(1059), Next::Renew(1060));
    assert_eq!(l.next(1070), Next::Renew(1070));
    assert_eq!(l.next(1105), Next::Rebind(1105));
    assert_eq!(l.next(1120), Next::Expire(1120));
    let forever = Lease {
        lease_seconds: u32::MAX,
        ..l
    };
    assert_eq!(forever.next(u64::MAX / 2), Next::Never);
}

#[test]
fn lease_round_trips_through_the_checkpoint_form() {
    let l = lease_at(1000);
    let json = serde_json::to_value(&l).unwrap();
    assert_eq!(json["mac"], "02:00:00:00:00:10");
    assert_eq!(json["address"], "10.77.0.59");
    assert_eq!(serde_json::from_value::<Lease>(json).unwrap(), l);
}

/// Virtual time: sleeping jumps the clock.
#[derive(Clone, Default)]
struct VirtualClock(Arc<AtomicU64>);

impl Clock for VirtualClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    async fn sleep_until(&self, unix: u64) {
        self.0.fetch_max(unix, Ordering::SeqCst);
    }
}

struct FakeOpener {
    script: Script,
    log: Log,
    clock: VirtualClock,
}

impl Opener for FakeOpener {
    type T = Fake;

    async fn open(&self) -> io::Result<Fake> {
        Ok(Fake {
            script: self.script.clone(),
            inbox: VecDeque::new(),
            log: self.log.clone(),
            clock: self.clock.0.clone(),
        })
    }
}

#[tokio::test]
async fn renewals_come_at_t1_from_each_new_lease_until_the_server_stops() {
    let clock = VirtualClock::default();
    clock.0.store(1000, Ordering::SeqCst);
    // The server ACKs the first three renewals, then falls silent.
    let answered = Arc::new(AtomicU64::new(0));
    let a = answered.clone();
    let script: Script = Arc::new(move |req| {
        if a.fetch_add(1, Ordering::SeqCst) < 3 {
            vec![answer(req, MessageType::Ack, 120)]
        } else {
            vec![]
        }
    });
    let log: Log = Arc::default();
    let opener = FakeOpener {
        script,
        log: log.clone(),
        clock: clock.clone(),
    };
    let mut leases = Vec::new();
    let ended = keeper::keep(
        lease_at(1000),
        &clock,
        &opener,
        Duration::from_millis(20),
        |l| leases.push(l.acquired_unix),
    )
    .await;
    // Renewed at T1 of each lease: 1060, 1120, 1180; then from 1240 renewing fails: retries
    // at half the time left to T2 (min 10 s), then rebinding (broadcast) from T2 = 1285, half
    // the time left to expiry, until the lease runs out at 1300.
    assert_eq!(leases, [1060, 1120, 1180]);
    let sent: Vec<(u64, Ipv4Addr)> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(_, to, at)| (*at, *to))
        .collect();
    let b = Ipv4Addr::BROADCAST;
    assert_eq!(
        sent,
        [
            (1060, SERVER),
            (1120, SERVER),
            (1180, SERVER),
            (1240, SERVER),
            (1262, SERVER),
            (1273, SERVER),
            (1283, SERVER),
            (1285, b),
            (1295, b),
        ]
    );
    assert!(
        log.lock()
            .unwrap()
            .iter()
            .all(|(m, ..)| m.ciaddr == OFFERED)
    );
    let last = Lease {
        router: Some(SERVER),
        mtu: Some(1400),
        ..lease_at(1180)
    };
    assert_eq!(ended, Ended::Expired(last));
}

#[tokio::test]
async fn a_nak_on_renewal_ends_the_lease() {
    let clock = VirtualClock::default();
    clock.0.store(1000, Ordering::SeqCst);
    let script: Script = Arc::new(|req| {
        let mut m = Message::request(MessageType::Nak, req.xid, req.chaddr)
            .with(opt::SERVER_ID, SERVER.octets().to_vec());
        m.op = BOOTREPLY;
        vec![m.encode()]
    });
    let opener = FakeOpener {
        script,
        log: Arc::default(),
        clock: clock.clone(),
    };
    let ended = keeper::keep(
        lease_at(1000),
        &clock,
        &opener,
        Duration::from_secs(1),
        |_| {},
    )
    .await;
    let Ended::Refused(lease, f) = ended else {
        panic!("{ended:?}");
    };
    assert_eq!(lease, lease_at(1000));
    assert_eq!(
        f.to_string(),
        "server 10.77.0.1 refused the request (DHCPNAK) without a message"
    );
    assert!(matches!(f, Failure::Nak { .. }));
}
