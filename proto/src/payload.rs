//! JSON payloads carried in the `binary_data` of argocd-agent events.
//!
//! Owns the request/response bodies of the resource proxy, redis proxy, resync protocol,
//! cluster-cache statistics, container logs, web terminal and error reports. Field names are
//! exactly upstream's Go JSON tags (`internal/event/event.go`), including `omitempty` behaviour,
//! so a Go peer decodes what we send and vice versa. Go `[]byte` fields travel as standard
//! base64 strings (`null` for a nil slice); see [`go_bytes`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Serde helpers for Go `[]byte` JSON fields: standard base64 with padding; `null` decodes to
/// an empty vector. An empty vector encodes as `""` (Go's encoding of a non-nil empty slice);
/// Go peers compare checksums with `bytes.Equal`, which treats nil and empty alike.
pub mod go_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialise bytes as a base64 string.
    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    /// Deserialise a base64 string (padded or not) or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        let Some(s) = s else { return Ok(Vec::new()) };
        base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(s.as_bytes()))
            .map_err(|e| serde::de::Error::custom(format!("invalid base64 in []byte field: {e}")))
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A request for a live resource (or discovery) on the agent's cluster, emitted by the
/// principal's resource proxy. The event `type` is the raw HTTP method.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceRequest {
    /// Request UUID; the response carries it back.
    #[serde(default)]
    pub uuid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    /// e.g. `status`, `scale`, `log`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subresource: String,
    /// HTTP method (`GET`, `PATCH`, `POST`, `DELETE`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub method: String,
    /// Body of write requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "go_bytes")]
    pub body: Vec<u8>,
    /// Query parameters of the HTTP request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
    /// API group (embedded `GroupVersionResource`).
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    /// Plural resource name, e.g. `deployments`.
    #[serde(default)]
    pub resource: String,
}

impl ResourceRequest {
    /// Neither group, version, resource, name nor namespace is set.
    pub fn is_empty(&self) -> bool {
        self.group.is_empty()
            && self.version.is_empty()
            && self.resource.is_empty()
            && self.name.is_empty()
            && self.namespace.is_empty()
    }
    /// A discovery/list request: no resource and no name.
    pub fn is_list(&self) -> bool {
        self.resource.is_empty() && self.name.is_empty()
    }
    /// A request for one named resource.
    pub fn is_resource(&self) -> bool {
        !self.resource.is_empty() && !self.name.is_empty()
    }
    /// No namespace given.
    pub fn is_cluster_scoped(&self) -> bool {
        self.namespace.is_empty()
    }
    /// Either a list or a named resource request.
    pub fn is_valid(&self) -> bool {
        self.is_resource() || self.is_list()
    }
}

/// The agent's answer to a [`ResourceRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceResponse {
    /// UUID of the request answered.
    #[serde(default)]
    pub uuid: String,
    /// HTTP status.
    #[serde(default)]
    pub status: i64,
    /// JSON body of the answer.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
}

/// A Redis command forwarded from the principal's redis proxy to the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisRequest {
    #[serde(default)]
    pub uuid: String,
    #[serde(rename = "connectionUuid", default)]
    pub connection_uuid: String,
    #[serde(default)]
    pub body: RedisCommandBody,
}

/// Exactly one of the members is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisCommandBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub get: Option<RedisCommandBodyGet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscribe: Option<RedisCommandBodySubscribe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ping: Option<RedisCommandBodyPing>,
    /// Our extension: the hub client's connection `connectionUuid` ended; the agent closes its
    /// subscriptions for it at once. Sent only to agents whose subscribe answer set
    /// [`RedisResponseBodySubscribeResponse::supports_close_connection`] (upstream agents end
    /// them when the pings stop, after 10 minutes).
    #[serde(
        rename = "closeConnection",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub close_connection: Option<RedisCommandBodyCloseConnection>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisCommandBodyGet {
    #[serde(default)]
    pub key: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisCommandBodySubscribe {
    #[serde(rename = "channel", default)]
    pub channel_name: String,
}

/// Serialises as `{}` like Go's empty struct.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisCommandBodyPing {}

/// Serialises as `{}`; see [`RedisCommandBody::close_connection`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisCommandBodyCloseConnection {}

/// The agent's answer to a [`RedisRequest`], or a push from a subscription.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisResponse {
    /// UUID of the request answered.
    #[serde(default)]
    pub uuid: String,
    #[serde(rename = "connectionUuid", default)]
    pub connection_uuid: String,
    #[serde(default)]
    pub body: RedisResponseBody,
}

/// Exactly one of the members is set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisResponseBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub get: Option<RedisResponseBodyGet>,
    #[serde(
        rename = "subscribeResponse",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub subscribe_response: Option<RedisResponseBodySubscribeResponse>,
    #[serde(
        rename = "pushFromSubscribe",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub push_from_subscribe: Option<RedisResponseBodyPushFromSubscribe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pong: Option<RedisResponseBodyPong>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisResponseBodyGet {
    /// Raw value of the key (base64 on the wire).
    #[serde(default, with = "go_bytes")]
    pub bytes: Vec<u8>,
    #[serde(rename = "cacheHit", default)]
    pub cache_hit: bool,
    #[serde(default)]
    pub error: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisResponseBodySubscribeResponse {
    #[serde(default)]
    pub error: String,
    /// Our extension (Go principals ignore it): the agent understands
    /// [`RedisCommandBody::close_connection`]; omitted when false, as upstream agents send it.
    #[serde(
        rename = "supportsCloseConnection",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub supports_close_connection: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisResponseBodyPushFromSubscribe {
    #[serde(rename = "channelName", default)]
    pub channel_name: String,
}

/// Serialises as `{}` like Go's empty struct.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RedisResponseBodyPong {}

/// Sent by the peer (not the source of truth) after a restart: the checksum of all its
/// resource keys (see [`crate::event::resync::set_checksum`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestSyncedResourceList {
    #[serde(default, with = "go_bytes")]
    pub checksum: Vec<u8>,
}

/// One resource key of the source of truth, sent when set checksums differ.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SyncedResource {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub kind: String,
}

/// Asks the source of truth for the current content of one resource; `checksum` is the
/// peer's spec checksum (empty when the peer does not have the object).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestUpdate {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, with = "go_bytes")]
    pub checksum: Vec<u8>,
}

/// Sent by the source of truth after it restarted; serialises as `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestResourceResync {}

/// Cluster cache statistics reported by the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterCacheInfo {
    #[serde(rename = "applicationsCount", default)]
    pub applications_count: i64,
    #[serde(rename = "apisCount", default)]
    pub apis_count: i64,
    #[serde(rename = "resourcesCount", default)]
    pub resources_count: i64,
}

/// A request for container logs; the event `type` is the raw HTTP method.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerLogRequest {
    #[serde(default)]
    pub uuid: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(rename = "podName", default)]
    pub pod_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub follow: bool,
    #[serde(rename = "tailLines", default, skip_serializing_if = "Option::is_none")]
    pub tail_lines: Option<i64>,
    #[serde(
        rename = "sinceSeconds",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub since_seconds: Option<i64>,
    #[serde(
        rename = "sinceTime",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub since_time: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub timestamps: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub previous: bool,
    #[serde(
        rename = "insecureSkipTLSVerifyBackend",
        default,
        skip_serializing_if = "is_false"
    )]
    pub insecure_skip_tls_verify_backend: bool,
    #[serde(
        rename = "limitBytes",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub limit_bytes: Option<i64>,
}

impl ContainerLogRequest {
    /// Build a request from the query parameters of a Kubernetes `pods/log` call the way upstream
    /// does: booleans are `true` case-insensitively, unparsable numbers are ignored.
    pub fn from_params(
        uuid: impl Into<String>,
        namespace: impl Into<String>,
        pod_name: impl Into<String>,
        params: &BTreeMap<String, String>,
    ) -> Self {
        let flag = |k: &str| {
            params
                .get(k)
                .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        };
        let num = |k: &str| params.get(k).and_then(|v| v.parse::<i64>().ok());
        ContainerLogRequest {
            uuid: uuid.into(),
            namespace: namespace.into(),
            pod_name: pod_name.into(),
            container: params.get("container").cloned().unwrap_or_default(),
            follow: flag("follow"),
            tail_lines: num("tailLines"),
            since_seconds: num("sinceSeconds"),
            since_time: params.get("sinceTime").cloned().unwrap_or_default(),
            timestamps: flag("timestamps"),
            previous: flag("previous"),
            insecure_skip_tls_verify_backend: flag("insecureSkipTLSVerifyBackend"),
            limit_bytes: num("limitBytes"),
        }
    }
}

/// A request to open a web terminal into a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerTerminalRequest {
    #[serde(default)]
    pub uuid: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(rename = "podName", default)]
    pub pod_name: String,
    #[serde(rename = "containerName", default)]
    pub container_name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default)]
    pub tty: bool,
    #[serde(default)]
    pub stdin: bool,
    #[serde(default)]
    pub stdout: bool,
    #[serde(default)]
    pub stderr: bool,
}

/// Payload of an `error` event, e.g. an adoption refused by the receiver.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorData {
    #[serde(rename = "resourceName", default)]
    pub resource_name: String,
    #[serde(rename = "resourceNamespace", default)]
    pub resource_namespace: String,
    #[serde(default)]
    pub message: String,
}
