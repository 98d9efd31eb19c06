//! Managed mode on the spoke: the hub is the source of truth for spec, the spoke for status.
//!
//! Owns: [`ManagedSync`], which is both the [`EventHandler`] for what the principal sends
//! (create / spec-update / set-operation / terminate-operation / delete of Applications, and
//! create / spec-update / delete of AppProjects, repository Secrets and the hub's GPG keys
//! ConfigMap, and the checksum resync:
//! `request-resource-resync`, `response-synced-resource`) and the observer of the agent
//! namespace's informers ([`crate::spoke_watch`], whose stores say what the spoke holds) that
//! keeps the spoke honest: it reverts local drift, recreates objects deleted without the hub
//! asking, reports status changes as `status-update`, and confirms deletions the hub asked for
//! with a `delete` event. Also owns the in-memory cache of the last hub copy per object (by kind,
//! namespace and name) and the set of deletions the hub asked for. Which spoke namespace an
//! Application is kept in (the agent's, or under destination-based mapping its hub namespace) is
//! [`crate::placement`]'s decision. Every write is idempotent: events may be
//! redelivered. Pure decisions live in [`crate::drift`], the spoke copy in [`crate::spoke_copy`].
//!
//! Upstream's identity rules: each copy carries its hub object's uid (source-uid) and the sending
//! principal's identity (principal-uid, from the `principaluid` extension). A live copy with
//! another source uid is replaced or updated in place as [`crate::drift::mismatch_policy`]
//! decides; a local Application without a source uid is left alone (upstream) unless
//! `--adoption-policy=always` adopts it, and never with `--ignore-unmanaged-apps` (a local
//! AppProject or repository Secret without one is taken over, as upstream does); an Application deleted locally comes back with the status it
//! had, then `--on-application-recreate` clears its operation state or requests a sync. Objects
//! labelled skip-sync are not watched (a copy so labelled locally is drift: it disappears from
//! the watch, is found in place when recreated and reverted).
//!
//! Resync (reference §2.5): after the process starts, once every kind was listed, the hub copy
//! cache is seeded from the spoke copies found (so drift revert and recreation work for objects
//! the hub does not resend) and the agent sends a `request-update{spec checksum}` per object plus
//! `request-synced-resource-list{checksum of its keys}`; the principal answers only objects that
//! differ, deletes what it no longer has and lists its keys when the key sets differ, and the
//! agent then asks for each key it lacks. The same answer goes to the principal's
//! `request-resource-resync` and the periodic resync. Nothing unchanged crosses the link in full.
//! Each `request-update` also carries the checksum of the copy's labels and annotations (so
//! edits of them made while the agent was down make the principal resend the object, and the
//! upsert reverts them) and, for Applications, of its status: the first list after start
//! reports no status, and the principal asks (`request-update` to the agent) for those that
//! differ from the hub's, so a restart with nothing changed sends no status at all.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use argocd_agent_kube::argocd::{Application, ObjectMetaExt};
use argocd_agent_kube::errors::{handle_error, is_not_found};
use argocd_agent_kube::repository::REPOSITORY_SELECTOR;
use argocd_agent_kube::skip_sync::without_skip_sync;
use argocd_agent_proto::event::{
    set_checksum, spec_checksum, Event, EventType, ResourceKey, AGENT_SOURCE,
    PRINCIPAL_UID_ANNOTATION,
};
use argocd_agent_proto::payload::{ErrorData, RequestUpdate, SyncedResource};
use argocd_agent_proto::sync::resync::{
    metadata_checksum, needs_object, request_update_key, status_checksum, with_checksum,
    METADATA_CHECKSUM, RESYNC_REQUEST_KEY, STATUS_CHECKSUM,
};
use argocd_agent_proto::sync::{keyed_request, EventHandler, HandleError, Outbox};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::config::{AdoptionPolicy, AgentConfig, RecreateAction, SourceUidMismatchPolicy};
use crate::drift::{
    mismatch_policy, needs_revert, on_deleted, recreated_from, status_report, CachedCopy,
    DeletedAction, StatusReport,
};
use crate::placement::{AppPlacement, Placed, NAMESPACE_REMAPPED_ANNOTATION};
use crate::spoke_copy::{
    managed_view, matches_desired, replacement_body, reported_view, spoke_copy,
    with_requested_operation, PackedObject, ReportedView, SpokeObject, SyncedKind,
};
use crate::spoke_watch::{SpokeInformers, SpokeObserver};

/// Field manager of every write the agent makes.
pub const FIELD_MANAGER: &str = "argocd-agent";

/// What managed mode needs from the configuration.
#[derive(Debug, Clone, Default)]
pub struct ManagedSettings {
    /// The agent's Argo CD namespace, where spoke copies live.
    pub namespace: String,
    /// What to do with a same-named local object the hub did not create.
    pub adoption_policy: AdoptionPolicy,
    /// What to do with a local object carrying another hub object's uid.
    pub source_uid_mismatch_policy: SourceUidMismatchPolicy,
    /// Only watch local objects matching this selector.
    pub label_selector: Option<String>,
    /// Leave local Applications the hub did not create alone (never adopt them).
    pub ignore_unmanaged_apps: bool,
    /// What follows the recreation of an Application deleted locally.
    pub on_application_recreate: RecreateAction,
}

impl ManagedSettings {
    /// Settings from the validated configuration.
    pub fn from_config(config: &AgentConfig) -> Self {
        ManagedSettings {
            namespace: config.namespace.clone(),
            adoption_policy: config.adoption_policy,
            source_uid_mismatch_policy: config.source_uid_mismatch_policy,
            // Objects labelled skip-sync are not watched, as upstream's agent does not.
            label_selector: Some(without_skip_sync(config.label_selector.as_deref())),
            ignore_unmanaged_apps: config.ignore_unmanaged_apps,
            on_application_recreate: config.on_application_recreate,
        }
    }

    /// The label selector for listing and watching `kind`: `--label-selector`, and for Secrets
    /// only repository and repo-creds ones.
    fn selector(&self, kind: SyncedKind) -> Option<String> {
        let own = self.label_selector.clone();
        if kind != SyncedKind::Repository {
            return own;
        }
        Some(match own {
            Some(sel) if !sel.is_empty() => format!("{REPOSITORY_SELECTOR},{sel}"),
            _ => REPOSITORY_SELECTOR.to_string(),
        })
    }
}

/// Identity of a spoke object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ObjectKey {
    kind: SyncedKind,
    namespace: String,
    name: String,
}

impl ObjectKey {
    fn new(kind: SyncedKind, namespace: &str, name: &str) -> Self {
        ObjectKey {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// The key of spoke object `obj` of `kind`.
    fn of(kind: SyncedKind, obj: &SpokeObject) -> Self {
        ObjectKey::new(kind, obj.namespace_str(), obj.name_str())
    }
}

#[derive(Debug, Default)]
struct SpokeState {
    /// Last hub copy per object.
    cache: HashMap<ObjectKey, CachedCopy>,
    /// Deletions the hub asked for and the watcher has not seen complete yet.
    expected_deletions: HashSet<ObjectKey>,
    /// Copies the agent deleted to create them again from a newer hub object (source-uid
    /// mismatch, `recreate`): not an unauthorised deletion once gone.
    replacing: HashSet<ObjectKey>,
    /// Status/operation view last reported per Application.
    reported: HashMap<ObjectKey, ReportedView>,
    /// Kinds whose first list since start completed.
    listed: HashSet<SyncedKind>,
}

const ALL_KINDS: [SyncedKind; 4] = [
    SyncedKind::Application,
    SyncedKind::AppProject,
    SyncedKind::Repository,
    SyncedKind::GpgKey,
];

/// The hub copy a live spoke copy was written from (what [`spoke_copy`] produced): seeds the cache
/// after a restart, when the hub does not resend objects whose checksums match.
fn hub_copy_of_live(kind: SyncedKind, live: &SpokeObject) -> SpokeObject {
    live.kept_parts(kind, live.metadata.namespace.clone())
}

/// The spoke side of managed mode (see the module docs). Share it as `Arc<ManagedSync>`.
pub struct ManagedSync {
    settings: ManagedSettings,
    client: kube::Client,
    placement: Arc<AppPlacement>,
    apps: Api<SpokeObject>,
    projects: Api<SpokeObject>,
    repositories: Api<SpokeObject>,
    gpg_keys: Api<SpokeObject>,
    /// The Applications of the agent namespace again, typed, for the operations only an
    /// Application has.
    applications: Api<Application>,
    /// What the spoke holds, per kind, as the watch last saw it.
    spoke: SpokeInformers,
    outbox: Arc<Outbox>,
    state: Mutex<SpokeState>,
}

fn write_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    }
}

pub(crate) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

impl ManagedSync {
    /// Managed sync over `client`, queueing outbound events into `outbox`; every Application in
    /// the agent namespace.
    pub fn new(client: kube::Client, settings: ManagedSettings, outbox: Arc<Outbox>) -> Arc<Self> {
        let placement = Arc::new(AppPlacement::namespaced(&settings.namespace));
        ManagedSync::placed(client, settings, placement, outbox)
    }

    /// [`ManagedSync::new`] keeping Applications where `placement` says.
    pub fn placed(
        client: kube::Client,
        settings: ManagedSettings,
        placement: Arc<AppPlacement>,
        outbox: Arc<Outbox>,
    ) -> Arc<Self> {
        let apps = Api::namespaced_with(
            client.clone(),
            &settings.namespace,
            &SyncedKind::Application.api_resource(),
        );
        let projects = Api::namespaced_with(
            client.clone(),
            &settings.namespace,
            &SyncedKind::AppProject.api_resource(),
        );
        let repositories = Api::namespaced_with(
            client.clone(),
            &settings.namespace,
            &SyncedKind::Repository.api_resource(),
        );
        let gpg_keys = Api::namespaced_with(
            client.clone(),
            &settings.namespace,
            &SyncedKind::GpgKey.api_resource(),
        );
        let applications = Api::namespaced(client.clone(), &settings.namespace);
        let spoke = SpokeInformers::placed(
            &client,
            &settings.namespace,
            ALL_KINDS.map(|kind| (kind, settings.selector(kind))),
            Some(placement.clone()),
        );
        Arc::new(ManagedSync {
            settings,
            client,
            placement,
            apps,
            projects,
            repositories,
            gpg_keys,
            applications,
            spoke,
            outbox,
            state: Mutex::new(SpokeState::default()),
        })
    }

    /// The last hub copy received for `kind`/`name` (the spoke copy the agent keeps in place).
    pub fn cached_copy(&self, kind: SyncedKind, name: &str) -> Option<SpokeObject> {
        self.lock()
            .cache
            .get(&ObjectKey::new(kind, &self.settings.namespace, name))
            .map(CachedCopy::desired)
    }

    fn lock(&self) -> MutexGuard<'_, SpokeState> {
        // No invariant spans a panic here; keep going with what is there.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn api(&self, kind: SyncedKind) -> &Api<SpokeObject> {
        match kind {
            SyncedKind::Application => &self.apps,
            SyncedKind::AppProject => &self.projects,
            SyncedKind::Repository => &self.repositories,
            SyncedKind::GpgKey => &self.gpg_keys,
        }
    }

    /// The API of `kind` in spoke namespace `namespace`.
    fn api_in(&self, kind: SyncedKind, namespace: &str) -> Api<SpokeObject> {
        if namespace == self.settings.namespace {
            return self.api(kind).clone();
        }
        Api::namespaced_with(self.client.clone(), namespace, &kind.api_resource())
    }

    /// The typed Applications of spoke namespace `namespace`.
    fn applications_in(&self, namespace: &str) -> Api<Application> {
        if namespace == self.settings.namespace {
            return self.applications.clone();
        }
        Api::namespaced(self.client.clone(), namespace)
    }

    /// The API listing every spoke object of `kind` the agent keeps (Applications under
    /// destination-based mapping: every namespace; the caller keeps those placement admits).
    fn list_api(&self, kind: SyncedKind) -> Api<SpokeObject> {
        if kind == SyncedKind::Application && self.placement.destination_mapping() {
            return Api::all_with(self.client.clone(), &kind.api_resource());
        }
        self.api(kind).clone()
    }

    /// Where the spoke copy of hub object `hub` of `kind` is kept, or why it may not be.
    fn place(&self, kind: SyncedKind, hub: &SpokeObject) -> Result<Placed, String> {
        self.place_from(kind, hub.namespace_str())
    }

    /// [`ManagedSync::place`] of a hub object in hub namespace `hub_namespace`.
    fn place_from(&self, kind: SyncedKind, hub_namespace: &str) -> Result<Placed, String> {
        match kind {
            SyncedKind::Application => self.placement.place(hub_namespace),
            _ => Ok(Placed {
                namespace: self.settings.namespace.clone(),
                remapped: false,
            }),
        }
    }

    /// The spoke copy of `hub` where `placed` says, marked when it was remapped.
    fn desired_copy(
        &self,
        kind: SyncedKind,
        hub: &SpokeObject,
        placed: &Placed,
        principal_uid: Option<&str>,
    ) -> Result<SpokeObject, HandleError> {
        let mut desired = spoke_copy(kind, hub, &placed.namespace)
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        if let Some(uid) = principal_uid.filter(|u| !u.is_empty()) {
            desired
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(PRINCIPAL_UID_ANNOTATION.into(), uid.into());
        }
        if placed.remapped {
            desired
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(NAMESPACE_REMAPPED_ANNOTATION.into(), "true".into());
        }
        Ok(desired)
    }

    /// The namespace a request about spoke object `obj` of `kind` names (the hub's, see
    /// [`AppPlacement::hub_namespace_of`]).
    fn request_namespace(&self, kind: SyncedKind, obj: &SpokeObject) -> String {
        match kind {
            SyncedKind::Application => self.placement.hub_namespace_of(&obj.metadata),
            _ => self.settings.namespace.clone(),
        }
    }

    /// The outbox key of a request-update about `kind` `namespace`/`name` (Applications in
    /// several namespaces may share a name).
    fn request_key(&self, kind: SyncedKind, namespace: &str, name: &str) -> String {
        if kind == SyncedKind::Application && self.placement.destination_mapping() {
            request_update_key(kind.resync_kind(), &format!("{namespace}/{name}"))
        } else {
            request_update_key(kind.resync_kind(), name)
        }
    }

    fn push(&self, event: Event) -> Result<(), HandleError> {
        self.outbox.push(event).map_err(|e| {
            warn!(error = %e, "cannot queue an event for the principal");
            HandleError::Retryable(e.to_string())
        })
    }

    // ---- principal -> spoke -------------------------------------------------------------

    /// create / spec-update: keep the hub copy (stamped with the sending principal's identity
    /// `principal_uid`, if known) and make the spoke match it; a payload with a deletionTimestamp
    /// means the hub is deleting the object.
    async fn apply_hub_object(
        &self,
        kind: SyncedKind,
        hub: &SpokeObject,
        principal_uid: Option<&str>,
    ) -> Result<(), HandleError> {
        if hub.is_terminating() {
            return self.delete_for_hub(kind, hub).await;
        }
        let placed = self.place(kind, hub).map_err(HandleError::Rejected);
        let placed = match placed {
            Ok(p) if kind == SyncedKind::Application => self
                .placement
                .ensure_namespace(&p.namespace)
                .await
                .map(|()| p),
            other => other,
        };
        let placed = match placed {
            Ok(p) => p,
            Err(e) => {
                if let (HandleError::Rejected(reason), SyncedKind::Application) = (&e, kind) {
                    self.report_error(hub, reason);
                }
                return Err(e);
            }
        };
        let mut desired = self.desired_copy(kind, hub, &placed, principal_uid)?;
        if principal_uid.is_none() {
            // An event without the principal's identity keeps the one the copy has.
            if let Some(known) = self
                .spoke
                .stored(kind, &placed.namespace, hub.name_str())
                .and_then(|o| o.annotation(PRINCIPAL_UID_ANNOTATION).map(str::to_string))
            {
                desired
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(PRINCIPAL_UID_ANNOTATION.into(), known);
            }
        }
        let key = ObjectKey::of(kind, &desired);
        // Packed once, outside the lock: compared with the copy held, and kept when it differs.
        let packed = PackedObject::pack(&desired);
        {
            let mut st = self.lock();
            st.expected_deletions.remove(&key);
            match st.cache.get(&key) {
                Some(c) if c.holds_packed(&packed) => {}
                _ => {
                    st.cache
                        .insert(key.clone(), CachedCopy::from_packed(packed, &desired));
                }
            }
        }
        let result = self.upsert(kind, &desired).await;
        if let Err(HandleError::Rejected(reason)) = &result {
            // Not ours to keep in place (e.g. adoption refused): no drift revert, no recreate.
            self.lock().cache.remove(&key);
            if kind == SyncedKind::Application {
                self.report_error(hub, reason);
            }
        }
        result
    }

    /// Tells the principal that a hub Application could not be applied here (it shows the message
    /// on the hub object as an `AgentError` condition). Other objects keep flowing.
    fn report_error(&self, hub: &SpokeObject, reason: &str) {
        let err = ErrorData {
            resource_name: hub.name_str().to_string(),
            resource_namespace: hub.namespace_str().to_string(),
            message: reason.to_string(),
        };
        match Event::error_report(AGENT_SOURCE, SyncedKind::Application.target(), &err) {
            Ok(ev) => {
                if let Err(e) = self.outbox.push(ev) {
                    warn!(error = %e, "cannot queue an error report for the principal");
                }
            }
            Err(e) => warn!(error = %e, "cannot build an error report"),
        }
    }

    /// Creates the spoke copy, or replaces a live one while keeping its status and operation.
    async fn upsert(&self, kind: SyncedKind, desired: &SpokeObject) -> Result<(), HandleError> {
        let ns = desired.namespace_str();
        let api = self.api_in(kind, ns);
        let name = desired.name_str();
        // A bulk of new objects (e.g. after a long disconnect) costs one write each, not a read
        // and a write: when the watch knows of no copy, try to create first.
        let believed_absent = self.lock().listed.contains(&kind)
            && self.spoke.source_uid_in(kind, ns, name).is_none();
        if believed_absent && self.create_copy(kind, desired).await? {
            return Ok(());
        }
        let live = api
            .get_opt(name)
            .await
            .map_err(|e| handle_error(format!("reading spoke {kind} {ns}/{name}"), e))?;
        let Some(live) = live else {
            return match self.create_copy(kind, desired).await? {
                true => Ok(()),
                false => Err(HandleError::Retryable(format!(
                    "spoke {kind} {ns}/{name} appeared while creating it"
                ))),
            };
        };
        let live = live.without_managed_fields();
        if live.is_terminating() {
            // Writing to it would not stop the deletion; the watcher recreates it once gone.
            debug!(kind = %kind, namespace = %ns, name, "spoke object is being deleted; it is recreated once gone");
            return Ok(());
        }
        let wanted_uid = desired.source_uid().unwrap_or_default();
        match live.source_uid() {
            None if self.settings.ignore_unmanaged_apps && kind == SyncedKind::Application => {
                return Err(HandleError::Rejected(format!(
                    "spoke {kind} {ns}/{name} exists but was not created from the hub, and \
                     --ignore-unmanaged-apps leaves such Applications alone; delete or rename \
                     it on the spoke, or rename the hub's"
                )))
            }
            None if kind != SyncedKind::Application => {
                info!(kind = %kind, namespace = %ns, name, "taking over a local object of the same name as the hub's")
            }
            None => match self.settings.adoption_policy {
                AdoptionPolicy::Never => {
                    return Err(HandleError::Rejected(format!(
                        "spoke {kind} {ns}/{name} exists but was not created from the hub; \
                         delete or rename it on the spoke, or let the agent adopt it with \
                         --adoption-policy=always"
                    )))
                }
                AdoptionPolicy::Always => {
                    info!(kind = %kind, namespace = %ns, name, "adopting a local Application of the same name as the hub's")
                }
            },
            Some(uid) if uid != wanted_uid => {
                match mismatch_policy(&live, desired, self.settings.source_uid_mismatch_policy) {
                    SourceUidMismatchPolicy::Recreate => {
                        info!(kind = %kind, namespace = %ns, name, "spoke object belongs to an older hub object; deleting it to recreate it from the current one");
                        self.lock().replacing.insert(ObjectKey::new(kind, ns, name));
                        let params = DeleteParams {
                            preconditions: Some(Preconditions {
                                uid: Some(live.uid_str().to_string()),
                                resource_version: None,
                            }),
                            ..DeleteParams::background()
                        };
                        return match api.delete(name, &params).await {
                            Ok(_) => Ok(()),
                            Err(e) if is_not_found(&e) => Err(HandleError::Retryable(format!(
                                "spoke {kind} {ns}/{name} vanished while replacing it"
                            ))),
                            Err(e) => Err(handle_error(
                                format!("deleting stale spoke {kind} {ns}/{name}"),
                                e,
                            )),
                        };
                    }
                    SourceUidMismatchPolicy::Upsert => {
                        info!(kind = %kind, namespace = %ns, name, "spoke object belongs to an older hub object; updating it in place")
                    }
                }
            }
            Some(_) => {}
        }
        if matches_desired(&live, desired) {
            self.record_applied(kind, desired, &live);
            return Ok(());
        }
        let body = replacement_body(&live, desired);
        match api.replace(name, &write_params(), &body).await {
            Ok(updated) => {
                self.record_applied(kind, desired, &updated);
                info!(kind = %kind, namespace = %ns, name, "updated spoke copy to the hub's");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => Err(HandleError::Retryable(format!(
                "spoke {kind} {ns}/{name} changed while updating it"
            ))),
            Err(e) => Err(handle_error(
                format!("updating spoke {kind} {ns}/{name}"),
                e,
            )),
        }
    }

    /// Creates the spoke copy `desired`; false if an object of that name already exists.
    async fn create_copy(
        &self,
        kind: SyncedKind,
        desired: &SpokeObject,
    ) -> Result<bool, HandleError> {
        let (ns, name) = (desired.namespace_str(), desired.name_str());
        match self.api_in(kind, ns).create(&write_params(), desired).await {
            Ok(created) => {
                self.record_applied(kind, desired, &created);
                info!(kind = %kind, namespace = %ns, name, "created spoke copy of the hub's object");
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
            Err(e) => Err(handle_error(
                format!("creating spoke {kind} {ns}/{name}"),
                e,
            )),
        }
    }

    /// Remembers what the apiserver stored for `desired` (if it is still the current hub copy).
    fn record_applied(&self, kind: SyncedKind, desired: &SpokeObject, stored: &SpokeObject) {
        let mut st = self.lock();
        if let Some(c) = st.cache.get_mut(&ObjectKey::of(kind, desired)) {
            if c.holds(desired) {
                c.applied = Some(managed_view(stored));
            }
        }
    }

    /// set-operation: make sure the spoke copy exists, then set its `.operation`.
    async fn set_operation(
        &self,
        hub: &SpokeObject,
        principal_uid: Option<&str>,
    ) -> Result<(), HandleError> {
        self.apply_hub_object(SyncedKind::Application, hub, principal_uid)
            .await?;
        let Some(operation) = hub.operation.as_ref().filter(|op| !op.is_null()) else {
            return Ok(());
        };
        if hub.is_terminating() {
            return Ok(());
        }
        let name = hub.name_str();
        let placed = self
            .place(SyncedKind::Application, hub)
            .map_err(HandleError::Rejected)?;
        let ns = &placed.namespace;
        let apps = self.applications_in(ns);
        let what = || format!("setting the operation of spoke Application {ns}/{name}");
        let live = apps.get(name).await.map_err(|e| handle_error(what(), e))?;
        let body = with_requested_operation(live, operation);
        // An update of what was read: a concurrent write is a conflict, retried.
        apps.replace(name, &write_params(), &body)
            .await
            .map_err(|e| handle_error(what(), e))?;
        info!(namespace = %ns, name, "started the operation the hub requested");
        Ok(())
    }

    /// terminate-operation: mark the running operation Terminating.
    async fn terminate_operation(&self, hub: &SpokeObject) -> Result<(), HandleError> {
        let name = hub.name_str();
        let Ok(placed) = self.place(SyncedKind::Application, hub) else {
            // Never kept here, so nothing runs here.
            return Ok(());
        };
        let ns = &placed.namespace;
        let patch = json!({"status": {"operationState": {"phase": "Terminating"}}});
        match self
            .api_in(SyncedKind::Application, ns)
            .patch(name, &patch_params(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => {
                info!(namespace = %ns, name, "terminating the operation as the hub requested");
                Ok(())
            }
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(handle_error(
                format!("terminating the operation of spoke Application {ns}/{name}"),
                e,
            )),
        }
    }

    /// delete (or spec-update with deletionTimestamp): delete the spoke copy, expecting it.
    async fn delete_for_hub(&self, kind: SyncedKind, hub: &SpokeObject) -> Result<(), HandleError> {
        let name = hub.name_str();
        if name.is_empty() {
            return Err(HandleError::Rejected(format!(
                "the {kind} payload has no metadata.name"
            )));
        }
        let hub_uid = hub.uid_str();
        // Not permitted here: never kept here, so nothing to delete.
        let placed = self.place(kind, hub).ok();
        let ns = placed
            .as_ref()
            .map_or(hub.namespace_str(), |p| p.namespace.as_str());
        let key = ObjectKey::new(kind, ns, name);
        let api = self.api_in(kind, ns);
        let live = match placed {
            Some(_) => api
                .get_opt(name)
                .await
                .map_err(|e| handle_error(format!("reading spoke {kind} {ns}/{name}"), e))?
                .map(SpokeObject::without_managed_fields),
            None => None,
        };
        let ours = live.as_ref().is_some_and(|l| {
            l.source_uid()
                .is_some_and(|u| hub_uid.is_empty() || u == hub_uid)
        });
        if !ours {
            // Nothing of this hub object exists here: the deletion is complete as far as the
            // spoke is concerned. Keep the cache if it describes another (newer) hub object.
            {
                let mut st = self.lock();
                let stale = st.cache.get(&key).is_none_or(|c| {
                    hub_uid.is_empty() || c.desired().source_uid() == Some(hub_uid)
                });
                if stale {
                    st.cache.remove(&key);
                }
            }
            debug!(kind = %kind, namespace = %ns, name, "no spoke copy of the deleted hub object");
            if kind == SyncedKind::Application {
                let mut annotations = std::collections::BTreeMap::from([(
                    argocd_agent_proto::event::SOURCE_UID_ANNOTATION.to_string(),
                    hub_uid.to_string(),
                )]);
                if placed.as_ref().is_some_and(|p| p.remapped) {
                    annotations.insert(NAMESPACE_REMAPPED_ANNOTATION.to_string(), "true".into());
                }
                let gone = SpokeObject {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        namespace: Some(ns.to_string()),
                        annotations: Some(annotations),
                        ..ObjectMeta::default()
                    },
                    other: kind.type_meta(),
                    ..SpokeObject::default()
                };
                self.confirm_deletion(&gone)?;
            }
            return Ok(());
        }
        let live = live.unwrap_or_default();
        {
            let mut st = self.lock();
            st.cache.remove(&key);
            st.expected_deletions.insert(key.clone());
        }
        if live.is_terminating() {
            return Ok(());
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(live.uid_str().to_string()),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                info!(kind = %kind, namespace = %ns, name, "deleting spoke copy as the hub asked");
                Ok(())
            }
            Err(e) if is_not_found(&e) => {
                // Gone in the meantime; the watcher confirms it (or already did).
                Ok(())
            }
            Err(e) => Err(handle_error(
                format!("deleting spoke {kind} {ns}/{name}"),
                e,
            )),
        }
    }

    fn confirm_deletion(&self, gone: &SpokeObject) -> Result<(), HandleError> {
        let ev = Event::for_object(
            EventType::Delete,
            SyncedKind::Application.target(),
            AGENT_SOURCE,
            gone,
        )
        .map_err(|e| HandleError::Rejected(e.to_string()))?;
        self.push(ev)
    }

    /// request-resource-resync, the resync after start and the periodic one: one request-update
    /// (spec checksum) per local object the hub created and the checksum of their keys; the
    /// principal answers only where its copy differs and lists its keys if the sets differ.
    pub async fn answer_resync(&self) -> Result<(), HandleError> {
        let mut sent = 0usize;
        let mut keys = Vec::new();
        for kind in ALL_KINDS {
            let mut params = ListParams::default();
            if let Some(sel) = self.settings.selector(kind) {
                params = params.labels(&sel);
            }
            if let Some(fields) = kind.field_selector() {
                params = params.fields(&fields);
            }
            let list = self.list_api(kind).list(&params).await.map_err(|e| {
                handle_error(
                    format!("listing spoke {kind}s in {}", self.settings.namespace),
                    e,
                )
            })?;
            for obj in list
                .items
                .into_iter()
                .map(SpokeObject::without_managed_fields)
            {
                if !self.placement.admits(obj.namespace_str()) {
                    continue;
                }
                let Some(uid) = obj.source_uid() else {
                    continue;
                };
                let json = obj.to_json();
                let checksum = match spec_checksum(&json, Some(kind.kind())) {
                    Ok(c) => c,
                    Err(e) => {
                        warn!(error = %e, "cannot checksum a spoke object for resync; skipping it");
                        continue;
                    }
                };
                let req = RequestUpdate {
                    name: obj.name_str().to_string(),
                    namespace: self.request_namespace(kind, &obj),
                    uid: uid.to_string(),
                    kind: kind.resync_kind().to_string(),
                    checksum,
                };
                let mut ev = Event::request_update(AGENT_SOURCE, &req)
                    .map_err(|e| HandleError::Rejected(e.to_string()))?;
                ev = with_checksum(ev, METADATA_CHECKSUM, &metadata_checksum(&json));
                if kind == SyncedKind::Application {
                    ev = with_checksum(ev, STATUS_CHECKSUM, &status_checksum(&json));
                }
                let key = self.request_key(kind, &req.namespace, &req.name);
                self.push(keyed_request(ev, key))?;
                keys.push(ResourceKey::new(kind.resync_kind(), &req.name, "", uid));
                sent += 1;
            }
        }
        let ev = Event::request_synced_resource_list(AGENT_SOURCE, set_checksum(&keys))
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        self.push(keyed_request(ev, RESYNC_REQUEST_KEY))?;
        info!(
            objects = sent,
            "sent the checksums of the spoke copies for a resync"
        );
        Ok(())
    }

    /// response-synced-resource: the hub has this key; ask for it (empty checksum) unless a spoke
    /// copy of that very hub object is here.
    async fn answer_synced_resource(&self, key: SyncedResource) -> Result<(), HandleError> {
        let Some(kind) = SyncedKind::from_resync_kind(&key.kind) else {
            return Err(HandleError::Rejected(format!(
                "response-synced-resource for unsupported kind {:?}",
                key.kind
            )));
        };
        if key.name.is_empty() {
            return Err(HandleError::Rejected(
                "response-synced-resource without a name".into(),
            ));
        }
        let placed = match self.place_from(kind, &key.namespace) {
            Ok(p) => p,
            Err(reason) => {
                debug!(kind = %kind, name = %key.name, %reason, "the hub lists an object this agent may not keep");
                return Ok(());
            }
        };
        let ns = placed.namespace.as_str();
        let listed = self.lock().listed.contains(&kind);
        let local = listed.then(|| self.spoke.source_uid_in(kind, ns, &key.name));
        let local = match local {
            Some(known) => known,
            // Not listed yet: ask the apiserver.
            None => self
                .api_in(kind, ns)
                .get_opt(&key.name)
                .await
                .map_err(|e| handle_error(format!("reading spoke {kind} {}", key.name), e))?
                .and_then(|o| o.source_uid().map(str::to_string)),
        };
        if !needs_object(local.as_deref(), &key.uid) {
            return Ok(());
        }
        debug!(kind = %kind, name = %key.name, "the hub has an object the spoke lacks; asking for it");
        let namespace = if kind == SyncedKind::Application && self.placement.destination_mapping() {
            key.namespace.clone()
        } else {
            self.settings.namespace.clone()
        };
        let req = RequestUpdate {
            name: key.name.clone(),
            namespace,
            uid: key.uid.clone(),
            kind: kind.resync_kind().to_string(),
            checksum: Vec::new(),
        };
        let ev = Event::request_update(AGENT_SOURCE, &req)
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        let outbox_key = self.request_key(kind, &req.namespace, &key.name);
        self.push(keyed_request(ev, outbox_key))
    }

    /// After the first list of a kind since start: seeds the hub copy cache from the spoke copies
    /// found; once every kind is listed, starts the resync after start.
    fn first_list_done(self: &Arc<Self>, kind: SyncedKind) {
        let listed: Vec<SpokeObject> = self
            .spoke
            .state(kind)
            .iter()
            .map(|o| SpokeObject::clone(o).without_managed_fields())
            .collect();
        let all_listed = {
            let mut st = self.lock();
            let mut seeded = 0usize;
            for live in listed.iter().filter(|l| l.source_uid().is_some()) {
                let key = ObjectKey::of(kind, live);
                if !st.cache.contains_key(&key) && !live.is_terminating() {
                    let mut copy = CachedCopy::new(&hub_copy_of_live(kind, live));
                    copy.applied = Some(managed_view(live));
                    st.cache.insert(key, copy);
                    seeded += 1;
                }
            }
            debug!(kind = %kind, seeded, "hub copies seeded from the spoke after start");
            st.listed.insert(kind);
            st.listed.len() == ALL_KINDS.len()
        };
        if !all_listed {
            return;
        }
        let sync = self.clone();
        tokio::spawn(async move {
            for attempt in 0..6u32 {
                match sync.answer_resync().await {
                    Ok(()) => return,
                    Err(e) => {
                        warn!(error = %e, "the resync after start failed; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(500 << attempt)).await;
                    }
                }
            }
        });
    }

    // ---- spoke watch --------------------------------------------------------------------

    /// Watches Applications, AppProjects and Secrets in the agent namespace until the future is
    /// dropped.
    pub async fn run_watchers(self: Arc<Self>) {
        self.spoke.run(&self).await
    }

    /// A spoke object was added or changed: report its status, revert drift.
    async fn on_applied(&self, kind: SyncedKind, live: &SpokeObject) {
        let (ns, name) = (live.namespace_str(), live.name_str());
        let key = ObjectKey::of(kind, live);
        let (revert, report) = {
            let st = self.lock();
            let cached = st.cache.get(&key);
            let revert = needs_revert(live, cached).then(|| cached.map(CachedCopy::desired));
            let report = match status_report(kind, live, st.reported.get(&key)) {
                // The first list since start: the resync after it carries each status checksum
                // and the principal asks for the statuses the hub lacks, so a restart with
                // nothing changed sends no status.
                StatusReport::Send(view)
                    if !st.listed.contains(&kind) && !st.reported.contains_key(&key) =>
                {
                    StatusReport::RecordOnly(view)
                }
                report => report,
            };
            (revert.flatten(), report)
        };
        match report {
            StatusReport::Unchanged => {}
            StatusReport::RecordOnly(view) => {
                self.lock().reported.insert(key, view);
            }
            StatusReport::Send(view) => self.send_status(live, view),
        }
        if let Some(desired) = revert {
            info!(kind = %kind, namespace = %ns, name, "reverting a local change to the hub's copy");
            if let Err(e) = self.upsert(kind, &desired).await {
                // A conflict means another write landed; its watch event brings us back here.
                debug!(kind = %kind, namespace = %ns, name, error = %e, "drift revert did not apply");
            }
        }
    }

    /// Queues a `status-update` with live Application `live` and remembers `view` as reported.
    fn send_status(&self, live: &SpokeObject, view: ReportedView) {
        let (ns, name) = (live.namespace_str(), live.name_str());
        match Event::for_object(
            EventType::StatusUpdate,
            SyncedKind::Application.target(),
            AGENT_SOURCE,
            live,
        ) {
            Ok(ev) => {
                if self.push(ev).is_ok() {
                    debug!(namespace = %ns, name, "queued status-update for the principal");
                    self.lock()
                        .reported
                        .insert(ObjectKey::of(SyncedKind::Application, live), view);
                }
            }
            Err(e) => warn!(namespace = %ns, name, error = %e, "cannot build a status-update"),
        }
    }

    /// The principal's `request-update` about an Application: its hub status differs from the
    /// status checksum the resync sent; send the status of the spoke copy of that hub object.
    async fn answer_status_request(&self, req: RequestUpdate) -> Result<(), HandleError> {
        if req.kind != SyncedKind::Application.kind() {
            return Err(HandleError::Rejected(format!(
                "a managed agent answers request-update for Applications only, not {:?}",
                req.kind
            )));
        }
        let Ok(placed) = self.place_from(SyncedKind::Application, &req.namespace) else {
            debug!(name = %req.name, namespace = %req.namespace, "status asked for an Application this agent may not keep");
            return Ok(());
        };
        let live = self
            .api_in(SyncedKind::Application, &placed.namespace)
            .get_opt(&req.name)
            .await
            .map_err(|e| handle_error(format!("reading spoke Application {}", req.name), e))?
            .map(SpokeObject::without_managed_fields);
        match live {
            Some(live) if live.source_uid() == Some(req.uid.as_str()) => {
                let view = reported_view(&live);
                self.send_status(&live, view);
            }
            _ => {
                debug!(name = %req.name, "status asked for an Application the spoke does not hold (any more)")
            }
        }
        Ok(())
    }

    /// A spoke object is gone: confirm an expected deletion, recreate an unexpected one.
    async fn on_gone(&self, kind: SyncedKind, gone: &SpokeObject) {
        let (ns, name) = (gone.namespace_str(), gone.name_str());
        let key = ObjectKey::of(kind, gone);
        let (expected, replacing, cached) = {
            let mut st = self.lock();
            st.reported.remove(&key);
            (
                st.expected_deletions.remove(&key),
                st.replacing.remove(&key),
                st.cache.get(&key).cloned(),
            )
        };
        match on_deleted(gone, expected, cached.as_ref()) {
            DeletedAction::Recreate(desired) if replacing => {
                info!(kind = %kind, namespace = %ns, name, "creating the spoke copy of the current hub object");
                if let Err(e) = self.upsert(kind, &desired).await {
                    warn!(kind = %kind, namespace = %ns, name, error = %e, "cannot create the replacement; the principal's next resync will");
                }
            }
            DeletedAction::Ignore => {}
            DeletedAction::Confirm => {
                info!(kind = %kind, namespace = %ns, name, "spoke copy deleted as the hub asked");
                if kind == SyncedKind::Application {
                    if let Err(e) = self.confirm_deletion(gone) {
                        warn!(namespace = %ns, name, error = %e, "cannot confirm a deletion to the principal");
                    }
                }
            }
            DeletedAction::Recreate(desired) => {
                info!(kind = %kind, namespace = %ns, name, "spoke copy was deleted locally; recreating it from the hub's copy");
                // As upstream's agent, an Application comes back with the status it had.
                let body = recreated_from(kind, &desired, gone);
                match self.upsert(kind, &body).await {
                    Ok(()) if kind == SyncedKind::Application => {
                        self.after_recreate(ns, name).await
                    }
                    Ok(()) => {}
                    Err(e) => {
                        warn!(kind = %kind, namespace = %ns, name, error = %e, "cannot recreate a locally deleted object; the principal's next resync will")
                    }
                }
            }
        }
    }
}

impl ManagedSync {
    /// `--on-application-recreate`: after Application `ns`/`name` was recreated with the
    /// status it had, clear its stale operation state or request a sync, or leave it be.
    async fn after_recreate(&self, ns: &str, name: &str) {
        let apps = self.applications_in(ns);
        let result = match self.settings.on_application_recreate {
            RecreateAction::Ignore => return,
            RecreateAction::ClearStatus => apps
                .patch(
                    name,
                    &patch_params(),
                    &Patch::Merge(json!({"status": {"operationState": null}})),
                )
                .await
                .map(|_| "cleared the stale operation state of the recreated Application"),
            RecreateAction::Resync => {
                // Argo CD writes the new Application's status meanwhile: retry a conflict.
                let mut attempt = 0;
                loop {
                    let written = match apps.get(name).await {
                        Ok(live) => {
                            let body = with_requested_operation(live, &json!({"sync": {}}));
                            apps.replace(name, &write_params(), &body).await
                        }
                        Err(e) => Err(e),
                    };
                    match written {
                        Err(kube::Error::Api(s)) if s.is_conflict() && attempt < 5 => attempt += 1,
                        other => {
                            break other.map(|_| "requested a sync of the recreated Application")
                        }
                    }
                }
            }
        };
        match result {
            Ok(done) => info!(namespace = %ns, name, "{done}"),
            Err(e) => warn!(namespace = %ns, name, error = %e,
                action = ?self.settings.on_application_recreate,
                "cannot apply --on-application-recreate to the recreated Application"),
        }
    }
}

impl SpokeObserver for ManagedSync {
    async fn applied(self: &Arc<Self>, kind: SyncedKind, live: SpokeObject) {
        self.on_applied(kind, &live).await
    }

    async fn gone(self: &Arc<Self>, kind: SyncedKind, last: SpokeObject) {
        self.on_gone(kind, &last).await
    }

    async fn listed(self: &Arc<Self>, kind: SyncedKind) {
        if !self.lock().listed.contains(&kind) {
            self.first_list_done(kind);
        }
    }
}

impl EventHandler for ManagedSync {
    async fn handle(&self, event: Event) -> Result<(), HandleError> {
        match &event.event_type {
            EventType::RequestResourceResync => return self.answer_resync().await,
            EventType::RequestUpdate => {
                let req = event
                    .data_as()
                    .map_err(|e| HandleError::Rejected(e.to_string()))?;
                return self.answer_status_request(req).await;
            }
            EventType::ResponseSyncedResource => {
                let key = event
                    .data_as()
                    .map_err(|e| HandleError::Rejected(e.to_string()))?;
                return self.answer_synced_resource(key).await;
            }
            EventType::Ping | EventType::Pong | EventType::Processed => return Ok(()),
            EventType::Error => {
                warn!(subject = event.subject.as_deref().unwrap_or(""),
                    data = %String::from_utf8_lossy(event.data.as_deref().unwrap_or_default()),
                    "the principal reported an error");
                return Ok(());
            }
            _ => {}
        }
        let Some(kind) = SyncedKind::from_target(&event.target) else {
            let msg = format!(
                "a managed agent does not handle {} events for target {:?}",
                event.event_type.name(),
                event.target.as_str()
            );
            return Err(HandleError::for_mode(&event, msg));
        };
        let obj: SpokeObject = event
            .data_as()
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        let principal_uid = event.principal_uid.as_deref();
        match (&event.event_type, kind) {
            (EventType::Create | EventType::SpecUpdate, _) => {
                self.apply_hub_object(kind, &obj, principal_uid).await
            }
            (EventType::Delete, _) => self.delete_for_hub(kind, &obj).await,
            (EventType::SetOperation, SyncedKind::Application) => {
                self.set_operation(&obj, principal_uid).await
            }
            (EventType::TerminateOperation, SyncedKind::Application) => {
                self.terminate_operation(&obj).await
            }
            (other, _) => Err(HandleError::for_mode(
                &event,
                format!(
                    "a managed agent does not handle {} events for {kind}s",
                    other.name()
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spoke_watch::seam::{drain, object, unreachable_client, watch_history};
    use argocd_agent_proto::event::SOURCE_UID_ANNOTATION;
    use argocd_agent_proto::sync::OutboxConfig;

    /// A spoke copy of hub Application `hub-{name}` as the watch delivers it.
    fn spoke_app(name: &str, health: &str) -> SpokeObject {
        object(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": name, "namespace": "argocd", "uid": format!("spoke-{name}"),
                "resourceVersion": "1",
                "annotations": {SOURCE_UID_ANNOTATION: format!("hub-{name}")}},
            "spec": {"project": "default"},
            "status": {"health": {"status": health}},
        }))
    }

    #[tokio::test]
    async fn watched_status_changes_and_hub_asked_deletions_reach_the_principal() {
        let outbox = Arc::new(Outbox::new(OutboxConfig::default()));
        let settings = ManagedSettings {
            namespace: "argocd".into(),
            adoption_policy: AdoptionPolicy::Always,
            source_uid_mismatch_policy: SourceUidMismatchPolicy::Recreate,
            label_selector: None,
            ..ManagedSettings::default()
        };
        let sync = ManagedSync::new(unreachable_client(), settings, outbox.clone());
        {
            let mut st = sync.lock();
            for name in ["b", "d"] {
                let key = ObjectKey::new(SyncedKind::Application, "argocd", name);
                st.expected_deletions.insert(key);
            }
        }
        // The first list reports no status (the resync after it carries status checksums).
        let history =
            watch_history(|name, version| spoke_app(name, ["", "Healthy", "Degraded"][version]));
        sync.spoke
            .feed(&sync, SyncedKind::Application, history)
            .await;
        assert_eq!(
            drain(&outbox),
            ["status-update a", "status-update c", "delete b", "delete d"]
        );
        // The store, not a map of the agent's own, answers what the spoke holds.
        let held = |name| sync.spoke.source_uid(SyncedKind::Application, name);
        assert_eq!(held("a").as_deref(), Some("hub-a"));
        assert_eq!(held("d"), None);
        assert!(
            sync.cached_copy(SyncedKind::Application, "a").is_some(),
            "seeded by the first list"
        );
    }

    /// An Application in spoke namespace `ns`, made from hub Application `hub-{ns}-{name}`.
    fn app_in(ns: &str, name: &str, health: &str) -> SpokeObject {
        object(json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {"name": name, "namespace": ns, "uid": format!("spoke-{ns}-{name}"),
                "resourceVersion": "1",
                "annotations": {SOURCE_UID_ANNOTATION: format!("hub-{ns}-{name}")}},
            "spec": {"project": "default"},
            "status": {"health": {"status": health}},
        }))
    }

    #[tokio::test]
    async fn under_destination_mapping_applications_of_allowed_namespaces_report_their_status_each()
    {
        use kube::runtime::watcher::Event::{Apply, Init, InitApply, InitDone};
        let outbox = Arc::new(Outbox::new(OutboxConfig::default()));
        let settings = ManagedSettings {
            namespace: "argocd".into(),
            adoption_policy: AdoptionPolicy::Always,
            source_uid_mismatch_policy: SourceUidMismatchPolicy::Recreate,
            label_selector: None,
            ..ManagedSettings::default()
        };
        let placement = Arc::new(AppPlacement::destination_for_tests(
            "argocd",
            &["team-*"],
            "hub-argocd",
        ));
        let sync = ManagedSync::placed(unreachable_client(), settings, placement, outbox.clone());
        let history = vec![
            Init,
            InitApply(app_in("team-a", "app", "Healthy")),
            InitApply(app_in("team-b", "app", "Healthy")),
            InitApply(app_in("kube-system", "app", "Healthy")),
            InitDone,
            Apply(app_in("team-a", "app", "Degraded")),
            Apply(app_in("kube-system", "app", "Degraded")),
            Apply(app_in("team-b", "app", "Degraded")),
        ];
        sync.spoke
            .feed(&sync, SyncedKind::Application, history)
            .await;
        outbox.set_connected(true);
        let mut sent = Vec::new();
        while let Some(ev) = outbox.take_next(std::time::Instant::now()) {
            outbox.ack(&ev.ack());
            let obj: serde_json::Value = ev.data_as().unwrap();
            sent.push(format!(
                "{} {}/{}",
                ev.event_type.name(),
                obj["metadata"]["namespace"].as_str().unwrap_or_default(),
                obj["metadata"]["name"].as_str().unwrap_or_default()
            ));
        }
        // Same name in two allowed namespaces: two Applications; kube-system is not the agent's.
        assert_eq!(
            sent,
            ["status-update team-a/app", "status-update team-b/app"]
        );
        assert_eq!(
            sync.spoke
                .source_uid_in(SyncedKind::Application, "team-b", "app")
                .as_deref(),
            Some("hub-team-b-app")
        );
        assert_eq!(
            sync.spoke
                .source_uid_in(SyncedKind::Application, "kube-system", "app"),
            None
        );
    }

    fn live_from(kind: SyncedKind, hub: &serde_json::Value) -> (SpokeObject, SpokeObject) {
        let desired = spoke_copy(kind, &object(hub.clone()), "argocd").unwrap();
        let mut live = desired.clone();
        live.metadata.uid = Some("spoke-uid".into());
        live.metadata.resource_version = Some("42".into());
        live.metadata.annotations.as_mut().unwrap().insert(
            crate::spoke_copy::LAST_APPLIED_ANNOTATION.into(),
            "{}".into(),
        );
        if kind == SyncedKind::Application {
            live.status = Some(json!({"health": {"status": "Healthy"}}));
            live.operation = Some(json!({"sync": {}}));
        }
        (desired, live)
    }

    #[test]
    fn the_hub_copy_seeded_from_a_spoke_copy_is_the_one_it_was_written_from() {
        let app = json!({
            "metadata": {"name": "app", "namespace": "agent-a", "uid": "hub-1",
                "labels": {"team": "a"}, "finalizers": ["resources-finalizer.argocd.argoproj.io"]},
            "spec": {"project": "default", "destination": {"server": "https://x", "namespace": "ns"}}
        });
        let (desired, live) = live_from(SyncedKind::Application, &app);
        assert_eq!(hub_copy_of_live(SyncedKind::Application, &live), desired);
        assert!(matches_desired(&live, &desired));

        let secret = json!({
            "metadata": {"name": "repo", "namespace": "argocd", "uid": "hub-2",
                "labels": {"argocd.argoproj.io/secret-type": "repository"}},
            "type": "Opaque", "data": {"url": "aHR0cHM6Ly9leGFtcGxl"}
        });
        let (desired, live) = live_from(SyncedKind::Repository, &secret);
        assert_eq!(hub_copy_of_live(SyncedKind::Repository, &live), desired);
    }

    #[test]
    fn spoke_copy_checksum_matches_the_hub_payload_it_came_from() {
        // The principal compares the checksum of the payload it would send with the one the
        // agent computes from the live spoke copy: equal when nothing changed.
        let app = json!({
            "metadata": {"name": "app", "uid": "hub-1"},
            "spec": {"project": "default", "destination": {"server": "https://x", "namespace": "ns"},
                "source": {"repoURL": "https://git", "targetRevision": "v1"}}
        });
        let (_, live) = live_from(SyncedKind::Application, &app);
        let live = live.to_json();
        assert_eq!(
            spec_checksum(&live, Some("Application")).unwrap(),
            spec_checksum(&app, Some("Application")).unwrap()
        );
        let changed = json!({
            "metadata": {"name": "app", "uid": "hub-1"},
            "spec": {"project": "default", "destination": {"server": "https://x", "namespace": "ns"},
                "source": {"repoURL": "https://git", "targetRevision": "v2"}}
        });
        assert_ne!(
            spec_checksum(&live, Some("Application")).unwrap(),
            spec_checksum(&changed, Some("Application")).unwrap()
        );
    }
}
