//! The CNI result of an ADD, in the shape of the version the runtime asked for: 0.3.1 and
//! 0.4.0 carry `version` on each IP, 1.0.0 dropped it, 1.1.0 added the interface `mtu`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{CniError, SUPPORTED_VERSIONS, code};

/// One attached interface as the driver reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attached {
    /// Its name in the pod.
    pub interface: String,
    /// Its MAC, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Its MTU, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Addresses (`10.0.0.5/24`) with their gateway.
    #[serde(default)]
    pub ips: Vec<Ip>,
    /// Routes the interface got.
    #[serde(default)]
    pub routes: Vec<Route>,
}

/// An address of the interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ip {
    /// CIDR interface form.
    pub address: String,
    /// The subnet's gateway, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

/// A route through the interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Destination CIDR.
    pub dst: String,
    /// Next hop, when not on-link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

/// Refuses a version the plugin does not speak, naming the ones it does.
pub fn check_version(version: &str) -> Result<(), CniError> {
    if SUPPORTED_VERSIONS.contains(&version) {
        return Ok(());
    }
    Err(CniError::new(
        code::INCOMPATIBLE_VERSION,
        format!("cniVersion {version:?} is not supported"),
        format!("knic speaks {}", SUPPORTED_VERSIONS.join(", ")),
    ))
}

/// The result JSON for `version` (already checked) of the interface in `sandbox`.
pub fn render(version: &str, sandbox: &str, a: &Attached) -> Value {
    let legacy = matches!(version, "0.3.1" | "0.4.0");
    let mut interface = Map::new();
    interface.insert("name".into(), json!(a.interface));
    if let Some(mac) = &a.mac {
        interface.insert("mac".into(), json!(mac));
    }
    if version == "1.1.0"
        && let Some(mtu) = a.mtu
    {
        interface.insert("mtu".into(), json!(mtu));
    }
    interface.insert("sandbox".into(), json!(sandbox));
    let ips: Vec<Value> = a
        .ips
        .iter()
        .map(|ip| {
            let mut out = Map::new();
            if legacy {
                let v6 = ip.address.contains(':');
                out.insert("version".into(), json!(if v6 { "6" } else { "4" }));
            }
            out.insert("interface".into(), json!(0));
            out.insert("address".into(), json!(ip.address));
            if let Some(gw) = &ip.gateway {
                out.insert("gateway".into(), json!(gw));
            }
            Value::Object(out)
        })
        .collect();
    let routes: Vec<Value> = a
        .routes
        .iter()
        .map(|r| match &r.gw {
            Some(gw) => json!({"dst": r.dst, "gw": gw}),
            None => json!({"dst": r.dst}),
        })
        .collect();
    json!({
        "cniVersion": version,
        "interfaces": [Value::Object(interface)],
        "ips": ips,
        "routes": routes,
        "dns": {},
    })
}

/// The answer to `VERSION`.
pub fn version_info() -> Value {
    json!({"cniVersion": "1.1.0", "supportedVersions": SUPPORTED_VERSIONS})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blue() -> Attached {
        Attached {
            interface: "net1".into(),
            mac: Some("02:00:00:00:00:01".into()),
            mtu: Some(9000),
            ips: vec![
                Ip {
                    address: "192.0.2.10/24".into(),
                    gateway: Some("192.0.2.1".into()),
                },
                Ip {
                    address: "2001:db8::a/64".into(),
                    gateway: None,
                },
            ],
            routes: vec![
                Route {
                    dst: "198.51.100.0/24".into(),
                    gw: Some("192.0.2.1".into()),
                },
                Route {
                    dst: "2001:db8:1::/48".into(),
                    gw: None,
                },
            ],
        }
    }

    const NS: &str = "/var/run/netns/cni-1";

    #[test]
    fn legacy_versions_carry_ip_versions() {
        for v in ["0.3.1", "0.4.0"] {
            let text = serde_json::to_string(&render(v, NS, &blue())).expect("json");
            assert_eq!(
                text,
                format!(
                    r#"{{"cniVersion":"{v}","dns":{{}},"interfaces":[{{"mac":"02:00:00:00:00:01","name":"net1","sandbox":"/var/run/netns/cni-1"}}],"ips":[{{"address":"192.0.2.10/24","gateway":"192.0.2.1","interface":0,"version":"4"}},{{"address":"2001:db8::a/64","interface":0,"version":"6"}}],"routes":[{{"dst":"198.51.100.0/24","gw":"192.0.2.1"}},{{"dst":"2001:db8:1::/48"}}]}}"#
                )
            );
        }
    }

    #[test]
    fn v1_0_drops_ip_versions_and_has_no_mtu() {
        let text = serde_json::to_string(&render("1.0.0", NS, &blue())).expect("json");
        assert_eq!(
            text,
            r#"{"cniVersion":"1.0.0","dns":{},"interfaces":[{"mac":"02:00:00:00:00:01","name":"net1","sandbox":"/var/run/netns/cni-1"}],"ips":[{"address":"192.0.2.10/24","gateway":"192.0.2.1","interface":0},{"address":"2001:db8::a/64","interface":0}],"routes":[{"dst":"198.51.100.0/24","gw":"192.0.2.1"},{"dst":"2001:db8:1::/48"}]}"#
        );
    }

    #[test]
    fn v1_1_adds_the_interface_mtu() {
        let text = serde_json::to_string(&render("1.1.0", NS, &blue())).expect("json");
        assert_eq!(
            text,
            r#"{"cniVersion":"1.1.0","dns":{},"interfaces":[{"mac":"02:00:00:00:00:01","mtu":9000,"name":"net1","sandbox":"/var/run/netns/cni-1"}],"ips":[{"address":"192.0.2.10/24","gateway":"192.0.2.1","interface":0},{"address":"2001:db8::a/64","interface":0}],"routes":[{"dst":"198.51.100.0/24","gw":"192.0.2.1"},{"dst":"2001:db8:1::/48"}]}"#
        );
    }

    #[test]
    fn no_addresses_no_mac_is_still_a_valid_result() {
        let a = Attached {
            interface: "pod1a2b".into(),
            ..Attached::default()
        };
        assert_eq!(
            render("1.0.0", NS, &a),
            json!({"cniVersion": "1.0.0", "interfaces": [{"name": "pod1a2b", "sandbox": NS}],
                   "ips": [], "routes": [], "dns": {}})
        );
    }

    #[test]
    fn unsupported_versions_are_refused_with_the_list() {
        for v in SUPPORTED_VERSIONS {
            assert_eq!(check_version(v), Ok(()));
        }
        let e = check_version("0.2.0").expect_err("too old");
        assert_eq!(e.code, 1);
        assert_eq!(e.msg, "cniVersion \"0.2.0\" is not supported");
        assert_eq!(e.details, "knic speaks 0.3.1, 0.4.0, 1.0.0, 1.1.0");
    }
}
