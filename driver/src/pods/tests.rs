// Attach, rollback, crash resume and Synchronize against the fake kernel: the hooks' logic
// without root (the e2e tests repeat the important paths in real namespaces).

mod hooks {
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex as StdMutex};

    use knic_proto::netconfig::Cidr;

    use super::super::*;
    use crate::claims::checkpoint::{Attachment, CheckpointStore};
    use crate::netns::fake::{FakeKernel, plan};

    const POD_UID: &str = "pod-uid";

    fn cidr(s: &str) -> Cidr {
        s.parse().expect("cidr")
    }

    fn netns_path() -> PathBuf {
        PathBuf::from("/var/run/netns/cni-1")
    }

    fn pod_ns() -> Ns {
        Ns::Pod(netns_path())
    }

    #[derive(Default)]
    struct Recorder(StdMutex<Vec<(String, Vec<DeviceStatus>)>>);

    impl StatusSink for Recorder {
        fn write<'a>(
            &'a self,
            claim: &'a PreparedClaim,
            devices: &'a [DeviceStatus],
        ) -> crate::BoxFuture<'a, Result<()>> {
            Box::pin(async move {
                if let Ok(mut seen) = self.0.lock() {
                    seen.push((claim.name.clone(), devices.to_vec()));
                }
                Ok(())
            })
        }
    }

    impl Recorder {
        /// Status writes happen after the hook answered: wait for `n` of them.
        async fn wait_for(&self, n: usize) -> Vec<(String, Vec<DeviceStatus>)> {
            for _ in 0..200 {
                let seen = self.0.lock().map(|s| s.clone()).unwrap_or_default();
                if seen.len() >= n {
                    return seen;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("fewer than {n} status writes");
        }
    }

    struct Setup {
        kernel: FakeKernel,
        claims: Arc<ClaimStore>,
        pods: Arc<PodNetworks<FakeKernel>>,
        status: Arc<Recorder>,
        _dir: tempfile::TempDir,
    }

    /// Two host devices prepared for one pod in one claim.
    async fn setup() -> Setup {
        setup_with(|_| ()).await
    }

    /// [`setup`], with the two plans changed by `adjust` first.
    async fn setup_with(adjust: impl FnOnce(&mut [netns::AttachPlan])) -> Setup {
        let kernel = FakeKernel::new();
        for (name, mac) in [("ens1f0v0", 1), ("ens1f0v1", 2)] {
            kernel.add_link(
                &Ns::Host,
                name,
                1500,
                [0xaa, 0, 0, 0, 0, mac],
                None,
                &[cidr("198.51.100.5/24")],
            );
        }
        kernel.add_namespace(&pod_ns());
        let dir = tempfile::tempdir().expect("tempdir");
        let claims = Arc::new(ClaimStore::open(CheckpointStore::new(dir.path())));
        let claim = PreparedClaim {
            network_label: None,
            namespace: "ns".into(),
            name: "c".into(),
            uid: "claim-uid".into(),
            pod_uid: POD_UID.into(),
            pod_name: "pod".into(),
            devices: vec![],
            configs: vec![],
            prepared_at: 0,
            attachments: {
                let mut plans = [
                    plan("dev-0", "ens1f0v0", "net1", &["192.0.2.10/24"]),
                    plan("dev-1", "ens1f0v1", "net2", &["192.0.2.11/24"]),
                ];
                adjust(&mut plans);
                plans.into_iter().map(Attachment::planned).collect()
            },
            allocations: vec![],
            functions: vec![],
        };
        {
            let mut locked = claims.lock().await;
            let mut next = locked.checkpoint().expect("checkpoint").clone();
            next.claims.insert(claim.uid.clone(), claim);
            locked.save(next, true).await.expect("save");
        }
        let status = Arc::new(Recorder::default());
        let pods = PodNetworks::new(kernel.clone(), claims.clone(), status.clone());
        Setup {
            kernel,
            claims,
            pods,
            status,
            _dir: dir,
        }
    }

    fn names(kernel: &FakeKernel, ns: &Ns) -> Vec<String> {
        let mut names: Vec<String> = kernel.links(ns).into_iter().map(|l| l.name).collect();
        names.sort();
        names
    }

    fn sandbox(netns: Option<PathBuf>) -> PodSandbox {
        PodSandbox {
            id: "sandbox".into(),
            name: "pod".into(),
            uid: POD_UID.into(),
            namespace: "ns".into(),
            netns,
            ips: vec![],
        }
    }

    async fn attachments(claims: &ClaimStore) -> Vec<Attachment> {
        claims
            .claim("claim-uid")
            .await
            .expect("store")
            .expect("claim")
            .attachments
    }

    #[tokio::test]
    async fn attach_records_the_host_state_then_configures_every_device() {
        let s = setup().await;
        s.pods
            .run_pod_sandbox(sandbox(Some(netns_path())))
            .await
            .expect("attach");
        assert_eq!(names(&s.kernel, &pod_ns()), ["net1", "net2"]);
        for a in attachments(&s.claims).await {
            assert!(a.attached && a.netns == Some(netns_path()), "{a:?}");
            let restore = a.restore.expect("host state recorded");
            assert_eq!(restore.host.addresses, [cidr("198.51.100.5/24")]);
        }
        let seen = s.status.wait_for(1).await;
        let ready: Vec<(bool, &str)> = seen[0]
            .1
            .iter()
            .map(|d| (d.ready, d.reason.as_str()))
            .collect();
        assert_eq!(
            ready,
            [(true, "InterfaceConfigured"), (true, "InterfaceConfigured")]
        );
        assert_eq!(seen[0].1[1].ips, ["192.0.2.11/24"]);

        // Stop puts both back exactly, and the records go.
        s.pods
            .stop_pod_sandbox(sandbox(Some(netns_path())))
            .await
            .expect("detach");
        assert_eq!(names(&s.kernel, &Ns::Host), ["ens1f0v0", "ens1f0v1"]);
        assert!(
            s.kernel
                .links(&Ns::Host)
                .iter()
                .all(|l| l.addresses == [cidr("198.51.100.5/24")])
        );
        assert!(
            attachments(&s.claims)
                .await
                .iter()
                .all(|a| a.restore.is_none() && !a.attached)
        );
    }

    #[tokio::test]
    async fn the_claim_status_reports_the_enforced_egress_limit() {
        let s = setup_with(|plans| {
            // Not a multiple of 8: the kernel enforces whole bytes, and the status says so.
            plans[0].bandwidth = Some(knic_proto::netconfig::Bandwidth {
                egress: 1_000_000_007,
                burst: None,
            });
        })
        .await;
        s.pods
            .run_pod_sandbox(sandbox(Some(netns_path())))
            .await
            .expect("attach");
        assert_eq!(
            s.kernel.egress_limit(&pod_ns(), "net1").map(|t| t.rate),
            Some(125_000_000)
        );
        assert_eq!(s.kernel.egress_limit(&pod_ns(), "net2"), None);
        let seen = s.status.wait_for(1).await;
        let data: Vec<Option<serde_json::Value>> =
            seen[0].1.iter().map(|d| d.data.clone()).collect();
        assert_eq!(
            data,
            [
                Some(serde_json::json!({"bandwidth": {"egress": "1000000000"}})),
                None
            ]
        );
        // As written to the API.
        let claim = s
            .claims
            .claim("claim-uid")
            .await
            .expect("store")
            .expect("claim");
        let patch = crate::api::status::status_patch(&claim, &seen[0].1, "now");
        assert_eq!(
            patch["status"]["devices"][0]["data"],
            serde_json::json!({"bandwidth": {"egress": "1000000000"}})
        );
        assert!(patch["status"]["devices"][1].get("data").is_none());
    }

    #[test]
    fn a_pci_functions_data_is_kept_next_to_the_limit() {
        let claim: PreparedClaim = serde_json::from_value(serde_json::json!({
            "namespace": "ns", "name": "c", "uid": "u", "podUid": "p", "podName": "pod",
            "devices": [], "configs": [], "preparedAt": 0,
            "functions": [{"device": "dev-0", "request": "nic", "pciAddress": "0000:3b:00.2"}],
        }))
        .expect("claim");
        let mut p = plan("dev-0", "ens1f0v0", "net1", &[]);
        assert_eq!(
            attached_data(&claim, &p),
            Some(serde_json::json!({"pciAddress": "0000:3b:00.2", "deviceMode": "netdev"}))
        );
        p.bandwidth = Some(knic_proto::netconfig::Bandwidth {
            egress: 2_000_000_000,
            burst: Some(65_536),
        });
        assert_eq!(
            attached_data(&claim, &p),
            Some(
                serde_json::json!({"pciAddress": "0000:3b:00.2", "deviceMode": "netdev",
                                    "bandwidth": {"egress": "2000000000"}})
            )
        );
    }

    #[tokio::test]
    async fn a_failed_device_undoes_the_whole_pod_and_says_why() {
        let s = setup().await;
        s.kernel.fail_on(
            "/var/run/netns/cni-1: addr add 192.0.2.11/24",
            "File exists",
        );
        let err = s
            .pods
            .run_pod_sandbox(sandbox(Some(netns_path())))
            .await
            .expect_err("the second device fails")
            .to_string();
        assert!(
            err.starts_with("ResourceClaim ns/c: device node-a/dev-1: ")
                && err.contains("File exists"),
            "{err}"
        );
        assert!(
            s.kernel.links(&pod_ns()).is_empty(),
            "nothing stays in the pod"
        );
        assert_eq!(names(&s.kernel, &Ns::Host), ["ens1f0v0", "ens1f0v1"]);
        assert!(
            attachments(&s.claims)
                .await
                .iter()
                .all(|a| a.restore.is_none() && !a.attached)
        );
        let seen = s.status.wait_for(1).await;
        assert_eq!(seen[0].1[0].reason, "AttachFailed");
        assert!(!seen[0].1[0].ready);
    }

    #[tokio::test]
    async fn another_device_under_a_prepared_name_is_refused_and_the_claim_says_so() {
        let s = setup().await;
        // ens1f0v1 was published with MAC aa:…:02; what carries the name now is another device.
        s.claims
            .update("claim-uid", |c| {
                c.attachments[1].plan.identity = Some(crate::netns::DeviceIdentity::Mac {
                    address: [0xaa, 0, 0, 0, 0, 7],
                });
            })
            .await
            .expect("update");
        let err = s
            .pods
            .run_pod_sandbox(sandbox(Some(netns_path())))
            .await
            .expect_err("the impostor is refused")
            .to_string();
        assert_eq!(
            err,
            "ResourceClaim ns/c: device node-a/dev-1: interface ens1f0v1 is MAC \
             aa:00:00:00:00:02, but the device was prepared as MAC aa:00:00:00:00:07; refusing \
             to move it into the pod"
        );
        assert!(s.kernel.links(&pod_ns()).is_empty(), "nothing in the pod");
        assert_eq!(names(&s.kernel, &Ns::Host), ["ens1f0v0", "ens1f0v1"]);
        let seen = s.status.wait_for(1).await;
        assert_eq!(seen[0].1[0].reason, "DeviceMismatch");
        assert_eq!(seen[0].1[0].device, "dev-1");
        assert!(!seen[0].1[0].ready);
    }

    #[derive(Default)]
    struct Warnings(StdMutex<Vec<crate::events::Warning>>);

    impl crate::events::EventSink for Warnings {
        fn warn(&self, warning: crate::events::Warning) {
            self.0.lock().expect("warnings").push(warning);
        }
    }

    #[tokio::test]
    async fn attach_failures_and_refusals_are_events_on_the_claim_and_the_pod() {
        let s = setup().await;
        let warnings = Arc::new(Warnings::default());
        s.pods.set_events(warnings.clone());
        // Shared with tests running in parallel: only ever more.
        let failed_before = crate::metrics::metrics().attaches.get(["error"]);
        s.claims
            .update("claim-uid", |c| {
                c.attachments[1].plan.identity = Some(crate::netns::DeviceIdentity::Mac {
                    address: [0xaa, 0, 0, 0, 0, 7],
                });
            })
            .await
            .expect("update");
        s.pods
            .run_pod_sandbox(sandbox(Some(netns_path())))
            .await
            .expect_err("the impostor is refused");
        let seen = s.status.wait_for(1).await;
        let claim = crate::claims::ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "claim-uid".into(),
        };
        let pod = Some(crate::events::PodRef {
            name: "pod".into(),
            uid: POD_UID.into(),
        });
        assert_eq!(
            warnings.0.lock().expect("warnings").clone(),
            vec![crate::events::Warning {
                claim: claim.clone(),
                pod: pod.clone(),
                action: "AttachInterfaces",
                reason: "DeviceMismatch",
                // The claim condition's text, word for word.
                message: seen[0].1[0].message.clone(),
            }]
        );
        assert!(crate::metrics::metrics().attaches.get(["error"]) >= failed_before + 1.0);
        warnings.0.lock().expect("warnings").clear();
        s.pods
            .run_pod_sandbox(sandbox(None))
            .await
            .expect_err("no namespace");
        assert_eq!(
            warnings.0.lock().expect("warnings").clone(),
            vec![crate::events::Warning {
                claim,
                pod,
                action: "AttachInterfaces",
                reason: "NoNetworkNamespace",
                message: "pod ns/pod has knic claims but no network namespace (hostNetwork \
                          pods cannot get interfaces)"
                    .into(),
            }]
        );
    }

    #[tokio::test]
    async fn synchronize_resumes_a_cut_short_attach_of_a_running_pod() {
        let s = setup().await;
        // A crash right after the host state was recorded, before the move.
        let restore = crate::netns::capture(&s.kernel, &attachments(&s.claims).await[0].plan)
            .await
            .expect("capture");
        s.claims
            .update("claim-uid", |c| {
                c.attachments[0].restore = Some(restore);
                c.attachments[0].netns = Some(netns_path());
            })
            .await
            .expect("record");
        s.pods.synchronize(vec![sandbox(Some(netns_path()))]).await;
        assert_eq!(names(&s.kernel, &pod_ns()), ["net1", "net2"]);
        assert!(attachments(&s.claims).await.iter().all(|a| a.attached));
    }

    #[tokio::test]
    async fn synchronize_attaches_a_running_pod_whose_start_knic_missed() {
        let s = setup().await;
        // The sandbox started while knic was disconnected: no RunPodSandbox ever arrived.
        s.pods.synchronize(vec![sandbox(Some(netns_path()))]).await;
        assert_eq!(names(&s.kernel, &pod_ns()), ["net1", "net2"]);
        assert!(attachments(&s.claims).await.iter().all(|a| a.attached));
        // A second Synchronize changes nothing.
        let moves = s.kernel.log().len();
        s.pods.synchronize(vec![sandbox(Some(netns_path()))]).await;
        assert_eq!(s.kernel.log().len(), moves);
    }

    #[tokio::test]
    async fn synchronize_returns_the_devices_of_a_pod_that_is_gone() {
        let s = setup().await;
        s.pods
            .run_pod_sandbox(sandbox(Some(netns_path())))
            .await
            .expect("attach");
        // The runtime restarted without the pod; its namespace died and the kernel handed the
        // physical devices back, down and without addresses.
        s.kernel.delete_namespace(&pod_ns());
        s.pods.synchronize(vec![]).await;
        let host = s.kernel.links(&Ns::Host);
        assert_eq!(names(&s.kernel, &Ns::Host), ["ens1f0v0", "ens1f0v1"]);
        assert!(
            host.iter()
                .all(|l| l.up && l.addresses == [cidr("198.51.100.5/24")]),
            "{host:?}"
        );
        assert!(
            attachments(&s.claims)
                .await
                .iter()
                .all(|a| a.restore.is_none())
        );
    }

    #[tokio::test]
    async fn release_at_unprepare_puts_devices_back_without_touching_the_store() {
        let s = setup().await;
        s.pods
            .run_pod_sandbox(sandbox(Some(netns_path())))
            .await
            .expect("attach");
        let claim = s
            .claims
            .claim("claim-uid")
            .await
            .expect("store")
            .expect("claim");
        let now = s.claims.snapshot().await.expect("snapshot");
        s.pods.release(&claim, &now).await.expect("release");
        assert_eq!(names(&s.kernel, &Ns::Host), ["ens1f0v0", "ens1f0v1"]);
        // The preparer forgets the claim next; the store is its to change, under its lock.
        assert!(
            attachments(&s.claims)
                .await
                .iter()
                .all(|a| a.restore.is_some())
        );
    }
}
