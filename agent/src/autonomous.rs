//! Autonomous mode on the spoke: the spoke is the source of truth for Applications and
//! AppProjects (spec and status); the principal keeps mirrors of them on the hub.
//!
//! Owns: [`AutonomousSync`], the observer of the agent namespace's informers
//! ([`crate::spoke_watch`]) that reports every new Application or AppProject as a `create`, every
//! change of one as a `spec-update` (spec and status together) and every deletion as a `delete`,
//! and the [`EventHandler`] for what the principal sends an autonomous agent: resync
//! questions (`request-update` with the mirror's checksum, `request-synced-resource-list` with
//! the checksum of the hub's key set) and the operations users request on a hub mirror
//! (`set-operation`, `terminate-operation`, `spec-update` carrying the refresh annotation), which
//! run here. Local objects are never overwritten from the hub: the owner wins. Objects labelled
//! skip-sync ([`argocd_agent_kube::skip_sync`]) are not watched and count as absent: one that
//! gains the label is reported deleted, as upstream's agent does.
//!
//! Behind upstream's principal, whose `request-update` carries the mirror's spec checksum
//! (upstream's resync compares specs only) instead of ours over everything the spoke owns, an
//! object whose spec matches is sent only when what that checksum does not cover (status,
//! operation, labels, annotations) changed since it was last reported ([`crate::reported`], kept
//! across restarts): an unchanged fleet resyncs with no resends, a status that changed while the
//! agent was down is still sent, once.
//!
//! Restart: what was queued survives in the durable outbox; what changed while the process was
//! down is found by the principal's checksum resync on connect, so the first list after start
//! only records what it sees, unless the outbox was lost ([`AutonomousSync::new`]'s
//! `full_resync`), in which case everything is sent once; once every kind was listed, the agent
//! asks for one more resync, which finds what was created while the first list ran. The agent
//! connects to the principal only after that first list ([`AutonomousSync::wait_listed`]), so
//! what is created once the agent is connected is always queued.
//!
//! AppProjects are the exception: the first list sends each one whose content differs from what
//! an earlier run reported (or was never reported), as upstream's agent sends every object on
//! start. Upstream's principal (v0.9.0, `internal/resync`) cannot find a spoke project through
//! its resync: it looks the spoke's name up in its own namespace, where the mirror is
//! `<agent>-<name>`, so it fails on a name the hub also has (`default`, which argocd-server
//! always creates: "source UID annotation not found") and the mirror would never be written, and
//! the hub's argocd-server refuses every operation on the mirrored Applications ("app is not
//! allowed in project"). Projects are few; an unchanged one costs nothing on restart.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use argocd_agent_proto::event::{
    set_checksum, spec_checksum, Event, EventType, ResourceKey, AGENT_SOURCE,
};
use argocd_agent_proto::payload::{RequestSyncedResourceList, RequestUpdate, SyncedResource};
use argocd_agent_proto::sync::resync::{owned_checksum, synced_resource_key, RESYNC_REQUEST_KEY};
use argocd_agent_proto::sync::{keyed_request, EventHandler, HandleError, Outbox};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch};
use serde_json::json;
use tracing::{debug, info, warn};

use argocd_agent_kube::argocd::{Application, ObjectMetaExt};
use argocd_agent_kube::errors::{handle_error, is_not_found};
use argocd_agent_kube::skip_sync::{is_skip_sync, without_skip_sync};

use crate::managed::patch_params;
use crate::reported::Reported;
use crate::spoke_copy::{SpokeObject, SyncedKind, REFRESH_ANNOTATION};
use crate::spoke_watch::{SpokeInformers, SpokeObserver};

/// The spoke side of autonomous mode (see the module docs). Share it as `Arc<AutonomousSync>`.
pub struct AutonomousSync {
    namespace: String,
    label_selector: Option<String>,
    apps: Api<SpokeObject>,
    projects: Api<SpokeObject>,
    /// What the spoke holds, per kind, as the watch last saw it.
    spoke: SpokeInformers,
    outbox: Arc<Outbox>,
    state: Mutex<SentState>,
}

#[derive(Debug, Default)]
struct SentState {
    /// Checksum of what was last reported per (kind, name).
    sent: HashMap<(SyncedKind, String), Vec<u8>>,
    /// Kinds whose first list since start still only records (no full resync asked).
    record_only: HashSet<SyncedKind>,
    /// uid and resourceVersion of the newest object queued per (kind, name): a resync answer
    /// built from a read older than what the watch already queued must not replace it.
    newest: HashMap<(SyncedKind, String), (String, u64)>,
    /// What was last reported per object, across restarts.
    reported: Reported,
}

/// Whether the spoke object whose [`owned_checksum`] is `owned` and spec checksum `spec` must be
/// sent to answer a `request-update` carrying `asked`: ours asks with the owned checksum, equal
/// when nothing differs; upstream's principal asks with the mirror's spec checksum, and then
/// an equal spec still needs the object when what it does not compare changed since it was last
/// reported (`last_reported`, `None` when unknown).
fn mirror_differs(
    owned: &[u8],
    spec: Option<&[u8]>,
    asked: &[u8],
    last_reported: Option<&[u8]>,
) -> bool {
    let spec_equal = spec == Some(asked);
    owned != asked && !(spec_equal && last_reported == Some(owned))
}

/// The spec checksum upstream's principal (v0.9.0, `internal/resync`) sends in its
/// `request-update` for the hub mirror of Application `json`: its spec as that principal writes
/// it, the project prefixed with the agent's name (`agentPrefixedProjectName`), which is the
/// mirror's namespace, `mirror_namespace`, the request's own (the destination it rewrites too is
/// left out of the checksum). `None` for AppProjects (upstream rewrites more of their mirrors:
/// they are compared by our checksum alone, as before) and without a namespace.
fn upstream_mirror_spec_checksum(
    kind: SyncedKind,
    json: &serde_json::Value,
    mirror_namespace: &str,
) -> Option<Vec<u8>> {
    if kind != SyncedKind::Application || mirror_namespace.is_empty() {
        return None;
    }
    let mut mirror = serde_json::json!({ "spec": json.get("spec")?.clone() });
    let project = mirror
        .pointer("/spec/project")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    mirror["spec"]["project"] = format!("{mirror_namespace}-{project}").into();
    spec_checksum(&mirror, Some(kind.kind())).ok()
}

/// `metadata.resourceVersion` as a number (etcd revisions are; `None` when it is not).
fn resource_version(obj: &SpokeObject) -> Option<u64> {
    obj.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
}

fn rejected(e: impl std::fmt::Display) -> HandleError {
    HandleError::Rejected(e.to_string())
}

impl AutonomousSync {
    /// Autonomous sync of `namespace`, of the objects `label_selector` selects that are not
    /// labelled skip-sync; `full_resync` sends every object once after start (the outbox of an
    /// earlier run was lost or damaged); `reported` is what earlier runs reported.
    pub fn new(
        client: kube::Client,
        namespace: String,
        label_selector: Option<String>,
        outbox: Arc<Outbox>,
        full_resync: bool,
        reported: Reported,
    ) -> Arc<Self> {
        let label_selector = Some(without_skip_sync(label_selector.as_deref()));
        let api = |kind: SyncedKind| {
            Api::namespaced_with(client.clone(), &namespace, &kind.api_resource())
        };
        let mut state = SentState {
            reported,
            ..SentState::default()
        };
        if !full_resync {
            state.record_only = HashSet::from([SyncedKind::Application, SyncedKind::AppProject]);
        }
        let spoke = SpokeInformers::new(
            &client,
            &namespace,
            [SyncedKind::Application, SyncedKind::AppProject]
                .map(|kind| (kind, label_selector.clone())),
        );
        Arc::new(AutonomousSync {
            apps: api(SyncedKind::Application),
            projects: api(SyncedKind::AppProject),
            spoke,
            namespace,
            label_selector,
            outbox,
            state: Mutex::new(state),
        })
    }

    fn lock(&self) -> MutexGuard<'_, SentState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The spoke API of a kind this agent owns; repositories and GPG keys are never synced in
    /// autonomous mode, so an event about one (from a confused or hostile peer) is refused as not
    /// for this mode (upstream's agent discards them), not acted on.
    fn api(&self, kind: SyncedKind) -> Result<&Api<SpokeObject>, HandleError> {
        match kind {
            SyncedKind::Application => Ok(&self.apps),
            SyncedKind::AppProject => Ok(&self.projects),
            SyncedKind::Repository => Err(HandleError::NotAllowed(
                "autonomous agents keep their own repositories; repository events are not accepted"
                    .into(),
            )),
            SyncedKind::GpgKey => Err(HandleError::NotAllowed(
                "autonomous agents keep their own GPG keys; GPG key events are not accepted".into(),
            )),
        }
    }

    fn push(&self, event: Event) -> Result<(), HandleError> {
        self.outbox.push(event).map_err(|e| {
            warn!(error = %e, "cannot queue an event for the principal");
            HandleError::Retryable(e.to_string())
        })
    }

    /// Queues the full object as a `create` (`new`: the principal has not been told about it
    /// by this process, or said it lacks it) or a `spec-update`, and remembers its checksum.
    ///
    /// Upstream's principal (v0.9.0, `principal/event.go`) only creates a mirror on `create`: a
    /// `spec-update` for an Application it does not have is acknowledged and dropped ("should
    /// exist before attempting to update"), so a new spoke object must be announced as `create`.
    /// Ours treats both alike, and `create` for an existing mirror updates it (upstream too).
    fn report(
        &self,
        kind: SyncedKind,
        obj: &SpokeObject,
        checksum: Vec<u8>,
        new: bool,
    ) -> Result<(), HandleError> {
        self.report_unless(kind, obj, checksum, new, |_| false)
            .map(|_| ())
    }

    /// [`report`](Self::report), unless `settled` says, under the same lock that records what was
    /// reported, that the principal already has it. Deciding and recording under one lock makes
    /// two requests about one object answered at once (upstream's principal can ask twice: each
    /// `request-update` has its own event id, so they run on different lanes) send it once.
    /// Returns whether the object was queued.
    fn report_unless(
        &self,
        kind: SyncedKind,
        obj: &SpokeObject,
        checksum: Vec<u8>,
        new: bool,
        settled: impl FnOnce(&SentState) -> bool,
    ) -> Result<bool, HandleError> {
        let event_type = if new {
            EventType::Create
        } else {
            EventType::SpecUpdate
        };
        let ev =
            Event::for_object(event_type, kind.target(), AGENT_SOURCE, obj).map_err(rejected)?;
        let key = (kind, obj.name_str().to_string());
        let (uid, version) = (obj.uid_str().to_string(), resource_version(obj));
        let mut st = self.lock();
        if settled(&st) {
            return Ok(false);
        }
        if let (Some((newest_uid, newest)), Some(v)) = (st.newest.get(&key), version) {
            if *newest_uid == uid && v < *newest {
                debug!(kind = %kind, name = %key.1, "not queuing an older read of the object");
                return Ok(false);
            }
        }
        self.push(ev)?;
        if let Some(v) = version {
            st.newest.insert(key.clone(), (uid, v));
        }
        st.reported.set(kind, &key.1, &checksum);
        st.sent.insert(key, checksum);
        Ok(true)
    }

    fn report_deleted(&self, kind: SyncedKind, name: &str, uid: &str) -> Result<(), HandleError> {
        let stub = SpokeObject {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.namespace.clone()),
                uid: Some(uid.to_string()),
                ..ObjectMeta::default()
            },
            other: kind.type_meta(),
            ..SpokeObject::default()
        };
        let ev = Event::for_object(EventType::Delete, kind.target(), AGENT_SOURCE, &stub)
            .map_err(rejected)?;
        self.push(ev)?;
        let mut st = self.lock();
        st.reported.remove(kind, name);
        st.sent.remove(&(kind, name.to_string()));
        st.newest.remove(&(kind, name.to_string()));
        Ok(())
    }

    // ---- spoke watch --------------------------------------------------------------------

    /// Watches Applications and AppProjects in the agent namespace until the future is dropped.
    pub async fn run_watchers(self: Arc<Self>) {
        self.spoke.run(&self).await
    }

    /// Waits until the spoke watches hold their first list (see [`run_watchers`](Self::run_watchers)).
    pub async fn wait_listed(&self) {
        self.spoke.wait_listed().await
    }

    fn on_applied(&self, kind: SyncedKind, live: &SpokeObject) {
        let name = live.name_str();
        let checksum = owned_checksum(&live.to_json());
        let (record_only, new) = {
            let mut st = self.lock();
            let sent = st.sent.get(&(kind, name.to_string()));
            if sent == Some(&checksum) {
                return;
            }
            let new = sent.is_none();
            // A project not reported as it is now is sent even in the first list (module docs).
            let unreported_project = kind == SyncedKind::AppProject
                && st.reported.get(kind, name) != Some(checksum.as_slice());
            let record_only = st.record_only.contains(&kind) && !unreported_project;
            if record_only {
                st.sent.insert((kind, name.to_string()), checksum.clone());
            }
            (record_only, new)
        };
        if record_only {
            return;
        }
        match self.report(kind, live, checksum, new) {
            Ok(()) => {
                debug!(kind = %kind, namespace = %self.namespace, name, "queued the object for the principal (create or spec-update)")
            }
            Err(e) => {
                warn!(kind = %kind, namespace = %self.namespace, name, error = %e, "cannot report a change to the principal; the next resync will")
            }
        }
    }

    fn on_gone(&self, kind: SyncedKind, name: &str, uid: &str) {
        info!(kind = %kind, namespace = %self.namespace, name, "spoke object deleted; telling the principal");
        if let Err(e) = self.report_deleted(kind, name, uid) {
            warn!(kind = %kind, name, error = %e, "cannot report a deletion to the principal; the next resync will");
        }
    }

    // ---- principal -> spoke -------------------------------------------------------------

    /// The live spoke object `kind`/`name`; one labelled skip-sync counts as absent, as the
    /// watch does not see it either.
    async fn live(&self, kind: SyncedKind, name: &str) -> Result<Option<SpokeObject>, HandleError> {
        self.api(kind)?
            .get_opt(name)
            .await
            .map(|o| {
                o.filter(|o| !is_skip_sync(&o.metadata))
                    .map(SpokeObject::without_managed_fields)
            })
            .map_err(|e| handle_error(format!("reading spoke {kind} {}/{name}", self.namespace), e))
    }

    /// request-update: the hub mirror's checksum against the live object; answers with the
    /// object when they differ, with `delete` when the object is gone (or is another one now).
    async fn answer_request_update(&self, req: RequestUpdate) -> Result<(), HandleError> {
        let kind = match req.kind.as_str() {
            "Application" => SyncedKind::Application,
            "AppProject" => SyncedKind::AppProject,
            other => {
                return Err(rejected(format!(
                    "request-update for unsupported kind {other:?}"
                )))
            }
        };
        match self.live(kind, &req.name).await? {
            Some(live) if live.uid_str() == req.uid || req.uid.is_empty() => {
                let json = live.to_json();
                let checksum = owned_checksum(&json);
                // With no uid the principal has no mirror (it asked after our key list).
                let spec = (!req.uid.is_empty())
                    .then(|| upstream_mirror_spec_checksum(kind, &json, &req.namespace))
                    .flatten();
                let owned = checksum.clone();
                // No uid in the request: announced as new.
                let sent = self.report_unless(kind, &live, checksum, req.uid.is_empty(), |st| {
                    let last = st.reported.get(kind, &req.name);
                    !mirror_differs(&owned, spec.as_deref(), &req.checksum, last)
                })?;
                if sent {
                    debug!(kind = %kind, name = %req.name, "hub mirror differed; sent the spoke's object");
                }
                Ok(())
            }
            _ => {
                debug!(kind = %kind, name = %req.name, "hub mirrors an object the spoke no longer has");
                self.report_deleted(kind, &req.name, &req.uid)
            }
        }
    }

    /// request-synced-resource-list: when the hub's key set differs from the spoke's, list every
    /// spoke key so the principal can ask for the objects it lacks.
    async fn answer_key_list(&self, req: RequestSyncedResourceList) -> Result<(), HandleError> {
        let mut params = ListParams::default();
        if let Some(sel) = &self.label_selector {
            params = params.labels(sel);
        }
        let mut keys = Vec::new();
        for kind in [SyncedKind::Application, SyncedKind::AppProject] {
            let list = self.api(kind)?.list(&params).await.map_err(|e| {
                handle_error(format!("listing spoke {kind}s in {}", self.namespace), e)
            })?;
            keys.extend(
                list.items
                    .iter()
                    .map(|o| ResourceKey::new(kind.kind(), o.name_str(), "", o.uid_str())),
            );
        }
        if set_checksum(&keys) == req.checksum {
            debug!(
                objects = keys.len(),
                "the hub mirrors exactly the spoke's objects"
            );
            return Ok(());
        }
        info!(
            objects = keys.len(),
            "the hub's mirrors differ from the spoke's objects; listing them for the principal"
        );
        for key in &keys {
            let ev = Event::synced_resource(AGENT_SOURCE, &SyncedResource::from(key))
                .map_err(rejected)?;
            self.push(keyed_request(ev, synced_resource_key(&key.kind, &key.name)))?;
        }
        Ok(())
    }

    /// set-operation from a hub mirror: run it here.
    async fn set_operation(&self, mirror: &Application) -> Result<(), HandleError> {
        let name = mirror.name_str();
        let Some(operation) = mirror.operation() else {
            return Ok(());
        };
        match self
            .apps
            .patch(
                name,
                &patch_params(),
                &Patch::Merge(json!({ "operation": operation })),
            )
            .await
        {
            Ok(_) => {
                info!(namespace = %self.namespace, name, "started the operation requested on the hub");
                Ok(())
            }
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(handle_error(format!("setting the operation of {name}"), e)),
        }
    }

    async fn terminate_operation(&self, mirror: &Application) -> Result<(), HandleError> {
        let name = mirror.name_str();
        let patch = json!({"status": {"operationState": {"phase": "Terminating"}}});
        match self
            .apps
            .patch(name, &patch_params(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {
                info!(namespace = %self.namespace, name, "terminating the operation as requested on the hub");
                Ok(())
            }
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(handle_error(
                format!("terminating the operation of {name}"),
                e,
            )),
        }
    }

    /// spec-update from a hub mirror: only a refresh request is taken; the spec is the spoke's.
    async fn refresh(&self, mirror: &Application) -> Result<(), HandleError> {
        let name = mirror.name_str();
        let Some(refresh) = mirror.annotation(REFRESH_ANNOTATION) else {
            return Ok(());
        };
        let patch = json!({"metadata": {"annotations": {REFRESH_ANNOTATION: refresh}}});
        match self
            .apps
            .patch(name, &patch_params(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {
                info!(namespace = %self.namespace, name, "refresh requested on the hub");
                Ok(())
            }
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(handle_error(format!("requesting a refresh of {name}"), e)),
        }
    }

    /// Periodic resync from this side: asks the principal to compare its mirrors with the spoke.
    pub fn request_resync(&self) {
        match Event::request_resource_resync(AGENT_SOURCE) {
            Ok(ev) => {
                let _ = self.push(keyed_request(ev, RESYNC_REQUEST_KEY));
            }
            Err(e) => warn!(error = %e, "cannot build a resync request"),
        }
    }
}

impl SpokeObserver for AutonomousSync {
    async fn applied(self: &Arc<Self>, kind: SyncedKind, live: SpokeObject) {
        self.on_applied(kind, &live)
    }

    async fn gone(self: &Arc<Self>, kind: SyncedKind, last: SpokeObject) {
        self.on_gone(kind, last.name_str(), last.uid_str())
    }

    /// The first list since start is over: from now on every change is reported. Once every
    /// kind's first list is over, one more resync is asked for: an object created after the
    /// principal's resync on connect but before the first list ended was only recorded.
    async fn listed(self: &Arc<Self>, kind: SyncedKind) {
        let all_listed = {
            let mut st = self.lock();
            st.record_only.remove(&kind) && st.record_only.is_empty()
        };
        if all_listed {
            self.request_resync();
        }
    }
}

impl EventHandler for AutonomousSync {
    async fn handle(&self, event: Event) -> Result<(), HandleError> {
        match (&event.event_type, &event.target) {
            (EventType::Ping | EventType::Pong | EventType::Processed, _) => Ok(()),
            (EventType::RequestUpdate, _) => {
                self.answer_request_update(event.data_as().map_err(rejected)?)
                    .await
            }
            (EventType::RequestSyncedResourceList, _) => {
                self.answer_key_list(event.data_as().map_err(rejected)?)
                    .await
            }
            (EventType::Error, _) => {
                warn!(data = %String::from_utf8_lossy(event.data.as_deref().unwrap_or_default()),
                    "the principal reported an error");
                Ok(())
            }
            (t, target) if SyncedKind::from_target(target) == Some(SyncedKind::Application) => {
                let mirror: Application = event.data_as().map_err(rejected)?;
                match t {
                    EventType::SetOperation => self.set_operation(&mirror).await,
                    EventType::TerminateOperation => self.terminate_operation(&mirror).await,
                    EventType::SpecUpdate => self.refresh(&mirror).await,
                    other => Err(HandleError::for_mode(
                        &event,
                        format!(
                            "an autonomous agent owns its Applications and does not take {} events from the hub",
                            other.name()
                        ),
                    )),
                }
            }
            (t, target) => {
                let msg = format!(
                    "an autonomous agent does not handle {} events for target {:?}",
                    t.name(),
                    target.as_str()
                );
                Err(HandleError::for_mode(&event, msg))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spoke_watch::seam::{drain, object, unreachable_client, watch_history};
    use argocd_agent_proto::sync::OutboxConfig;

    /// An autonomous sync of namespace `ns` through `client` and the outbox it queues to.
    fn sync_over(
        client: kube::Client,
        full_resync: bool,
        reported: Reported,
    ) -> (Arc<AutonomousSync>, Arc<Outbox>) {
        let outbox = Arc::new(Outbox::new(OutboxConfig::default()));
        let sync = AutonomousSync::new(
            client,
            "ns".into(),
            None,
            outbox.clone(),
            full_resync,
            reported,
        );
        (sync, outbox)
    }

    fn app(rev: &str, resource_version: &str) -> SpokeObject {
        object(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": resource_version},
            "spec": {"source": {"targetRevision": rev}},
        }))
    }

    fn named(name: &str, rev: &str) -> SpokeObject {
        let mut obj = app(rev, "1");
        obj.metadata.name = Some(name.to_string());
        obj.metadata.uid = Some(format!("u-{name}"));
        obj
    }

    #[test]
    fn behind_a_principal_comparing_specs_only_an_equal_spec_is_sent_only_when_the_rest_changed() {
        let (owned, spec, other) = (&[1u8][..], &[2u8][..], &[3u8][..]);
        // Ours asks with the owned checksum.
        assert!(!mirror_differs(owned, Some(spec), owned, None));
        assert!(mirror_differs(owned, Some(spec), other, Some(owned)));
        // Upstream's asks with the spec checksum: equal spec, nothing else changed since the
        // last report: nothing to send (an unchanged fleet resyncs without resends).
        assert!(!mirror_differs(owned, Some(spec), spec, Some(owned)));
        // Equal spec, but the status (or labels) changed since the last report, or no record.
        assert!(mirror_differs(owned, Some(spec), spec, Some(other)));
        assert!(mirror_differs(owned, Some(spec), spec, None));
        // Another spec.
        assert!(mirror_differs(owned, Some(spec), other, Some(owned)));
        // No mirror (no uid asked): always sent.
        assert!(mirror_differs(owned, None, spec, Some(owned)));
    }

    #[test]
    fn upstreams_mirror_spec_checksum_covers_the_prefixed_project_and_not_the_destination() {
        let spoke = json!({"spec": {"project": "default", "destination": {"server": "https://kubernetes.default.svc"},
                                    "source": {"path": "demo"}}});
        let mirror = json!({"kind": "Application", "spec": {"project": "agent-a-default",
                                    "destination": {"name": "agent-a"}, "source": {"path": "demo"}}});
        let upstream = spec_checksum(&mirror, None).unwrap();
        assert_eq!(
            upstream_mirror_spec_checksum(SyncedKind::Application, &spoke, "agent-a"),
            Some(upstream)
        );
        assert_eq!(
            upstream_mirror_spec_checksum(SyncedKind::AppProject, &spoke, "agent-a"),
            None
        );
    }

    #[tokio::test]
    async fn after_the_first_list_adds_changes_deletions_and_relist_vanishings_are_reported() {
        let (sync, outbox) = sync_over(unreachable_client(), false, Reported::default());
        // The first list only records (the principal's resync on connect finds what changed).
        let history = watch_history(|name, version| named(name, &format!("r{version}")));
        sync.spoke
            .feed(&sync, SyncedKind::Application, history)
            .await;
        assert_eq!(
            drain(&outbox),
            ["spec-update a", "create c", "delete b", "delete d"]
        );
    }

    /// The first list sends a project the earlier runs never reported, or reported otherwise,
    /// and only records one reported as it is (upstream's principal cannot resync projects).
    #[tokio::test]
    async fn the_first_list_sends_the_projects_not_reported_as_they_are() {
        let project = |name: &str, repo: &str| {
            object(json!({
                "apiVersion": "argoproj.io/v1alpha1",
                "kind": "AppProject",
                "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"), "resourceVersion": "1"},
                "spec": {"sourceRepos": [repo]},
            }))
        };
        let (same, changed, unknown) = (
            project("same", "*"),
            project("changed", "https://new"),
            project("default", "*"),
        );
        let mut reported = Reported::default();
        reported.set(
            SyncedKind::AppProject,
            "same",
            &owned_checksum(&same.to_json()),
        );
        reported.set(
            SyncedKind::AppProject,
            "changed",
            &owned_checksum(&project("changed", "https://old").to_json()),
        );
        let (sync, outbox) = sync_over(unreachable_client(), false, reported);
        use kube::runtime::watcher::Event::{Init, InitApply, InitDone};
        let first_list = vec![
            Init,
            InitApply(same),
            InitApply(changed),
            InitApply(unknown),
            InitDone,
        ];
        sync.spoke
            .feed(&sync, SyncedKind::AppProject, first_list)
            .await;
        assert_eq!(drain(&outbox), ["create changed", "create default"]);
    }

    #[tokio::test]
    async fn an_older_read_never_replaces_a_newer_queued_object() {
        let (sync, outbox) = sync_over(unreachable_client(), false, Reported::default());
        let (newer, older) = (app("r3", "12"), app("r2", "11"));
        sync.report(
            SyncedKind::Application,
            &newer,
            owned_checksum(&newer.to_json()),
            false,
        )
        .unwrap();
        sync.report(
            SyncedKind::Application,
            &older,
            owned_checksum(&older.to_json()),
            false,
        )
        .unwrap();
        outbox.set_connected(true);
        let queued = outbox.take_next(std::time::Instant::now()).expect("queued");
        let data: SpokeObject = queued.data_as().expect("object");
        assert_eq!(data, newer);
        assert!(outbox.take_next(std::time::Instant::now()).is_none());
    }

    #[tokio::test]
    async fn a_new_spoke_object_is_announced_as_create_and_later_changes_as_spec_update() {
        // Past the first list (full resync): every object seen is reported.
        let (sync, outbox) = sync_over(unreachable_client(), true, Reported::default());
        let (first, second) = (app("r1", "10"), app("r2", "11"));
        sync.on_applied(SyncedKind::Application, &first);
        sync.on_applied(SyncedKind::Application, &second);
        outbox.set_connected(true);
        let now = std::time::Instant::now;
        let created = outbox.take_next(now()).expect("create queued");
        assert_eq!(created.event_type, EventType::Create);
        assert!(outbox.ack(&created.ack()));
        let updated = outbox.take_next(now()).expect("spec-update queued");
        assert_eq!(updated.event_type, EventType::SpecUpdate);
    }

    /// A client whose apiserver answers every GET with `obj`, each answer held until `together`
    /// requests are in flight, so the answers to them are checked at the same moment.
    fn serving_together(obj: &SpokeObject, together: usize) -> kube::Client {
        let body = bytes::Bytes::from(serde_json::to_vec(obj).expect("json"));
        let barrier = Arc::new(tokio::sync::Barrier::new(together));
        let service = tower::service_fn(move |_req: http::Request<kube::client::Body>| {
            let (body, barrier) = (body.clone(), barrier.clone());
            async move {
                barrier.wait().await;
                let response = http::Response::builder()
                    .header("content-type", "application/json")
                    .body(http_body_util::Full::new(body))
                    .expect("response");
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        kube::Client::new(service, "ns")
    }

    /// Upstream's principal can ask about one mirror twice at once (two `request-update`s, two
    /// event ids, two lanes): the object whose status changed since it was last reported is sent
    /// once, not once per request (seen in e2e: the second answer had read the record before the
    /// first one updated it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn requests_about_one_mirror_answered_at_once_send_the_object_once() {
        const AT_ONCE: usize = 8;
        let live = app("r1", "7");
        let mut reported = Reported::default();
        reported.set(SyncedKind::Application, "a", &[9u8]);
        let (sync, outbox) = sync_over(serving_together(&live, AT_ONCE), true, reported);
        let spec = upstream_mirror_spec_checksum(SyncedKind::Application, &live.to_json(), "m")
            .expect("a spec checksum");
        let request = RequestUpdate {
            name: "a".into(),
            namespace: "m".into(),
            uid: "u1".into(),
            kind: "Application".into(),
            checksum: spec,
        };
        let answers = (0..AT_ONCE).map(|_| {
            let (sync, request) = (sync.clone(), request.clone());
            tokio::spawn(async move { sync.answer_request_update(request).await })
        });
        for answer in futures::future::join_all(answers).await {
            answer.expect("joined").expect("answered");
        }
        assert_eq!(drain(&outbox), ["spec-update a"]);
    }
}
