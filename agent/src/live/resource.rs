//! Resource-proxy requests run against the spoke apiserver, limited to what Argo CD manages.
//!
//! Owns the rule of what the hub may see and touch: discovery and `/version` always; an object
//! only if it — or an owner up to [`OWNER_DEPTH`] levels up (a Deployment's ReplicaSet and Pods) —
//! carries Argo CD's tracking metadata as the spoke's Argo CD is configured to write it
//! (`argocd-cm`'s `application.resourceTrackingMethod`, read as upstream's agent and Argo CD read
//! it: `annotation` — Argo CD 3's default — and `annotation+label` mean the annotation
//! `argocd.argoproj.io/tracking-id`; `label` means the instance label named in
//! `application.instanceLabelKey`, default `app.kubernetes.io/instance`; so a Helm-installed
//! Secret labelled `app.kubernetes.io/instance` is not "tracked" under annotation tracking); lists
//! are filtered to such objects (events to those about them); writes (POST/PATCH/PUT/DELETE) only
//! to such objects, and a create only of an object that carries the metadata itself. Everything
//! else is answered 403 with a Kubernetes `Status`, so an untracked Secret is never returned.
//! When `argocd-cm` cannot be read (other than absent: Argo CD's defaults then) or names an
//! unknown method, every object request is answered 503 saying why, rather than guessing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use argocd_agent_proto::payload::ResourceRequest;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::core::GroupVersionKind;
use serde_json::{json, Value};

use super::encode_query_component;

/// Annotation Argo CD's annotation tracking writes.
pub const TRACKING_ANNOTATION: &str = "argocd.argoproj.io/tracking-id";
/// Argo CD's default instance label.
pub const DEFAULT_INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// How far up the owner chain tracking is looked for.
pub const OWNER_DEPTH: usize = 5;
/// Query parameter carrying a discovery request's path (set by our principal).
pub const DISCOVERY_PATH_PARAM: &str = "discoveryPath";
/// Query parameter carrying a PATCH's content type (set by our principal).
pub const PATCH_TYPE_PARAM: &str = "patchType";
const RULES_TTL: Duration = Duration::from_secs(5);
/// How long a failure to read the rules is remembered (each failure is logged once).
const RULES_ERROR_TTL: Duration = Duration::from_secs(5);
const PATCH_TYPES: [&str; 4] = [
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
    "application/apply-patch+yaml",
];

/// A Kubernetes `Status` failure body.
pub fn status_body(code: u16, reason: &str, message: &str) -> Vec<u8> {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code})
    .to_string()
    .into_bytes()
}

fn forbidden(what: &str) -> (u16, Vec<u8>) {
    (
        403,
        status_body(
            403,
            "Forbidden",
            &format!("{what} is not managed by Argo CD on this cluster; the agent only serves tracked resources"),
        ),
    )
}

/// How the spoke's Argo CD marks the objects it manages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tracking {
    /// `annotation` (Argo CD 3's default, also when unset) and `annotation+label` (where the label
    /// is informational): the `argocd.argoproj.io/tracking-id` annotation.
    Annotation,
    /// `label`: the instance label of this name.
    Label(String),
}

impl Tracking {
    /// The method `argocd-cm`'s `data` configures (`None`: no `argocd-cm`, Argo CD's defaults);
    /// an unknown method is an error naming it.
    pub fn from_settings(data: Option<&BTreeMap<String, String>>) -> Result<Tracking, String> {
        let get = |key: &str| {
            data.and_then(|d| d.get(key))
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
        };
        match get("application.resourceTrackingMethod") {
            None | Some("annotation") | Some("annotation+label") => Ok(Tracking::Annotation),
            Some("label") => Ok(Tracking::Label(
                get("application.instanceLabelKey")
                    .unwrap_or(DEFAULT_INSTANCE_LABEL)
                    .to_string(),
            )),
            Some(other) => Err(format!(
                "argocd-cm sets application.resourceTrackingMethod to {other:?}, which is none of \
                 annotation, annotation+label, label"
            )),
        }
    }

    /// Whether the object itself carries this tracking metadata (non-empty).
    pub fn marks(&self, obj: &Value) -> bool {
        let (field, key) = match self {
            Tracking::Annotation => ("/metadata/annotations", TRACKING_ANNOTATION),
            Tracking::Label(label) => ("/metadata/labels", label.as_str()),
        };
        obj.pointer(field)
            .and_then(|m| m.get(key))
            .and_then(Value::as_str)
            .is_some_and(|v| !v.is_empty())
    }
}

/// The tracking method in force, read from `argocd-cm` (cached briefly, failures too).
pub struct TrackingRules {
    client: kube::Client,
    namespace: String,
    cached: Mutex<Option<(Instant, Result<Tracking, String>)>>,
}

impl TrackingRules {
    /// Rules read from `argocd-cm` in `namespace`.
    pub fn new(client: kube::Client, namespace: String) -> Self {
        TrackingRules {
            client,
            namespace,
            cached: Mutex::new(None),
        }
    }

    /// The method in force, or why it cannot be known (logged once per failed read).
    pub async fn current(&self) -> Result<Tracking, String> {
        if let Some((at, rules)) = &*self.cached.lock().unwrap_or_else(|e| e.into_inner()) {
            let ttl = if rules.is_ok() {
                RULES_TTL
            } else {
                RULES_ERROR_TTL
            };
            if at.elapsed() < ttl {
                return rules.clone();
            }
        }
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let rules = match cms.get_opt("argocd-cm").await {
            Ok(cm) => Tracking::from_settings(cm.as_ref().and_then(|cm| cm.data.as_ref())),
            Err(e) => Err(format!(
                "cannot read argocd-cm in namespace {}: {e} (the agent needs get on \
                 configmaps/argocd-cm there: the agent chart's Role grants it)",
                self.namespace
            )),
        };
        if let Err(why) = &rules {
            tracing::warn!(
                reason = %why,
                "resource proxy: which objects Argo CD tracks is unknown, object requests are answered 503"
            );
        }
        *self.cached.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Instant::now(), rules.clone()));
        rules
    }
}

fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:".contains(&b))
}

fn valid_discovery_path(path: &str) -> bool {
    let segs: Vec<&str> = path.split('/').skip(1).collect();
    segs.iter().all(|s| valid_segment(s))
        && matches!(
            segs.as_slice(),
            ["version"] | ["api"] | ["apis"] | ["api", _] | ["apis", _] | ["apis", _, _]
        )
}

/// The apiserver path of a request (object path when `name` is set), without subresource.
fn object_path(group: &str, version: &str, namespace: &str, resource: &str, name: &str) -> String {
    let mut p = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    if !namespace.is_empty() {
        p.push_str(&format!("/namespaces/{namespace}"));
    }
    p.push('/');
    p.push_str(resource);
    if !name.is_empty() {
        p.push('/');
        p.push_str(name);
    }
    p
}

/// Sends one request to the apiserver; returns status and body (transport failures as 502).
async fn send(
    client: &kube::Client,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (u16, Vec<u8>) {
    let mut builder = http::Request::builder()
        .method(method)
        .uri(uri)
        .header(http::header::ACCEPT, "application/json");
    if let Some(ct) = content_type {
        builder = builder.header(http::header::CONTENT_TYPE, ct);
    }
    let req = match builder.body(kube::client::Body::from(body)) {
        Ok(r) => r,
        Err(e) => return (400, status_body(400, "BadRequest", &e.to_string())),
    };
    match client.send(req).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            match resp.into_body().collect().await {
                Ok(b) => (status, b.to_bytes().to_vec()),
                Err(e) => (
                    502,
                    status_body(
                        502,
                        "InternalError",
                        &format!("reading the spoke apiserver's answer: {e}"),
                    ),
                ),
            }
        }
        Err(e) => (
            502,
            status_body(
                502,
                "InternalError",
                &format!("the spoke apiserver cannot be reached: {e}"),
            ),
        ),
    }
}

async fn get_json(client: &kube::Client, path: &str) -> Result<Value, (u16, Vec<u8>)> {
    get_object(client, path).await.map(|(obj, _)| obj)
}

/// GETs `path`: the object parsed, and the apiserver's bytes of it (answered as they are, not
/// serialized again).
async fn get_object(client: &kube::Client, path: &str) -> Result<(Value, Vec<u8>), (u16, Vec<u8>)> {
    let (status, body) = send(client, "GET", path, None, Vec::new()).await;
    if status != 200 {
        return Err((status, body));
    }
    match serde_json::from_slice(&body) {
        Ok(obj) => Ok((obj, body)),
        Err(e) => Err((502, status_body(502, "InternalError", &e.to_string()))),
    }
}

/// Resolves owners and decides tracking; remembers what it looked up during one request.
struct Tracker<'a> {
    client: &'a kube::Client,
    tracking: Tracking,
    kinds: HashMap<(String, String), Option<(String, bool)>>,
}

impl Tracker<'_> {
    /// Path prefix (group/version/resource) and namespacedness of a kind.
    async fn resource_of(&mut self, api_version: &str, kind: &str) -> Option<(String, bool)> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(v) = self.kinds.get(&key) {
            return v.clone();
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let found = kube::discovery::pinned_kind(self.client, &gvk)
            .await
            .ok()
            .map(|(ar, caps)| (ar.plural, caps.scope == kube::discovery::Scope::Namespaced));
        self.kinds.insert(key, found.clone());
        found
    }

    /// Whether `obj` or an owner up the chain carries tracking metadata.
    async fn is_tracked(&mut self, obj: &Value) -> bool {
        let mut current = obj.clone();
        for _ in 0..=OWNER_DEPTH {
            if self.tracking.marks(&current) {
                return true;
            }
            let ns = current
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let Some(owner) = current
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .and_then(|o| {
                    o.iter()
                        .find(|r| r["controller"] == true)
                        .or_else(|| o.first())
                })
                .cloned()
            else {
                return false;
            };
            let (Some(av), Some(kind), Some(name)) = (
                owner["apiVersion"].as_str(),
                owner["kind"].as_str(),
                owner["name"].as_str(),
            ) else {
                return false;
            };
            let Some((plural, namespaced)) = self.resource_of(av, kind).await else {
                return false;
            };
            let (group, version) = av.split_once('/').unwrap_or(("", av));
            let path = object_path(
                group,
                version,
                if namespaced { &ns } else { "" },
                &plural,
                name,
            );
            match get_json(self.client, &path).await {
                Ok(o) => current = o,
                Err(_) => return false,
            }
        }
        false
    }

    /// Whether an event is about a tracked object.
    async fn event_is_about_tracked(&mut self, ev: &Value) -> bool {
        let Some(about) = ev.get("involvedObject").or_else(|| ev.get("regarding")) else {
            return false;
        };
        let (Some(av), Some(kind), Some(name)) = (
            about["apiVersion"].as_str(),
            about["kind"].as_str(),
            about["name"].as_str(),
        ) else {
            return false;
        };
        let ns = about["namespace"].as_str().unwrap_or("");
        let Some((plural, namespaced)) = self.resource_of(av, kind).await else {
            return false;
        };
        let (group, version) = av.split_once('/').unwrap_or(("", av));
        match get_json(
            self.client,
            &object_path(
                group,
                version,
                if namespaced { ns } else { "" },
                &plural,
                name,
            ),
        )
        .await
        {
            Ok(obj) => {
                let uid_matches = about["uid"].as_str().is_none_or(|u| {
                    u.is_empty() || obj.pointer("/metadata/uid").and_then(Value::as_str) == Some(u)
                });
                uid_matches && self.is_tracked(&obj).await
            }
            Err(_) => false,
        }
    }
}

/// The path of a discovery request (no resource, no name): the one our principal names, else the
/// one upstream principals encode by group and version alone (`/api/{v}`, `/apis/{g}/{v}`, and
/// `/api` when both are empty).
fn discovery_path(req: &ResourceRequest, named: Option<String>) -> String {
    named.unwrap_or_else(|| match (req.group.as_str(), req.version.as_str()) {
        ("", "") => "/api".into(),
        ("", v) => format!("/api/{v}"),
        (g, v) => format!("/apis/{g}/{v}"),
    })
}

/// Reads pod `namespace`/`pod` under the tracking rules (a GET through [`execute`]): 200 only for
/// a pod Argo CD manages (through its owners). Logs and terminals ask this before they open.
pub async fn read_tracked_pod(
    client: &kube::Client,
    rules: &TrackingRules,
    uuid: &str,
    namespace: &str,
    pod: &str,
) -> (u16, Vec<u8>) {
    let probe = ResourceRequest {
        uuid: uuid.to_string(),
        method: "GET".into(),
        namespace: namespace.to_string(),
        name: pod.to_string(),
        version: "v1".into(),
        resource: "pods".into(),
        ..ResourceRequest::default()
    };
    execute(client, rules, &probe).await
}

/// Runs `req` against the spoke apiserver; returns the HTTP status and body to send back.
pub async fn execute(
    client: &kube::Client,
    rules: &TrackingRules,
    req: &ResourceRequest,
) -> (u16, Vec<u8>) {
    let method = req.method.to_ascii_uppercase();
    let mut params = req.params.clone();
    if req.is_list() {
        let path = discovery_path(req, params.remove(DISCOVERY_PATH_PARAM));
        if method != "GET" || !valid_discovery_path(&path) {
            return (
                400,
                status_body(
                    400,
                    "BadRequest",
                    &format!("{method} {path} is not a discovery request"),
                ),
            );
        }
        return send(client, "GET", &path, None, Vec::new()).await;
    }
    let segments = [&req.group, &req.namespace, &req.name, &req.subresource];
    if !valid_segment(&req.version)
        || !valid_segment(&req.resource)
        || segments.iter().any(|s| !s.is_empty() && !valid_segment(s))
    {
        return (
            400,
            status_body(
                400,
                "BadRequest",
                "malformed group, version, resource, namespace, name or subresource",
            ),
        );
    }
    let patch_type = params.remove(PATCH_TYPE_PARAM);
    params.remove(DISCOVERY_PATH_PARAM);
    let query: String = params
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                encode_query_component(k),
                encode_query_component(v)
            )
        })
        .collect::<Vec<_>>()
        .join("&");
    let with_query = |p: String| {
        if query.is_empty() {
            p
        } else {
            format!("{p}?{query}")
        }
    };
    let base = object_path(
        &req.group,
        &req.version,
        &req.namespace,
        &req.resource,
        &req.name,
    );
    let target = if req.subresource.is_empty() {
        base.clone()
    } else {
        format!("{base}/{}", req.subresource)
    };
    let what = if req.name.is_empty() {
        req.resource.clone()
    } else {
        format!("{} {}/{}", req.resource, req.namespace, req.name)
    };
    let tracking = match rules.current().await {
        Ok(tracking) => tracking,
        Err(why) => return (503, status_body(503, "ServiceUnavailable", &why)),
    };
    let mut tracker = Tracker {
        client,
        tracking,
        kinds: HashMap::new(),
    };

    if req.name.is_empty() {
        return match method.as_str() {
            "GET" => {
                let (status, body) =
                    send(client, "GET", &with_query(target), None, Vec::new()).await;
                if status != 200 {
                    return (status, body);
                }
                let Ok(mut list) = serde_json::from_slice::<Value>(&body) else {
                    return (
                        502,
                        status_body(
                            502,
                            "InternalError",
                            "the spoke apiserver returned a list that is not JSON",
                        ),
                    );
                };
                let items = list
                    .get_mut("items")
                    .and_then(Value::as_array_mut)
                    .map(std::mem::take)
                    .unwrap_or_default();
                let is_events = req.resource == "events";
                let mut kept = Vec::new();
                for item in items {
                    let keep = if is_events {
                        tracker.event_is_about_tracked(&item).await
                    } else {
                        tracker.is_tracked(&item).await
                    };
                    if keep {
                        kept.push(item);
                    }
                }
                list["items"] = Value::Array(kept);
                (200, list.to_string().into_bytes())
            }
            "POST" => {
                let Ok(obj) = serde_json::from_slice::<Value>(&req.body) else {
                    return (
                        400,
                        status_body(
                            400,
                            "BadRequest",
                            "the body of a create must be a JSON object",
                        ),
                    );
                };
                if !tracker.tracking.marks(&obj) {
                    return forbidden(&format!("the new {}", req.resource));
                }
                send(
                    client,
                    "POST",
                    &with_query(target),
                    Some("application/json"),
                    req.body.clone(),
                )
                .await
            }
            _ => (
                405,
                status_body(
                    405,
                    "MethodNotAllowed",
                    &format!("{method} of a whole collection is not allowed"),
                ),
            ),
        };
    }

    // A named object: check what it is before serving or touching it.
    let (obj, raw) = match get_object(client, &base).await {
        Ok(o) => o,
        Err(answer) => return answer,
    };
    if !tracker.is_tracked(&obj).await {
        return forbidden(&what);
    }
    match method.as_str() {
        "GET" if req.subresource.is_empty() => (200, raw),
        "GET" => send(client, "GET", &with_query(target), None, Vec::new()).await,
        "POST" | "PUT" => {
            send(
                client,
                &method,
                &with_query(target),
                Some("application/json"),
                req.body.clone(),
            )
            .await
        }
        "PATCH" => {
            let ct = patch_type.unwrap_or_else(|| PATCH_TYPES[0].to_string());
            let essence = ct.split(';').next().unwrap_or_default().trim().to_string();
            if !PATCH_TYPES.contains(&essence.as_str()) {
                return (
                    415,
                    status_body(
                        415,
                        "UnsupportedMediaType",
                        &format!("patch type {ct:?} is not supported"),
                    ),
                );
            }
            send(
                client,
                "PATCH",
                &with_query(target),
                Some(&essence),
                req.body.clone(),
            )
            .await
        }
        "DELETE" => {
            send(
                client,
                "DELETE",
                &with_query(target),
                Some("application/json"),
                req.body.clone(),
            )
            .await
        }
        other => (
            405,
            status_body(405, "MethodNotAllowed", &format!("{other} is not allowed")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracking_follows_argocd_cms_method() {
        let ann = json!({"metadata": {"annotations": {TRACKING_ANNOTATION: "app:apps/Deployment:ns/web"}}});
        let default_label = json!({"metadata": {"labels": {DEFAULT_INSTANCE_LABEL: "app"}}});
        let custom = json!({"metadata": {"labels": {"custom/instance": "app"}}});
        let empty = json!({"metadata": {"labels": {DEFAULT_INSTANCE_LABEL: ""},
            "annotations": {TRACKING_ANNOTATION: ""}}});
        let cm = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        // No argocd-cm, no method, annotation, annotation+label: the annotation only (a Helm
        // release's instance label is not Argo CD's tracking).
        for data in [
            None,
            Some(cm(&[])),
            Some(cm(&[("application.resourceTrackingMethod", "annotation")])),
            Some(cm(&[(
                "application.resourceTrackingMethod",
                "annotation+label",
            )])),
        ] {
            let t = Tracking::from_settings(data.as_ref()).unwrap();
            assert_eq!(t, Tracking::Annotation);
            assert!(t.marks(&ann));
            assert!(!t.marks(&default_label));
            assert!(!t.marks(&empty));
        }
        let label = Tracking::from_settings(Some(&cm(&[(
            "application.resourceTrackingMethod",
            "label",
        )])))
        .unwrap();
        assert_eq!(label, Tracking::Label(DEFAULT_INSTANCE_LABEL.into()));
        assert!(label.marks(&default_label) && !label.marks(&ann) && !label.marks(&empty));
        let custom_label = Tracking::from_settings(Some(&cm(&[
            ("application.resourceTrackingMethod", "label"),
            ("application.instanceLabelKey", "custom/instance"),
        ])))
        .unwrap();
        assert!(custom_label.marks(&custom) && !custom_label.marks(&default_label));
        let unknown = Tracking::from_settings(Some(&cm(&[(
            "application.resourceTrackingMethod",
            "labels",
        )])));
        assert!(unknown.unwrap_err().contains("\"labels\""));
    }

    #[test]
    fn discovery_paths_come_from_the_parameter_or_upstreams_group_and_version() {
        let req = |g: &str, v: &str| ResourceRequest {
            group: g.into(),
            version: v.into(),
            ..ResourceRequest::default()
        };
        assert_eq!(discovery_path(&req("", ""), None), "/api");
        assert_eq!(discovery_path(&req("", "v1"), None), "/api/v1");
        assert_eq!(discovery_path(&req("apps", "v1"), None), "/apis/apps/v1");
        let named = Some("/apis".to_string());
        assert_eq!(discovery_path(&req("apps", "v1"), named), "/apis");
        assert!(!valid_discovery_path(&discovery_path(
            &req("apps", ""),
            None
        )));
    }

    #[test]
    fn only_discovery_paths_are_discovery() {
        for ok in [
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps",
            "/apis/apps/v1",
            "/version",
        ] {
            assert!(valid_discovery_path(ok), "{ok}");
        }
        for bad in [
            "/api/v1/secrets",
            "/apis/../x",
            "/healthz",
            "",
            "/apis/apps/v1/namespaces/a/secrets",
        ] {
            assert!(!valid_discovery_path(bad), "{bad}");
        }
    }

    #[test]
    fn paths_are_built_from_the_request() {
        assert_eq!(
            object_path("apps", "v1", "g", "deployments", "web"),
            "/apis/apps/v1/namespaces/g/deployments/web"
        );
        assert_eq!(
            object_path("", "v1", "", "namespaces", "g"),
            "/api/v1/namespaces/g"
        );
        assert_eq!(encode_query_component("app=web,x"), "app%3Dweb%2Cx");
        assert_eq!(encode_query_component("a b~\u{e9}"), "a%20b~%C3%A9");
    }
}
