//! The typed event model over the CloudEvents 1.0 protobuf envelope.
//!
//! Owns [`Event`] (one argocd-agent event with its identity extensions and JSON payload), its
//! lossless conversion to and from [`pb::cloudevents::CloudEvent`] and the `eventstreamapi.Event`
//! wrapper, the constructors both sides use (object events, ACKs, resource/redis/log/terminal
//! requests and responses, resync messages, heartbeats, error reports), and — in submodules —
//! the event type/target vocabulary ([`kind`]), a Go-compatible JSON serialiser ([`go_json`])
//! the resync checksums ([`resync`]) and the checks of the Kubernetes names events carry
//! ([`names`]).
//!
//! Wire layout (what upstream's Go sdk produces and expects): `spec_version` "1.0", `source`,
//! `type`, and in `attributes`: `dataschema` (the target) as `ce_uri` — cloudevents sdk-go's
//! protobuf format encodes it so and decodes it from nothing else, so a `ce_string` target reads as
//! empty on a Go peer, which then drops the event — and as `ce_string`: `subject`,
//! `datacontenttype` ("application/json"), and the extensions `resourceid`, `eventid`,
//! `sentat`, `principaluid`, `traceparent`, `tracestate`. We read a target of any of the three
//! string-like kinds. The JSON payload travels in `binary_data`. We also set the CloudEvent `id`
//! to the event id (upstream leaves it empty).

pub mod go_json;
pub mod kind;
pub mod names;
pub mod resync;

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, Utc};
use prost::Message as _;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use self::kind::{EventType, Target, TYPE_PREFIX};
pub use self::resync::{
    data_checksum, set_checksum, spec_checksum, ChecksumError, ResourceKey, GPG_KEYS_CONFIGMAP,
    GPG_KEY_RESYNC_KIND, HYDRATE_ANNOTATION, LAST_APPLIED_ANNOTATION, MISMATCH_POLICY_ANNOTATION,
    PRINCIPAL_UID_ANNOTATION, REFRESH_ANNOTATION, REPOSITORY_RESYNC_KIND, SOURCE_UID_ANNOTATION,
};
use crate::payload::{
    ClusterCacheInfo, ContainerLogRequest, ContainerTerminalRequest, ErrorData, RedisRequest,
    RedisResponse, RequestResourceResync, RequestSyncedResourceList, RequestUpdate,
    ResourceRequest, ResourceResponse, SyncedResource,
};
use crate::pb;
use crate::pb::cloudevents::{cloud_event, cloud_event_attribute_value, CloudEvent};

/// The only CloudEvents spec version spoken.
pub const SPEC_VERSION: &str = "1.0";
/// `datacontenttype` of every payload.
pub const CONTENT_TYPE_JSON: &str = "application/json";
/// Source string upstream's agent uses (hard-coded there).
pub const AGENT_SOURCE: &str = "agent://agent-managed";

/// Attribute names on the wire.
pub mod attr {
    pub const DATASCHEMA: &str = "dataschema";
    pub const SUBJECT: &str = "subject";
    pub const DATACONTENTTYPE: &str = "datacontenttype";
    pub const RESOURCE_ID: &str = "resourceid";
    pub const EVENT_ID: &str = "eventid";
    pub const SENT_AT: &str = "sentat";
    pub const PRINCIPAL_UID: &str = "principaluid";
    pub const TRACEPARENT: &str = "traceparent";
    pub const TRACESTATE: &str = "tracestate";
    /// Our extension on an ACK that reports a processing failure ("ACKed with error").
    /// Upstream peers ignore unknown extensions, so this stays wire compatible.
    pub const ACK_ERROR: &str = "error";
}

/// Value of an extension attribute we do not interpret, kept with its CloudEvents type so
/// re-encoding reproduces it.
#[derive(Debug, Clone, PartialEq)]
pub enum ExtensionValue {
    Bool(bool),
    Integer(i32),
    String(String),
    Bytes(Vec<u8>),
    Uri(String),
    UriRef(String),
    Timestamp(prost_types::Timestamp),
}

impl ExtensionValue {
    /// The value if it is textual (string, URI or URI reference).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            ExtensionValue::String(s) | ExtensionValue::Uri(s) | ExtensionValue::UriRef(s) => {
                Some(s)
            }
            _ => None,
        }
    }

    fn from_pb(v: pb::cloudevents::CloudEventAttributeValue) -> Option<Self> {
        use cloud_event_attribute_value::Attr;
        Some(match v.attr? {
            Attr::CeBoolean(b) => ExtensionValue::Bool(b),
            Attr::CeInteger(i) => ExtensionValue::Integer(i),
            Attr::CeString(s) => ExtensionValue::String(s),
            Attr::CeBytes(b) => ExtensionValue::Bytes(b),
            Attr::CeUri(s) => ExtensionValue::Uri(s),
            Attr::CeUriRef(s) => ExtensionValue::UriRef(s),
            Attr::CeTimestamp(t) => ExtensionValue::Timestamp(t),
        })
    }

    fn to_pb(&self) -> pb::cloudevents::CloudEventAttributeValue {
        use cloud_event_attribute_value::Attr;
        let attr = match self {
            ExtensionValue::Bool(b) => Attr::CeBoolean(*b),
            ExtensionValue::Integer(i) => Attr::CeInteger(*i),
            ExtensionValue::String(s) => Attr::CeString(s.clone()),
            ExtensionValue::Bytes(b) => Attr::CeBytes(b.clone()),
            ExtensionValue::Uri(s) => Attr::CeUri(s.clone()),
            ExtensionValue::UriRef(s) => Attr::CeUriRef(s.clone()),
            ExtensionValue::Timestamp(t) => Attr::CeTimestamp(*t),
        };
        pb::cloudevents::CloudEventAttributeValue { attr: Some(attr) }
    }
}

impl From<&str> for ExtensionValue {
    fn from(s: &str) -> Self {
        ExtensionValue::String(s.to_string())
    }
}

impl From<String> for ExtensionValue {
    fn from(s: String) -> Self {
        ExtensionValue::String(s)
    }
}

fn ce_string(s: &str) -> pb::cloudevents::CloudEventAttributeValue {
    pb::cloudevents::CloudEventAttributeValue {
        attr: Some(cloud_event_attribute_value::Attr::CeString(s.to_string())),
    }
}

fn ce_uri(s: &str) -> pb::cloudevents::CloudEventAttributeValue {
    pb::cloudevents::CloudEventAttributeValue {
        attr: Some(cloud_event_attribute_value::Attr::CeUri(s.to_string())),
    }
}

/// Why an event could not be decoded or built. Messages say what is wrong with the input.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("malformed protobuf CloudEvent: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("eventstreamapi.Event carries no CloudEvent (field 1 `event` is missing)")]
    MissingEnvelope,
    #[error("CloudEvent has an empty `type`; every argocd-agent event needs one")]
    MissingType,
    #[error("CloudEvent spec_version is {0:?}; only \"1.0\" is supported")]
    BadSpecVersion(String),
    #[error(
        "event {event_type} carries proto_data (google.protobuf.Any); only JSON in binary_data or text_data is supported"
    )]
    ProtoData { event_type: String },
    #[error(
        "event {event_type} has datacontenttype {content_type:?}; only application/json payloads are supported"
    )]
    UnsupportedContentType {
        event_type: String,
        content_type: String,
    },
    #[error("event {event_type} (target {target:?}) requires a JSON payload but carries no data")]
    MissingData { event_type: String, target: String },
    #[error(
        "event {event_type} (target {target:?}) carries data that is not valid JSON: {source}"
    )]
    InvalidJson {
        event_type: String,
        target: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot decode the payload of event {event_type} as {into}: {source}")]
    DataDecode {
        event_type: String,
        into: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot serialise event payload to JSON: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("object is not usable for an event: {0}")]
    InvalidObject(String),
}

/// One argocd-agent event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// CloudEvent `type`.
    pub event_type: EventType,
    /// CloudEvent `dataschema`.
    pub target: Target,
    /// CloudEvent `source` (principal: its server name, often empty; agent: [`AGENT_SOURCE`]).
    pub source: String,
    /// CloudEvent `subject`: `<namespace>/<name>` for object events.
    pub subject: Option<String>,
    /// Extension `resourceid`: `<name>_<uid>` for objects, a UUID for requests. Coalescing and
    /// ACK matching key. Empty = not set.
    pub resource_id: String,
    /// Extension `eventid`: `<name>_<uid>_<resourceVersion>` for objects, the request UUID for
    /// requests and their responses. Empty = not set.
    pub event_id: String,
    /// Extension `sentat` (RFC 3339 with nanoseconds): time of first send.
    pub sent_at: Option<DateTime<Utc>>,
    /// Extension `principaluid`: persistent principal identity (HA failover detection).
    pub principal_uid: Option<String>,
    /// Extension `traceparent` (W3C trace context).
    pub traceparent: Option<String>,
    /// Extension `tracestate` (W3C trace context).
    pub tracestate: Option<String>,
    /// JSON payload (`binary_data`, `datacontenttype` application/json).
    pub data: Option<Vec<u8>>,
    /// Every other attribute, preserved verbatim for re-encoding (and the raw value of a known
    /// extension whose type or format we could not interpret).
    pub extensions: BTreeMap<String, ExtensionValue>,
}

/// Format a time as Go's `time.RFC3339Nano` does for UTC: fractional seconds with trailing
/// zeros removed (none at all for whole seconds) and a `Z` suffix.
pub fn format_rfc3339_nano(t: &DateTime<Utc>) -> String {
    let base = t.format("%Y-%m-%dT%H:%M:%S").to_string();
    // A leap second is second 60 plus 1e9 nanoseconds in chrono; `%S` already wrote the 60.
    let nanos = t.timestamp_subsec_nanos() % 1_000_000_000;
    if nanos == 0 {
        return format!("{base}Z");
    }
    let frac = format!("{nanos:09}");
    format!("{base}.{}Z", frac.trim_end_matches('0'))
}

/// Parse an RFC 3339 timestamp (any offset, any fraction) into UTC.
pub fn parse_rfc3339(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn new_uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn is_json_content_type(ct: &str) -> bool {
    let essence = ct
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
}

/// A protobuf timestamp as a time RFC 3339 can write (four-digit years, nanos below one
/// second), so that it survives being sent on as the `sentat` string.
fn timestamp_to_utc(t: &prost_types::Timestamp) -> Option<DateTime<Utc>> {
    let nanos = u32::try_from(t.nanos).ok().filter(|n| *n < 1_000_000_000)?;
    DateTime::<Utc>::from_timestamp(t.seconds, nanos).filter(|d| (0..=9999).contains(&d.year()))
}

impl Event {
    /// A new event with fresh UUIDs as `resourceid` and `eventid`, `sentat` now, no data.
    pub fn new(event_type: EventType, target: Target, source: impl Into<String>) -> Event {
        let id = new_uuid();
        Event {
            event_type,
            target,
            source: source.into(),
            subject: None,
            resource_id: id.clone(),
            event_id: id,
            sent_at: Some(Utc::now()),
            principal_uid: None,
            traceparent: None,
            tracestate: None,
            data: None,
            extensions: BTreeMap::new(),
        }
    }

    /// Replace the payload with the JSON serialisation of `payload`.
    pub fn with_json<T: Serialize + ?Sized>(mut self, payload: &T) -> Result<Event, EventError> {
        self.data = Some(serde_json::to_vec(payload).map_err(EventError::Encode)?);
        Ok(self)
    }

    /// Set `subject`.
    pub fn with_subject(mut self, subject: impl Into<String>) -> Event {
        self.subject = Some(subject.into());
        self
    }

    /// Set `source`.
    pub fn with_source(mut self, source: impl Into<String>) -> Event {
        self.source = source.into();
        self
    }

    /// Set `principaluid`.
    pub fn with_principal_uid(mut self, uid: impl Into<String>) -> Event {
        self.principal_uid = Some(uid.into());
        self
    }

    /// Set the W3C trace context extensions.
    pub fn with_trace(
        mut self,
        traceparent: impl Into<String>,
        tracestate: Option<String>,
    ) -> Event {
        self.traceparent = Some(traceparent.into());
        self.tracestate = tracestate;
        self
    }

    /// Set both ids (requests and their answers use the request UUID).
    pub fn with_ids(
        mut self,
        resource_id: impl Into<String>,
        event_id: impl Into<String>,
    ) -> Event {
        self.resource_id = resource_id.into();
        self.event_id = event_id.into();
        self
    }

    /// An event about a Kubernetes object (Application, AppProject, ApplicationSet, Secret,
    /// ConfigMap), typed or as JSON: subject `<namespace>/<name>` (just `<name>` when cluster
    /// scoped), `resourceid` `<name>_<uid>`, `eventid` `<name>_<uid>_<resourceVersion>`, `sentat`
    /// now, and the object as payload. `metadata.name` is required; a missing uid or
    /// resourceVersion yields empty parts, as upstream does for orphan deletes. The payload is
    /// the object's JSON tree written out, so a typed object and the same object as JSON are the
    /// same bytes on the wire.
    pub fn for_object<T: Serialize + ?Sized>(
        event_type: EventType,
        target: Target,
        source: impl Into<String>,
        obj: &T,
    ) -> Result<Event, EventError> {
        let obj = serde_json::to_value(obj).map_err(EventError::Encode)?;
        let meta = obj
            .get("metadata")
            .ok_or_else(|| EventError::InvalidObject("it has no metadata".into()))?;
        let field = |k: &str| meta.get(k).and_then(|v| v.as_str()).unwrap_or_default();
        let name = field("name");
        if name.is_empty() {
            return Err(EventError::InvalidObject(
                "metadata.name is missing or empty".into(),
            ));
        }
        let (namespace, uid, rv) = (field("namespace"), field("uid"), field("resourceVersion"));
        let subject = if namespace.is_empty() {
            name.to_string()
        } else {
            format!("{namespace}/{name}")
        };
        Event::new(event_type, target, source)
            .with_subject(subject)
            .with_ids(format!("{name}_{uid}"), format!("{name}_{uid}_{rv}"))
            .with_json(&obj)
    }

    /// The ACK of this event: type `processed`, target `eventProcessed`, all extensions of
    /// this event copied (so `eventid`/`resourceid` match; our `error` extension excepted), no
    /// data, empty source (set one with [`Event::with_source`]).
    pub fn ack(&self) -> Event {
        let mut extensions = self.extensions.clone();
        extensions.remove(attr::ACK_ERROR);
        Event {
            event_type: EventType::Processed,
            target: Target::EventProcessed,
            source: String::new(),
            subject: None,
            resource_id: self.resource_id.clone(),
            event_id: self.event_id.clone(),
            sent_at: self.sent_at,
            principal_uid: self.principal_uid.clone(),
            traceparent: self.traceparent.clone(),
            tracestate: self.tracestate.clone(),
            data: None,
            extensions,
        }
    }

    /// An ACK that reports a processing failure in the `error` extension. Upstream peers treat
    /// it as a plain ACK (the event is not retried); ours can log/count the error.
    pub fn ack_with_error(&self, message: impl Into<String>) -> Event {
        let mut ack = self.ack();
        ack.extensions.insert(
            attr::ACK_ERROR.to_string(),
            ExtensionValue::String(message.into()),
        );
        ack
    }

    /// The error reported by an ACK made with [`Event::ack_with_error`].
    pub fn ack_error(&self) -> Option<&str> {
        if !self.event_type.is_ack() {
            return None;
        }
        self.extensions
            .get(attr::ACK_ERROR)
            .and_then(ExtensionValue::as_str)
    }

    /// Resource-proxy request; `type` is the request's HTTP method, ids are the request UUID.
    pub fn resource_request(
        source: impl Into<String>,
        req: &ResourceRequest,
    ) -> Result<Event, EventError> {
        Event::new(
            EventType::HttpMethod(req.method.clone()),
            Target::Resource,
            source,
        )
        .with_ids(&req.uuid, &req.uuid)
        .with_json(req)
    }

    /// Resource-proxy response; `eventid` is the request UUID, `resourceid` a fresh UUID.
    pub fn resource_response(
        source: impl Into<String>,
        resp: &ResourceResponse,
    ) -> Result<Event, EventError> {
        Event::new(EventType::Response, Target::Resource, source)
            .with_ids(new_uuid(), &resp.uuid)
            .with_json(resp)
    }

    /// Redis-proxy request; ids are the request UUID.
    pub fn redis_request(
        source: impl Into<String>,
        req: &RedisRequest,
    ) -> Result<Event, EventError> {
        Event::new(EventType::RedisRequest, Target::Redis, source)
            .with_ids(&req.uuid, &req.uuid)
            .with_json(req)
    }

    /// Redis-proxy response; `eventid` is the request UUID, `resourceid` a fresh UUID.
    pub fn redis_response(
        source: impl Into<String>,
        resp: &RedisResponse,
    ) -> Result<Event, EventError> {
        Event::new(EventType::RedisResponse, Target::Redis, source)
            .with_ids(new_uuid(), &resp.uuid)
            .with_json(resp)
    }

    /// Resync: the checksum of the sender's key set (see [`set_checksum`]).
    pub fn request_synced_resource_list(
        source: impl Into<String>,
        checksum: Vec<u8>,
    ) -> Result<Event, EventError> {
        Event::new(
            EventType::RequestSyncedResourceList,
            Target::ResourceResync,
            source,
        )
        .with_json(&RequestSyncedResourceList { checksum })
    }

    /// Resync: one key of the source of truth (`response-synced-resource`).
    pub fn synced_resource(
        source: impl Into<String>,
        res: &SyncedResource,
    ) -> Result<Event, EventError> {
        Event::new(
            EventType::ResponseSyncedResource,
            Target::ResourceResync,
            source,
        )
        .with_json(res)
    }

    /// Resync: ask the source of truth for one object.
    pub fn request_update(
        source: impl Into<String>,
        req: &RequestUpdate,
    ) -> Result<Event, EventError> {
        Event::new(EventType::RequestUpdate, Target::ResourceResync, source).with_json(req)
    }

    /// Resync: "I (the source of truth) restarted".
    pub fn request_resource_resync(source: impl Into<String>) -> Result<Event, EventError> {
        Event::new(
            EventType::RequestResourceResync,
            Target::ResourceResync,
            source,
        )
        .with_json(&RequestResourceResync {})
    }

    /// Cluster cache statistics.
    pub fn cluster_cache_info_update(
        source: impl Into<String>,
        info: &ClusterCacheInfo,
    ) -> Result<Event, EventError> {
        Event::new(
            EventType::ClusterCacheInfoUpdate,
            Target::ClusterCacheInfoUpdate,
            source,
        )
        .with_json(info)
    }

    /// Container-log request; `type` is the HTTP method, ids are the request UUID.
    pub fn container_log_request(
        source: impl Into<String>,
        method: &str,
        req: &ContainerLogRequest,
    ) -> Result<Event, EventError> {
        Event::new(
            EventType::HttpMethod(method.to_string()),
            Target::ContainerLog,
            source,
        )
        .with_ids(&req.uuid, &req.uuid)
        .with_json(req)
    }

    /// Web-terminal request; ids are the request UUID.
    pub fn terminal_request(
        source: impl Into<String>,
        req: &ContainerTerminalRequest,
    ) -> Result<Event, EventError> {
        Event::new(EventType::TerminalRequest, Target::Terminal, source)
            .with_ids(&req.uuid, &req.uuid)
            .with_json(req)
    }

    /// Heartbeat ping (no data).
    pub fn ping(source: impl Into<String>) -> Event {
        Event::new(EventType::Ping, Target::Heartbeat, source)
    }

    /// Heartbeat pong (no data).
    pub fn pong(source: impl Into<String>) -> Event {
        Event::new(EventType::Pong, Target::Heartbeat, source)
    }

    /// An error report about an object of kind `target`.
    pub fn error_report(
        source: impl Into<String>,
        target: Target,
        err: &ErrorData,
    ) -> Result<Event, EventError> {
        let mut ev = Event::new(EventType::Error, target, source);
        if !err.resource_name.is_empty() {
            ev.subject = Some(if err.resource_namespace.is_empty() {
                err.resource_name.clone()
            } else {
                format!("{}/{}", err.resource_namespace, err.resource_name)
            });
        }
        ev.with_json(err)
    }

    /// Whether this is an ACK.
    pub fn is_ack(&self) -> bool {
        self.event_type.is_ack()
    }

    /// `(namespace, name)` from `subject` (`None` namespace when the subject has no `/`).
    pub fn subject_parts(&self) -> Option<(Option<&str>, &str)> {
        let s = self.subject.as_deref()?;
        Some(match s.split_once('/') {
            Some((ns, name)) => (Some(ns), name),
            None => (None, s),
        })
    }

    /// Decode the JSON payload as `T`.
    pub fn data_as<T: DeserializeOwned>(&self) -> Result<T, EventError> {
        let data = self
            .data
            .as_deref()
            .ok_or_else(|| EventError::MissingData {
                event_type: self.event_type.to_wire(),
                target: self.target.to_string(),
            })?;
        serde_json::from_slice(data).map_err(|source| EventError::DataDecode {
            event_type: self.event_type.to_wire(),
            into: std::any::type_name::<T>(),
            source,
        })
    }

    /// The CloudEvent envelope of this event (copies the payload).
    pub fn to_cloud_event(&self) -> CloudEvent {
        self.clone().into_cloud_event()
    }

    /// The CloudEvent envelope of this event.
    pub fn into_cloud_event(self) -> CloudEvent {
        let mut attributes: std::collections::HashMap<String, _> = self
            .extensions
            .iter()
            .map(|(k, v)| (k.clone(), v.to_pb()))
            .collect();
        let target = self.target.as_str();
        if !target.is_empty() {
            attributes.insert(attr::DATASCHEMA.into(), ce_uri(target));
        }
        if let Some(s) = &self.subject {
            attributes.insert(attr::SUBJECT.into(), ce_string(s));
        }
        if !self.resource_id.is_empty() {
            attributes.insert(attr::RESOURCE_ID.into(), ce_string(&self.resource_id));
        }
        if !self.event_id.is_empty() {
            attributes.insert(attr::EVENT_ID.into(), ce_string(&self.event_id));
        }
        if let Some(t) = &self.sent_at {
            attributes.insert(attr::SENT_AT.into(), ce_string(&format_rfc3339_nano(t)));
        }
        for (name, val) in [
            (attr::PRINCIPAL_UID, &self.principal_uid),
            (attr::TRACEPARENT, &self.traceparent),
            (attr::TRACESTATE, &self.tracestate),
        ] {
            if let Some(v) = val {
                attributes.insert(name.into(), ce_string(v));
            }
        }
        let data = self.data.map(|d| {
            attributes.insert(attr::DATACONTENTTYPE.into(), ce_string(CONTENT_TYPE_JSON));
            cloud_event::Data::BinaryData(d)
        });
        CloudEvent {
            id: self.event_id.clone(),
            source: self.source,
            spec_version: SPEC_VERSION.into(),
            r#type: self.event_type.to_wire(),
            attributes,
            data,
        }
    }

    /// Decode a CloudEvent envelope. Unknown types and targets decode (as `Unknown`); errors
    /// are reserved for envelopes that are broken: no type, wrong spec version, non-JSON data,
    /// or no data where the event type needs some.
    pub fn try_from_cloud_event(ce: CloudEvent) -> Result<Event, EventError> {
        if ce.r#type.is_empty() {
            return Err(EventError::MissingType);
        }
        if ce.spec_version != SPEC_VERSION {
            return Err(EventError::BadSpecVersion(ce.spec_version));
        }
        let event_type = EventType::from_wire(&ce.r#type);

        let mut target = Target::Unknown(String::new());
        let mut subject = None;
        let mut content_type = None;
        let mut resource_id = String::new();
        let mut event_id = String::new();
        let mut sent_at = None;
        let mut principal_uid = None;
        let mut traceparent = None;
        let mut tracestate = None;
        let mut extensions = BTreeMap::new();

        for (name, value) in ce.attributes {
            let Some(value) = ExtensionValue::from_pb(value) else {
                continue; // an attribute without a value carries nothing
            };
            let text = value.as_str().map(str::to_string);
            match (name.as_str(), text) {
                (attr::DATASCHEMA, Some(s)) => target = Target::from_wire(&s),
                (attr::SUBJECT, Some(s)) => subject = Some(s),
                (attr::DATACONTENTTYPE, Some(s)) => content_type = Some(s),
                // Not a media type at all: refused below like any non-JSON content type.
                (attr::DATACONTENTTYPE, None) => content_type = Some(format!("{value:?}")),
                (attr::RESOURCE_ID, Some(s)) => resource_id = s,
                (attr::EVENT_ID, Some(s)) => event_id = s,
                (attr::PRINCIPAL_UID, Some(s)) => principal_uid = Some(s),
                (attr::TRACEPARENT, Some(s)) => traceparent = Some(s),
                (attr::TRACESTATE, Some(s)) => tracestate = Some(s),
                (attr::SENT_AT, text) => {
                    let parsed = match (&value, text) {
                        (_, Some(s)) => parse_rfc3339(&s),
                        (ExtensionValue::Timestamp(t), None) => timestamp_to_utc(t),
                        _ => None,
                    };
                    match parsed {
                        Some(t) => sent_at = Some(t),
                        None => {
                            extensions.insert(name, value);
                        }
                    }
                }
                _ => {
                    extensions.insert(name, value);
                }
            }
        }
        if event_id.is_empty() && !ce.id.is_empty() {
            event_id = ce.id;
            // A non-text `eventid` would be overwritten by this id when the event is sent on.
            extensions.remove(attr::EVENT_ID);
        }

        let data = match ce.data {
            None => None,
            Some(cloud_event::Data::BinaryData(b)) => Some(b),
            Some(cloud_event::Data::TextData(t)) => Some(t.into_bytes()),
            Some(cloud_event::Data::ProtoData(_)) => {
                return Err(EventError::ProtoData {
                    event_type: ce.r#type,
                })
            }
        };
        // Go's sdk always sets binary_data, empty for events without payload (ACKs).
        let data = data.filter(|d| !d.is_empty());

        if let Some(ct) = &content_type {
            if data.is_some() && !is_json_content_type(ct) {
                return Err(EventError::UnsupportedContentType {
                    event_type: ce.r#type,
                    content_type: ct.clone(),
                });
            }
        }
        match &data {
            None if event_type.requires_data() => {
                return Err(EventError::MissingData {
                    event_type: ce.r#type,
                    target: target.to_string(),
                })
            }
            Some(d) => {
                if let Err(source) = serde_json::from_slice::<serde::de::IgnoredAny>(d) {
                    return Err(EventError::InvalidJson {
                        event_type: ce.r#type,
                        target: target.to_string(),
                        source,
                    });
                }
            }
            None => {}
        }

        Ok(Event {
            event_type,
            target,
            source: ce.source,
            subject,
            resource_id,
            event_id,
            sent_at,
            principal_uid,
            traceparent,
            tracestate,
            data,
            extensions,
        })
    }

    /// The `eventstreamapi.Event` wrapper sent on `Subscribe`.
    pub fn to_stream_event(&self) -> pb::eventstreamapi::Event {
        pb::eventstreamapi::Event {
            event: Some(self.to_cloud_event()),
        }
    }

    /// The `eventstreamapi.Event` wrapper sent on `Subscribe`.
    pub fn into_stream_event(self) -> pb::eventstreamapi::Event {
        pb::eventstreamapi::Event {
            event: Some(self.into_cloud_event()),
        }
    }

    /// Decode the `eventstreamapi.Event` wrapper received on `Subscribe`.
    pub fn try_from_stream_event(ev: pb::eventstreamapi::Event) -> Result<Event, EventError> {
        Event::try_from_cloud_event(ev.event.ok_or(EventError::MissingEnvelope)?)
    }

    /// Protobuf bytes of the CloudEvent (e.g. for an on-disk queue).
    pub fn encode_to_vec(&self) -> Vec<u8> {
        self.to_cloud_event().encode_to_vec()
    }

    /// Decode protobuf bytes of a CloudEvent.
    pub fn decode(bytes: &[u8]) -> Result<Event, EventError> {
        Event::try_from_cloud_event(CloudEvent::decode(bytes)?)
    }
}

/// Event type and `dataschema` (the resource type) of a wire event, read without decoding the
/// payload: what send-path metrics label events with.
pub fn stream_event_labels(wire: &pb::eventstreamapi::Event) -> (EventType, &str) {
    let Some(ce) = &wire.event else {
        return (EventType::from_wire(""), "");
    };
    let target = ce
        .attributes
        .get(attr::DATASCHEMA)
        .and_then(|v| match &v.attr {
            Some(
                cloud_event_attribute_value::Attr::CeString(s)
                | cloud_event_attribute_value::Attr::CeUri(s)
                | cloud_event_attribute_value::Attr::CeUriRef(s),
            ) => Some(s.as_str()),
            _ => None,
        })
        .unwrap_or_default();
    (EventType::from_wire(&ce.r#type), target)
}

/// Sets the `principaluid` extension on a wire event without decoding it (the principal stamps every
/// event it sends, whatever queued it).
pub fn stamp_principal_uid(wire: &mut pb::eventstreamapi::Event, uid: &str) {
    if let Some(ce) = wire.event.as_mut() {
        ce.attributes
            .insert(attr::PRINCIPAL_UID.to_string(), ce_string(uid));
    }
}

impl TryFrom<CloudEvent> for Event {
    type Error = EventError;
    fn try_from(ce: CloudEvent) -> Result<Self, Self::Error> {
        Event::try_from_cloud_event(ce)
    }
}

impl From<Event> for CloudEvent {
    fn from(ev: Event) -> Self {
        ev.into_cloud_event()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire`, and checks the event survives re-encoding unchanged.
    fn round_trip(wire: &str) -> Result<Event, EventError> {
        let ev = Event::decode(&hex::decode(wire).expect("hex")[..])?;
        assert_eq!(Event::decode(&ev.encode_to_vec()).unwrap(), ev);
        Ok(ev)
    }

    // The inputs below are cloudevent_decode fuzz crashes (re-encoding changed the event).

    #[test]
    fn a_non_text_content_type_is_refused_instead_of_lost_on_re_encoding() {
        // `datacontenttype` as a boolean attribute, with JSON data.
        let err =
            round_trip("1a03312e302201782a150a0f64617461636f6e74656e747479706512020801320131")
                .unwrap_err();
        assert!(
            matches!(err, EventError::UnsupportedContentType { .. }),
            "{err}"
        );
    }

    #[test]
    fn a_sent_at_timestamp_beyond_rfc3339_years_is_kept_as_an_extension() {
        // `sentat` as a protobuf Timestamp in the year 14645.
        let ev = round_trip("1a03312e302201782a130a0673656e74617412093a070880c0ee8ed20b").unwrap();
        assert_eq!(ev.sent_at, None);
        assert!(matches!(
            ev.extensions.get(attr::SENT_AT),
            Some(ExtensionValue::Timestamp(_))
        ));
    }

    #[test]
    fn the_cloud_event_id_replaces_a_non_text_event_id() {
        // CloudEvent `id` "x" with an `eventid` attribute of bytes (minimised from the crash).
        let ev = round_trip("0a01781a03312e302201782a0e0a076576656e7469641203220179").unwrap();
        assert_eq!(ev.event_id, "x");
        assert!(ev.extensions.is_empty(), "{:?}", ev.extensions);
    }

    #[test]
    fn a_leap_second_sent_at_is_written_back_as_second_60() {
        // `sentat` "2016-12-31T23:59:60Z" came back as 23:59:60.1.
        let ev = round_trip(
            "1a03312e302201782a200a0673656e74617412161a14323031362d31322d33315432333a35393a36305a",
        )
        .unwrap();
        assert_eq!(
            format_rfc3339_nano(&ev.sent_at.unwrap()),
            "2016-12-31T23:59:60Z"
        );
    }
}
