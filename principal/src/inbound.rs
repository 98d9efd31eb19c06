//! Events from an agent, applied on the hub. Managed agents: Application status (written onto the
//! hub object — Argo CD's Application has no status subresource), confirmation of deletions the
//! hub asked for, and the checksum resync (for Applications, AppProjects and repository Secrets):
//! `request-update{checksum}` answered only where the hub's copy differs (or is being deleted, or
//! is gone), `request-synced-resource-list{checksum}` answered with the hub's keys only when the
//! key sets differ.
//! Autonomous agents: the spoke's Applications and AppProjects (`create`/`spec-update` = write the
//! mirror, `delete` = remove it), and their resync answers (`response-synced-resource` for a key
//! the hub may lack, `request-resource-resync`). A managed agent can only ever read or write the
//! hub Applications mapped to it ([`crate::hub::AppMapping`]: by namespace, the namespace is taken
//! from the authenticated agent, never from the event; by destination, the event names the hub
//! namespace and the Application found there must have the agent as `spec.destination.name`).
//! An autonomous agent only touches objects in its own hub namespace (and its own `<agent>-`
//! AppProjects), the namespace taken from the authenticated agent; and within those names only the objects the
//! principal marked as its mirrors ([`crate::hub::check_mirror_owner`]), whatever uid the event
//! carries. Every name an event carries is checked as a
//! Kubernetes name before it is used (`argocd_agent_proto::event::names`).
//! Either mode: `cluster-cache-info-update` (the spoke's cache counts) goes to
//! [`crate::cluster_info`].

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use argocd_agent_kube::argocd::{
    same_operation, AppProject, Application, ApplicationCondition, ObjectMetaExt,
};
use argocd_agent_proto::event::{
    names, spec_checksum, Event, EventType, Target, GPG_KEY_RESYNC_KIND, REPOSITORY_RESYNC_KIND,
    SOURCE_UID_ANNOTATION,
};
use argocd_agent_proto::payload::{
    ClusterCacheInfo, ErrorData, RequestSyncedResourceList, RequestUpdate,
};
use argocd_agent_proto::sync::resync::{
    answer_request_update, answer_with_metadata, checksum_of, status_checksum, SourceObject,
    UpdateAnswer, METADATA_CHECKSUM, STATUS_CHECKSUM,
};
use argocd_agent_proto::sync::{EventHandler, HandleError};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};

use argocd_agent_kube::errors::handle_error;

use crate::hub::{
    queue, request_object, request_object_in, to_value, AppMapping, Hub, MirrorKind, Mirrored,
};
use crate::routing::{
    application_payload, operation_already_started, repository_payload, requests_carried_out,
};
use crate::sessions::AgentSession;
use argocd_agent_proto::mode::AgentMode;
use argocd_agent_proto::payload::SyncedResource;
use argocd_agent_proto::peer_input::Truncated;

/// Condition type written on a hub Application when its agent could not apply it (upstream's name).
pub const AGENT_ERROR: &str = "AgentError";

/// Handles one agent's inbound events.
pub struct AgentInbound {
    /// The agent's session (name, outbox for replies).
    pub session: Arc<AgentSession>,
    /// The hub view.
    pub hub: Arc<Hub>,
    /// Callers waiting for the agent's live answers (resource/redis proxies, logs).
    pub live: Arc<crate::live::LiveRequests>,
    /// Where the agent's cluster cache counts are shown to the hub's Argo CD.
    pub cluster_info: Arc<crate::cluster_info::ClusterInfoWriter>,
    /// The status this stream last wrote per hub Application.
    pub status_writes: StatusWrites,
}

/// The status last written per hub Application (its checksum), so that a status equal to the
/// hub view is skipped only when the view is not behind a write of this stream: an agent whose
/// status goes A → B → A in quick succession must leave A on the hub, although the view may
/// still show A when the second A arrives (it has not seen B yet).
#[derive(Debug, Default)]
pub struct StatusWrites(std::sync::Mutex<std::collections::HashMap<String, u64>>);

impl StatusWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, u64>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the view's copy of `name`'s status can be trusted to hold `status`: true unless
    /// this stream last wrote a different status (the view may not show that write yet).
    fn view_trusted_for(&self, name: &str, status: u64) -> bool {
        self.lock().get(name).is_none_or(|last| *last == status)
    }

    fn wrote(&self, name: &str, status: u64) {
        self.lock().insert(name.to_string(), status);
    }
}

fn required_name<K: kube::Resource>(obj: &K) -> Result<&str, HandleError> {
    Some(obj.name_str())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| HandleError::Rejected("object has no metadata.name".into()))
}

impl AgentInbound {
    fn agent(&self) -> &str {
        self.session.name.as_str()
    }

    /// Hub Applications in `namespace`.
    fn apps(&self, namespace: &str) -> Api<Application> {
        Api::namespaced(self.hub.client.clone(), namespace)
    }

    /// The hub namespace of the Application spoke copy `spoke` (as this agent sent it).
    fn hub_namespace_of<'a>(&'a self, spoke: &'a Application) -> &'a str {
        self.hub
            .mapping()
            .hub_namespace_of(self.agent(), spoke, &self.hub.principal_namespace)
    }

    /// The hub namespace of an Application this agent named as `namespace`/… in a request.
    fn hub_namespace<'a>(&'a self, namespace: &'a str) -> &'a str {
        self.hub.mapping().hub_namespace(
            self.agent(),
            namespace,
            false,
            &self.hub.principal_namespace,
        )
    }

    async fn status_update(&self, ev: &Event) -> Result<(), HandleError> {
        let spoke: Application = ev
            .data_as()
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        let name = required_name(&spoke)?;
        let namespace = self.hub_namespace_of(&spoke);
        let Some(hub_app) = self.hub.application(self.agent(), namespace, name) else {
            return Err(HandleError::Rejected(format!(
                "no Application {namespace}/{name} of agent {} on the hub",
                self.agent()
            )));
        };
        let hub_uid = hub_app.metadata.uid.as_deref();
        let source_uid = spoke.annotation(SOURCE_UID_ANNOTATION);
        if source_uid != hub_uid {
            return Err(HandleError::Rejected(format!(
                "status for {name} is from a different object (source-uid {source_uid:?}, hub uid {hub_uid:?})"
            )));
        }
        let status = serde_json::to_value(&spoke.status)
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        let mut ops = vec![json!({"op": "add", "path": "/status", "value": status})];
        let hub_op = hub_app.operation();
        let ran = hub_op
            .zip(spoke.started_operation())
            .is_some_and(|(requested, started)| same_operation(requested, started));
        if ran && spoke.operation().is_none() {
            ops.push(json!({"op": "remove", "path": "/operation"}));
        }
        let checksum = {
            let mut h = std::hash::DefaultHasher::new();
            status.to_string().hash(&mut h);
            h.finish()
        };
        if hub_app.status != spoke.status
            || ops.len() > 1
            || !self.status_writes.view_trusted_for(name, checksum)
        {
            let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops))
                .map_err(|e| HandleError::Rejected(e.to_string()))?;
            self.apps(namespace)
                .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await
                .map_err(|e| handle_error("writing the hub Application", e))?;
            self.status_writes.wrote(name, checksum);
        }
        let done = requests_carried_out(&hub_app, &spoke);
        if !done.is_empty() {
            // A merge patch: removing an annotation that is already gone is no error.
            let annotations: serde_json::Map<String, Value> =
                done.iter().map(|k| (k.to_string(), Value::Null)).collect();
            let patch = json!({"metadata": {"annotations": annotations}});
            self.apps(namespace)
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| handle_error("writing the hub Application", e))?;
        }
        Ok(())
    }

    async fn delete_confirmed(&self, ev: &Event) -> Result<(), HandleError> {
        let spoke: Application = ev
            .data_as()
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        let name = required_name(&spoke)?;
        let namespace = self.hub_namespace_of(&spoke);
        let Some(hub_app) = self.hub.application(self.agent(), namespace, name) else {
            return Ok(());
        };
        if !hub_app.is_terminating() {
            tracing::info!(
                agent = self.agent(),
                app = name,
                "agent reported a delete the hub did not ask for; ignoring"
            );
            return Ok(());
        }
        let patch = json!({"metadata": {"finalizers": null}});
        match self
            .apps(namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(handle_error(
                "releasing the hub Application's finalizers",
                e,
            )),
        }
    }

    /// An agent could not apply an Application (e.g. its apiserver refused it): record it on the
    /// hub object as an `AgentError` condition, replacing an earlier one, so the hub's users see it.
    async fn error_report(&self, ev: &Event) -> Result<(), HandleError> {
        let report: ErrorData = ev
            .data_as()
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        let namespace = self.hub_namespace(&report.resource_namespace);
        let Some(hub_app) = self
            .hub
            .application(self.agent(), namespace, &report.resource_name)
        else {
            return Err(HandleError::Rejected(format!(
                "error report for unknown Application {:?}",
                report.resource_name
            )));
        };
        tracing::warn!(agent = self.agent(), app = %report.resource_name, message = %Truncated(&report.message), "agent could not apply an Application");
        let mut conditions: Vec<ApplicationCondition> = hub_app
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|c| {
                c.iter()
                    .filter(|c| c.type_.as_deref() != Some(AGENT_ERROR))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        conditions.push(ApplicationCondition {
            type_: Some(AGENT_ERROR.into()),
            message: Some(report.message),
            last_transition_time: Some(
                chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            ),
            ..ApplicationCondition::default()
        });
        let op = if hub_app.status.is_some() {
            json!({"op": "add", "path": "/status/conditions", "value": conditions})
        } else {
            json!({"op": "add", "path": "/status", "value": {"conditions": conditions}})
        };
        let patch: json_patch::Patch = serde_json::from_value(json!([op]))
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        self.apps(namespace)
            .patch(
                &report.resource_name,
                &PatchParams::default(),
                &Patch::<()>::Json(patch),
            )
            .await
            .map_err(|e| handle_error("writing the hub Application", e))?;
        Ok(())
    }

    fn request_update(&self, ev: &Event) -> Result<(), HandleError> {
        let req: RequestUpdate = ev
            .data_as()
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        // The hub's object of that name (as the agent would receive it), if it still applies.
        let hub_app = match req.kind.as_str() {
            "Application" => {
                let namespace = self.hub_namespace(&req.namespace);
                self.hub.application(self.agent(), namespace, &req.name)
            }
            _ => None,
        };
        let (target, hub_uid, payload, terminating) = match req.kind.as_str() {
            "Application" => (
                Target::Application,
                hub_app.as_ref().map(|o| o.uid_str().to_string()),
                hub_app
                    .as_ref()
                    .map(|o| to_value(&application_payload(o, false))),
                hub_app.as_ref().is_some_and(|o| o.is_terminating()),
            ),
            "AppProject" => {
                let obj = self.hub.project_for(self.agent(), &req.name);
                let payload = obj
                    .as_ref()
                    .map(|o| to_value(&self.hub.mapping().project_copy(o, self.agent())));
                let terminating = obj.as_ref().is_some_and(|o| o.is_terminating());
                (
                    Target::AppProject,
                    obj.map(|o| o.uid_str().to_string()),
                    payload,
                    terminating,
                )
            }
            // `Secret`: our agents before upstream's `Repository`.
            REPOSITORY_RESYNC_KIND | "Secret" => {
                let obj = self.hub.repository_for(self.agent(), &req.name);
                let payload = obj.as_deref().map(|s| to_value(&repository_payload(s)));
                let terminating = obj.as_ref().is_some_and(|s| s.is_terminating());
                (
                    Target::Repository,
                    obj.as_ref().map(|s| s.uid_str().to_string()),
                    payload,
                    terminating,
                )
            }
            GPG_KEY_RESYNC_KIND => {
                let obj = self.hub.gpg_keys().filter(|cm| cm.name_str() == req.name);
                (
                    Target::GpgKey,
                    obj.as_ref().map(|cm| cm.uid_str().to_string()),
                    obj.as_ref()
                        .map(|cm| to_value(&crate::hub::gpg_keys::payload(cm))),
                    obj.as_ref()
                        .is_some_and(|cm| cm.metadata.deletion_timestamp.is_some()),
                )
            }
            other => {
                return Err(HandleError::Rejected(format!(
                    "request-update for unsupported kind {other:?}"
                )))
            }
        };
        let hub_uid = hub_uid.as_deref().unwrap_or_default();
        let checksum = payload
            .as_ref()
            .and_then(|p| spec_checksum(p, Some(&req.kind)).ok())
            .unwrap_or_default();
        let source = payload.as_ref().map(|_| SourceObject {
            uid: hub_uid,
            checksum: &checksum,
            terminating,
        });
        let answer = answer_with_metadata(
            answer_request_update(source, &req.uid, &req.checksum),
            payload.as_ref(),
            checksum_of(ev, METADATA_CHECKSUM).as_deref(),
        );
        if let (Some(hub_app), Some(spoke_status)) =
            (hub_app.as_ref(), checksum_of(ev, STATUS_CHECKSUM))
        {
            self.ask_status_if_differs(hub_app, &req, &spoke_status);
        }
        match (answer, payload) {
            (UpdateAnswer::UpToDate, _) => {}
            (UpdateAnswer::SendObject, Some(payload)) => {
                queue(&self.session, EventType::SpecUpdate, target, &payload)
            }
            _ => {
                // The hub no longer has it (or has a different object by that name): the agent's copy goes.
                let stub = json!({"metadata": {"name": req.name, "namespace": req.namespace, "uid": req.uid}});
                queue(&self.session, EventType::Delete, target, &stub);
            }
        }
        Ok(())
    }
}

impl AgentInbound {
    /// The agent sent the [`status_checksum`] of its copy of `hub_app` with a `request-update`
    /// (resync after its restart, or periodic): asks it for the status when the hub holds another
    /// one, or an operation the spoke already started (its status-update removes it), so that
    /// an unchanged status costs no message and no hub write.
    fn ask_status_if_differs(
        &self,
        hub_app: &Application,
        req: &RequestUpdate,
        spoke_status: &[u8],
    ) {
        let hub_uid = hub_app.uid_str();
        if req.uid != hub_uid {
            return;
        }
        let hub_status = status_checksum(&to_value(hub_app));
        let leftover_operation =
            hub_app.operation().is_some() && operation_already_started(hub_app);
        if hub_status != spoke_status || leftover_operation {
            tracing::debug!(agent = self.agent(), app = %req.name, "hub status differs from the spoke's; asking the agent for it");
            // Under destination mapping the agent needs the hub namespace to find its copy.
            let namespace = match self.hub.mapping() {
                AppMapping::Namespace => "",
                AppMapping::Destination => hub_app.namespace_str(),
            };
            request_object_in(
                &self.session,
                &req.kind,
                namespace,
                &req.name,
                hub_uid,
                hub_status,
            );
        }
    }

    /// Writes the hub mirror of the spoke object `ev` carries.
    async fn upsert_mirror<K: Mirrored>(&self, ev: &Event) -> Result<(), HandleError> {
        let spoke: K = ev
            .data_as()
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        self.hub.mirrors().upsert_mirror(self.agent(), &spoke).await
    }

    async fn handle_autonomous(&self, ev: Event) -> Result<(), HandleError> {
        let kind = match ev.target {
            Target::Application => Some(MirrorKind::Application),
            Target::AppProject => Some(MirrorKind::AppProject),
            _ => None,
        };
        match (&ev.event_type, kind) {
            (EventType::Create | EventType::SpecUpdate | EventType::StatusUpdate, Some(kind)) => {
                match kind {
                    MirrorKind::Application => self.upsert_mirror::<Application>(&ev).await,
                    MirrorKind::AppProject => self.upsert_mirror::<AppProject>(&ev).await,
                }
            }
            (EventType::Delete, Some(kind)) => {
                // Only the metadata of what the spoke deleted matters.
                let spoke: kube::api::DynamicObject = ev
                    .data_as()
                    .map_err(|e| HandleError::Rejected(e.to_string()))?;
                let (mirrors, agent) = (self.hub.mirrors(), self.agent());
                let (name, uid) = (required_name(&spoke)?, spoke.uid_str());
                match kind {
                    MirrorKind::Application => {
                        mirrors.delete_mirror::<Application>(agent, name, uid).await
                    }
                    MirrorKind::AppProject => {
                        mirrors.delete_mirror::<AppProject>(agent, name, uid).await
                    }
                }
            }
            (EventType::ResponseSyncedResource, _) => {
                let key: SyncedResource = ev
                    .data_as()
                    .map_err(|e| HandleError::Rejected(e.to_string()))?;
                let kind = match key.kind.as_str() {
                    "Application" => MirrorKind::Application,
                    "AppProject" => MirrorKind::AppProject,
                    other => {
                        return Err(HandleError::Rejected(format!(
                            "response-synced-resource for unsupported kind {other:?}"
                        )))
                    }
                };
                if !self
                    .hub
                    .mirrors()
                    .has_mirror(kind, self.agent(), &key.name, &key.uid)
                {
                    request_object(&self.session, &key.kind, &key.name, &key.uid, Vec::new());
                }
                Ok(())
            }
            (EventType::RequestResourceResync, _) => {
                self.hub.mirrors().autonomous_resync(&self.session);
                Ok(())
            }
            (EventType::Error, _) => {
                tracing::warn!(agent = self.agent(), data = %Truncated(&String::from_utf8_lossy(ev.data.as_deref().unwrap_or_default())), "autonomous agent reported an error");
                Ok(())
            }
            (EventType::Ping | EventType::Pong, _) => Ok(()),
            (EventType::ClusterCacheInfoUpdate, _) => self.cluster_cache_info(&ev).await,
            (t, _) => {
                let msg = format!(
                    "event type {} for target {} is not accepted from an autonomous agent",
                    t.name(),
                    ev.target.as_str()
                );
                Err(HandleError::for_mode(&ev, msg))
            }
        }
    }
}

impl AgentInbound {
    /// `cluster-cache-info-update` (either mode, as upstream): the spoke's counts into the hub
    /// Argo CD's cluster info ([`crate::cluster_info`]).
    async fn cluster_cache_info(&self, ev: &Event) -> Result<(), HandleError> {
        let stats: ClusterCacheInfo = ev
            .data_as()
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        self.cluster_info.cache_stats_reported(self.agent(), stats);
        Ok(())
    }
}

impl EventHandler for AgentInbound {
    async fn handle(&self, ev: Event) -> Result<(), HandleError> {
        // Before any use: names reach apiserver URLs (`name?dryRun=All` must not).
        names::check_event_names(&ev).map_err(HandleError::Rejected)?;
        // Answers to the live view's requests (resource and Redis proxies), in either mode: the
        // hub's argocd-server shows an autonomous agent's mirrors live too, as upstream's does.
        if matches!(
            ev.event_type,
            EventType::Response | EventType::RedisResponse
        ) {
            return self.live.handle_reply(&self.session, &ev).await;
        }
        if self.session.mode() == AgentMode::Autonomous {
            return self.handle_autonomous(ev).await;
        }
        match (&ev.event_type, &ev.target) {
            (EventType::StatusUpdate, Target::Application) => self.status_update(&ev).await,
            (EventType::Delete, Target::Application) => self.delete_confirmed(&ev).await,
            (EventType::RequestUpdate, _) => self.request_update(&ev),
            (EventType::RequestSyncedResourceList, _) => {
                let req: RequestSyncedResourceList = ev
                    .data_as()
                    .map_err(|e| HandleError::Rejected(e.to_string()))?;
                self.hub
                    .managed()
                    .answer_managed_key_list(&self.session, &req.checksum);
                Ok(())
            }
            (EventType::Error, Target::Application) => self.error_report(&ev).await,
            (EventType::Ping | EventType::Pong, _) => Ok(()),
            (EventType::ClusterCacheInfoUpdate, _) => self.cluster_cache_info(&ev).await,
            (t, target) => {
                let msg = format!(
                    "event type {} for target {} is not accepted from a managed agent",
                    t.name(),
                    target.as_str()
                );
                Err(HandleError::for_mode(&ev, msg))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_is_trusted_unless_this_stream_last_wrote_another_status() {
        let writes = StatusWrites::default();
        assert!(writes.view_trusted_for("a", 1), "nothing written yet");
        writes.wrote("a", 2);
        assert!(writes.view_trusted_for("a", 2));
        assert!(
            !writes.view_trusted_for("a", 1),
            "A → B → A: the view may still show the first A, the hub holds B"
        );
        assert!(writes.view_trusted_for("b", 1), "per Application");
    }
}
