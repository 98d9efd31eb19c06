//! Events from an agent, applied on the hub. Managed agents: Application status (written onto the
//! hub object — Argo CD's Application has no status subresource), confirmation of deletions the
//! hub asked for, and the checksum resync (for Applications, AppProjects and repository Secrets):
//! `request-update{checksum}` answered only where the hub's copy differs (or is being deleted, or
//! is gone), `request-synced-resource-list{checksum}` answered with the hub's keys only when the
//! key sets differ.
//! Autonomous agents: the spoke's Applications and AppProjects (`create`/`spec-update` = write the
//! mirror, `delete` = remove it), and their resync answers (`response-synced-resource` for a key
//! the hub may lack, `request-resource-resync`). An agent can only ever touch objects in its own
//! hub namespace (and its own `<agent>-` AppProjects): the namespace is taken from the
//! authenticated agent, never from the event; and within those names only the objects the
//! principal marked as its mirrors ([`crate::hub::check_mirror_owner`]), whatever uid the event
//! carries. Every name an event carries is checked as a
//! Kubernetes name before it is used (`argocd_agent_proto::event::names`).
//! Either mode: `cluster-cache-info-update` (the spoke's cache counts) goes to
//! [`crate::cluster_info`].

use std::sync::Arc;

use argocd_agent_proto::event::{
    names, spec_checksum, Event, EventType, Target, SOURCE_UID_ANNOTATION,
};
use argocd_agent_proto::payload::{
    ClusterCacheInfo, ErrorData, RequestSyncedResourceList, RequestUpdate,
};
use argocd_agent_proto::sync::resync::{
    answer_request_update, answer_with_metadata, checksum_of, status_checksum, SourceObject,
    UpdateAnswer, METADATA_CHECKSUM, STATUS_CHECKSUM,
};
use argocd_agent_proto::sync::{EventHandler, HandleError};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{json, Value};

use argocd_agent_kube::errors::handle_error;

use crate::hub::{application_resource, queue, request_object, Hub, MirrorKind};
use crate::routing::{
    application_payload, operation_already_started, project_for_agent, repository_payload,
    requests_carried_out,
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
}

fn name_of(obj: &Value) -> Result<&str, HandleError> {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| HandleError::Rejected("object has no metadata.name".into()))
}

impl AgentInbound {
    fn agent(&self) -> &str {
        self.session.name.as_str()
    }

    fn apps(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.hub.client.clone(),
            self.agent(),
            &application_resource(),
        )
    }

    async fn status_update(&self, ev: &Event) -> Result<(), HandleError> {
        let spoke: Value = ev
            .data_as()
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        let name = name_of(&spoke)?;
        let Some(hub_app) = self.hub.application(self.agent(), name) else {
            return Err(HandleError::Rejected(format!(
                "no Application {}/{name} on the hub",
                self.agent()
            )));
        };
        let hub_uid = hub_app.pointer("/metadata/uid").and_then(Value::as_str);
        let source_uid = spoke
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(SOURCE_UID_ANNOTATION))
            .and_then(Value::as_str);
        if source_uid != hub_uid {
            return Err(HandleError::Rejected(format!(
                "status for {name} is from a different object (source-uid {source_uid:?}, hub uid {hub_uid:?})"
            )));
        }
        let status = spoke.get("status").cloned().unwrap_or(Value::Null);
        let mut ops = vec![json!({"op": "add", "path": "/status", "value": status})];
        let hub_op = hub_app.get("operation").filter(|o| !o.is_null());
        let spoke_op = spoke.get("operation").filter(|o| !o.is_null());
        let ran = spoke.pointer("/status/operationState/operation");
        if hub_op.is_some() && spoke_op.is_none() && ran == hub_op {
            ops.push(json!({"op": "remove", "path": "/operation"}));
        }
        if hub_app.get("status") != Some(&status) || ops.len() > 1 {
            let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops))
                .map_err(|e| HandleError::Rejected(e.to_string()))?;
            self.apps()
                .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await
                .map_err(|e| handle_error("writing the hub Application", e))?;
        }
        let done = requests_carried_out(&hub_app, &spoke);
        if !done.is_empty() {
            // A merge patch: removing an annotation that is already gone is no error.
            let annotations: serde_json::Map<String, Value> =
                done.iter().map(|k| (k.to_string(), Value::Null)).collect();
            let patch = json!({"metadata": {"annotations": annotations}});
            self.apps()
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| handle_error("writing the hub Application", e))?;
        }
        Ok(())
    }

    async fn delete_confirmed(&self, ev: &Event) -> Result<(), HandleError> {
        let spoke: Value = ev
            .data_as()
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        let name = name_of(&spoke)?;
        let Some(hub_app) = self.hub.application(self.agent(), name) else {
            return Ok(());
        };
        if hub_app.pointer("/metadata/deletionTimestamp").is_none() {
            tracing::info!(
                agent = self.agent(),
                app = name,
                "agent reported a delete the hub did not ask for; ignoring"
            );
            return Ok(());
        }
        let patch = json!({"metadata": {"finalizers": null}});
        match self
            .apps()
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
        let Some(hub_app) = self.hub.application(self.agent(), &report.resource_name) else {
            return Err(HandleError::Rejected(format!(
                "error report for unknown Application {:?}",
                report.resource_name
            )));
        };
        tracing::warn!(agent = self.agent(), app = %report.resource_name, message = %Truncated(&report.message), "agent could not apply an Application");
        let mut conditions: Vec<Value> = hub_app
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .map(|c| {
                c.iter()
                    .filter(|c| c["type"] != AGENT_ERROR)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        conditions.push(json!({
            "type": AGENT_ERROR,
            "message": report.message,
            "lastTransitionTime": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        }));
        let op = if hub_app.get("status").is_some_and(|s| s.is_object()) {
            json!({"op": "add", "path": "/status/conditions", "value": conditions})
        } else {
            json!({"op": "add", "path": "/status", "value": {"conditions": conditions}})
        };
        let patch: json_patch::Patch = serde_json::from_value(json!([op]))
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        self.apps()
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
        let uid = |o: &Value| {
            o.pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let hub_app = match req.kind.as_str() {
            "Application" => self.hub.application(self.agent(), &req.name),
            _ => None,
        };
        let (target, hub_uid, payload) = match req.kind.as_str() {
            "Application" => {
                let payload = hub_app.as_ref().map(|o| application_payload(o, false));
                (Target::Application, hub_app.as_ref().map(uid), payload)
            }
            "AppProject" => {
                let obj = self.hub.project_for(self.agent(), &req.name);
                let payload = obj.as_ref().map(|o| project_for_agent(o, self.agent()));
                let hub_uid = obj.and_then(|o| o.metadata.uid.clone());
                (Target::AppProject, hub_uid, payload)
            }
            "Secret" => {
                let obj = self.hub.repository_for(self.agent(), &req.name);
                let payload = obj.as_ref().map(repository_payload);
                (Target::Repository, obj.as_ref().map(uid), payload)
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
        let source = payload.as_ref().map(|p| SourceObject {
            uid: hub_uid,
            checksum: &checksum,
            terminating: p
                .pointer("/metadata/deletionTimestamp")
                .is_some_and(|t| !t.is_null()),
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
    fn ask_status_if_differs(&self, hub_app: &Value, req: &RequestUpdate, spoke_status: &[u8]) {
        let hub_uid = hub_app
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if req.uid != hub_uid {
            return;
        }
        let hub_status = status_checksum(hub_app);
        let leftover_operation = hub_app.get("operation").is_some_and(|o| !o.is_null())
            && operation_already_started(hub_app);
        if hub_status != spoke_status || leftover_operation {
            tracing::debug!(agent = self.agent(), app = %req.name, "hub status differs from the spoke's; asking the agent for it");
            request_object(&self.session, &req.kind, &req.name, hub_uid, hub_status);
        }
    }

    async fn handle_autonomous(&self, ev: Event) -> Result<(), HandleError> {
        let kind = match ev.target {
            Target::Application => Some(MirrorKind::Application),
            Target::AppProject => Some(MirrorKind::AppProject),
            _ => None,
        };
        match (&ev.event_type, kind) {
            (EventType::Create | EventType::SpecUpdate | EventType::StatusUpdate, Some(kind)) => {
                let spoke: Value = ev
                    .data_as()
                    .map_err(|e| HandleError::Rejected(e.to_string()))?;
                self.hub
                    .mirrors()
                    .upsert_mirror(kind, self.agent(), &spoke)
                    .await
            }
            (EventType::Delete, Some(kind)) => {
                let spoke: Value = ev
                    .data_as()
                    .map_err(|e| HandleError::Rejected(e.to_string()))?;
                let uid = spoke
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                self.hub
                    .mirrors()
                    .delete_mirror(kind, self.agent(), name_of(&spoke)?, uid)
                    .await
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
            (t, _) => Err(HandleError::Rejected(format!(
                "event type {} for target {} is not accepted from an autonomous agent",
                t.name(),
                ev.target.as_str()
            ))),
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
            (EventType::Response | EventType::RedisResponse, _) => {
                self.live.handle_reply(&self.session, &ev).await
            }
            (t, target) => Err(HandleError::Rejected(format!(
                "event type {} for target {} is not accepted from a managed agent",
                t.name(),
                target.as_str()
            ))),
        }
    }
}
