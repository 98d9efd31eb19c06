//! Where agents reach the principal when a GitOpsCluster does not say: discovered from the
//! principal's Service as upstream argocd-pull-integration does — its LoadBalancer ingress
//! (hostname or IP) and service port, else, for a `NodePort` Service, a node's `InternalIP` and
//! the node port — and which of a GitOpsCluster's endpoint fields to write back into its spec.
//!
//! Owns the pure choice ([`endpoint_from_service`], [`endpoint_for`], [`write_back`]) and the two
//! reads it needs (the Service, by the name `--operator-principal-service` gives; the nodes, only
//! for a `NodePort` Service without ingress).

use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams};

use super::crd::GitOpsCluster;

/// Port agents dial when nothing names one (upstream's default).
pub const DEFAULT_PRINCIPAL_PORT: u16 = 443;

/// The principal endpoint found on its Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredEndpoint {
    /// Host name or IP address.
    pub address: String,
    /// Port.
    pub port: u16,
}

/// A port upstream treats as the principal's TLS port: named `https`, or 443/8443.
fn is_tls_port(port: &k8s_openapi::api::core::v1::ServicePort) -> bool {
    port.name.as_deref() == Some("https") || port.port == 443 || port.port == 8443
}

/// The endpoint a Service offers to agents outside the hub: its LoadBalancer ingress with the
/// TLS service port, else (type `NodePort`) `node_ip` with the TLS port's node port (or the first
/// node port). `Err` says why there is none.
pub fn endpoint_from_service(
    service: &Service,
    node_ip: Option<&str>,
) -> Result<DiscoveredEndpoint, String> {
    let spec = service.spec.clone().unwrap_or_default();
    let ports = spec.ports.unwrap_or_default();
    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .find_map(|i| {
            i.hostname
                .clone()
                .filter(|h| !h.is_empty())
                .or_else(|| i.ip.clone().filter(|ip| !ip.is_empty()))
        });
    if let Some(address) = ingress {
        let port = ports
            .iter()
            .find(|p| is_tls_port(p))
            .and_then(|p| u16::try_from(p.port).ok())
            .unwrap_or(DEFAULT_PRINCIPAL_PORT);
        return Ok(DiscoveredEndpoint { address, port });
    }
    let name = service.metadata.name.as_deref().unwrap_or_default();
    let type_ = spec.type_.unwrap_or_else(|| "ClusterIP".into());
    if type_ != "NodePort" {
        return Err(format!(
            "service {name} has no LoadBalancer ingress and is of type {type_} (LoadBalancer or NodePort needed)"
        ));
    }
    let Some(node_ip) = node_ip else {
        return Err(format!(
            "service {name} is a NodePort service but no node reports an InternalIP"
        ));
    };
    let node_port = ports
        .iter()
        .filter(|p| p.node_port.is_some_and(|n| n != 0))
        .find(|p| is_tls_port(p))
        .or_else(|| ports.iter().find(|p| p.node_port.is_some_and(|n| n != 0)))
        .and_then(|p| p.node_port)
        .and_then(|n| u16::try_from(n).ok());
    match node_port {
        Some(port) => Ok(DiscoveredEndpoint {
            address: node_ip.to_owned(),
            port,
        }),
        None => Err(format!("NodePort service {name} has no node port assigned")),
    }
}

/// The first `InternalIP` any node reports.
fn node_internal_ip(nodes: &[Node]) -> Option<String> {
    nodes
        .iter()
        .flat_map(|n| n.status.iter().flat_map(|s| s.addresses.iter().flatten()))
        .find(|a| a.type_ == "InternalIP" && !a.address.is_empty())
        .map(|a| a.address.clone())
}

/// Discovers the principal endpoint from Service `service` in `namespace`. The outer error is an
/// API failure; the inner one says why the Service offers no endpoint.
pub async fn discover_principal_endpoint(
    client: &kube::Client,
    namespace: &str,
    service: &str,
) -> Result<Result<DiscoveredEndpoint, String>, kube::Error> {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let Some(service) = services.get_opt(service).await? else {
        return Ok(Err(format!(
            "service {namespace}/{service} not found (the principal's Service is named by \
             --operator-principal-service)"
        )));
    };
    let first = endpoint_from_service(&service, None);
    let is_node_port = service.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("NodePort");
    if first.is_ok() || !is_node_port {
        return Ok(first);
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let listed = nodes.list(&ListParams::default()).await?;
    Ok(endpoint_from_service(
        &service,
        node_internal_ip(&listed.items).as_deref(),
    ))
}

/// The principal endpoint a GitOpsCluster's agents dial: each field from its spec, else the
/// operator's flags, else discovery. `Err` says what to set.
pub fn endpoint_for(
    goc: &GitOpsCluster,
    flag_address: Option<&str>,
    flag_port: Option<u16>,
    discovered: &Result<DiscoveredEndpoint, String>,
) -> Result<(String, u16), String> {
    let addon = &goc.spec.argocd_agent_addon;
    let found = discovered.as_ref().ok();
    let address = addon
        .principal_server_address
        .clone()
        .filter(|a| !a.is_empty())
        .or_else(|| flag_address.map(str::to_owned))
        .or_else(|| found.map(|d| d.address.clone()))
        .ok_or_else(|| {
            format!(
                "principal address unknown: set spec.argoCDAgentAddon.principalServerAddress (or the principal's --operator-principal-address); discovery: {}",
                discovered.as_ref().err().map(String::as_str).unwrap_or("no address")
            )
        })?;
    let port = match addon
        .principal_server_port
        .as_deref()
        .filter(|p| !p.is_empty())
    {
        Some(p) => match p.parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => {
                return Err(format!(
                    "spec.argoCDAgentAddon.principalServerPort {p:?} is not a port number"
                ))
            }
        },
        None => flag_port
            .or_else(|| found.map(|d| d.port))
            .unwrap_or(DEFAULT_PRINCIPAL_PORT),
    };
    Ok((address, port))
}

/// The spec fields to write back (as upstream, the discovered values are recorded in the
/// GitOpsCluster): `principalServerAddress` and/or `principalServerPort` where the spec has none
/// and discovery supplied the value (a value from the operator's flags is not frozen into specs).
pub fn write_back(
    goc: &GitOpsCluster,
    flag_address: Option<&str>,
    flag_port: Option<u16>,
    discovered: &Result<DiscoveredEndpoint, String>,
) -> Option<serde_json::Value> {
    let found = discovered.as_ref().ok()?;
    let addon = &goc.spec.argocd_agent_addon;
    let empty = |v: &Option<String>| v.as_deref().is_none_or(str::is_empty);
    let mut fields = serde_json::Map::new();
    if empty(&addon.principal_server_address) && flag_address.is_none() {
        fields.insert(
            "principalServerAddress".into(),
            found.address.clone().into(),
        );
    }
    if empty(&addon.principal_server_port) && flag_port.is_none() {
        fields.insert("principalServerPort".into(), found.port.to_string().into());
    }
    (!fields.is_empty()).then(|| serde_json::json!({"spec": {"argoCDAgentAddon": fields}}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    fn goc(addon: serde_json::Value) -> GitOpsCluster {
        serde_json::from_value(json!({
            "apiVersion": "apps.open-cluster-management.io/v1alpha1", "kind": "GitOpsCluster",
            "metadata": {"name": "g", "namespace": "argocd"},
            "spec": {"placementRef": {"kind": "Placement", "name": "all"}, "argoCDAgentAddon": addon}
        }))
        .unwrap()
    }

    #[test]
    fn load_balancer_ingress_and_its_tls_port_win() {
        let svc = service(json!({
            "metadata": {"name": "argocd-agent-principal"},
            "spec": {"type": "LoadBalancer", "ports": [
                {"name": "metrics", "port": 8000},
                {"name": "https", "port": 8443, "nodePort": 31443}
            ]},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}
        }));
        assert_eq!(
            endpoint_from_service(&svc, Some("10.0.0.1")),
            Ok(DiscoveredEndpoint {
                address: "203.0.113.7".into(),
                port: 8443
            })
        );
        let hostname = service(json!({
            "spec": {"type": "LoadBalancer", "ports": [{"port": 9999}]},
            "status": {"loadBalancer": {"ingress": [{"hostname": "lb.example.com", "ip": "203.0.113.7"}]}}
        }));
        assert_eq!(
            endpoint_from_service(&hostname, None),
            Ok(DiscoveredEndpoint {
                address: "lb.example.com".into(),
                port: 443
            }),
            "hostname first; no TLS port: upstream's default 443"
        );
    }

    #[test]
    fn node_port_service_uses_a_node_internal_ip_and_the_node_port() {
        let svc = service(json!({
            "metadata": {"name": "argocd-agent-principal"},
            "spec": {"type": "NodePort", "ports": [
                {"name": "metrics", "port": 8000, "nodePort": 30800},
                {"name": "https", "port": 443, "nodePort": 30443}
            ]}
        }));
        assert_eq!(
            endpoint_from_service(&svc, Some("10.0.0.5")),
            Ok(DiscoveredEndpoint {
                address: "10.0.0.5".into(),
                port: 30443
            })
        );
        let unnamed = service(
            json!({"spec": {"type": "NodePort", "ports": [{"port": 9000, "nodePort": 30900}]}}),
        );
        assert_eq!(
            endpoint_from_service(&unnamed, Some("10.0.0.5"))
                .unwrap()
                .port,
            30900
        );
        let err = endpoint_from_service(&svc, None).unwrap_err();
        assert!(err.contains("no node reports an InternalIP"), "{err}");
        let cluster_ip = service(json!({"metadata": {"name": "p"}, "spec": {"type": "ClusterIP"}}));
        let err = endpoint_from_service(&cluster_ip, Some("10.0.0.5")).unwrap_err();
        assert!(err.contains("type ClusterIP"), "{err}");
        let nodes: Vec<Node> = serde_json::from_value(json!([
            {"metadata": {"name": "a"}, "status": {"addresses": [{"type": "Hostname", "address": "a"}]}},
            {"metadata": {"name": "b"}, "status": {"addresses": [{"type": "ExternalIP", "address": "198.51.100.1"}, {"type": "InternalIP", "address": "10.0.0.9"}]}}
        ]))
        .unwrap();
        assert_eq!(node_internal_ip(&nodes).as_deref(), Some("10.0.0.9"));
    }

    #[test]
    fn spec_then_flags_then_discovery_and_only_discovered_values_are_written_back() {
        let found = Ok(DiscoveredEndpoint {
            address: "10.0.0.5".into(),
            port: 30443,
        });
        let empty = goc(json!({}));
        assert_eq!(
            endpoint_for(&empty, None, None, &found),
            Ok(("10.0.0.5".into(), 30443))
        );
        assert_eq!(
            write_back(&empty, None, None, &found),
            Some(
                json!({"spec": {"argoCDAgentAddon": {"principalServerAddress": "10.0.0.5", "principalServerPort": "30443"}}})
            )
        );
        let with_address = goc(json!({"principalServerAddress": "principal.example.com"}));
        assert_eq!(
            endpoint_for(&with_address, None, None, &found),
            Ok(("principal.example.com".into(), 30443))
        );
        assert_eq!(
            write_back(&with_address, None, None, &found),
            Some(json!({"spec": {"argoCDAgentAddon": {"principalServerPort": "30443"}}}))
        );
        assert_eq!(
            endpoint_for(&empty, Some("flag.example.com"), Some(8443), &found),
            Ok(("flag.example.com".into(), 8443))
        );
        assert_eq!(
            write_back(&empty, Some("flag.example.com"), Some(8443), &found),
            None
        );
        let complete = goc(json!({"principalServerAddress": "p", "principalServerPort": "443"}));
        assert_eq!(write_back(&complete, None, None, &found), None);
        let missing = Err("service argocd/argocd-agent-principal not found".to_string());
        let err = endpoint_for(&empty, None, None, &missing).unwrap_err();
        assert!(err.contains("not found"), "{err}");
        let bad_port = goc(json!({"principalServerAddress": "p", "principalServerPort": "https"}));
        assert!(endpoint_for(&bad_port, None, None, &found)
            .unwrap_err()
            .contains("not a port number"));
    }
}
