//! Fuzzes the resource proxy's request parsing on arbitrary path+query strings: the URI as
//! hyper would accept it, [`parse_api_path`], [`parse_query`], and the request payloads built
//! from them ([`resource_request`], [`ContainerLogRequest::from_params`]).
//! Oracles: nothing panics, and every path segment that reaches the agent (group, version,
//! resource, namespace, name, subresource, pod) is a plain segment — never empty where it
//! names something, never `.`/`..`, never holding `/`, `%`, `?` or `#` — so a request cannot
//! address anything but the object its path names.
#![no_main]

use argocd_agent_principal::resource_proxy::route::{
    parse_api_path, parse_query, resource_request, ApiRoute,
};
use argocd_agent_proto::payload::ContainerLogRequest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Exactly what the proxy reads: the request target as hyper parses it.
    if let Ok(uri) = text.parse::<http::Uri>() {
        check(uri.path(), uri.query());
    }
    // And the raw split, for inputs hyper would refuse (defence in depth).
    let (path, query) = match text.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (text, None),
    };
    check(path, query);
});

fn plain(segment: &str) -> bool {
    segment != "." && segment != ".." && !segment.contains(['/', '%', '?', '#', '\0'])
}

fn check(path: &str, query: Option<&str>) {
    let params = parse_query(query);
    let Some(route) = parse_api_path(path) else {
        return;
    };
    match &route {
        ApiRoute::Discovery(p) => assert!(p.starts_with('/'), "{path:?} → {route:?}"),
        ApiRoute::Resource {
            group,
            version,
            resource,
            namespace,
            name,
            subresource,
        } => {
            assert!(
                !version.is_empty() && !resource.is_empty(),
                "{path:?} → {route:?}"
            );
            for s in [group, version, resource, namespace, name, subresource] {
                assert!(s.is_empty() || plain(s), "{path:?} → {route:?}");
            }
        }
        ApiRoute::ContainerLog { namespace, pod } => {
            assert!(
                !namespace.is_empty() && !pod.is_empty(),
                "{path:?} → {route:?}"
            );
            assert!(plain(namespace) && plain(pod), "{path:?} → {route:?}");
            let log = ContainerLogRequest::from_params("uuid", namespace, pod, &params);
            let _ = serde_json::to_vec(&log).expect("a log request serialises");
            return;
        }
        ApiRoute::Exec { namespace, pod } => {
            assert!(
                !namespace.is_empty() && !pod.is_empty(),
                "{path:?} → {route:?}"
            );
            assert!(plain(namespace) && plain(pod), "{path:?} → {route:?}");
            return;
        }
    }
    let req = resource_request("uuid", "GET", &route, params, Vec::new());
    let _ = (req.is_valid(), req.is_list(), req.is_cluster_scoped());
    let _ = serde_json::to_vec(&req).expect("a resource request serialises");
}
