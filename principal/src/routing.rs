//! Pure decisions of hub-side sync, kept free of I/O so each is unit-tested: which events a change of
//! a hub Application produces, which agents an AppProject applies to, and the copy of an object
//! that an agent receives ([`without_bookkeeping`], [`repository_payload`], ...); for autonomous
//! agents, the hub mirror of a spoke object
//! ([`mirror_application`], [`mirror_project`]) and the view of a mirror that hub edits may not
//! change ([`mirror_view`]); which hub namespaces are served ([`namespace_allowed`]) and the label
//! selector of each hub watch ([`combined_selector`]).

use argocd_agent_kube::argocd::{
    type_meta, AppProject, Application, ApplicationDestination, ObjectMetaExt,
};
use argocd_agent_proto::event::EventType;
use argocd_agent_proto::glob::{glob_match, match_in_list};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use serde_json::Value;

pub use argocd_agent_proto::event::{
    HYDRATE_ANNOTATION, LAST_APPLIED_ANNOTATION, REFRESH_ANNOTATION,
};

/// Events a change of a hub Application (in a managed agent's namespace) produces, in order.
pub fn application_change_events(old: Option<&Application>, new: &Application) -> Vec<EventType> {
    let mut out = Vec::new();
    let new_op = new.operation();
    match old {
        None => {
            out.push(EventType::Create);
            if new_op.is_some() {
                out.push(EventType::SetOperation);
            }
        }
        Some(old) => {
            let (o, n) = (&old.metadata, &new.metadata);
            let meta_changed = o.labels != n.labels
                || o.annotations != n.annotations
                || o.finalizers != n.finalizers
                || o.deletion_timestamp != n.deletion_timestamp;
            if meta_changed || old.spec != new.spec {
                out.push(EventType::SpecUpdate);
            }
            if new_op.is_some() && new_op != old.operation() {
                out.push(EventType::SetOperation);
            }
            if new.operation_phase() == Some("Terminating")
                && old.operation_phase() != Some("Terminating")
            {
                out.push(EventType::TerminateOperation);
            }
        }
    }
    out
}

/// Whether the spoke already started the hub's pending operation (it copied it into
/// `status.operationState.operation`), so sending it again would run it twice.
pub fn operation_already_started(app: &Application) -> bool {
    app.operation().is_none() || app.operation_started()
}

/// The requests on hub Application `hub_app` (refresh, hydrate) that a managed agent's
/// status-update `spoke` shows carried out: the hub copy asks and the spoke copy no longer does
/// (Argo CD's controller removes the refresh annotation in the same write as the refreshed
/// status). The hub's requests are then removed too, as upstream does for the refresh, which is
/// what `argocd app get --refresh` waits for.
pub fn requests_carried_out(hub_app: &Application, spoke: &Application) -> Vec<&'static str> {
    [REFRESH_ANNOTATION, HYDRATE_ANNOTATION]
        .into_iter()
        .filter(|key| hub_app.annotation(key).is_some() && spoke.annotation(key).is_none())
        .collect()
}

/// The payload of an Application event: the object without `status` and, except for operation
/// events, without `operation`.
pub fn application_payload(app: &Application, with_operation: bool) -> Application {
    let mut out = app.clone();
    out.status = None;
    if !with_operation {
        out.operation = None;
    }
    strip_metadata(&mut out.metadata);
    out
}

/// `obj` without what upstream strips from every copy it sends: managed fields and kubectl's
/// last-applied copy.
pub fn without_bookkeeping<K: kube::Resource + Clone>(obj: &K) -> K {
    let mut out = obj.clone();
    strip_metadata(out.meta_mut());
    out
}

/// Removes what upstream strips from every copy: managed fields and kubectl's last-applied copy.
fn strip_metadata(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// Whether the principal watches and serves Applications in hub namespace `namespace`
/// (`--allowed-namespaces`: globs or `/regex/`, as upstream's `MatchStringInList`; none = every
/// namespace).
pub fn namespace_allowed(patterns: &[String], namespace: &str) -> bool {
    patterns.is_empty() || match_in_list(patterns, namespace)
}

/// The label selector of a hub watch: the kind's own (`fixed`, e.g. repository Secrets only) and
/// `--label-selector`, both required (Kubernetes ANDs comma-separated requirements).
pub fn combined_selector(fixed: Option<&str>, user: Option<&str>) -> Option<String> {
    match (fixed, user.filter(|u| !u.is_empty())) {
        (Some(f), Some(u)) => Some(format!("{f},{u}")),
        (Some(one), None) | (None, Some(one)) => Some(one.to_string()),
        (None, None) => None,
    }
}

/// The `agentName` query parameter of a resource-proxy destination URL
/// (`https://<proxy>:<port>?agentName=<agent>`), as upstream reads it with Go's
/// `url.Parse(server).Query().Get("agentName")`: a URL holding an ASCII control character does
/// not parse; the query ends at `#`; pairs are split on `&`, and one holding `;` or a malformed `%`
/// escape is dropped (Go's `ParseQuery`); keys and values are percent-decoded with `+` as a space;
/// the first `agentName` wins; an empty value is none. (Go's host and port checks are not
/// repeated: a destination whose URL fails them reaches no cluster either way.)
fn server_agent_name(server: &str) -> Option<String> {
    if server.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return None;
    }
    let url = server.split_once('#').map_or(server, |(url, _)| url);
    let (_, query) = url.split_once('?')?;
    query
        .split('&')
        .filter(|pair| !pair.is_empty() && !pair.contains(';'))
        .find_map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if query_unescape(key)? != "agentName" {
                return None;
            }
            query_unescape(value)
        })
        .filter(|name| !name.is_empty())
}

/// Go's `url.QueryUnescape`: `+` is a space, `%XX` a byte; a `%` not followed by two hex digits
/// is an error (`None`).
fn query_unescape(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let malformed = bytes.iter().enumerate().any(|(i, b)| {
        *b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    });
    if malformed {
        return None;
    }
    let spaced = s.replace('+', " ");
    Some(
        percent_encoding::percent_decode_str(&spaced)
            .decode_utf8_lossy()
            .into_owned(),
    )
}

/// Whether destination `dest` names `agent` (upstream's per-destination rule): a named destination
/// by glob on its name; a nameless one by its server, `*` or a glob in the URL's `agentName`.
fn names_agent(dest: &ApplicationDestination, agent: &str) -> bool {
    match (
        dest.name.as_deref().filter(|n| !n.is_empty()),
        dest.server.as_deref(),
    ) {
        (Some(name), _) => !name.starts_with('!') && glob_match(name, agent),
        (None, Some("*")) => true,
        (None, Some(server)) => server_agent_name(server).is_some_and(|p| glob_match(&p, agent)),
        (None, None) => false,
    }
}

/// Whether a destination name denies `agent` (`!pattern`); one denial outweighs every match.
fn denies_agent(dest: &ApplicationDestination, agent: &str) -> bool {
    dest.name
        .as_deref()
        .and_then(|n| n.strip_prefix('!'))
        .is_some_and(|p| glob_match(p, agent))
}

/// Whether an AppProject's destinations select `agent` (the destination half of upstream's
/// DoesAgentMatchWithProject): one names it and no destination name denies it.
pub fn destinations_match_agent(project: &AppProject, agent: &str) -> bool {
    let destinations = &project.spec.destinations;
    !destinations.iter().any(|d| denies_agent(d, agent))
        && destinations.iter().any(|d| names_agent(d, agent))
}

/// Whether an AppProject's `sourceNamespaces` admit the agent's hub namespace (named after the
/// agent), as Argo CD's `MatchStringInList(.., REGEXP)` does: `/regex/` (unanchored) or a glob.
pub fn source_namespaces_match_agent(project: &AppProject, agent: &str) -> bool {
    match_in_list(&project.spec.source_namespaces, agent)
}

/// Whether an AppProject on the hub applies to managed agent `agent` under namespace mapping
/// (upstream's DoesAgentMatchWithProject): its destinations select the agent AND its source
/// namespaces admit the agent's namespace (an Application in namespace `agent` must be allowed to
/// use the project, or sending it would be pointless).
pub fn project_matches_agent(project: &AppProject, agent: &str) -> bool {
    destinations_match_agent(project, agent) && source_namespaces_match_agent(project, agent)
}

/// The copy of a hub AppProject an agent receives: destinations that name the agent rewritten to
/// the in-cluster destination, roles and source namespaces removed (they only mean something on the
/// hub).
pub fn project_for_agent(project: &AppProject, agent: &str) -> AppProject {
    let mut copy = project.clone();
    copy.status = None;
    copy.spec.roles = None;
    copy.spec.source_namespaces.clear();
    copy.spec.destinations = project
        .spec
        .destinations
        .iter()
        .filter(|d| names_agent(d, agent))
        .map(|d| ApplicationDestination {
            name: Some("in-cluster".into()),
            server: Some("https://kubernetes.default.svc".into()),
            namespace: Some(d.namespace.clone().unwrap_or_else(|| "*".into())),
            ..ApplicationDestination::default()
        })
        .collect();
    strip_metadata(&mut copy.metadata);
    copy
}

/// The payload of a repository event: the Secret without managed fields and last-applied.
pub fn repository_payload(secret: &Secret) -> Secret {
    without_bookkeeping(secret)
}

fn mirror_metadata<K: kube::Resource + Serialize>(
    spoke: &K,
    agent: &str,
    name: &str,
    namespace: &str,
) -> ObjectMeta {
    use argocd_agent_proto::event::SOURCE_UID_ANNOTATION;
    use argocd_agent_proto::sync::resync::{
        owned_checksum, MIRROR_AGENT_ANNOTATION, MIRROR_CHECKSUM_ANNOTATION,
    };
    let spoke_json = serde_json::to_value(spoke).unwrap_or(Value::Null);
    let mut annotations = spoke.meta().annotations.clone().unwrap_or_default();
    annotations.remove(LAST_APPLIED_ANNOTATION);
    annotations.insert(SOURCE_UID_ANNOTATION.into(), spoke.uid_str().into());
    annotations.insert(MIRROR_AGENT_ANNOTATION.into(), agent.into());
    annotations.insert(
        MIRROR_CHECKSUM_ANNOTATION.into(),
        hex::encode(owned_checksum(&spoke_json)),
    );
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        annotations: Some(annotations),
        labels: spoke.meta().labels.clone(),
        ..ObjectMeta::default()
    }
}

/// Name of the hub mirror of autonomous agent `agent`'s AppProject `project`.
pub fn mirrored_project_name(agent: &str, project: &str) -> String {
    format!("{agent}-{project}")
}

/// The hub mirror of an autonomous agent's Application: in namespace `agent`, same name,
/// source-uid = the spoke uid, `spec.project` = `<agent>-<project>`, destination
/// `{name: <agent>, namespace: <spoke destination namespace>}` (no server), the spoke's status
/// and operation; no finalizers (nothing on the hub may block a deletion the spoke decided).
pub fn mirror_application(spoke: &Application, agent: &str) -> Application {
    let mut spec = spoke.spec.clone();
    let project = spoke.spec.project.as_deref().unwrap_or("default");
    spec.project = Some(mirrored_project_name(agent, project));
    // Upstream's `server: ""` is dropped by Go's omitempty; an explicit "" is refused by the
    // Application CRD's schema, so the field is left out.
    spec.destination = Some(ApplicationDestination {
        name: Some(agent.into()),
        namespace: spoke
            .spec
            .destination
            .as_ref()
            .and_then(|d| d.namespace.clone()),
        ..ApplicationDestination::default()
    });
    Application {
        metadata: mirror_metadata(spoke, agent, spoke.name_str(), agent),
        spec,
        operation: spoke.operation.clone(),
        status: spoke.status.clone(),
        other: type_meta::<Application>(),
    }
}

/// Rewrites one Casbin policy line of project `project` for its hub mirror: the subject
/// `proj:<project>:<role>` becomes `proj:<agent>-<project>:<role>` and the object
/// `<project>/<app>` becomes `<agent>-<project>/<agent>/<app>`.
pub fn mirror_policy_line(line: &str, agent: &str, project: &str) -> String {
    let subject = format!("proj:{project}:");
    let object = format!("{project}/");
    line.split(',')
        .map(|part| {
            let t = part.trim();
            let rewritten = if let Some(role) = t.strip_prefix(&subject) {
                format!("proj:{}:{role}", mirrored_project_name(agent, project))
            } else if let Some(app) = t.strip_prefix(&object) {
                format!("{}/{agent}/{app}", mirrored_project_name(agent, project))
            } else {
                return part.to_string();
            };
            let lead = &part[..part.len() - part.trim_start().len()];
            format!("{lead}{rewritten}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The hub mirror of an autonomous agent's AppProject: `<agent>-<name>` in the principal
/// namespace, `sourceNamespaces: [<agent>]`, one destination `{name: <agent>, server: "*",
/// namespace: "*"}`, role policy lines rewritten with [`mirror_policy_line`].
pub fn mirror_project(spoke: &AppProject, agent: &str, principal_namespace: &str) -> AppProject {
    let name = spoke.name_str();
    let mut spec = spoke.spec.clone();
    spec.source_namespaces = vec![agent.to_string()];
    spec.destinations = vec![ApplicationDestination {
        name: Some(agent.into()),
        server: Some("*".into()),
        namespace: Some("*".into()),
        ..ApplicationDestination::default()
    }];
    for role in spec.roles.iter_mut().flatten() {
        for line in role.policies.iter_mut().flatten() {
            *line = mirror_policy_line(line, agent, name);
        }
    }
    let mirror_name = mirrored_project_name(agent, name);
    AppProject {
        metadata: mirror_metadata(spoke, agent, &mirror_name, principal_namespace),
        spec,
        status: None,
        other: type_meta::<AppProject>(),
    }
}

/// What hub edits of a mirror may not change (reverted when they do): spec, status, labels and
/// annotations other than the refresh request and kubectl's last-applied copy. The mirror
/// itself with nothing else kept; absent and empty labels and annotations count as the same.
pub fn mirror_view<K: MirrorObject>(obj: &K) -> K {
    let meta = obj.meta();
    let mut annotations = meta.annotations.clone().unwrap_or_default();
    annotations.remove(LAST_APPLIED_ANNOTATION);
    annotations.remove(REFRESH_ANNOTATION);
    let metadata = ObjectMeta {
        labels: meta.labels.clone().filter(|l| !l.is_empty()),
        annotations: Some(annotations).filter(|a| !a.is_empty()),
        ..ObjectMeta::default()
    };
    obj.owned_part(metadata)
}

/// An Argo CD kind an autonomous agent owns and the hub mirrors.
pub trait MirrorObject: kube::Resource + Clone + PartialEq {
    /// `metadata` with what the spoke decides of this object (spec, status) and nothing else.
    fn owned_part(&self, metadata: ObjectMeta) -> Self;
}

impl MirrorObject for Application {
    fn owned_part(&self, metadata: ObjectMeta) -> Self {
        Application {
            metadata,
            spec: self.spec.clone(),
            status: self.status.clone(),
            ..Application::default()
        }
    }
}

impl MirrorObject for AppProject {
    fn owned_part(&self, metadata: ObjectMeta) -> Self {
        AppProject {
            metadata,
            spec: self.spec.clone(),
            status: self.status.clone(),
            ..AppProject::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn to_value<T: serde::Serialize>(v: &T) -> Value {
        serde_json::to_value(v).unwrap()
    }

    fn project(v: Value) -> AppProject {
        serde_json::from_value(v).unwrap()
    }

    fn typed(v: &Value) -> Application {
        serde_json::from_value(v.clone()).unwrap()
    }

    fn annotations(pairs: &[(&str, &str)]) -> Option<std::collections::BTreeMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn allowed_namespaces_are_globs_and_none_allows_every_namespace() {
        assert!(namespace_allowed(&[], "agent-a"));
        let patterns = vec!["team-*".to_string(), "agent-?".to_string()];
        assert!(namespace_allowed(&patterns, "team-blue"));
        assert!(namespace_allowed(&patterns, "agent-a"));
        assert!(!namespace_allowed(&patterns, "agent-ab"));
        assert!(!namespace_allowed(&patterns, "other"));
        let upstream_syntax = vec![
            "{dev,prod}-[ab]".to_string(),
            "/^fleet-[0-9]+$/".to_string(),
        ];
        assert!(namespace_allowed(&upstream_syntax, "prod-b"));
        assert!(!namespace_allowed(&upstream_syntax, "prod-c"));
        assert!(namespace_allowed(&upstream_syntax, "fleet-7"));
    }

    #[test]
    fn the_label_selector_narrows_each_watch_and_keeps_its_own_selector() {
        assert_eq!(combined_selector(None, None), None);
        assert_eq!(combined_selector(None, Some("")), None);
        assert_eq!(
            combined_selector(None, Some("sync=yes")).as_deref(),
            Some("sync=yes")
        );
        assert_eq!(
            combined_selector(Some("type in (a,b)"), Some("sync=yes")).as_deref(),
            Some("type in (a,b),sync=yes")
        );
        assert_eq!(
            combined_selector(Some("type in (a,b)"), None).as_deref(),
            Some("type in (a,b)")
        );
    }

    fn app(spec_rev: &str) -> Application {
        typed(
            &json!({"metadata": {"name": "a", "namespace": "agent1", "uid": "u1", "resourceVersion": "1"},
                    "spec": {"source": {"targetRevision": spec_rev}}}),
        )
    }

    #[test]
    fn hub_requests_are_carried_out_once_the_spoke_copy_no_longer_asks_for_them() {
        let mut hub = app("v1");
        let spoke = app("v1");
        assert!(
            requests_carried_out(&hub, &spoke).is_empty(),
            "nothing was requested"
        );
        hub.metadata.annotations = annotations(&[
            (REFRESH_ANNOTATION, "normal"),
            (HYDRATE_ANNOTATION, "normal"),
        ]);
        assert_eq!(
            requests_carried_out(&hub, &spoke),
            [REFRESH_ANNOTATION, HYDRATE_ANNOTATION]
        );
        let mut pending = spoke.clone();
        pending.metadata.annotations = annotations(&[(REFRESH_ANNOTATION, "normal")]);
        assert_eq!(
            requests_carried_out(&hub, &pending),
            [HYDRATE_ANNOTATION],
            "the spoke's controller has not refreshed yet"
        );
    }

    #[test]
    fn new_app_is_a_create_and_its_operation_follows() {
        assert_eq!(
            application_change_events(None, &app("v1")),
            [EventType::Create]
        );
        let mut with_op = app("v1");
        with_op.operation = Some(json!({"sync": {}}));
        assert_eq!(
            application_change_events(None, &with_op),
            [EventType::Create, EventType::SetOperation]
        );
    }

    #[test]
    fn spec_change_and_operation_are_separate_events_and_status_alone_is_none() {
        let old = app("v1");
        let mut new = app("v2");
        new.operation = Some(json!({"sync": {"revision": "abc"}}));
        assert_eq!(
            application_change_events(Some(&old), &new),
            [EventType::SpecUpdate, EventType::SetOperation]
        );
        let mut status_only = app("v1");
        status_only.status = serde_json::from_value(json!({"sync": {"status": "Synced"}})).unwrap();
        assert!(application_change_events(Some(&old), &status_only).is_empty());
    }

    #[test]
    fn deletion_timestamp_is_a_spec_update_and_terminating_a_terminate() {
        let old = app("v1");
        let mut deleting = app("v1");
        deleting.metadata.deletion_timestamp =
            serde_json::from_value(json!("2026-01-01T00:00:00Z")).unwrap();
        assert_eq!(
            application_change_events(Some(&old), &deleting),
            [EventType::SpecUpdate]
        );
        let mut term = app("v1");
        term.status =
            serde_json::from_value(json!({"operationState": {"phase": "Terminating"}})).unwrap();
        assert_eq!(
            application_change_events(Some(&old), &term),
            [EventType::TerminateOperation]
        );
        assert!(application_change_events(Some(&term), &term).is_empty());
    }

    #[test]
    fn payload_drops_status_managed_fields_and_last_applied() {
        let mut a = app("v1");
        a.status = serde_json::from_value(json!({"x": 1})).unwrap();
        a.operation = Some(json!({"sync": {}}));
        a.metadata.managed_fields = Some(Vec::new());
        a.metadata.annotations = annotations(&[(LAST_APPLIED_ANNOTATION, "{}"), ("keep", "me")]);
        let p = application_payload(&a, false);
        assert!(p.status.is_none() && p.operation.is_none());
        assert!(p.metadata.managed_fields.is_none());
        assert_eq!(p.metadata.annotations, annotations(&[("keep", "me")]));
        assert!(application_payload(&a, true).operation.is_some());
    }

    #[test]
    fn operation_already_started_compares_with_operation_state() {
        let mut a = app("v1");
        a.operation = Some(json!({"sync": {"revision": "r1"}}));
        assert!(!operation_already_started(&a));
        a.status = serde_json::from_value(
            json!({"operationState": {"operation": {"sync": {"revision": "r1"}}, "phase": "Running"}}),
        )
        .unwrap();
        assert!(operation_already_started(&a));
    }

    #[test]
    fn project_matching_needs_a_destination_and_a_source_namespace_as_upstream() {
        let p = project(
            json!({"spec": {"destinations": [{"name": "agent-*", "namespace": "guestbook"}],
                                 "sourceNamespaces": ["agent-1", "team-a"]}}),
        );
        assert!(project_matches_agent(&p, "agent-1"), "both halves match");
        assert!(
            !project_matches_agent(&p, "agent-2"),
            "destination matches, source namespace does not"
        );
        assert!(
            !project_matches_agent(&p, "team-a"),
            "source namespace matches, destination does not"
        );
        assert!(!project_matches_agent(&p, "other"));
        let no_sources = project(json!({"spec": {"destinations": [{"name": "*"}]}}));
        assert!(destinations_match_agent(&no_sources, "agent-1"));
        assert!(
            !project_matches_agent(&no_sources, "agent-1"),
            "no sourceNamespaces: no agent under namespace mapping"
        );
    }

    #[test]
    fn source_namespaces_match_by_glob_or_slash_delimited_regex() {
        let p = project(json!({"spec": {"sourceNamespaces": ["ship-?", "/^fleet-[0-9]+$/"]}}));
        assert!(source_namespaces_match_agent(&p, "ship-1"));
        assert!(!source_namespaces_match_agent(&p, "ship-10"));
        assert!(source_namespaces_match_agent(&p, "fleet-42"));
        assert!(!source_namespaces_match_agent(&p, "fleet-x"));
        let unanchored = project(json!({"spec": {"sourceNamespaces": ["/east/"]}}));
        assert!(source_namespaces_match_agent(&unanchored, "us-east-1"));
    }

    /// Go's `url.Parse(s).Query().Get("agentName")` for each URL (checked against Go 1.x's
    /// net/url rules: decoding, `+`, first value wins, pairs with `;` or bad escapes dropped).
    #[test]
    fn server_agent_name_reads_the_query_as_gos_url_query_get() {
        let cases: &[(&str, Option<&str>)] = &[
            ("https://p:9090?agentName=agent-1", Some("agent-1")),
            ("https://p:9090?agentName=agent%2D1", Some("agent-1")),
            ("https://p:9090?agentName=agent%2d1", Some("agent-1")),
            ("https://p:9090?agentName=a+b", Some("a b")),
            ("https://p:9090?agentName=a%2Bb", Some("a+b")),
            ("https://p:9090?agent%4Eame=x", Some("x")),
            (
                "https://p:9090?agentName=first&agentName=second",
                Some("first"),
            ),
            ("https://p:9090?agentName=&agentName=second", None),
            (
                "https://p:9090?agentName=bad%zz&agentName=second",
                Some("second"),
            ),
            (
                "https://p:9090?agentName=a;b&agentName=second",
                Some("second"),
            ),
            ("https://p:9090?x=1&agentName=agent-*#frag", Some("agent-*")),
            ("https://p:9090#agentName=x", None),
            ("https://p:9090?agentname=x", None),
            ("https://p:9090?agentName", None),
            ("https://p:9090", None),
            ("https://p:9090?agentName=a\u{7f}", None),
        ];
        for (url, want) in cases {
            assert_eq!(server_agent_name(url).as_deref(), *want, "{url:?}");
        }
        let encoded = project(
            json!({"spec": {"destinations": [{"server": "https://proxy:9090?agentName=agent%2D%2A"}]}}),
        );
        assert!(
            destinations_match_agent(&encoded, "agent-7"),
            "decoded before globbing"
        );
    }

    #[test]
    fn destination_matching_follows_names_servers_and_denials() {
        let denied =
            project(json!({"spec": {"destinations": [{"name": "*"}, {"name": "!agent-2"}]}}));
        assert!(destinations_match_agent(&denied, "agent-1"));
        assert!(!destinations_match_agent(&denied, "agent-2"));
        let by_url = project(
            json!({"spec": {"destinations": [{"server": "https://proxy:9090?agentName=agent-9"}]}}),
        );
        assert!(destinations_match_agent(&by_url, "agent-9"));
        assert!(!destinations_match_agent(&by_url, "agent-90"));
        let url_glob = project(
            json!({"spec": {"destinations": [{"server": "https://proxy:9090?x=1&agentName=agent-*"}]}}),
        );
        assert!(destinations_match_agent(&url_glob, "agent-90"));
        let brackets = project(json!({"spec": {"destinations": [
            {"name": "agent-[12]"}, {"name": "!{agent-2,agent-3}"}]}}));
        assert!(destinations_match_agent(&brackets, "agent-1"));
        assert!(
            !destinations_match_agent(&brackets, "agent-2"),
            "denied by a brace glob"
        );
        assert!(!destinations_match_agent(&brackets, "agent-4"));
        let any_server = project(json!({"spec": {"destinations": [{"server": "*"}]}}));
        assert!(destinations_match_agent(&any_server, "whoever"));
        let plain_server = project(
            json!({"spec": {"destinations": [{"server": "https://kubernetes.default.svc"}]}}),
        );
        assert!(!destinations_match_agent(&plain_server, "agent-1"));
        let named_wins = project(json!({"spec": {"destinations": [
            {"name": "other", "server": "https://proxy:9090?agentName=agent-1"}]}}));
        assert!(
            !destinations_match_agent(&named_wins, "agent-1"),
            "a named destination is matched by its name only"
        );
    }

    #[test]
    fn agent_copy_of_a_project_points_at_in_cluster_and_has_no_roles() {
        let p = project(json!({"metadata": {"name": "p"}, "spec": {
            "destinations": [{"name": "agent-1", "namespace": "gb"}, {"name": "other", "namespace": "x"}],
            "roles": [{"name": "r"}], "sourceNamespaces": ["agent-1"]}, "status": {"x": 1}}));
        let c = project_for_agent(&p, "agent-1");
        assert_eq!(
            to_value(&c.spec.destinations),
            json!([{"name": "in-cluster", "server": "https://kubernetes.default.svc", "namespace": "gb"}])
        );
        assert!(c.spec.roles.is_none() && c.spec.source_namespaces.is_empty());
        assert!(c.status.is_none());
        assert_eq!(c.metadata.name.as_deref(), Some("p"));
    }

    #[test]
    fn autonomous_application_mirror_is_renamed_into_the_agent_namespace() {
        let spoke = json!({"metadata": {"name": "web", "namespace": "argocd", "uid": "s1",
            "finalizers": ["x"], "labels": {"a": "1"}},
            "spec": {"project": "team", "destination": {"server": "https://kubernetes.default.svc", "namespace": "web"}},
            "status": {"sync": {"status": "Synced"}}});
        let m = mirror_application(&typed(&spoke), "ship1");
        assert_eq!(m.namespace_str(), "ship1");
        assert_eq!(m.annotation("argocd.argoproj.io/source-uid"), Some("s1"));
        assert_eq!(m.spec.project.as_deref(), Some("ship1-team"));
        assert_eq!(
            to_value(&m.spec.destination),
            json!({"name": "ship1", "namespace": "web"})
        );
        assert_eq!(m.status, typed(&spoke).status);
        assert!(m.metadata.finalizers.is_none());
    }

    #[test]
    fn autonomous_project_mirror_rewrites_destinations_namespaces_and_policies() {
        let spoke = json!({"metadata": {"name": "team", "uid": "p1"},
            "spec": {"destinations": [{"server": "*", "namespace": "web"}],
                     "roles": [{"name": "ci", "policies": ["p, proj:team:ci, applications, sync, team/*, allow"]}]}});
        let m = mirror_project(&project(spoke), "ship1", "argocd");
        assert_eq!((m.name_str(), m.namespace_str()), ("ship1-team", "argocd"));
        assert_eq!(m.spec.source_namespaces, ["ship1"]);
        assert_eq!(
            to_value(&m.spec.destinations),
            json!([{"name": "ship1", "server": "*", "namespace": "*"}])
        );
        assert_eq!(
            m.spec.roles.as_ref().unwrap()[0].policies.as_ref().unwrap()[0],
            "p, proj:ship1-team:ci, applications, sync, ship1-team/ship1/*, allow"
        );
    }

    #[test]
    fn a_mirror_view_ignores_refresh_requests_and_empty_metadata_but_not_spec_edits() {
        let spoke = json!({"metadata": {"name": "web", "uid": "s1"},
            "spec": {"project": "team", "destination": {"namespace": "web"}}});
        let mirror = mirror_application(&typed(&spoke), "ship1");
        let mut refreshed = mirror.clone();
        refreshed.metadata.labels = Some(Default::default());
        refreshed.metadata.resource_version = Some("9".into());
        refreshed
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(REFRESH_ANNOTATION.into(), "normal".into());
        assert_eq!(mirror_view(&refreshed), mirror_view(&mirror));
        let mut edited = mirror.clone();
        edited.spec.project = Some("elsewhere".into());
        assert_ne!(mirror_view(&edited), mirror_view(&mirror));
    }

    #[test]
    fn a_repository_payload_drops_managed_fields_and_last_applied_only() {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "repo", "managedFields": [{}],
                         "annotations": {LAST_APPLIED_ANNOTATION: "{}", "keep": "me"}},
            "type": "Opaque",
            "data": {"project": "dGVhbS1h", "url": "eA=="}
        }))
        .unwrap();
        let payload = repository_payload(&secret);
        assert!(payload.metadata.managed_fields.is_none());
        assert_eq!(
            payload.metadata.annotations,
            Some([("keep".to_string(), "me".to_string())].into())
        );
        assert_eq!(payload.data, secret.data);
        assert_eq!(payload.type_, secret.type_);
    }
}
