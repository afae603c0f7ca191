use super::*;

#[test]
fn exposition_is_exact_and_in_a_stable_order() {
    let registry = Registry::new();
    let requests = registry
        .counter(
            "knic_test_requests_total",
            "Requests by method and result.",
            ["method", "result"],
        )
        .expect("counter");
    let up = registry
        .gauge("knic_test_up", "Whether it is up.", [])
        .expect("gauge");
    let latency = registry
        .histogram(
            "knic_test_latency_seconds",
            "Latency.",
            ["method"],
            &[0.1, 1.0],
        )
        .expect("histogram");
    requests.inc(["Prepare", "success"]);
    requests.inc(["Prepare", "success"]);
    requests.inc(["Prepare", "error"]);
    requests.touch(["Unprepare", "success"]);
    up.set([], 1.0);
    latency.observe(["Prepare"], 0.05);
    latency.observe(["Prepare"], 0.5);
    latency.observe(["Prepare"], 7.25);
    let expected = "\
# HELP knic_test_latency_seconds Latency.
# TYPE knic_test_latency_seconds histogram
knic_test_latency_seconds_bucket{method=\"Prepare\",le=\"0.1\"} 1
knic_test_latency_seconds_bucket{method=\"Prepare\",le=\"1\"} 2
knic_test_latency_seconds_bucket{method=\"Prepare\",le=\"+Inf\"} 3
knic_test_latency_seconds_sum{method=\"Prepare\"} 7.8
knic_test_latency_seconds_count{method=\"Prepare\"} 3
# HELP knic_test_requests_total Requests by method and result.
# TYPE knic_test_requests_total counter
knic_test_requests_total{method=\"Prepare\",result=\"error\"} 1
knic_test_requests_total{method=\"Prepare\",result=\"success\"} 2
knic_test_requests_total{method=\"Unprepare\",result=\"success\"} 0
# HELP knic_test_up Whether it is up.
# TYPE knic_test_up gauge
knic_test_up 1
";
    assert_eq!(registry.render(), expected);
    // Same state, same text.
    assert_eq!(registry.render(), expected);
    assert_eq!(requests.get(["Prepare", "success"]), 2.0);
    assert_eq!(latency.count(["Prepare"]), 3);
}

#[test]
fn label_values_and_help_are_escaped() {
    let registry = Registry::new();
    let c = registry
        .counter(
            "knic_escapes_total",
            "Help with \\ and\nnewline \"quoted\".",
            ["v"],
        )
        .expect("counter");
    c.inc(["a\\b \"c\"\nd"]);
    assert_eq!(
        registry.render(),
        "# HELP knic_escapes_total Help with \\\\ and\\nnewline \"quoted\".\n\
         # TYPE knic_escapes_total counter\n\
         knic_escapes_total{v=\"a\\\\b \\\"c\\\"\\nd\"} 1\n"
    );
}

#[test]
fn families_without_labels_export_zero_and_labelled_ones_only_their_type() {
    let registry = Registry::new();
    registry.counter("knic_a_total", "A.", []).expect("a");
    registry.gauge("knic_b", "B.", ["kind"]).expect("b");
    registry
        .histogram("knic_c_seconds", "C.", [], &[1.0])
        .expect("c");
    assert_eq!(
        registry.render(),
        "# HELP knic_a_total A.\n# TYPE knic_a_total counter\nknic_a_total 0\n\
         # HELP knic_b B.\n# TYPE knic_b gauge\n\
         # HELP knic_c_seconds C.\n# TYPE knic_c_seconds histogram\n\
         knic_c_seconds_bucket{le=\"1\"} 0\nknic_c_seconds_bucket{le=\"+Inf\"} 0\n\
         knic_c_seconds_sum 0\nknic_c_seconds_count 0\n"
    );
}

#[test]
fn gauges_go_both_ways_and_replace_all_drops_vanished_series() {
    let registry = Registry::new();
    let g = registry
        .gauge("knic_devices", "Devices.", ["kind"])
        .expect("gauge");
    g.set(["vf"], 3.0);
    g.add(["vf"], -1.0);
    g.set(["pf"], 1.0);
    assert_eq!(g.get(["vf"]), 2.0);
    g.replace_all([(["veth".to_string()], 4.0)]);
    assert_eq!(
        registry.render(),
        "# HELP knic_devices Devices.\n# TYPE knic_devices gauge\nknic_devices{kind=\"veth\"} 4\n"
    );
}

#[test]
fn counters_ignore_negative_and_non_finite_additions() {
    let registry = Registry::new();
    let c = registry.counter("knic_c_total", "C.", []).expect("counter");
    c.add([], 2.0);
    c.add([], -1.0);
    c.add([], f64::NAN);
    c.add([], f64::INFINITY);
    assert_eq!(c.get([]), 2.0);
    let h = registry
        .histogram("knic_h_seconds", "H.", [], &[1.0])
        .expect("histogram");
    h.observe([], f64::NAN);
    assert_eq!(h.count([]), 0);
}

#[test]
fn special_values_are_spelled_as_prometheus_reads_them() {
    assert_eq!(number(f64::NAN), "NaN");
    assert_eq!(number(f64::INFINITY), "+Inf");
    assert_eq!(number(f64::NEG_INFINITY), "-Inf");
    assert_eq!(number(0.005), "0.005");
    assert_eq!(number(60.0), "60");
}

#[test]
fn bad_names_are_refused_naming_the_rule() {
    let registry = Registry::new();
    let err = |r: Result<Counter<1>>| r.expect_err("must be refused").to_string();
    assert_eq!(
        err(registry.counter("1bad", "x", ["a"])),
        "metric name \"1bad\": must match [a-zA-Z_:][a-zA-Z0-9_:]*"
    );
    assert_eq!(
        err(registry.counter("", "x", ["a"])),
        "metric name \"\": must match [a-zA-Z_:][a-zA-Z0-9_:]*"
    );
    assert_eq!(
        err(registry.counter("knic_x_total", "x", ["a-b"])),
        "metric knic_x_total: label name \"a-b\": must match [a-zA-Z_][a-zA-Z0-9_]*"
    );
    assert_eq!(
        err(registry.counter("knic_x_total", "x", ["__name"])),
        "metric knic_x_total: label name \"__name\": names starting with \"__\" are reserved"
    );
    assert_eq!(
        registry
            .counter("knic_x_total", "x", ["a", "a"])
            .expect_err("twice")
            .to_string(),
        "metric knic_x_total: label name \"a\" is given twice"
    );
    assert_eq!(
        registry
            .histogram("knic_h_seconds", "x", ["le"], &[1.0])
            .expect_err("le")
            .to_string(),
        "metric knic_h_seconds: label name \"le\": reserved for histogram buckets"
    );
    assert_eq!(
        registry
            .histogram("knic_h_seconds", "x", [], &[1.0, 1.0])
            .expect_err("buckets")
            .to_string(),
        "metric knic_h_seconds: buckets must be finite, strictly increasing and at least one"
    );
    registry
        .counter("knic_once_total", "x", ["a"])
        .expect("first");
    assert_eq!(
        err(registry.counter("knic_once_total", "x", ["a"])),
        "metric knic_once_total: registered twice"
    );
}

#[test]
fn readiness_names_what_is_missing_in_declaration_order() {
    let ready = Readiness::new(&["slices published", "kubelet registered", "NRI connected"]);
    assert_eq!(
        ready.report(),
        (
            false,
            "not ready: slices published, kubelet registered, NRI connected\n".into()
        )
    );
    ready.set("kubelet registered", true);
    ready.set("no such condition", true);
    assert_eq!(
        ready.report(),
        (false, "not ready: slices published, NRI connected\n".into())
    );
    ready.set("slices published", true);
    ready.set("NRI connected", true);
    assert_eq!(ready.report(), (true, "ok\n".into()));
    ready.set("NRI connected", false);
    assert_eq!(ready.missing(), vec!["NRI connected".to_string()]);
}

#[test]
fn endpoints_answer_metrics_health_and_readiness() {
    let registry = Registry::new();
    registry.gauge("knic_up", "Up.", []).expect("gauge");
    let health = Health::new(&["leader or standby"], std::time::Duration::from_secs(30));
    let metrics = answer("GET", "/metrics", &registry, &health);
    assert_eq!(metrics.status, 200);
    assert_eq!(
        metrics.content_type,
        "text/plain; version=0.0.4; charset=utf-8"
    );
    assert_eq!(
        metrics.body,
        "# HELP knic_up Up.\n# TYPE knic_up gauge\nknic_up 0\n"
    );
    assert_eq!(
        answer("GET", "/readyz", &registry, &health),
        Answer {
            status: 503,
            content_type: "text/plain; charset=utf-8",
            body: "not ready: leader or standby\n".into()
        }
    );
    health.readiness.set("leader or standby", true);
    let ready = answer("HEAD", "/readyz", &registry, &health);
    assert_eq!((ready.status, ready.body.as_str()), (200, "ok\n"));
    let live = answer("GET", "/healthz", &registry, &health);
    assert_eq!((live.status, live.body.as_str()), (200, "ok\n"));
    let posted = answer("POST", "/metrics", &registry, &health);
    assert_eq!(
        (posted.status, posted.body.as_str()),
        (405, "method POST not allowed: use GET\n")
    );
    let unknown = answer("GET", "/", &registry, &health);
    assert_eq!(
        (unknown.status, unknown.body.as_str()),
        (404, "not found: / (try /metrics, /healthz, /readyz)\n")
    );
}

#[test]
fn healthz_fails_once_the_heartbeat_is_older_than_the_limit() {
    let registry = Registry::new();
    let health = Health::new(&[], std::time::Duration::ZERO);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let live = answer("GET", "/healthz", &registry, &health);
    assert_eq!(
        (live.status, live.body.as_str()),
        (503, "event loop stalled: no heartbeat for 1s (limit 0s)\n")
    );
    health.heartbeat.beat();
    let health = Health {
        stall_after: std::time::Duration::from_secs(5),
        ..health
    };
    assert_eq!(answer("GET", "/healthz", &registry, &health).status, 200);
    // No condition: always ready.
    assert_eq!(answer("GET", "/readyz", &registry, &health).status, 200);
}

#[test]
fn listen_addresses_are_checked_and_empty_disables() {
    assert_eq!(listen_address(""), Ok(None));
    assert_eq!(
        listen_address("0.0.0.0:9461"),
        Ok(Some("0.0.0.0:9461".parse().expect("address")))
    );
    assert_eq!(
        listen_address("[::]:9462"),
        Ok(Some("[::]:9462".parse().expect("address")))
    );
    for bad in ["9461", "localhost:9461", "0.0.0.0", "0.0.0.0:99999"] {
        assert_eq!(
            listen_address(bad).expect_err(bad).to_string(),
            format!(
                "{bad:?} is not an address:port to listen on (such as 0.0.0.0:9461 or \
                 [::]:9461); the empty string disables the server"
            )
        );
    }
}
