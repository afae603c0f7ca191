use super::*;
use crate::claims::tests::{ClaimBuilder, MemClaims, add, claim_u1, in_dir, prepared, wanted};
use crate::events::EventSink;
use std::sync::Mutex as StdMutex;

const DRIVER: &str = "knic.dev";

fn settings() -> OrphanSettings {
    OrphanSettings {
        idle: Duration::from_secs(10),
        grace: Duration::from_secs(30),
        period: Duration::from_secs(5),
        max_recheck: Duration::from_secs(60),
    }
}

/// A checkpoint holding one prepared claim `u1` of device `dev-a` (exclusive) for pod `pu`.
async fn one_prepared() -> (tempfile::TempDir, Arc<MemClaims>, Preparer, Checkpoint) {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(MemClaims::default());
    add(&source, claim_u1(&[("nic", DRIVER, "dev-a")]));
    let preparer = in_dir(source.clone(), &dir);
    prepared(&preparer, wanted("u1")).await;
    let checkpoint = preparer.claims().snapshot().await.unwrap();
    (dir, source, preparer, checkpoint)
}

fn found(claim: ResourceClaim) -> Answer {
    Answer::Found(Box::new(claim))
}

#[tokio::test]
async fn what_the_api_says_about_a_prepared_claim() {
    let (_dir, _source, _preparer, checkpoint) = one_prepared().await;
    let claim = &checkpoint.claims["u1"];
    let gone = |answer: &Answer| gone_because(claim, answer, DRIVER);
    assert_eq!(gone(&found(claim_u1(&[("nic", DRIVER, "dev-a")]))), None);
    assert_eq!(
        gone(&Answer::Missing).as_deref(),
        Some("its ResourceClaim no longer exists")
    );
    let recreated = ClaimBuilder::new("claim", "u2")
        .allocated(&[("nic", DRIVER, "dev-a")])
        .build();
    assert_eq!(
        gone(&found(recreated)).as_deref(),
        Some("its ResourceClaim was deleted and re-created (uid u2 now)")
    );
    let deallocated = ClaimBuilder::new("claim", "u1").build();
    let elsewhere = claim_u1(&[("nic", DRIVER, "dev-b")]);
    for answer in [found(deallocated), found(elsewhere)] {
        assert_eq!(
            gone(&answer).as_deref(),
            Some("its ResourceClaim is no longer allocated the devices knic prepared for it")
        );
    }
    // An outage or a refused read is never "gone".
    assert_eq!(gone(&Answer::Failed("connection refused".into())), None);
}

#[tokio::test]
async fn a_gone_claim_is_withheld_at_once_and_unprepared_after_a_second_answer() {
    let (_dir, _source, _preparer, checkpoint) = one_prepared().await;
    let claim = &checkpoint.claims["u1"];
    let mut reaper = Reaper::new(DRIVER, settings());
    let t0 = Instant::now();
    // Idle since now: not looked up before `idle` has passed.
    assert!(reaper.due(&checkpoint, t0).is_empty());
    assert!(
        reaper
            .due(&checkpoint, t0 + Duration::from_secs(9))
            .is_empty()
    );
    let t1 = t0 + Duration::from_secs(10);
    assert_eq!(reaper.due(&checkpoint, t1), vec![wanted("u1")]);
    let why = "its ResourceClaim no longer exists".to_owned();
    assert_eq!(
        reaper.answer(claim, &Answer::Missing, t1),
        Action::Withhold(why.clone())
    );
    assert_eq!(
        reaper.withheld(&checkpoint),
        BTreeSet::from(["dev-a".to_owned()])
    );
    assert_eq!(reaper.suspects(), 1);
    // Nothing is asked again before the grace; an outage then decides nothing and keeps the
    // device withheld.
    assert!(
        reaper
            .due(&checkpoint, t1 + Duration::from_secs(29))
            .is_empty()
    );
    let t2 = t1 + Duration::from_secs(30);
    assert_eq!(reaper.due(&checkpoint, t2), vec![wanted("u1")]);
    assert_eq!(
        reaper.answer(claim, &Answer::Failed("503".into()), t2),
        Action::Keep
    );
    assert_eq!(reaper.withheld(&checkpoint).len(), 1);
    let t3 = t2 + Duration::from_secs(5);
    assert_eq!(reaper.due(&checkpoint, t3), vec![wanted("u1")]);
    assert_eq!(
        reaper.answer(claim, &Answer::Missing, t3),
        Action::Unprepare(why)
    );
    // Once unprepared (gone from the checkpoint) it is forgotten.
    let empty = Checkpoint::default();
    assert!(reaper.due(&empty, t3).is_empty());
    assert!(reaper.withheld(&checkpoint).is_empty());
    assert_eq!(reaper.suspects(), 0);
}

#[tokio::test]
async fn a_claim_that_comes_back_is_offered_again_and_looked_up_ever_less_often() {
    let (_dir, _source, _preparer, checkpoint) = one_prepared().await;
    let claim = &checkpoint.claims["u1"];
    let live = found(claim_u1(&[("nic", DRIVER, "dev-a")]));
    let mut reaper = Reaper::new(DRIVER, settings());
    let t0 = Instant::now();
    reaper.due(&checkpoint, t0);
    let mut t = t0 + Duration::from_secs(10);
    assert!(matches!(
        reaper.answer(claim, &Answer::Missing, t),
        Action::Withhold(_)
    ));
    t += Duration::from_secs(30);
    assert_eq!(reaper.due(&checkpoint, t).len(), 1);
    assert_eq!(reaper.answer(claim, &live, t), Action::Keep);
    assert!(reaper.withheld(&checkpoint).is_empty());
    // The pause doubles from the period (5 s, after the first answer) up to the cap (60 s).
    let mut pauses = Vec::new();
    for _ in 0..5 {
        let mut waited = 0;
        loop {
            waited += 1;
            t += Duration::from_secs(1);
            if !reaper.due(&checkpoint, t).is_empty() {
                break;
            }
        }
        pauses.push(waited);
        assert_eq!(reaper.answer(claim, &live, t), Action::Keep);
    }
    assert_eq!(pauses, [5, 10, 20, 40, 60]);
}

#[tokio::test]
async fn a_claim_in_a_pod_is_never_looked_up_and_shares_are_not_withheld() {
    let (_dir, _source, _preparer, mut checkpoint) = one_prepared().await;
    let mut reaper = Reaper::new(DRIVER, settings());
    let t0 = Instant::now();
    let mut in_a_pod = checkpoint.clone();
    let claim = in_a_pod.claims.get_mut("u1").unwrap();
    claim.attachments[0].restore = Some(crate::netns::Restore {
        host: crate::netns::LinkState {
            index: 7,
            name: "eth0".into(),
            mtu: 1500,
            mac: None,
            up: true,
            addresses: Vec::new(),
            kind: None,
            permanent_mac: None,
            pci_address: None,
        },
        vf: None,
        ethtool: None,
        sizes: None,
    });
    assert!(in_pod(claim));
    for s in [0, 10, 60, 600] {
        assert!(
            reaper
                .due(&in_a_pod, t0 + Duration::from_secs(s))
                .is_empty()
        );
    }
    // A share of a port: gone, but the port stays offered to its other shares.
    let claim = checkpoint.claims.get_mut("u1").unwrap();
    claim.devices[0].share_id = Some("5e0d7b4e-4c36-4c6e-9f3e-3d1b9d2f6a10".into());
    let claim = claim.clone();
    reaper.due(&checkpoint, t0);
    reaper.due(&checkpoint, t0 + Duration::from_secs(10));
    assert!(matches!(
        reaper.answer(&claim, &Answer::Missing, t0 + Duration::from_secs(10)),
        Action::Withhold(_)
    ));
    assert_eq!(reaper.suspects(), 1);
    assert!(reaper.withheld(&checkpoint).is_empty());
}

#[derive(Default)]
struct Recorded(StdMutex<Vec<Warning>>);

impl EventSink for Recorded {
    fn warn(&self, warning: Warning) {
        self.0.lock().unwrap().push(warning);
    }
}

/// The loop with real time, a real checkpoint and the preparer's own unprepare: the claim is
/// deleted from the "API", its device is withheld, then it is unprepared with an Event on the
/// claim and its pod, and the device is offered again.
#[tokio::test]
async fn the_loop_unprepares_a_deleted_claim() {
    let (_dir, source, preparer, _) = one_prepared().await;
    let preparer = Arc::new(preparer);
    source.claims.lock().unwrap().clear();
    let events = Arc::new(Recorded::default());
    let (withheld_tx, mut withheld) = watch::channel(BTreeSet::new());
    let (stop_tx, stop) = watch::channel(false);
    let settings = OrphanSettings {
        idle: Duration::from_millis(50),
        grace: Duration::from_millis(200),
        period: Duration::from_millis(20),
        max_recheck: Duration::from_secs(1),
    };
    let started = Instant::now();
    let task = tokio::spawn(reap(
        preparer.clone(),
        source.clone(),
        events.clone(),
        settings,
        withheld_tx,
        stop,
    ));
    let held = tokio::time::timeout(Duration::from_secs(5), withheld.wait_for(|w| !w.is_empty()))
        .await
        .expect("withheld in time")
        .unwrap()
        .clone();
    assert_eq!(held, BTreeSet::from(["dev-a".to_owned()]));
    assert!(
        preparer.claims().claim("u1").await.unwrap().is_some(),
        "unprepared before the grace"
    );
    tokio::time::timeout(
        Duration::from_secs(5),
        withheld.wait_for(BTreeSet::is_empty),
    )
    .await
    .expect("offered again in time")
    .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    assert!(preparer.claims().claim("u1").await.unwrap().is_none());
    let warnings = events.0.lock().unwrap().clone();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].reason, "OrphanedClaimUnprepared");
    assert_eq!(
        warnings[0].pod,
        Some(PodRef {
            name: "p".into(),
            uid: "pu".into()
        })
    );
    assert!(
        warnings[0].message.starts_with(
            "knic unprepared claim ns/claim (uid u1) itself: its ResourceClaim no longer exists"
        ),
        "{}",
        warnings[0].message
    );
    stop_tx.send(true).unwrap();
    task.await.unwrap();
}
