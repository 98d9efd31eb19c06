//! Entries of Argo CD's Redis cache that this project reads and writes, in Argo CD's own format
//! (argo-cd v3 `util/cache/cache.go`, `util/cache/redis.go`, `util/cache/appstate/cache.go`).
//!
//! Owns the cluster info entry (`v1alpha1.ClusterInfo`, what `argocd cluster list`/`get` and the
//! UI show as a cluster's connection state and cache counts): its key
//! (`cluster|info|<server>|<CacheVersion>`, plus `.gz` when Argo CD compresses, its default
//! `--redis-compress gzip`), its value (the `encoding/json` encoding with `json.Encoder`'s
//! trailing newline, gzipped when compressed) and its lifetime ([`CLUSTER_INFO_TTL`]: Argo CD drops
//! an entry nobody re-saves within 10 minutes). Not the connection to Redis: callers bring theirs.

use std::io::{Read, Write};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

/// Argo CD's `common.CacheVersion`, the suffix of every cache key.
pub const CACHE_VERSION: &str = "1.8.3";
/// How long Argo CD keeps a cluster info entry (`clusterInfoCacheExpiration`, not configurable).
pub const CLUSTER_INFO_TTL: Duration = Duration::from_secs(600);
/// The server URL of the cluster an Argo CD runs in, whose info an agent reads on its spoke.
pub const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";

/// `ConnectionStatus` values (Argo CD's `ConnectionStatusSuccessful`, `...Failed`).
pub const CONNECTION_SUCCESSFUL: &str = "Successful";
/// The connection to the cluster failed (for an agent: it is not connected).
pub const CONNECTION_FAILED: &str = "Failed";

/// How Argo CD compresses its cache values (`--redis-compress`, `RedisCompressionType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RedisCompression {
    /// `gzip` (Argo CD's default): keys end in `.gz`, values are gzipped.
    #[default]
    Gzip,
    /// `none`: plain JSON under the bare key.
    None,
}

impl std::str::FromStr for RedisCompression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "gzip" => Ok(RedisCompression::Gzip),
            "none" => Ok(RedisCompression::None),
            other => Err(format!(
                "unknown compression type {other:?} (possible values: gzip, none)"
            )),
        }
    }
}

impl std::fmt::Display for RedisCompression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RedisCompression::Gzip => "gzip",
            RedisCompression::None => "none",
        })
    }
}

/// Argo CD's `v1alpha1.ConnectionState`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectionState {
    /// `Successful`, `Failed` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// Human-readable detail.
    #[serde(default)]
    pub message: String,
    /// When the status was determined (Argo CD's JSON name is `attemptedAt`).
    #[serde(rename = "attemptedAt", default)]
    pub modified_at: Option<Time>,
}

/// Argo CD's `v1alpha1.ClusterCacheInfo`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterCacheInfo {
    /// Kubernetes resources the controller's cluster cache holds.
    #[serde(rename = "resourcesCount", default, skip_serializing_if = "is_zero")]
    pub resources_count: i64,
    /// APIs the controller's cluster cache watches.
    #[serde(rename = "apisCount", default, skip_serializing_if = "is_zero")]
    pub apis_count: i64,
    /// The most recent cluster cache synchronisation.
    #[serde(
        rename = "lastCacheSyncTime",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub last_cache_sync_time: Option<Time>,
}

/// Argo CD's `v1alpha1.ClusterInfo`, the value of a cluster info entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterInfo {
    /// The connection to the cluster.
    #[serde(rename = "connectionState", default)]
    pub connection_state: ConnectionState,
    /// The cluster's Kubernetes version.
    #[serde(
        rename = "serverVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub server_version: String,
    /// The controller's cluster cache.
    #[serde(rename = "cacheInfo", default)]
    pub cache_info: ClusterCacheInfo,
    /// Applications deployed to the cluster.
    #[serde(rename = "applicationsCount", default)]
    pub applications_count: i64,
    /// API versions the cluster serves.
    #[serde(rename = "apiVersions", default, skip_serializing_if = "Vec::is_empty")]
    pub api_versions: Vec<String>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// Why a cached value could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CacheDecodeError {
    /// The value is not gzip (or the stream is cut).
    #[error("cached value is not valid gzip: {0}")]
    Gzip(#[from] std::io::Error),
    /// The JSON does not decode to the expected type.
    #[error("failed to decode cached data: {0}")]
    Json(#[from] serde_json::Error),
}

/// The Redis key of `server`'s cluster info (`cluster|info|<server>|1.8.3`, `.gz` when gzipped).
pub fn cluster_info_key(server: &str, compression: RedisCompression) -> String {
    let key = format!("cluster|info|{server}|{CACHE_VERSION}");
    match compression {
        RedisCompression::Gzip => key + ".gz",
        RedisCompression::None => key,
    }
}

/// A cache value as Argo CD writes it: JSON with a trailing newline, gzipped when compressed.
pub fn encode<T: Serialize>(value: &T, compression: RedisCompression) -> Vec<u8> {
    let mut json = serde_json::to_vec(value).expect("cache values serialise");
    json.push(b'\n');
    match compression {
        RedisCompression::None => json,
        RedisCompression::Gzip => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(&json)
                .and_then(|()| gz.finish())
                .expect("gzip into memory cannot fail")
        }
    }
}

/// A cache value as Argo CD reads it (JSON, after gunzip when compressed).
pub fn decode<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    compression: RedisCompression,
) -> Result<T, CacheDecodeError> {
    let json = match compression {
        RedisCompression::None => bytes.to_vec(),
        RedisCompression::Gzip => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(bytes).read_to_end(&mut out)?;
            out
        }
    };
    // The trailing newline is whitespace to serde_json too.
    Ok(serde_json::from_slice(&json)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn keys_are_argo_cds() {
        assert_eq!(
            cluster_info_key("https://kubernetes.default.svc", RedisCompression::Gzip),
            "cluster|info|https://kubernetes.default.svc|1.8.3.gz"
        );
        assert_eq!(
            cluster_info_key("https://p:8443?agentName=a", RedisCompression::None),
            "cluster|info|https://p:8443?agentName=a|1.8.3"
        );
    }

    #[test]
    fn cluster_info_encodes_as_go_encoding_json_does() {
        let info = ClusterInfo {
            connection_state: ConnectionState {
                status: CONNECTION_SUCCESSFUL.into(),
                message: "Agent: 'a' is connected with principal".into(),
                modified_at: Some(time("2026-11-24T16:00:00Z")),
            },
            applications_count: 2,
            cache_info: ClusterCacheInfo {
                apis_count: 40,
                resources_count: 300,
                last_cache_sync_time: None,
            },
            ..Default::default()
        };
        // Field order and omissions of Go's encoder for v1alpha1.ClusterInfo; json.Encoder adds `\n`.
        let expected = "{\"connectionState\":{\"status\":\"Successful\",\"message\":\"Agent: 'a' is connected with principal\",\"attemptedAt\":\"2026-11-24T16:00:00Z\"},\"cacheInfo\":{\"resourcesCount\":300,\"apisCount\":40},\"applicationsCount\":2}\n";
        assert_eq!(
            String::from_utf8(encode(&info, RedisCompression::None)).unwrap(),
            expected
        );
        let empty = "{\"connectionState\":{\"status\":\"\",\"message\":\"\",\"attemptedAt\":null},\"cacheInfo\":{},\"applicationsCount\":0}\n";
        assert_eq!(
            String::from_utf8(encode(&ClusterInfo::default(), RedisCompression::None)).unwrap(),
            empty
        );
    }

    #[test]
    fn gzip_values_round_trip_and_are_gzip() {
        let info = ClusterInfo {
            applications_count: 3,
            server_version: "1.36".into(),
            api_versions: vec!["v1".into()],
            cache_info: ClusterCacheInfo {
                last_cache_sync_time: Some(time("2026-11-24T16:00:01Z")),
                ..Default::default()
            },
            ..Default::default()
        };
        let bytes = encode(&info, RedisCompression::Gzip);
        assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip magic");
        let back: ClusterInfo = decode(&bytes, RedisCompression::Gzip).unwrap();
        assert_eq!(back, info);
        assert!(decode::<ClusterInfo>(b"{}", RedisCompression::Gzip).is_err());
    }

    /// What Argo CD's application-controller writes for its in-cluster destination (fields we do
    /// not model, fractional seconds, and `null`s) reads back.
    #[test]
    fn a_controller_written_value_decodes() {
        let json = br#"{"connectionState":{"status":"Successful","message":"","attemptedAt":"2026-11-24T16:00:00Z"},"serverVersion":"1.36","cacheInfo":{"resourcesCount":812,"apisCount":57,"lastCacheSyncTime":"2026-11-24T15:59:50Z"},"applicationsCount":1,"apiVersions":["v1","apps/v1"]}
"#;
        let info: ClusterInfo = decode(json, RedisCompression::None).unwrap();
        assert_eq!(info.cache_info.resources_count, 812);
        assert_eq!(info.cache_info.apis_count, 57);
        assert_eq!(info.applications_count, 1);
        assert_eq!(info.connection_state.status, CONNECTION_SUCCESSFUL);
    }

    #[test]
    fn compression_flag_values() {
        assert_eq!("gzip".parse(), Ok(RedisCompression::Gzip));
        assert_eq!("none".parse(), Ok(RedisCompression::None));
        assert!("zstd".parse::<RedisCompression>().is_err());
        assert_eq!(RedisCompression::default().to_string(), "gzip");
    }
}
