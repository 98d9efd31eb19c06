//! Autonomous agents: the hub mirrors of what their spokes own, and the mirrors' protection.
//!
//! Owns writing the mirrors of spoke objects ([`Mirrors::upsert_mirror`], [`Mirrors::delete_mirror`]),
//! remembering each mirror as written and reverting hub edits and deletions of it, forwarding
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

use argocd_agent_kube::errors::handle_error;
use argocd_agent_kube::resources;
use argocd_agent_proto::event::{
    set_checksum, Event, EventType, ResourceKey, Target, SOURCE_UID_ANNOTATION,
};
use argocd_agent_proto::sync::keyed_request;
use argocd_agent_proto::sync::resync::{
    MIRROR_AGENT_ANNOTATION, MIRROR_CHECKSUM_ANNOTATION, RESYNC_REQUEST_KEY,
};
use argocd_agent_proto::sync::HandleError;
use argocd_agent_runtime::telemetry::MetricsRegistry;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::Value;

use super::namespaces::Namespaces;
use super::view::{to_value, HubView, Kind};
use super::{name_of, push, queue, read, request_object, write, SOURCE};
use crate::routing::{
    application_payload, mirror_application, mirror_project, mirror_view, mirrored_project_name,
    namespace_allowed, REFRESH_ANNOTATION,
};
use crate::sessions::AgentSession;

type AppKey = (String, String);

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
pub fn check_mirror_owner(
    kind: MirrorKind,
    live: &Value,
    agent: &str,
) -> Result<(), MirrorCollision> {
    match mirror_agent_of(live) {
        Some(owner) if owner == agent => Ok(()),
        owner => Err(MirrorCollision {
            kind,
            name: name_of(live).to_string(),
            owner: owner.map(str::to_string),
        }),
    }
}

/// A mirror (JSON) as an Application; a hub object the informer held always is one.
fn typed_app(v: &Value) -> argocd_agent_kube::argocd::Application {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

/// Field manager of the principal's hub writes.
const FIELD_MANAGER: &str = "argocd-principal";

pub(super) fn source_uid_of(v: &Value) -> Option<&str> {
    v.pointer("/metadata/annotations")
        .and_then(|a| a.get(SOURCE_UID_ANNOTATION))
        .and_then(Value::as_str)
}

fn mirror_agent_of(v: &Value) -> Option<&str> {
    v.pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_AGENT_ANNOTATION))
        .and_then(Value::as_str)
}

fn is_terminating(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

fn phase(v: &Value) -> Option<&str> {
    v.pointer("/status/operationState/phase")
        .and_then(Value::as_str)
}

fn refresh(v: &Value) -> Option<&Value> {
    v.pointer("/metadata/annotations")
        .and_then(|a| a.get(REFRESH_ANNOTATION))
}

/// The kinds an autonomous agent owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorKind {
    /// Application, mirrored into namespace `<agent>`.
    Application,
    /// AppProject, mirrored as `<agent>-<name>` in the principal namespace.
    AppProject,
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
    /// Applications by (agent, name), AppProjects by mirror name. Hub edits are reverted to
    /// these; deletions recreate them.
    app_mirrors: RwLock<HashMap<AppKey, Value>>,
    project_mirrors: RwLock<HashMap<String, Value>>,
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
            app_mirrors: RwLock::new(HashMap::new()),
            project_mirrors: RwLock::new(HashMap::new()),
        })
    }
}

impl Mirrors {
    fn mirror_api(&self, kind: MirrorKind, agent: &str) -> Api<DynamicObject> {
        match kind {
            MirrorKind::Application => {
                Api::namespaced_with(self.client.clone(), agent, &resources::application())
            }
            MirrorKind::AppProject => Api::namespaced_with(
                self.client.clone(),
                &self.principal_namespace,
                &resources::appproject(),
            ),
        }
    }

    /// Writes the hub mirror of spoke object `spoke` of autonomous agent `agent` (the spoke's
    /// version wins over whatever the hub holds).
    pub async fn upsert_mirror(
        &self,
        kind: MirrorKind,
        agent: &str,
        spoke: &Value,
    ) -> Result<(), HandleError> {
        if name_of(spoke).is_empty() {
            return Err(HandleError::Rejected(
                "the object has no metadata.name".into(),
            ));
        }
        if kind == MirrorKind::Application
            && !namespace_allowed(&self.options.allowed_namespaces, agent)
        {
            return Err(HandleError::Rejected(format!(
                "hub namespace {agent:?} is not in the principal's --allowed-namespaces"
            )));
        }
        let desired = match kind {
            MirrorKind::Application => mirror_application(spoke, agent),
            MirrorKind::AppProject => mirror_project(spoke, agent, &self.principal_namespace),
        };
        let name = name_of(&desired).to_string();
        // The remembered mirrors decide what hub edits are reverted to: another owner's name
        // never enters them (the write below checks the apiserver's object; this the hub view and
        // the writes in flight).
        let cached = match kind {
            MirrorKind::Application => self.view.application(agent, &name).map(|a| to_value(&*a)),
            MirrorKind::AppProject => self.view.project(&name).map(|p| to_value(&*p)),
        };
        if let Some(cached) = &cached {
            self.refuse_foreign(kind, agent, cached)?;
        }
        let remembered = match kind {
            MirrorKind::Application => remember_mirror(
                &mut write(&self.app_mirrors),
                (agent.to_string(), name.clone()),
                kind,
                &desired,
                agent,
            ),
            MirrorKind::AppProject => remember_mirror(
                &mut write(&self.project_mirrors),
                name.clone(),
                kind,
                &desired,
                agent,
            ),
        };
        remembered.map_err(|c| self.refused(agent, c))?;
        let written = self.write_mirror(kind, agent, &desired).await;
        if let Err(HandleError::Rejected(_)) = &written {
            // Not written (e.g. the name is another owner's): nothing to protect or restore.
            self.forget_mirror(kind, agent, &name, Some(&desired));
        }
        written
    }

    /// Refuses (and counts) a write or deletion by `agent` of hub object `live` that is not its
    /// mirror.
    fn refuse_foreign(
        &self,
        kind: MirrorKind,
        agent: &str,
        live: &Value,
    ) -> Result<(), HandleError> {
        check_mirror_owner(kind, live, agent).map_err(|c| self.refused(agent, c))
    }

    fn refused(&self, agent: &str, c: MirrorCollision) -> HandleError {
        self.options.collisions.record(agent);
        tracing::debug!(agent, kind = ?c.kind, name = %c.name, owner = ?c.owner, "refused a mirror write: the hub object of that name is not this agent's mirror");
        HandleError::Rejected(c.to_string())
    }

    /// Drops the remembered mirror `name` of `agent` (when it is `only_if`, if given): it is no
    /// longer restored after hub edits or deletions.
    fn forget_mirror(&self, kind: MirrorKind, agent: &str, name: &str, only_if: Option<&Value>) {
        let ours = |v: &Value| mirror_agent_of(v) == Some(agent) && only_if.is_none_or(|o| o == v);
        match kind {
            MirrorKind::Application => {
                let mut apps = write(&self.app_mirrors);
                let key = (agent.to_string(), name.to_string());
                if apps.get(&key).is_some_and(ours) {
                    apps.remove(&key);
                }
            }
            MirrorKind::AppProject => {
                let mut projects = write(&self.project_mirrors);
                if projects.get(name).is_some_and(ours) {
                    projects.remove(name);
                }
            }
        }
    }

    /// Creates or replaces a mirror with `desired`, keeping a hub-requested operation.
    async fn write_mirror(
        &self,
        kind: MirrorKind,
        agent: &str,
        desired: &Value,
    ) -> Result<(), HandleError> {
        let name = name_of(desired);
        let api = self.mirror_api(kind, agent);
        let what = format!("mirror {kind:?} {name} of agent {agent}");
        // A bulk of new mirrors (e.g. after a long disconnect) costs one write each, not a read
        // and a write: when the hub view holds no object of that name, try to create first (an
        // existing one, or any failure, falls through to the read below).
        if !self.mirror_known(kind, agent, name) {
            if let Ok(body) = serde_json::from_value(desired.clone()) {
                if let Ok(true) = Self::create_mirror(&api, kind, agent, &body).await {
                    return Ok(());
                }
            }
        }
        let live = api
            .get_opt(name)
            .await
            .map_err(|e| handle_error(&what, e))?;
        let body: DynamicObject = match live {
            None => serde_json::from_value(desired.clone())
                .map_err(|e| HandleError::Rejected(format!("{what}: {e}")))?,
            Some(live) => {
                let live = to_value(&live);
                self.refuse_foreign(kind, agent, &live)?;
                if is_terminating(&live) {
                    return Err(HandleError::Retryable(format!(
                        "{what} is being deleted; retrying once gone"
                    )));
                }
                if mirror_view(&live) == mirror_view(desired)
                    && live.get("operation") == desired.get("operation")
                {
                    return Ok(());
                }
                let mut body = desired.clone();
                body["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"].clone();
                if let Some(r) = refresh(&live) {
                    body["metadata"]["annotations"][REFRESH_ANNOTATION] = r.clone();
                }
                if let Some(f) = live.pointer("/metadata/finalizers") {
                    body["metadata"]["finalizers"] = f.clone();
                }
                let replaced: DynamicObject = serde_json::from_value(body)
                    .map_err(|e| HandleError::Rejected(format!("{what}: {e}")))?;
                api.replace(
                    name,
                    &PostParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &replaced,
                )
                .await
                .map_err(|e| handle_error(&what, e))?;
                tracing::debug!(agent, kind = ?kind, name, "updated hub mirror from the spoke");
                return Ok(());
            }
        };
        match Self::create_mirror(&api, kind, agent, &body).await {
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

    /// Whether the hub view holds an object named like mirror `name` (or is not listed yet).
    fn mirror_known(&self, kind: MirrorKind, agent: &str, name: &str) -> bool {
        match kind {
            MirrorKind::Application => {
                !self.view.is_listed(Kind::Application)
                    || self.view.application(agent, name).is_some()
            }
            MirrorKind::AppProject => {
                !self.view.is_listed(Kind::AppProject) || self.view.project(name).is_some()
            }
        }
    }

    /// Creates mirror `body`; `Ok(false)` when an object of that name already exists.
    async fn create_mirror(
        api: &Api<DynamicObject>,
        kind: MirrorKind,
        agent: &str,
        body: &DynamicObject,
    ) -> Result<bool, kube::Error> {
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match api.create(&params, body).await {
            Ok(created) => {
                let name = created.metadata.name.as_deref().unwrap_or_default();
                tracing::info!(agent, kind = ?kind, name, "created hub mirror of a spoke object");
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Deletes the hub mirror of spoke object `name` (uid `uid`, empty = any) of agent `agent`:
    /// the spoke deleted it. Not recreated afterwards. Only `agent`'s mirror is deleted: the
    /// object is read from the apiserver, checked, and deleted with its uid as precondition.
    pub async fn delete_mirror(
        &self,
        kind: MirrorKind,
        agent: &str,
        name: &str,
        uid: &str,
    ) -> Result<(), HandleError> {
        let mirror_name = match kind {
            MirrorKind::Application => name.to_string(),
            MirrorKind::AppProject => mirrored_project_name(agent, name),
        };
        let api = self.mirror_api(kind, agent);
        let what = format!("deleting mirror {kind:?} {mirror_name} of agent {agent}");
        let Some(live) = api
            .get_opt(&mirror_name)
            .await
            .map_err(|e| handle_error(&what, e))?
            .map(|live| to_value(&live))
        else {
            self.forget_mirror(kind, agent, &mirror_name, None);
            return Ok(());
        };
        self.refuse_foreign(kind, agent, &live)?;
        let theirs = source_uid_of(&live);
        if !uid.is_empty() && theirs.is_some_and(|t| t != uid) {
            tracing::debug!(
                agent,
                name,
                "delete for an older spoke object; the mirror is a newer one"
            );
            return Ok(());
        }
        self.forget_mirror(kind, agent, &mirror_name, None);
        if live.pointer("/metadata/finalizers").is_some() {
            let patch = serde_json::json!({"metadata": {"finalizers": null}});
            match api
                .patch(&mirror_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
                Err(e) => return Err(handle_error(&what, e)),
            }
        }
        // The object checked above, not one made under the same name since.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: live
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .map(str::to_string),
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

    /// Recreates or reverts a mirror from what the principal last wrote, in the background.
    fn spawn_restore(self: &Arc<Self>, kind: MirrorKind, desired: Value, why: &'static str) {
        let mirrors = self.clone();
        tokio::spawn(async move {
            let agent = mirror_agent_of(&desired).unwrap_or_default().to_string();
            let name = name_of(&desired).to_string();
            tracing::info!(agent, kind = ?kind, name, "hub mirror was {why}; restoring the spoke's version");
            for attempt in 0..5u32 {
                let still_wanted = match kind {
                    MirrorKind::Application => {
                        read(&mirrors.app_mirrors).get(&(agent.clone(), name.clone()))
                            == Some(&desired)
                    }
                    MirrorKind::AppProject => {
                        read(&mirrors.project_mirrors).get(&name) == Some(&desired)
                    }
                };
                if !still_wanted {
                    return;
                }
                match mirrors.write_mirror(kind, &agent, &desired).await {
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
        old: Option<&Value>,
        new: &Value,
    ) {
        let agent = session.name.as_str();
        let Some(desired) = read(&self.app_mirrors)
            .get(&(agent.to_string(), name_of(new).to_string()))
            .cloned()
        else {
            return;
        };
        if is_terminating(new) {
            if new.pointer("/metadata/finalizers").is_some() {
                let mirrors = self.clone();
                let name = name_of(new).to_string();
                let agent = agent.to_string();
                tokio::spawn(async move {
                    let patch = serde_json::json!({"metadata": {"finalizers": null}});
                    let _ = mirrors
                        .mirror_api(MirrorKind::Application, &agent)
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                });
            }
            return;
        }
        let new_op = new.get("operation").filter(|o| !o.is_null());
        let old_op = old
            .and_then(|o| o.get("operation"))
            .filter(|o| !o.is_null());
        let written_op = desired.get("operation").filter(|o| !o.is_null());
        if new_op.is_some() && new_op != old_op && new_op != written_op {
            tracing::info!(
                agent,
                app = name_of(new),
                "sync requested on the hub mirror; forwarding it to the spoke"
            );
            queue(
                session,
                EventType::SetOperation,
                Target::Application,
                &application_payload(&typed_app(new), true),
            );
        }
        if phase(new) == Some("Terminating")
            && old.and_then(phase) != Some("Terminating")
            && phase(&desired) != Some("Terminating")
        {
            tracing::info!(
                agent,
                app = name_of(new),
                "termination requested on the hub mirror; forwarding it to the spoke"
            );
            queue(
                session,
                EventType::TerminateOperation,
                Target::Application,
                &application_payload(&typed_app(new), false),
            );
        }
        if refresh(new).is_some()
            && refresh(new) != old.and_then(refresh)
            && refresh(new) != refresh(&desired)
        {
            tracing::info!(
                agent,
                app = name_of(new),
                "refresh requested on the hub mirror; forwarding it to the spoke"
            );
            queue(
                session,
                EventType::SpecUpdate,
                Target::Application,
                &application_payload(&typed_app(new), false),
            );
        }
        if mirror_view(new) != mirror_view(&desired) {
            self.spawn_restore(MirrorKind::Application, desired, "edited on the hub");
        }
    }

    /// A hub AppProject changed: reverts edits of a remembered mirror. False when `new` is not
    /// a remembered mirror (the change is the managed agents' business).
    pub fn project_changed(self: &Arc<Self>, new: &Value) -> bool {
        let Some(desired) = read(&self.project_mirrors).get(name_of(new)).cloned() else {
            return false;
        };
        if !is_terminating(new) && mirror_view(new) != mirror_view(&desired) {
            self.spawn_restore(MirrorKind::AppProject, desired, "edited on the hub");
        }
        true
    }

    /// A hub Application of autonomous agent `agent` was deleted: a remembered mirror is
    /// recreated.
    pub fn application_deleted(self: &Arc<Self>, agent: &str, last: &Value) {
        let key = (agent.to_string(), name_of(last).to_string());
        if let Some(desired) = read(&self.app_mirrors).get(&key).cloned() {
            self.spawn_restore(MirrorKind::Application, desired, "deleted on the hub");
        }
    }

    /// A hub AppProject was deleted: a remembered mirror is recreated. False when `last` is not
    /// a remembered mirror.
    pub fn project_deleted(self: &Arc<Self>, last: &Value) -> bool {
        let Some(desired) = read(&self.project_mirrors).get(name_of(last)).cloned() else {
            return false;
        };
        self.spawn_restore(MirrorKind::AppProject, desired, "deleted on the hub");
        true
    }

    /// Whether `agent`'s mirror of (kind, spoke name, spoke uid) exists on the hub.
    pub fn has_mirror(&self, kind: MirrorKind, agent: &str, name: &str, uid: &str) -> bool {
        let live = match kind {
            MirrorKind::Application => self.view.application(agent, name).map(|a| to_value(&*a)),
            MirrorKind::AppProject => self
                .view
                .project(&mirrored_project_name(agent, name))
                .map(|p| to_value(&*p)),
        };
        live.is_some_and(|l| mirror_agent_of(&l) == Some(agent) && source_uid_of(&l) == Some(uid))
    }

    /// The checksum resync with an autonomous agent: one `request-update` per mirror (with the
    /// checksum of the spoke object it mirrors) and the checksum of the mirrored key set.
    pub fn autonomous_resync(&self, session: &AgentSession) {
        let agent = session.name.as_str();
        let checksum_of = |v: &Value| {
            v.pointer("/metadata/annotations")
                .and_then(|a| a.get(MIRROR_CHECKSUM_ANNOTATION))
                .and_then(Value::as_str)
                .and_then(|h| hex::decode(h).ok())
                .unwrap_or_default()
        };
        let apps: Vec<Value> = self
            .view
            .applications_of(agent)
            .iter()
            .map(|a| to_value(&**a))
            .filter(|v| mirror_agent_of(v) == Some(agent) && source_uid_of(v).is_some())
            .collect();
        let prefix = format!("{agent}-");
        let projects: Vec<Value> = self
            .view
            .projects()
            .iter()
            .map(|p| to_value(&**p))
            .filter(|v| mirror_agent_of(v) == Some(agent) && name_of(v).starts_with(&prefix))
            .collect();
        let mut keys = Vec::new();
        for app in &apps {
            let name = name_of(app);
            let uid = source_uid_of(app).unwrap_or_default();
            write(&self.app_mirrors)
                .entry((agent.to_string(), name.to_string()))
                .or_insert_with(|| app.clone());
            keys.push(ResourceKey::new("Application", name, "", uid));
            request_object(session, "Application", name, uid, checksum_of(app));
        }
        for project in &projects {
            let mirror_name = name_of(project);
            let name = &mirror_name[prefix.len()..];
            let uid = source_uid_of(project).unwrap_or_default();
            write(&self.project_mirrors)
                .entry(mirror_name.to_string())
                .or_insert_with(|| project.clone());
            keys.push(ResourceKey::new("AppProject", name, "", uid));
            request_object(session, "AppProject", name, uid, checksum_of(project));
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

/// Remembers `desired` as `agent`'s mirror under `key`, unless another owner's mirror is
/// remembered there (two agents whose `<agent>-<project>` names meet).
fn remember_mirror<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, Value>,
    key: K,
    kind: MirrorKind,
    desired: &Value,
    agent: &str,
) -> Result<(), MirrorCollision> {
    if let Some(remembered) = map.get(&key) {
        check_mirror_owner(kind, remembered, agent)?;
    }
    map.insert(key, desired.clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hub_object(name: &str, owner: Option<&str>) -> Value {
        let mut v = json!({"metadata": {"name": name, "annotations": {"note": "x"}}});
        if let Some(owner) = owner {
            v["metadata"]["annotations"][MIRROR_AGENT_ANNOTATION] = json!(owner);
        }
        v
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
        let mut remembered: HashMap<String, Value> = HashMap::new();
        let theirs = hub_object("team-b-x", Some("team-b"));
        remember_mirror(
            &mut remembered,
            "team-b-x".into(),
            MirrorKind::AppProject,
            &theirs,
            "team-b",
        )
        .unwrap();
        let mine = hub_object("team-b-x", Some("team"));
        assert!(remember_mirror(
            &mut remembered,
            "team-b-x".into(),
            MirrorKind::AppProject,
            &mine,
            "team"
        )
        .is_err());
        assert_eq!(remembered["team-b-x"], theirs);
        // The owner's next version replaces its own.
        let mut newer = theirs.clone();
        newer["spec"] = json!({"description": "v2"});
        remember_mirror(
            &mut remembered,
            "team-b-x".into(),
            MirrorKind::AppProject,
            &newer,
            "team-b",
        )
        .unwrap();
        assert_eq!(remembered["team-b-x"], newer);
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
}
