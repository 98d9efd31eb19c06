//! What a Kubernetes API path asks for: discovery, `/version`, an object or a list (with its
//! subresource), a container's logs, or an exec into a container. Pure parsing, no I/O.

use std::collections::BTreeMap;

use argocd_agent_proto::payload::ResourceRequest;
use percent_encoding::percent_decode_str;

/// Query parameter our agent reads the discovery path from (discovery requests carry no
/// group/version/resource that could tell `/api` from `/apis`).
pub const DISCOVERY_PATH_PARAM: &str = "discoveryPath";
/// Query parameter our agent reads a PATCH's content type from (the payload has no header field).
pub const PATCH_TYPE_PARAM: &str = "patchType";

/// A parsed request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiRoute {
    /// `/api`, `/api/v1`, `/apis`, `/apis/<g>`, `/apis/<g>/<v>` or `/version`.
    Discovery(String),
    /// An object, a list, or a subresource.
    Resource {
        /// API group ("" for core).
        group: String,
        /// API version.
        version: String,
        /// Plural resource.
        resource: String,
        /// Namespace ("" for cluster scope or all namespaces).
        namespace: String,
        /// Object name ("" for a list).
        name: String,
        /// Subresource ("" for none).
        subresource: String,
    },
    /// `/api/v1/namespaces/<ns>/pods/<pod>/log`.
    ContainerLog {
        /// Namespace.
        namespace: String,
        /// Pod.
        pod: String,
    },
    /// `/api/v1/namespaces/<ns>/pods/<pod>/exec` (a web terminal or `kubectl exec`).
    Exec {
        /// Namespace.
        namespace: String,
        /// Pod.
        pod: String,
    },
}

fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
}

/// Parses `path` (without query); `None` for anything that is not a Kubernetes API path.
pub fn parse_api_path(path: &str) -> Option<ApiRoute> {
    // The first segment is skipped below as the empty one before the leading `/`.
    if !path.starts_with('/') {
        return None;
    }
    let path = path.trim_end_matches('/');
    if path == "/version" {
        return Some(ApiRoute::Discovery(path.to_string()));
    }
    let segs: Vec<&str> = path.split('/').skip(1).collect();
    if !segs.iter().all(|s| valid_segment(s)) {
        return None;
    }
    let (group, version, rest) = match segs.as_slice() {
        ["api"] | ["apis"] | ["api", _] | ["apis", _] | ["apis", _, _] => {
            return Some(ApiRoute::Discovery(path.to_string()))
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, resource, name, subresource) = match rest {
        ["namespaces", ns, sub @ ("status" | "finalize")] => ("", "namespaces", *ns, *sub),
        ["namespaces", ns] => ("", "namespaces", *ns, ""),
        ["namespaces", ns, r] => (*ns, *r, "", ""),
        ["namespaces", ns, r, n] => (*ns, *r, *n, ""),
        ["namespaces", ns, r, n, s] => (*ns, *r, *n, *s),
        [r] => ("", *r, "", ""),
        [r, n] => ("", *r, *n, ""),
        [r, n, s] => ("", *r, *n, *s),
        _ => return None,
    };
    if group.is_empty() && version == "v1" && resource == "pods" {
        // Pods are namespaced: `/api/v1/pods/<pod>/log` names no pod.
        let (namespace, pod) = (namespace.to_string(), name.to_string());
        match subresource {
            "log" if !namespace.is_empty() => {
                return Some(ApiRoute::ContainerLog { namespace, pod })
            }
            "exec" if !namespace.is_empty() => return Some(ApiRoute::Exec { namespace, pod }),
            "log" | "exec" => return None,
            _ => {}
        }
    }
    Some(ApiRoute::Resource {
        group: group.to_string(),
        version: version.to_string(),
        resource: resource.to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        subresource: subresource.to_string(),
    })
}

/// Decodes a URL query string into parameters (the last value of a repeated key wins).
pub fn parse_query(query: Option<&str>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(decode_query_component(k), decode_query_component(v));
    }
    out
}

/// Every value of the repeated query parameter `key`, in order (e.g. an exec's `command`).
pub fn query_values(query: Option<&str>, key: &str) -> Vec<String> {
    query
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode_query_component(k) == key).then(|| decode_query_component(v))
        })
        .collect()
}

/// One query key or value as a form encodes it: `+` is a space, then `%XX` escapes are decoded
/// (a `%` not followed by two hex digits stays as it is; bytes that are not UTF-8 become U+FFFD).
fn decode_query_component(s: &str) -> String {
    percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

/// The request event payload for `route` (not a container log).
pub fn resource_request(
    uuid: &str,
    method: &str,
    route: &ApiRoute,
    mut params: BTreeMap<String, String>,
    body: Vec<u8>,
) -> ResourceRequest {
    let mut req = ResourceRequest {
        uuid: uuid.to_string(),
        method: method.to_string(),
        body,
        ..ResourceRequest::default()
    };
    match route {
        ApiRoute::Discovery(path) => {
            // Upstream's agents know a discovery request by its group and version alone
            // (`/api/v1`, `/apis/apps/v1`); ours by the path, which covers every discovery path.
            let segs: Vec<&str> = path.split('/').skip(1).collect();
            match segs.as_slice() {
                ["api", v] => req.version = v.to_string(),
                ["apis", g, v] => (req.group, req.version) = (g.to_string(), v.to_string()),
                _ => {}
            }
            params.insert(DISCOVERY_PATH_PARAM.to_string(), path.clone());
        }
        ApiRoute::Resource {
            group,
            version,
            resource,
            namespace,
            name,
            subresource,
        } => {
            req.group = group.clone();
            req.version = version.clone();
            req.resource = resource.clone();
            req.namespace = namespace.clone();
            req.name = name.clone();
            req.subresource = subresource.clone();
        }
        ApiRoute::ContainerLog { .. } | ApiRoute::Exec { .. } => {}
    }
    req.params = params;
    req
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The route of a resource path, written `group/version/resource/namespace/name/subresource`.
    fn res(fields: &str) -> Option<ApiRoute> {
        let f: Vec<String> = fields.split('/').map(str::to_string).collect();
        let [group, version, resource, namespace, name, subresource] = f.as_slice() else {
            panic!("six fields in {fields}");
        };
        Some(ApiRoute::Resource {
            group: group.clone(),
            version: version.clone(),
            resource: resource.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
            subresource: subresource.clone(),
        })
    }

    #[test]
    fn discovery_requests_carry_upstreams_group_and_version_and_our_path() {
        for (path, group, version) in [
            ("/api", "", ""),
            ("/apis", "", ""),
            ("/api/v1", "", "v1"),
            ("/apis/apps", "", ""),
            ("/apis/apps/v1", "apps", "v1"),
        ] {
            let route = ApiRoute::Discovery(path.into());
            let req = resource_request("u", "GET", &route, BTreeMap::new(), Vec::new());
            assert_eq!((req.group.as_str(), req.version.as_str()), (group, version));
            assert!(req.resource.is_empty() && req.name.is_empty(), "{path}");
            assert_eq!(req.params[DISCOVERY_PATH_PARAM], path);
        }
    }

    #[test]
    fn kubernetes_paths_are_understood() {
        let discovery = [
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps",
            "/apis/apps/v1",
            "/version",
        ];
        let discovery = discovery.map(|p| (p, Some(ApiRoute::Discovery(p.into()))));
        let resources = [
            (
                "/apis/apps/v1/namespaces/g/deployments/web",
                "apps/v1/deployments/g/web/",
            ),
            (
                "/apis/apps/v1/namespaces/g/deployments/web/scale",
                "apps/v1/deployments/g/web/scale",
            ),
            ("/api/v1/namespaces/g/secrets", "/v1/secrets/g//"),
            ("/api/v1/namespaces/g", "/v1/namespaces//g/"),
            ("/api/v1/namespaces", "/v1/namespaces///"),
            ("/api/v1/nodes/n1/status", "/v1/nodes//n1/status"),
        ]
        .map(|(p, route)| (p, res(route)));
        let log = ApiRoute::ContainerLog {
            namespace: "g".into(),
            pod: "p".into(),
        };
        let exec = ApiRoute::Exec {
            namespace: "g".into(),
            pod: "p".into(),
        };
        let logs = [
            ("/api/v1/namespaces/g/pods/p/log", Some(log)),
            ("/api/v1/namespaces/g/pods/p/exec", Some(exec)),
        ];
        for (path, expected) in discovery.into_iter().chain(resources).chain(logs) {
            assert_eq!(parse_api_path(path), expected, "{path}");
        }
    }

    #[test]
    fn other_paths_are_refused() {
        for p in [
            "/",
            "/healthz",
            "/api/v1/namespaces/g/pods/p/log/x/y",
            "/apis/a/v1/../x",
            "/metrics",
            "/api/v1/a%2Fb",
        ] {
            assert_eq!(parse_api_path(p), None, "{p}");
        }
    }

    #[test]
    fn relative_paths_are_refused() {
        // proxy_path fuzz crash: "cont/api" was taken for the discovery path "cont/api".
        for p in [
            "cont/api",
            "api",
            "x/apis/apps/v1/namespaces/g/deployments/web",
            "*",
        ] {
            assert_eq!(parse_api_path(p), None, "{p}");
        }
    }

    #[test]
    fn logs_of_a_pod_without_namespace_are_refused() {
        // proxy_path fuzz crash: this became a log request for pod "p" in namespace "".
        assert_eq!(parse_api_path("/api/v1/pods/p/log"), None);
        assert_eq!(parse_api_path("/api/v1/pods/p/exec"), None);
    }

    #[test]
    fn repeated_query_parameters_keep_every_value_in_order() {
        let q = Some("container=web&command=sh&command=-c&command=echo+a%26b&tty=true");
        assert_eq!(query_values(q, "command"), ["sh", "-c", "echo a&b"]);
        assert!(query_values(q, "stdin").is_empty());
    }

    #[test]
    fn queries_are_decoded() {
        let q = parse_query(Some("labelSelector=app%3Dweb&limit=5&watch"));
        assert_eq!(q["labelSelector"], "app=web");
        assert_eq!(q["limit"], "5");
        assert_eq!(q["watch"], "");
        let q = parse_query(Some("a=x+y%2Bz&b=100%&c=%zz%4&d=%+F&e=%C3%A9%FF"));
        assert_eq!(q["a"], "x y+z", "+ is a space, an escaped + is not");
        assert_eq!(q["b"], "100%");
        assert_eq!(q["c"], "%zz%4", "incomplete escapes stay");
        assert_eq!(q["d"], "% F", "a sign is no hex digit");
        assert_eq!(q["e"], "\u{e9}\u{fffd}");
    }
}
