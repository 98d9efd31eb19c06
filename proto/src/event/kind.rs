//! Event types (CloudEvent `type`) and targets (CloudEvent `dataschema`) with their exact
//! upstream wire strings. Decoding never fails: unrecognised values become `Unknown`.
//!
//! Also owns the bounded label values metrics use ([`EventType::metric_label`],
//! [`Target::metric_label`]): a peer chooses the wire strings, so anything unrecognised folds into
//! [`UNKNOWN_LABEL`] instead of minting a new time series per value.

use std::fmt;

/// The metric label value of every unrecognised event type, HTTP method or target.
pub const UNKNOWN_LABEL: &str = "unknown";

/// HTTP methods the resource proxy forwards; other upper-case tokens are labelled unknown.
const HTTP_METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE",
];

/// Prefix of every argocd-agent event type on the wire.
pub const TYPE_PREFIX: &str = "io.argoproj.argocd-agent.event.";

/// What happened / what is asked for. Wire form: `io.argoproj.argocd-agent.event.<name>`,
/// except [`EventType::HttpMethod`], whose wire form is the bare HTTP method.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    /// `create`: object created.
    Create,
    /// `delete`: object deleted.
    Delete,
    /// `spec-update`: spec changed.
    SpecUpdate,
    /// `status-update`: status changed.
    StatusUpdate,
    /// `set-operation`: start a sync operation (never coalesced).
    SetOperation,
    /// `terminate-operation`: terminate a running operation.
    TerminateOperation,
    /// `processed`: ACK of another event.
    Processed,
    /// `response`: resource-proxy response.
    Response,
    /// `redis-request`.
    RedisRequest,
    /// `redis-response`.
    RedisResponse,
    /// `request-synced-resource-list`: resync, "here is the checksum of my keys".
    RequestSyncedResourceList,
    /// `response-synced-resource`: resync, one key of the source of truth.
    ResponseSyncedResource,
    /// `request-update`: resync, "send me this object if my checksum is stale".
    RequestUpdate,
    /// `request-resource-resync`: resync, "I restarted, ask me for updates".
    RequestResourceResync,
    /// `cluster-cache-info-update`: cluster cache statistics.
    ClusterCacheInfoUpdate,
    /// `terminal-request`: open a web terminal.
    TerminalRequest,
    /// `ping`: heartbeat.
    Ping,
    /// `pong`: heartbeat answer.
    Pong,
    /// `error`: error report (e.g. adoption refused).
    Error,
    /// Resource-proxy or container-log request: the wire `type` is the raw HTTP method
    /// (`GET`, `PATCH`, `POST`, `DELETE`, ...).
    HttpMethod(String),
    /// Anything else, kept verbatim. Receivers log it and ACK with an error.
    Unknown(String),
}

const NAMED: &[(EventType, &str)] = &[
    (EventType::Create, "create"),
    (EventType::Delete, "delete"),
    (EventType::SpecUpdate, "spec-update"),
    (EventType::StatusUpdate, "status-update"),
    (EventType::SetOperation, "set-operation"),
    (EventType::TerminateOperation, "terminate-operation"),
    (EventType::Processed, "processed"),
    (EventType::Response, "response"),
    (EventType::RedisRequest, "redis-request"),
    (EventType::RedisResponse, "redis-response"),
    (
        EventType::RequestSyncedResourceList,
        "request-synced-resource-list",
    ),
    (
        EventType::ResponseSyncedResource,
        "response-synced-resource",
    ),
    (EventType::RequestUpdate, "request-update"),
    (EventType::RequestResourceResync, "request-resource-resync"),
    (
        EventType::ClusterCacheInfoUpdate,
        "cluster-cache-info-update",
    ),
    (EventType::TerminalRequest, "terminal-request"),
    (EventType::Ping, "ping"),
    (EventType::Pong, "pong"),
    (EventType::Error, "error"),
];

impl EventType {
    /// Every named (non-`HttpMethod`, non-`Unknown`) event type.
    pub fn all_named() -> impl Iterator<Item = EventType> {
        NAMED.iter().map(|(t, _)| t.clone())
    }

    /// Short name after the prefix (`spec-update`), the method for `HttpMethod`, or the raw
    /// string for `Unknown`.
    pub fn name(&self) -> &str {
        match self {
            EventType::HttpMethod(m) => m,
            EventType::Unknown(s) => s,
            named => NAMED
                .iter()
                .find(|(t, _)| t == named)
                .map(|(_, n)| *n)
                .unwrap_or_default(),
        }
    }

    /// The value of a metric's `event_type` label: [`Self::name`] for named types and standard
    /// HTTP methods, [`UNKNOWN_LABEL`] for anything else (a bounded set whatever peers send).
    pub fn metric_label(&self) -> &str {
        match self {
            EventType::HttpMethod(m) if HTTP_METHODS.contains(&m.as_str()) => m,
            EventType::HttpMethod(_) | EventType::Unknown(_) => UNKNOWN_LABEL,
            named => named.name(),
        }
    }

    /// The CloudEvent `type` string.
    pub fn to_wire(&self) -> String {
        match self {
            EventType::HttpMethod(m) => m.clone(),
            EventType::Unknown(s) => s.clone(),
            named => format!("{TYPE_PREFIX}{}", named.name()),
        }
    }

    /// Parse a CloudEvent `type`. Never fails.
    pub fn from_wire(s: &str) -> EventType {
        if let Some(name) = s.strip_prefix(TYPE_PREFIX) {
            if let Some((t, _)) = NAMED.iter().find(|(_, n)| *n == name) {
                return t.clone();
            }
            return EventType::Unknown(s.to_string());
        }
        if is_http_method(s) {
            return EventType::HttpMethod(s.to_string());
        }
        EventType::Unknown(s.to_string())
    }

    /// Whether a well-formed event of this type carries a JSON payload. Used on decode to
    /// reject e.g. a `spec-update` without an object. `Unknown` never requires data.
    pub fn requires_data(&self) -> bool {
        !matches!(
            self,
            EventType::Processed | EventType::Ping | EventType::Pong | EventType::Unknown(_)
        )
    }

    /// An ACK (`processed`).
    pub fn is_ack(&self) -> bool {
        matches!(self, EventType::Processed)
    }
}

/// An HTTP method token as used by the resource proxy: 1..=16 ASCII upper-case letters.
fn is_http_method(s: &str) -> bool {
    !s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_uppercase())
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_wire())
    }
}

/// What an event is about (CloudEvent `dataschema`); receivers dispatch on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// `application`: Argo CD Application.
    Application,
    /// `appproject`: Argo CD AppProject.
    AppProject,
    /// `applicationset`: Argo CD ApplicationSet.
    ApplicationSet,
    /// `repository`: repository Secret.
    Repository,
    /// `gpgkey`: the GPG keys ConfigMap.
    GpgKey,
    /// `resource`: resource-proxy request/response.
    Resource,
    /// `redis`: redis-proxy request/response.
    Redis,
    /// `resourceResync`: resync protocol.
    ResourceResync,
    /// `clusterCacheInfoUpdate`: cluster cache statistics.
    ClusterCacheInfoUpdate,
    /// `containerlog`: container log request.
    ContainerLog,
    /// `terminal`: web terminal request.
    Terminal,
    /// `heartbeat`: ping/pong.
    Heartbeat,
    /// `eventProcessed`: ACK.
    EventProcessed,
    /// Anything else (including an absent `dataschema`, kept as `Unknown("")`).
    Unknown(String),
}

const TARGETS: &[(Target, &str)] = &[
    (Target::Application, "application"),
    (Target::AppProject, "appproject"),
    (Target::ApplicationSet, "applicationset"),
    (Target::Repository, "repository"),
    (Target::GpgKey, "gpgkey"),
    (Target::Resource, "resource"),
    (Target::Redis, "redis"),
    (Target::ResourceResync, "resourceResync"),
    (Target::ClusterCacheInfoUpdate, "clusterCacheInfoUpdate"),
    (Target::ContainerLog, "containerlog"),
    (Target::Terminal, "terminal"),
    (Target::Heartbeat, "heartbeat"),
    (Target::EventProcessed, "eventProcessed"),
];

impl Target {
    /// Every named (non-`Unknown`) target.
    pub fn all_named() -> impl Iterator<Item = Target> {
        TARGETS.iter().map(|(t, _)| t.clone())
    }

    /// The `dataschema` string.
    pub fn as_str(&self) -> &str {
        match self {
            Target::Unknown(s) => s,
            named => TARGETS
                .iter()
                .find(|(t, _)| t == named)
                .map(|(_, n)| *n)
                .unwrap_or_default(),
        }
    }

    /// The value of a metric's `target` label: [`Self::as_str`] for named targets,
    /// [`UNKNOWN_LABEL`] for anything else.
    pub fn metric_label(&self) -> &str {
        match self {
            Target::Unknown(_) => UNKNOWN_LABEL,
            named => named.as_str(),
        }
    }

    /// Parse a `dataschema` string. Never fails.
    pub fn from_wire(s: &str) -> Target {
        TARGETS
            .iter()
            .find(|(_, n)| *n == s)
            .map(|(t, _)| t.clone())
            .unwrap_or_else(|| Target::Unknown(s.to_string()))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_labels_are_a_bounded_set_whatever_the_wire_says() {
        let mut labels = std::collections::BTreeSet::new();
        for i in 0..1000 {
            for wire in [
                format!("{TYPE_PREFIX}made-up-{i}"),
                format!("io.example.{i}"),
                "ZZZ".repeat(1 + i % 5),
            ] {
                labels.insert(EventType::from_wire(&wire).metric_label().to_string());
            }
            labels.insert(
                Target::from_wire(&format!("t{i}"))
                    .metric_label()
                    .to_string(),
            );
        }
        assert_eq!(labels.into_iter().collect::<Vec<_>>(), vec![UNKNOWN_LABEL]);
        assert_eq!(EventType::SpecUpdate.metric_label(), "spec-update");
        assert_eq!(EventType::from_wire("PATCH").metric_label(), "PATCH");
        assert_eq!(Target::Application.metric_label(), "application");
        assert_eq!(Target::from_wire("").metric_label(), UNKNOWN_LABEL);
    }
}
