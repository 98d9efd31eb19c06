//! Autonomous agents: the hub mirrors of what their spokes own, and the mirrors' protection.
//!
//! Owns writing the mirrors of spoke objects ([`Mirrors::upsert_mirror`], [`Mirrors::delete_mirror`]),
//! remembering each mirror as written ([`Remembered`]: packed, its JSON, so thousands of them cost
//! about their JSON) and reverting hub edits and deletions of it, forwarding
//! operations, terminations and refresh requests made on a mirror to the spoke, and the checksum
//! resync ([`Mirrors::autonomous_resync`]): one `request-update` (carrying the mirror's checksum)
//! per mirror plus one `request-synced-resource-list`, so a resync where nothing changed costs
//! O(1)-sized messages. Conflicts resolve to the owner: for an autonomous agent's objects, the
//! spoke.
//!
//! Ownership, not names: every mirror carries the agent it belongs to
//! ([`MIRROR_AGENT_ANNOTATION`], set by the principal, never taken from the spoke), and an agent
//! only creates, replaces or deletes hub objects that carry its own name there. A name taken by
//! another agent's mirror (agent `team` writing project `b-x` = `team-b-x`, the mirror of agent
//! `team-b`'s project `x`) or by an object made on the hub (no mark) is refused
//! ([`MirrorCollision`]) and counted in `argocd_principal_mirror_collisions_total{agent_name}`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use argocd_agent_kube::argocd::{AppProject, Application, ObjectMetaExt};
use argocd_agent_kube::errors::handle_error;
use argocd_agent_kube::packed::{JsonDigest, Packed};
use argocd_agent_proto::event::{
    set_checksum, Event, EventType, ResourceKey, Target, SOURCE_UID_ANNOTATION,
};
use argocd_agent_proto::sync::keyed_request;
use argocd_agent_proto::sync::resync::{
    MIRROR_AGENT_ANNOTATION, MIRROR_CHECKSUM_ANNOTATION, RESYNC_REQUEST_KEY,
};
use argocd_agent_proto::sync::HandleError;
use argocd_agent_runtime::telemetry::MetricsRegistry;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Serialize;
use serde_json::Value;

use super::namespaces::Namespaces;
use super::view::{HubView, Kind};
use super::{push, queue, read, request_object, write, SOURCE};
use crate::routing::{
    application_payload, mirror_application, mirror_project, mirror_view, mirrored_project_name,
    namespace_allowed, MirrorObject, REFRESH_ANNOTATION,
};
use crate::sessions::AgentSession;

/// `argocd_principal_mirror_collisions_total{agent_name}`: mirror writes and deletions refused
/// because the hub object of that name is not the agent's mirror. `agent_name` is an
/// authenticated agent, so the series are as many as the agents.
#[derive(Debug, Clone, Default)]
pub struct MirrorCollisions(Family<Vec<(String, String)>, Counter>);

impl MirrorCollisions {
    /// Registers the counter in `registry`.
    pub fn register(&self, registry: &MetricsRegistry) {
        registry.register(
            "argocd_principal_mirror_collisions",
            "Mirror writes refused because the hub object of that name belongs to another agent or was made on the hub",
            self.0.clone(),
        );
    }

    fn record(&self, agent: &str) {
        self.0
            .get_or_create(&vec![("agent_name".into(), agent.into())])
            .inc();
    }
}

/// A hub object that a mirror write or deletion of `agent` would have touched, but that is not
/// `agent`'s mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorCollision {
    /// What the agent tried to write.
    pub kind: MirrorKind,
    /// The hub object's name.
    pub name: String,
    /// The agent the hub object belongs to; `None` = made on the hub (no owner mark).
    pub owner: Option<String>,
}

impl std::fmt::Display for MirrorCollision {
    // Told to the agent: says the name is taken, not by whom.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hub {:?} {} exists and is not this agent's mirror; it is left unchanged (rename the object on the spoke)",
            self.kind, self.name
        )
    }
}

/// Whether `agent` may replace or delete the hub object `live` that its mirror of that name
/// would be: only when the principal marked `live` as `agent`'s mirror.
pub fn check_mirror_owner<K: kube::Resource>(
    kind: MirrorKind,
    live: &K,
    agent: &str,
) -> Result<(), MirrorCollision> {
    owned_by(
        kind,
        live.name_str(),
        live.annotation(MIRROR_AGENT_ANNOTATION),
        agent,
    )
}

/// Whether `agent` may replace or delete the hub object `name` whose owner mark is `owner`.
fn owned_by(
    kind: MirrorKind,
    name: &str,
    owner: Option<&str>,
    agent: &str,
) -> Result<(), MirrorCollision> {
    match owner {
        Some(owner) if owner == agent => Ok(()),
        owner => Err(MirrorCollision {
            kind,
            name: name.to_string(),
            owner: owner.map(str::to_string),
        }),
    }
}

/// Field manager of the principal's hub writes.
const FIELD_MANAGER: &str = "argocd-principal";

/// Whether `obj` is `agent`'s mirror of the spoke object with uid `uid`.
fn is_mirror_of<K: kube::Resource>(obj: &K, agent: &str, uid: &str) -> bool {
    obj.annotation(MIRROR_AGENT_ANNOTATION) == Some(agent)
        && obj.annotation(SOURCE_UID_ANNOTATION) == Some(uid)
}

/// Whether `obj` is a mirror `agent` wrote of some spoke object.
fn mirrored_by<K: kube::Resource>(obj: &K, agent: &str) -> bool {
    obj.annotation(MIRROR_AGENT_ANNOTATION) == Some(agent)
        && obj.annotation(SOURCE_UID_ANNOTATION).is_some()
}

/// The checksum of the spoke object a mirror was written from.
fn mirror_checksum<K: kube::Resource>(mirror: &K) -> Vec<u8> {
    mirror
        .annotation(MIRROR_CHECKSUM_ANNOTATION)
        .and_then(|h| hex::decode(h).ok())
        .unwrap_or_default()
}

/// The kinds an autonomous agent owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorKind {
    /// Application, mirrored into namespace `<agent>`.
    Application,
    /// AppProject, mirrored as `<agent>-<name>` in the principal namespace.
    AppProject,
}

/// Where a remembered mirror is kept: `<agent>/<name>` for Applications (the hub object's
/// namespace and name; neither can hold a `/`), the mirror name for AppProjects (whose mirror
/// names are one namespace for every agent). One allocation, 16 bytes in the table.
type MirrorKey = Box<str>;

/// A kind the mirrors write: how its mirror is named, made and found, and where the principal
/// remembers the mirrors it wrote.
pub trait Mirrored:
    MirrorObject
    + kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Serialize
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// The kind, as errors and logs name it.
    const KIND: MirrorKind;
    /// The hub mirror of `spoke`, an object of autonomous agent `agent`.
    fn mirror(spoke: &Self, agent: &str, principal_namespace: &str) -> Self;
    /// The name of `agent`'s mirror of its object `name`.
    fn mirror_name(agent: &str, name: &str) -> String;
    /// The hub namespace of `agent`'s mirrors of this kind.
    fn mirror_namespace<'a>(agent: &'a str, principal_namespace: &'a str) -> &'a str;
    /// The key of `agent`'s remembered mirror `mirror_name`.
    fn key(agent: &str, mirror_name: &str) -> MirrorKey;
    /// The mirrors of this kind as the principal last wrote them.
    fn remembered(mirrors: &Mirrors) -> &Remembered<Self>;
    /// The hub view's object `mirror_name` where `agent`'s mirrors of this kind live.
    fn in_view(view: &HubView, agent: &str, mirror_name: &str) -> Option<Arc<Self>>;
    /// The hub view's kind.
    const VIEW_KIND: Kind;
    /// A requested operation (Applications only).
    fn requested_operation(&self) -> Option<&Value> {
        None
    }
    /// Whether the spoke refreshed this object later than mirror `live` shows (Applications:
    /// Argo CD moved `status.reconciledAt` on), so a refresh requested on `live` was carried out.
    fn refreshed_since(&self, _live: &Self) -> bool {
        false
    }
}

impl Mirrored for Application {
    const KIND: MirrorKind = MirrorKind::Application;
    const VIEW_KIND: Kind = Kind::Application;

    fn mirror(spoke: &Self, agent: &str, _: &str) -> Self {
        mirror_application(spoke, agent)
    }

    fn mirror_name(_: &str, name: &str) -> String {
        name.to_string()
    }

    fn mirror_namespace<'a>(agent: &'a str, _: &'a str) -> &'a str {
        agent
    }

    fn key(agent: &str, mirror_name: &str) -> MirrorKey {
        format!("{agent}/{mirror_name}").into()
    }

    fn remembered(mirrors: &Mirrors) -> &Remembered<Self> {
        &mirrors.app_mirrors
    }

    fn in_view(view: &HubView, agent: &str, mirror_name: &str) -> Option<Arc<Self>> {
        view.application_in(agent, mirror_name)
    }

    fn requested_operation(&self) -> Option<&Value> {
        self.operation()
    }

    fn refreshed_since(&self, live: &Self) -> bool {
        let reconciled = |app: &Application| {
            app.status
                .as_ref()
                .and_then(|s| s.reconciled_at.as_deref())
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        };
        match (reconciled(self), reconciled(live)) {
            (Some(now), Some(before)) => now > before,
            (Some(_), None) => true,
            _ => false,
        }
    }
}

impl Mirrored for AppProject {
    const KIND: MirrorKind = MirrorKind::AppProject;
    const VIEW_KIND: Kind = Kind::AppProject;

    fn mirror(spoke: &Self, agent: &str, principal_namespace: &str) -> Self {
        mirror_project(spoke, agent, principal_namespace)
    }

    fn mirror_name(agent: &str, name: &str) -> String {
        mirrored_project_name(agent, name)
    }

    fn mirror_namespace<'a>(_: &'a str, principal_namespace: &'a str) -> &'a str {
        principal_namespace
    }

    fn key(_: &str, mirror_name: &str) -> MirrorKey {
        mirror_name.into()
    }

    fn remembered(mirrors: &Mirrors) -> &Remembered<Self> {
        &mirrors.project_mirrors
    }

    fn in_view(view: &HubView, _: &str, mirror_name: &str) -> Option<Arc<Self>> {
        view.project(mirror_name)
    }
}

/// What the flags choose for mirrors.
#[derive(Debug, Clone, Default)]
pub struct MirrorOptions {
    /// Hub namespaces mirrors may be written to (`--allowed-namespaces`, globs); empty = any.
    pub allowed_namespaces: Vec<String>,
    /// Where refused mirror writes are counted.
    pub collisions: MirrorCollisions,
}

/// The mirrors of autonomous agents' objects, as the principal last wrote them.
pub struct Mirrors {
    client: kube::Client,
    principal_namespace: String,
    view: HubView,
    namespaces: Namespaces,
    options: MirrorOptions,
    /// Hub edits are reverted to these; deletions recreate them.
    app_mirrors: Remembered<Application>,
    project_mirrors: Remembered<AppProject>,
}

impl Mirrors {
    /// Mirrors written with `client`, AppProject mirrors in `principal_namespace`.
    pub fn new(
        client: kube::Client,
        principal_namespace: String,
        view: HubView,
        namespaces: Namespaces,
        options: MirrorOptions,
    ) -> Arc<Mirrors> {
        Arc::new(Mirrors {
            client,
            principal_namespace,
            view,
            namespaces,
            options,
            app_mirrors: Remembered::default(),
            project_mirrors: Remembered::default(),
        })
    }
}

impl Mirrors {
    fn mirror_api<K: Mirrored>(&self, agent: &str) -> Api<K> {
        Api::namespaced(
            self.client.clone(),
            K::mirror_namespace(agent, &self.principal_namespace),
        )
    }

    /// Writes the hub mirror of spoke object `spoke` of autonomous agent `agent` (the spoke's
    /// version wins over whatever the hub holds).
    pub async fn upsert_mirror<K: Mirrored>(
        &self,
        agent: &str,
        spoke: &K,
    ) -> Result<(), HandleError> {
        if spoke.name_str().is_empty() {
            return Err(HandleError::Rejected(
                "the object has no metadata.name".into(),
            ));
        }
        if K::KIND == MirrorKind::Application
            && !namespace_allowed(&self.options.allowed_namespaces, agent)
        {
            return Err(HandleError::Rejected(format!(
                "hub namespace {agent:?} is not in the principal's --allowed-namespaces"
            )));
        }
        let desired = K::mirror(spoke, agent, &self.principal_namespace);
        let name = desired.name_str().to_string();
        // The remembered mirrors decide what hub edits are reverted to: another owner's name
        // never enters them (the write below checks the apiserver's object; this the hub view and
        // the writes in flight).
        if let Some(cached) = K::in_view(&self.view, agent, &name) {
            self.refuse_foreign(agent, &*cached)?;
        }
        let remembered = K::remembered(self)
            .remember(K::key(agent, &name), &desired, agent)
            .map_err(|c| self.refused(agent, c))?;
        let written = self.write_mirror(agent, &desired).await;
        if let Err(HandleError::Rejected(_)) = &written {
            // Not written (e.g. the name is another owner's): nothing to protect or restore.
            self.forget_mirror::<K>(agent, &name, Some(&remembered));
        }
        written
    }

    /// Refuses (and counts) a write or deletion by `agent` of hub object `live` that is not its
    /// mirror.
    fn refuse_foreign<K: Mirrored>(&self, agent: &str, live: &K) -> Result<(), HandleError> {
        check_mirror_owner(K::KIND, live, agent).map_err(|c| self.refused(agent, c))
    }

    fn refused(&self, agent: &str, c: MirrorCollision) -> HandleError {
        self.options.collisions.record(agent);
        tracing::debug!(agent, kind = ?c.kind, name = %c.name, owner = ?c.owner, "refused a mirror write: the hub object of that name is not this agent's mirror");
        HandleError::Rejected(c.to_string())
    }

    /// Drops the remembered mirror `name` of `agent` (when it is `only_if`, if given): it is no
    /// longer restored after hub edits or deletions.
    fn forget_mirror<K: Mirrored>(&self, agent: &str, name: &str, only_if: Option<&Packed<K>>) {
        K::remembered(self).forget(&K::key(agent, name), agent, only_if);
    }

    /// Creates or replaces a mirror with `desired`, keeping a hub-requested operation.
    async fn write_mirror<K: Mirrored>(&self, agent: &str, desired: &K) -> Result<(), HandleError> {
        let kind = K::KIND;
        let name = desired.name_str();
        let api = self.mirror_api::<K>(agent);
        let what = format!("mirror {kind:?} {name} of agent {agent}");
        // A bulk of new mirrors (e.g. after a long disconnect) costs one write each, not a read
        // and a write: when the hub view holds no object of that name, try to create first (an
        // existing one, or any failure, falls through to the read below).
        if !self.mirror_known::<K>(agent, name) {
            if let Ok(true) = Self::create_mirror(&api, agent, desired).await {
                return Ok(());
            }
        }
        let live = api
            .get_opt(name)
            .await
            .map_err(|e| handle_error(&what, e))?;
        if let Some(live) = live {
            let Some(body) = self.replacement(agent, &live, desired, &what)? else {
                return Ok(());
            };
            api.replace(
                name,
                &PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                },
                &body,
            )
            .await
            .map_err(|e| handle_error(&what, e))?;
            tracing::debug!(agent, kind = ?kind, name, "updated hub mirror from the spoke");
            return Ok(());
        }
        match Self::create_mirror(&api, agent, desired).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(HandleError::Retryable(format!(
                "{what} appeared while creating it"
            ))),
            Err(kube::Error::Api(s)) if s.code == 404 && kind == MirrorKind::Application => {
                Err(match self.namespaces.ensure(agent).await {
                    Ok(()) => HandleError::Retryable(format!(
                        "{what}: hub namespace was missing; created it"
                    )),
                    Err(msg) => HandleError::Rejected(msg),
                })
            }
            Err(e) => Err(handle_error(&what, e)),
        }
    }

    /// What replacing the hub's `live` object with mirror `desired` of `agent` takes: refused
    /// (and counted) when `live` is not `agent`'s mirror, retried later while it is being deleted,
    /// nothing when it already is `desired` (what hub edits may not change, and the requested
    /// operation), else the PUT body: `desired` with `live`'s resourceVersion (a concurrent write
    /// conflicts), its finalizers, and a refresh the hub requested on it until the spoke shows it
    /// refreshed since (`desired` reconciled later than `live`): argocd-server's `app get
    /// --refresh` (and the UI's refresh) waits for the annotation to go, as upstream's principal
    /// lets it go with the spoke's next update.
    fn replacement<K: Mirrored>(
        &self,
        agent: &str,
        live: &K,
        desired: &K,
        what: &str,
    ) -> Result<Option<K>, HandleError> {
        self.refuse_foreign(agent, live)?;
        if live.is_terminating() {
            return Err(HandleError::Retryable(format!(
                "{what} is being deleted; retrying once gone"
            )));
        }
        if mirror_view(live) == mirror_view(desired)
            && live.requested_operation() == desired.requested_operation()
        {
            return Ok(None);
        }
        let mut body = desired.clone();
        let meta = body.meta_mut();
        meta.resource_version = live.meta().resource_version.clone();
        if let Some(r) = live
            .annotation(REFRESH_ANNOTATION)
            .filter(|_| !desired.refreshed_since(live))
        {
            meta.annotations
                .get_or_insert_with(Default::default)
                .insert(REFRESH_ANNOTATION.into(), r.into());
        }
        if live.meta().finalizers.is_some() {
            meta.finalizers = live.meta().finalizers.clone();
        }
        Ok(Some(body))
    }

    /// Whether the hub view holds an object named like mirror `name` (or is not listed yet).
    fn mirror_known<K: Mirrored>(&self, agent: &str, name: &str) -> bool {
        !self.view.is_listed(K::VIEW_KIND) || K::in_view(&self.view, agent, name).is_some()
    }

    /// Creates mirror `body`; `Ok(false)` when an object of that name already exists.
    async fn create_mirror<K: Mirrored>(
        api: &Api<K>,
        agent: &str,
        body: &K,
    ) -> Result<bool, kube::Error> {
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match api.create(&params, body).await {
            Ok(created) => {
                let name = created.name_str();
                tracing::info!(agent, kind = ?K::KIND, name, "created hub mirror of a spoke object");
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes the hub mirror of spoke object `name` (uid `uid`, empty = any) of agent `agent`:
    /// the spoke deleted it. Not recreated afterwards. Only `agent`'s mirror is deleted: the
    /// object is read from the apiserver, checked, and deleted with its uid as precondition.
    pub async fn delete_mirror<K: Mirrored>(
        &self,
        agent: &str,
        name: &str,
        uid: &str,
    ) -> Result<(), HandleError> {
        let kind = K::KIND;
        let mirror_name = K::mirror_name(agent, name);
        let api = self.mirror_api::<K>(agent);
        let what = format!("deleting mirror {kind:?} {mirror_name} of agent {agent}");
        let Some(live) = api
            .get_opt(&mirror_name)
            .await
            .map_err(|e| handle_error(&what, e))?
        else {
            self.forget_mirror::<K>(agent, &mirror_name, None);
            return Ok(());
        };
        self.refuse_foreign(agent, &live)?;
        let theirs = live.annotation(SOURCE_UID_ANNOTATION);
        if !uid.is_empty() && theirs.is_some_and(|t| t != uid) {
            tracing::debug!(
                agent,
                name,
                "delete for an older spoke object; the mirror is a newer one"
            );
            return Ok(());
        }
        self.forget_mirror::<K>(agent, &mirror_name, None);
        if live.meta().finalizers.is_some() {
            match release_finalizers(&api, &mirror_name).await {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
                Err(e) => return Err(handle_error(&what, e)),
            }
        }
        // The object checked above, not one made under the same name since.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: live.meta().uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match api.delete(&mirror_name, &params).await {
            Ok(_) => {
                tracing::info!(agent, kind = ?kind, name = %mirror_name, "deleted hub mirror: the spoke deleted the object");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(handle_error(&what, e)),
        }
    }

    /// Recreates or reverts a mirror from what the principal last wrote, in the background, while
    /// it is still what the principal remembers.
    fn spawn_restore<K: Mirrored>(
        self: &Arc<Self>,
        remembered: RememberedMirror<K>,
        why: &'static str,
    ) {
        let mirrors = self.clone();
        tokio::spawn(async move {
            let desired = remembered.object.unpack();
            let agent = remembered.owner.as_ref();
            let name = desired.name_str();
            let key = K::key(agent, name);
            tracing::info!(agent, kind = ?K::KIND, name, "hub mirror was {why}; restoring the spoke's version");
            for attempt in 0..5u32 {
                if !K::remembered(&mirrors).holds(&key, &remembered.object) {
                    return;
                }
                match mirrors.write_mirror(agent, &desired).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::debug!(agent, name, error = %e, "restoring the mirror failed; retrying");
                        tokio::time::sleep(Duration::from_millis(200 * 2u64.pow(attempt))).await;
                    }
                }
            }
        });
    }

    /// A hub Application in an autonomous agent's namespace changed: forward requests, revert edits.
    pub fn application_changed(
        self: &Arc<Self>,
        session: &AgentSession,
        old: Option<&Application>,
        new: &Application,
    ) {
        let agent = session.name.as_str();
        let name = new.name_str();
        let Some(remembered) = self.app_mirrors.get(&Application::key(agent, name)) else {
            return;
        };
        if new.is_terminating() {
            if new.metadata.finalizers.is_some() {
                let api = self.mirror_api::<Application>(agent);
                let name = name.to_string();
                tokio::spawn(async move {
                    let _ = release_finalizers(&api, &name).await;
                });
            }
            return;
        }
        // A request the mirror was written with is the spoke's, not the hub's: the remembered
        // mirror is unpacked to tell, only when `new` requests what `old` did not.
        let unpacked = std::cell::OnceCell::new();
        let desired = || unpacked.get_or_init(|| remembered.object.unpack());
        let new_op = new.operation();
        if new_op.is_some()
            && new_op != old.and_then(Application::operation)
            && new_op != desired().operation()
        {
            tracing::info!(
                agent,
                app = name,
                "sync requested on the hub mirror; forwarding it to the spoke"
            );
            queue(
                session,
                EventType::SetOperation,
                Target::Application,
                &application_payload(new, true),
            );
        }
        let terminating = |a: &Application| a.operation_phase() == Some("Terminating");
        if terminating(new) && !old.is_some_and(terminating) && !terminating(desired()) {
            tracing::info!(
                agent,
                app = name,
                "termination requested on the hub mirror; forwarding it to the spoke"
            );
            queue(
                session,
                EventType::TerminateOperation,
                Target::Application,
                &application_payload(new, false),
            );
        }
        let refresh = new.annotation(REFRESH_ANNOTATION);
        if refresh.is_some()
            && refresh != old.and_then(|o| o.annotation(REFRESH_ANNOTATION))
            && refresh != desired().annotation(REFRESH_ANNOTATION)
        {
            tracing::info!(
                agent,
                app = name,
                "refresh requested on the hub mirror; forwarding it to the spoke"
            );
            queue(
                session,
                EventType::SpecUpdate,
                Target::Application,
                &application_payload(new, false),
            );
        }
        if !remembered.shows(new) {
            self.spawn_restore(remembered, "edited on the hub");
        }
    }

    /// A hub AppProject changed: reverts edits of a remembered mirror. False when `new` is not
    /// a remembered mirror (the change is the managed agents' business).
    pub fn project_changed(self: &Arc<Self>, new: &AppProject) -> bool {
        let key = AppProject::key("", new.name_str());
        let Some(remembered) = self.project_mirrors.get(&key) else {
            return false;
        };
        if !new.is_terminating() && !remembered.shows(new) {
            self.spawn_restore(remembered, "edited on the hub");
        }
        true
    }

    /// A hub Application of autonomous agent `agent` was deleted: a remembered mirror is
    /// recreated.
    pub fn application_deleted(self: &Arc<Self>, agent: &str, last: &Application) {
        let key = Application::key(agent, last.name_str());
        if let Some(remembered) = self.app_mirrors.get(&key) {
            self.spawn_restore(remembered, "deleted on the hub");
        }
    }

    /// A hub AppProject was deleted: a remembered mirror is recreated. False when `last` is not
    /// a remembered mirror.
    pub fn project_deleted(self: &Arc<Self>, last: &AppProject) -> bool {
        let key = AppProject::key("", last.name_str());
        let Some(remembered) = self.project_mirrors.get(&key) else {
            return false;
        };
        self.spawn_restore(remembered, "deleted on the hub");
        true
    }

    /// Whether `agent`'s mirror of (kind, spoke name, spoke uid) exists on the hub.
    pub fn has_mirror(&self, kind: MirrorKind, agent: &str, name: &str, uid: &str) -> bool {
        fn has<K: Mirrored>(mirrors: &Mirrors, agent: &str, name: &str, uid: &str) -> bool {
            K::in_view(&mirrors.view, agent, &K::mirror_name(agent, name))
                .is_some_and(|l| is_mirror_of(&*l, agent, uid))
        }
        match kind {
            MirrorKind::Application => has::<Application>(self, agent, name, uid),
            MirrorKind::AppProject => has::<AppProject>(self, agent, name, uid),
        }
    }

    /// The checksum resync with an autonomous agent: one `request-update` per mirror (with the
    /// checksum of the spoke object it mirrors) and the checksum of the mirrored key set.
    pub fn autonomous_resync(&self, session: &AgentSession) {
        let agent = session.name.as_str();
        let apps: Vec<Arc<Application>> = self
            .view
            .applications_in(agent)
            .into_iter()
            .filter(|a| mirrored_by(&**a, agent))
            .collect();
        let prefix = format!("{agent}-");
        let projects: Vec<Arc<AppProject>> = self
            .view
            .projects()
            .into_iter()
            .filter(|p| mirrored_by(&**p, agent) && p.name_str().starts_with(&prefix))
            .collect();
        let mut keys = Vec::new();
        for app in &apps {
            let name = app.name_str();
            let uid = app.annotation(SOURCE_UID_ANNOTATION).unwrap_or_default();
            self.app_mirrors
                .remember_found(Application::key(agent, name), &**app, agent);
            keys.push(ResourceKey::new("Application", name, "", uid));
            request_object(session, "Application", name, uid, mirror_checksum(&**app));
        }
        for project in &projects {
            let mirror_name = project.name_str();
            let name = &mirror_name[prefix.len()..];
            let uid = project
                .annotation(SOURCE_UID_ANNOTATION)
                .unwrap_or_default();
            self.project_mirrors.remember_found(
                AppProject::key(agent, mirror_name),
                &**project,
                agent,
            );
            keys.push(ResourceKey::new("AppProject", name, "", uid));
            request_object(
                session,
                "AppProject",
                name,
                uid,
                mirror_checksum(&**project),
            );
        }
        match Event::request_synced_resource_list(SOURCE, set_checksum(&keys)) {
            Ok(ev) => push(session, keyed_request(ev, RESYNC_REQUEST_KEY)),
            Err(e) => tracing::error!(error = %e, "cannot build a resync request"),
        }
        tracing::info!(
            agent,
            applications = apps.len(),
            projects = projects.len(),
            "checksum resync with the autonomous agent started"
        );
    }
}

/// Removes every finalizer of mirror `name` (nothing on the hub may block a deletion the spoke
/// decided).
async fn release_finalizers<K: Mirrored>(api: &Api<K>, name: &str) -> Result<(), kube::Error> {
    let patch = serde_json::json!({"metadata": {"finalizers": null}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// The mirrors of one kind as the principal last wrote them (hub edits are reverted to these,
/// deletions recreate them), each packed with its owner and the digest of its [`mirror_view`]:
/// thousands of them cost about their JSON, and neither telling whether a hub change touched
/// what a mirror protects nor whether a restore is still wanted parses one.
pub struct Remembered<K>(RwLock<HashMap<MirrorKey, RememberedMirror<K>>>);

impl<K> Default for Remembered<K> {
    fn default() -> Self {
        Remembered(RwLock::new(HashMap::new()))
    }
}

/// One remembered mirror.
pub struct RememberedMirror<K> {
    /// The agent whose mirror it is.
    owner: Box<str>,
    /// The mirror as the principal last wrote it.
    object: Packed<K>,
    /// [`mirror_view`] of `object`, digested.
    view: JsonDigest,
}

// Derived, `Clone` would ask `K: Clone`; the fields are clones of bytes whatever `K` is.
impl<K> Clone for RememberedMirror<K> {
    fn clone(&self) -> Self {
        RememberedMirror {
            owner: self.owner.clone(),
            object: self.object.clone(),
            view: self.view,
        }
    }
}

/// What hub edits of `obj` may not change ([`mirror_view`]), digested.
fn view_digest<K: Mirrored>(obj: &K) -> JsonDigest {
    JsonDigest::of(&mirror_view(obj))
}

impl<K: Mirrored> RememberedMirror<K> {
    fn of(obj: &K, owner: &str) -> Self {
        RememberedMirror {
            owner: owner.into(),
            object: Packed::pack(obj),
            view: view_digest(obj),
        }
    }

    /// Whether hub object `live` shows everything this mirror protects as it was written.
    fn shows(&self, live: &K) -> bool {
        self.view == view_digest(live)
    }
}

impl<K: Mirrored> Remembered<K> {
    /// Remembers `desired` as `agent`'s mirror under `key`, unless another owner's mirror is
    /// remembered there (two agents whose `<agent>-<project>` names meet); what it remembered.
    fn remember(
        &self,
        key: MirrorKey,
        desired: &K,
        agent: &str,
    ) -> Result<Packed<K>, MirrorCollision> {
        let mirror = RememberedMirror::of(desired, agent);
        let packed = mirror.object.clone();
        let mut map = write(&self.0);
        if let Some(remembered) = map.get(&key) {
            owned_by(K::KIND, desired.name_str(), Some(&remembered.owner), agent)?;
        }
        map.insert(key, mirror);
        Ok(packed)
    }

    /// Remembers hub object `found`, `agent`'s mirror, under `key` unless a mirror is remembered
    /// there already (one the principal wrote since is newer than what the hub view shows).
    fn remember_found(&self, key: MirrorKey, found: &K, agent: &str) {
        write(&self.0)
            .entry(key)
            .or_insert_with(|| RememberedMirror::of(found, agent));
    }

    /// The mirror remembered under `key`.
    fn get(&self, key: &str) -> Option<RememberedMirror<K>> {
        read(&self.0).get(key).cloned()
    }

    /// Whether `object` is the mirror remembered under `key`.
    fn holds(&self, key: &str, object: &Packed<K>) -> bool {
        read(&self.0).get(key).is_some_and(|m| m.object == *object)
    }

    /// Forgets `agent`'s mirror under `key` (when it is `only_if`, if given).
    fn forget(&self, key: &str, agent: &str, only_if: Option<&Packed<K>>) {
        let mut map = write(&self.0);
        let ours =
            |m: &RememberedMirror<K>| *m.owner == *agent && only_if.is_none_or(|o| *o == m.object);
        if map.get(key).is_some_and(ours) {
            map.remove(key);
        }
    }

    #[cfg(test)]
    fn unpacked(&self, key: &str) -> Option<K> {
        self.get(key).map(|m| m.object.unpack())
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        read(&self.0).is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_proto::event::LAST_APPLIED_ANNOTATION;
    use serde_json::json;

    fn hub_object(name: &str, owner: Option<&str>) -> AppProject {
        let mut project: AppProject = serde_json::from_value(
            json!({"metadata": {"name": name, "annotations": {"note": "x"}}}),
        )
        .unwrap();
        if let Some(owner) = owner {
            project
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(MIRROR_AGENT_ANNOTATION.to_string(), owner.to_string());
        }
        project
    }

    #[test]
    fn only_the_agent_marked_on_a_hub_object_may_replace_or_delete_it() {
        let own = hub_object("team-x", Some("team"));
        assert_eq!(
            check_mirror_owner(MirrorKind::AppProject, &own, "team"),
            Ok(())
        );
        // Agent `team`'s project `b-x` and agent `team-b`'s project `x` share one hub name.
        let other = hub_object("team-b-x", Some("team-b"));
        let refused = check_mirror_owner(MirrorKind::AppProject, &other, "team").unwrap_err();
        assert_eq!(refused.owner.as_deref(), Some("team-b"));
        assert_eq!(refused.name, "team-b-x");
        // The agent is told the name is taken, not by whom.
        assert!(!refused.to_string().contains("team-b\""), "{refused}");
        assert!(refused.to_string().contains("not this agent's mirror"));
        // Made on the hub (no owner mark): nobody's mirror.
        let admin = hub_object("team-admin", None);
        let refused = check_mirror_owner(MirrorKind::AppProject, &admin, "team").unwrap_err();
        assert_eq!(refused.owner, None);
        let app = hub_object("hub-owned", None);
        assert!(check_mirror_owner(MirrorKind::Application, &app, "team").is_err());
    }

    #[test]
    fn a_remembered_mirror_is_never_replaced_by_another_agents_version() {
        let remembered = Remembered::<AppProject>::default();
        let key = || AppProject::key("team-b", "team-b-x");
        let theirs = hub_object("team-b-x", Some("team-b"));
        remembered.remember(key(), &theirs, "team-b").unwrap();
        let mine = hub_object("team-b-x", Some("team"));
        let refused = remembered.remember(key(), &mine, "team").unwrap_err();
        assert_eq!(refused.owner.as_deref(), Some("team-b"));
        assert_eq!(remembered.unpacked(&key()), Some(theirs.clone()));
        // Nor forgotten by it.
        remembered.forget(&key(), "team", None);
        assert_eq!(remembered.unpacked(&key()), Some(theirs.clone()));
        // The owner's next version replaces its own.
        let mut newer = theirs.clone();
        newer.spec.other.insert("description".into(), json!("v2"));
        let packed = remembered.remember(key(), &newer, "team-b").unwrap();
        assert_eq!(remembered.unpacked(&key()), Some(newer.clone()));
        assert!(remembered.holds(&key(), &packed));
        assert!(!remembered.holds(&key(), &Packed::pack(&theirs)));
        // Forgetting only a version it no longer holds leaves it; forgetting it drops it.
        remembered.forget(&key(), "team-b", Some(&Packed::pack(&theirs)));
        assert!(remembered.holds(&key(), &packed));
        remembered.forget(&key(), "team-b", Some(&packed));
        assert!(remembered.is_empty());
    }

    #[test]
    fn a_remembered_mirror_tells_hub_edits_of_what_it_protects_from_the_rest() {
        let written: Application = serde_json::from_value(json!({
            "metadata": {"name": "guestbook", "namespace": "auto",
                         "annotations": {MIRROR_AGENT_ANNOTATION: "auto"}},
            "spec": {"project": "auto-default"},
            "status": {"sync": {"status": "Synced"}}
        }))
        .unwrap();
        let remembered = RememberedMirror::of(&written, "auto");
        // As the apiserver stores it, with a refresh requested and kubectl's copy: no edit.
        let mut live = written.clone();
        live.metadata.resource_version = Some("7".into());
        live.metadata.uid = Some("hub-uid".into());
        live.metadata.labels = Some(Default::default());
        let annotations = live
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotations.insert(REFRESH_ANNOTATION.into(), "hard".into());
        annotations.insert(LAST_APPLIED_ANNOTATION.into(), "{}".into());
        assert!(remembered.shows(&live));
        let mut edited = live.clone();
        edited.spec.project = Some("default".into());
        assert!(!remembered.shows(&edited));
        let mut relabelled = live.clone();
        relabelled.metadata.labels = Some([("x".to_string(), "1".to_string())].into());
        assert!(!remembered.shows(&relabelled));
        let mut restated = live;
        restated.status = None;
        assert!(!remembered.shows(&restated));
    }

    #[test]
    fn collisions_are_counted_by_agent() {
        let registry = MetricsRegistry::empty();
        let collisions = MirrorCollisions::default();
        collisions.register(&registry);
        collisions.record("team");
        collisions.record("team");
        let text = registry.encode().unwrap();
        assert!(
            text.lines()
                .any(|l| l == "argocd_principal_mirror_collisions_total{agent_name=\"team\"} 2"),
            "{text}"
        );
    }

    mod through_the_view {
        use argocd_agent_proto::event::set_checksum;
        use argocd_agent_proto::mode::AgentMode;
        use argocd_agent_proto::payload::{RequestSyncedResourceList, RequestUpdate};

        use super::super::super::mapping::AppMapping;
        use super::super::super::namespaces::NamespaceCreation;
        use super::super::super::testing::*;
        use super::*;
        use crate::sessions::AgentRegistry;

        /// `agent`'s mirror annotations for spoke uid `uid` and checksum `checksum` (hex).
        fn marks(agent: &str, uid: &str, checksum: &str) -> Value {
            json!({MIRROR_AGENT_ANNOTATION: agent, SOURCE_UID_ANNOTATION: uid,
                   MIRROR_CHECKSUM_ANNOTATION: checksum})
        }

        /// Hub mirror of autonomous agent `agent`'s Application `name`.
        fn app_mirror(agent: &str, name: &str, checksum: &str) -> Value {
            let mut v = app(agent, name, "v1");
            v["metadata"]["annotations"] = marks(agent, &format!("spoke-{name}"), checksum);
            v
        }

        /// Hub mirror (`<agent>-<name>`) of autonomous agent `agent`'s AppProject `name`, marked
        /// as `owner`'s.
        fn project_mirror(agent: &str, name: &str, owner: &str, checksum: &str) -> Value {
            let mut v = project(&format!("{agent}-{name}"), &[agent]);
            v["metadata"]["annotations"] = marks(owner, &format!("spoke-{name}"), checksum);
            v
        }

        struct Fixture {
            mirrors: Arc<Mirrors>,
            registry: Arc<AgentRegistry>,
            collisions: MetricsRegistry,
            _feeds: Feeds,
        }

        async fn fixture(apps: Vec<Value>, projects: Vec<Value>) -> Fixture {
            fixture_allowing(vec![], apps, projects).await
        }

        /// [`fixture`] with `--allowed-namespaces` `allowed`.
        async fn fixture_allowing(
            allowed: Vec<String>,
            apps: Vec<Value>,
            projects: Vec<Value>,
        ) -> Fixture {
            let registry = registry(&[("auto", AgentMode::Autonomous)]);
            let (view, feeds) = listed(AppMapping::Namespace, apps, projects, vec![], None).await;
            let metrics = MetricsRegistry::empty();
            let options = MirrorOptions {
                allowed_namespaces: allowed,
                ..MirrorOptions::default()
            };
            options.collisions.register(&metrics);
            let mirrors = Mirrors::new(
                offline_client(),
                "argocd".into(),
                view,
                Namespaces::new(offline_client(), NamespaceCreation::default()),
                options,
            );
            Fixture {
                mirrors,
                registry,
                collisions: metrics,
                _feeds: feeds,
            }
        }

        #[tokio::test]
        async fn the_checksum_resync_asks_once_per_own_mirror_with_its_checksum_then_sends_the_key_set(
        ) {
            const N: usize = 20;
            let mut apps: Vec<Value> = (0..N)
                .map(|i| app_mirror("auto", &format!("app-{i:02}"), &format!("{i:02x}")))
                .collect();
            // Made on the hub in the agent's namespace, and a mirror another agent wrote: not
            // the agent's mirrors.
            apps.push(app("auto", "hub-made", "v1"));
            apps.push(app_mirror("other", "elsewhere", "ff"));
            let f = fixture(
                apps,
                vec![
                    project_mirror("auto", "p", "auto", "abcd"),
                    project_mirror("auto", "q", "auto-x", "abcd"),
                    project("auto-admin", &["auto"]),
                ],
            )
            .await;
            let session = f.registry.get("auto").unwrap();
            f.mirrors.autonomous_resync(&session);
            let events = drained_events(&session);
            assert_eq!(
                events.len(),
                N + 2,
                "one request per mirror, one key-set checksum"
            );
            let mut requests: Vec<RequestUpdate> = events[..N + 1]
                .iter()
                .map(|ev| {
                    assert_eq!(ev.event_type, EventType::RequestUpdate);
                    // O(1) each, whatever the objects hold.
                    assert!(ev.data.as_ref().unwrap().len() < 160, "{:?}", ev.data);
                    ev.data_as().unwrap()
                })
                .collect();
            requests.sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
            // AppProject sorts before Application.
            assert_eq!(
                requests[0],
                RequestUpdate {
                    name: "p".into(),
                    namespace: String::new(),
                    uid: "spoke-p".into(),
                    kind: "AppProject".into(),
                    checksum: vec![0xab, 0xcd],
                },
                "named as on the spoke"
            );
            for (i, r) in requests[1..].iter().enumerate() {
                assert_eq!(
                    (r.kind.as_str(), r.name.as_str(), r.uid.as_str()),
                    (
                        "Application",
                        format!("app-{i:02}").as_str(),
                        format!("spoke-app-{i:02}").as_str()
                    )
                );
                assert_eq!(r.checksum, vec![i as u8]);
            }
            let last = &events[N + 1];
            assert_eq!(last.event_type, EventType::RequestSyncedResourceList);
            let keys: Vec<ResourceKey> = requests
                .iter()
                .map(|r| ResourceKey::new(&r.kind, &r.name, "", &r.uid))
                .collect();
            assert_eq!(
                last.data_as::<RequestSyncedResourceList>()
                    .unwrap()
                    .checksum,
                set_checksum(&keys)
            );
            // What the resync found is remembered: the project mirror's hub edits are the
            // mirrors' business now, a hub-made project stays the managed router's.
            let p: AppProject =
                serde_json::from_value(project_mirror("auto", "p", "auto", "abcd")).unwrap();
            assert!(f.mirrors.project_changed(&p));
            let admin: AppProject =
                serde_json::from_value(project("auto-admin", &["auto"])).unwrap();
            assert!(!f.mirrors.project_changed(&admin));
            assert!(!f.mirrors.project_deleted(&admin));
        }

        #[tokio::test]
        async fn a_mirror_counts_as_the_agents_only_with_its_mark_and_the_spoke_uid() {
            let f = fixture(
                vec![
                    app_mirror("auto", "guestbook", "00"),
                    app("auto", "hub-made", "v1"),
                ],
                vec![project_mirror("auto", "p", "auto", "00")],
            )
            .await;
            let m = &f.mirrors;
            assert!(m.has_mirror(
                MirrorKind::Application,
                "auto",
                "guestbook",
                "spoke-guestbook"
            ));
            assert!(!m.has_mirror(MirrorKind::Application, "auto", "guestbook", "another-uid"));
            assert!(!m.has_mirror(MirrorKind::Application, "auto", "hub-made", "uid-hub-made"));
            assert!(m.has_mirror(MirrorKind::AppProject, "auto", "p", "spoke-p"));
            assert!(!m.has_mirror(MirrorKind::AppProject, "other", "p", "spoke-p"));
        }

        #[tokio::test]
        async fn a_sync_or_refresh_requested_on_a_mirror_is_forwarded_to_the_spoke_once() {
            let mirror = app_mirror("auto", "guestbook", "00");
            let f = fixture(vec![mirror.clone(), app("auto", "hub-made", "v1")], vec![]).await;
            let session = f.registry.get("auto").unwrap();
            f.mirrors.autonomous_resync(&session);
            drained_events(&session);
            let typed = |v: &Value| serde_json::from_value::<Application>(v.clone()).unwrap();

            let mut synced = mirror.clone();
            synced["operation"] = json!({"sync": {"revision": "HEAD"}});
            f.mirrors
                .application_changed(&session, Some(&typed(&mirror)), &typed(&synced));
            assert_eq!(
                drained(&session),
                vec!["set-operation Application guestbook"]
            );
            // The same operation seen again (any later change of the object): not sent twice.
            f.mirrors
                .application_changed(&session, Some(&typed(&synced)), &typed(&synced));
            assert!(drained(&session).is_empty());

            let mut refreshed = mirror.clone();
            refreshed["metadata"]["annotations"][REFRESH_ANNOTATION] = json!("hard");
            f.mirrors
                .application_changed(&session, Some(&typed(&mirror)), &typed(&refreshed));
            assert_eq!(drained(&session), vec!["spec-update Application guestbook"]);

            // Not a remembered mirror: nothing is forwarded.
            let mut hub_made = app("auto", "hub-made", "v1");
            hub_made["operation"] = json!({"sync": {"revision": "HEAD"}});
            f.mirrors
                .application_changed(&session, None, &typed(&hub_made));
            assert!(drained(&session).is_empty());
        }

        /// A refresh requested on the hub stays on the mirror until the spoke's Argo CD shows it
        /// refreshed (reconciled later than the mirror), then goes: `argocd app get --refresh`
        /// waits for exactly that.
        #[tokio::test]
        async fn a_hub_refresh_stays_on_the_mirror_until_the_spoke_reconciled_since() {
            let f = fixture(vec![], vec![]).await;
            let at = |v: &Value, t: &str| {
                let mut v = v.clone();
                v["status"]["reconciledAt"] = json!(t);
                serde_json::from_value::<Application>(v).unwrap()
            };
            let mirror = app_mirror("auto", "guestbook", "00");
            let mut live = mirror.clone();
            live["metadata"]["resourceVersion"] = json!("7");
            live["metadata"]["annotations"][REFRESH_ANNOTATION] = json!("normal");
            let live = at(&live, "2026-11-29T10:00:00Z");
            let mut changed = mirror.clone();
            changed["spec"]["source"]["targetRevision"] = json!("v2");
            let replace = |desired: &Application| {
                f.mirrors
                    .replacement("auto", &live, desired, "guestbook")
                    .unwrap()
                    .expect("a replacement")
            };
            let not_yet = replace(&at(&changed, "2026-11-29T10:00:00Z"));
            assert_eq!(not_yet.annotation(REFRESH_ANNOTATION), Some("normal"));
            let refreshed = replace(&at(&changed, "2026-11-29T10:00:05Z"));
            assert_eq!(refreshed.annotation(REFRESH_ANNOTATION), None);
        }

        #[tokio::test]
        async fn a_replacement_keeps_the_hubs_version_refresh_and_finalizers_and_refuses_foreign_objects(
        ) {
            let f = fixture(vec![], vec![]).await;
            let typed = |v: Value| serde_json::from_value::<AppProject>(v).unwrap();
            let desired = typed(project_mirror("auto", "p", "auto", "01"));

            let mut live = project_mirror("auto", "p", "auto", "01");
            live["metadata"]["resourceVersion"] = json!("7");
            assert_eq!(
                f.mirrors
                    .replacement("auto", &typed(live.clone()), &desired, "p")
                    .unwrap(),
                None,
                "already the spoke's version"
            );

            let mut edited = live.clone();
            edited["spec"]["description"] = json!("edited on the hub");
            edited["metadata"]["annotations"][REFRESH_ANNOTATION] = json!("normal");
            edited["metadata"]["finalizers"] = json!(["keep.me/finalizer"]);
            let body = f
                .mirrors
                .replacement("auto", &typed(edited), &desired, "p")
                .unwrap()
                .expect("a replacement");
            assert_eq!(body.spec, desired.spec, "the spoke's spec wins");
            assert_eq!(body.metadata.resource_version.as_deref(), Some("7"));
            assert_eq!(body.annotation(REFRESH_ANNOTATION), Some("normal"));
            assert_eq!(
                body.metadata.finalizers,
                Some(vec!["keep.me/finalizer".to_string()])
            );

            let mut terminating = live.clone();
            terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            assert!(matches!(
                f.mirrors
                    .replacement("auto", &typed(terminating), &desired, "p"),
                Err(HandleError::Retryable(_))
            ));

            let foreign = typed(project_mirror("auto", "p", "auto-x", "01"));
            let refused = f
                .mirrors
                .replacement("auto", &foreign, &desired, "p")
                .unwrap_err();
            assert!(
                matches!(&refused, HandleError::Rejected(m) if m.contains("not this agent's mirror")),
                "{refused}"
            );
            let text = f.collisions.encode().unwrap();
            assert!(
                text.lines()
                    .any(|l| l == "argocd_principal_mirror_collisions_total{agent_name=\"auto\"} 1"),
                "{text}"
            );
        }

        /// What agent `agent` sends for its spoke object `name`.
        fn spoke<K: Mirrored>(name: &str) -> K {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "argocd",
                "uid": format!("spoke-{name}")}, "spec": {}}))
            .unwrap()
        }

        fn rejected(r: Result<(), HandleError>, reason: &str) {
            assert!(
                matches!(&r, Err(HandleError::Rejected(m)) if m.contains(reason)),
                "{r:?}"
            );
        }

        #[tokio::test]
        async fn a_mirror_write_onto_a_name_that_is_not_the_agents_is_refused_before_any_request() {
            // Made on the hub in the agent's namespace; agent `team-b`'s mirror of its project
            // `x`, whose hub name agent `team`'s project `b-x` would take too.
            let f = fixture(
                vec![app("auto", "hub-made", "v1")],
                vec![project_mirror("team-b", "x", "team-b", "00")],
            )
            .await;
            // (The client reaches no apiserver: a request would fail as retryable, not refused.)
            rejected(
                f.mirrors
                    .upsert_mirror("auto", &spoke::<Application>("hub-made"))
                    .await,
                "not this agent's mirror",
            );
            rejected(
                f.mirrors
                    .upsert_mirror("team", &spoke::<AppProject>("b-x"))
                    .await,
                "not this agent's mirror",
            );
            rejected(
                f.mirrors
                    .upsert_mirror("auto", &spoke::<Application>(""))
                    .await,
                "no metadata.name",
            );
            let text = f.collisions.encode().unwrap();
            for agent in ["auto", "team"] {
                let line =
                    format!("argocd_principal_mirror_collisions_total{{agent_name=\"{agent}\"}} 1");
                assert!(text.lines().any(|l| l == line), "{text}");
            }
            // Nothing refused is remembered (so never restored over the hub's object).
            assert!(f.mirrors.app_mirrors.is_empty());
            assert!(f.mirrors.project_mirrors.is_empty());
        }

        #[tokio::test]
        async fn an_application_mirror_outside_the_allowed_namespaces_is_refused_naming_the_flag() {
            let f = fixture_allowing(vec!["edge-*".into()], vec![], vec![]).await;
            rejected(
                f.mirrors
                    .upsert_mirror("auto", &spoke::<Application>("guestbook"))
                    .await,
                "--allowed-namespaces",
            );
            // A positive control: an allowed namespace gets past the check to the write, which
            // here has no apiserver to reach and so fails as retryable.
            let allowed = f
                .mirrors
                .upsert_mirror("edge-1", &spoke::<Application>("guestbook"))
                .await;
            assert!(
                matches!(allowed, Err(HandleError::Retryable(_))),
                "{allowed:?}"
            );
        }
    }
}
