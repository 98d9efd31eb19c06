//! Resync helpers shared by principal and agent: resource keys, the key-set checksum and the
//! per-object spec checksum, computed exactly as upstream (`internal/resources`,
//! `internal/resync`) so checksums from a Go peer compare equal.

use std::fmt;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::go_json;
use crate::payload::SyncedResource;

/// Annotation `kubectl apply` leaves behind: never copied to a peer, never part of a checksum and
/// never a reason to revert.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Annotation asking Argo CD for a refresh (a hub request that flows to the spoke); the spoke's
/// application controller removes it once done, which is no drift.
pub const REFRESH_ANNOTATION: &str = "argocd.argoproj.io/refresh";

/// Annotation asking Argo CD to hydrate (argocd-server sets it with every refresh request); the
/// spoke's controller may drop it, which is no drift either.
pub const HYDRATE_ANNOTATION: &str = "argocd.argoproj.io/hydrate";

/// Annotation that carries the source object's UID on the peer's copy.
pub const SOURCE_UID_ANNOTATION: &str = "argocd.argoproj.io/source-uid";

/// Annotation a managed agent stamps on its copy with the identity of the principal that sent
/// it (the `principaluid` event extension), as upstream's agent does: a copy whose principal
/// changed (a failover) is taken over in place rather than recreated.
pub const PRINCIPAL_UID_ANNOTATION: &str = "argocd.argoproj.io/principal-uid";

/// Annotation on a hub object overriding the agent's `--source-uid-mismatch-policy` for that
/// object (`recreate` or `upsert`), as upstream's.
pub const MISMATCH_POLICY_ANNOTATION: &str = "argocd.argoproj.io/source-uid-mismatch-policy";

/// Identity of one synchronised object. `uid` is the *source* UID: the object's own UID on
/// the source-of-truth side, the [`SOURCE_UID_ANNOTATION`] value on the peer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ResourceKey {
    pub kind: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

impl ResourceKey {
    pub fn new(
        kind: impl Into<String>,
        name: impl Into<String>,
        namespace: impl Into<String>,
        uid: impl Into<String>,
    ) -> Self {
        ResourceKey {
            kind: kind.into(),
            name: name.into(),
            namespace: namespace.into(),
            uid: uid.into(),
        }
    }

    /// Key of a Kubernetes object in JSON form: `kind`, `metadata.name`, `metadata.namespace`,
    /// and the source UID (annotation if present, else `metadata.uid`). `kind` may be passed
    /// explicitly for objects whose JSON lacks it (typed clients often drop `kind`).
    /// Returns `None` when kind or name is missing.
    pub fn from_object(obj: &Value, kind: Option<&str>) -> Option<ResourceKey> {
        let meta = obj.get("metadata")?;
        let kind = kind
            .map(str::to_string)
            .or_else(|| obj.get("kind").and_then(Value::as_str).map(str::to_string))?;
        let name = meta.get("name").and_then(Value::as_str)?.to_string();
        if kind.is_empty() || name.is_empty() {
            return None;
        }
        let namespace = meta
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let uid = meta
            .get("annotations")
            .and_then(|a| a.get(SOURCE_UID_ANNOTATION))
            .and_then(Value::as_str)
            .or_else(|| meta.get("uid").and_then(Value::as_str))
            .unwrap_or_default()
            .to_string();
        Some(ResourceKey {
            kind,
            name,
            namespace,
            uid,
        })
    }

    /// The string that enters the set checksum: `Kind/Name/UID` (namespace omitted, because
    /// it differs between hub and spoke).
    pub fn checksum_entry(&self) -> String {
        format!("{}/{}/{}", self.kind, self.name, self.uid)
    }
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.kind, self.namespace, self.name, self.uid
        )
    }
}

impl From<&SyncedResource> for ResourceKey {
    fn from(s: &SyncedResource) -> Self {
        ResourceKey::new(&s.kind, &s.name, &s.namespace, &s.uid)
    }
}

impl From<&ResourceKey> for SyncedResource {
    fn from(k: &ResourceKey) -> Self {
        SyncedResource {
            name: k.name.clone(),
            namespace: k.namespace.clone(),
            uid: k.uid.clone(),
            kind: k.kind.clone(),
        }
    }
}

/// Checksum of a set of keys: sha256 over the byte-sorted `Kind/Name/UID` strings concatenated
/// without separator. An empty set yields an empty vector (upstream: nil).
pub fn set_checksum<'a>(keys: impl IntoIterator<Item = &'a ResourceKey>) -> Vec<u8> {
    let mut entries: Vec<String> = keys.into_iter().map(ResourceKey::checksum_entry).collect();
    if entries.is_empty() {
        return Vec::new();
    }
    entries.sort_unstable();
    let mut h = Sha256::new();
    for e in &entries {
        h.update(e.as_bytes());
    }
    h.finalize().to_vec()
}

/// Why a spec checksum could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum ChecksumError {
    #[error("{kind} {name:?} has no spec field; cannot compute its spec checksum")]
    MissingSpec { kind: String, name: String },
    #[error("the spec of {kind} {name:?} is not a JSON object")]
    SpecNotObject { kind: String, name: String },
}

/// Name of the hub's GPG keys ConfigMap (Argo CD's `argocd-gpg-keys-cm`), in the principal's
/// namespace on the hub and the agent's on the spoke.
pub const GPG_KEYS_CONFIGMAP: &str = "argocd-gpg-keys-cm";

/// The resync kind (`kind` of `request-update` and of resource keys) upstream gives the GPG keys
/// ConfigMap.
pub const GPG_KEY_RESYNC_KIND: &str = "GPGKey";

/// The resync kind (`kind` of `request-update` and of resource keys) upstream gives repository
/// Secrets. Our agents and principals before it used `Secret`, which both still accept.
pub const REPOSITORY_RESYNC_KIND: &str = "Repository";

/// Spec checksum of an object as upstream computes it: for `Secret` (or the repository resync
/// kind, [`REPOSITORY_RESYNC_KIND`]) sha256(Go-JSON of `data`,
/// `null` when absent); for `ConfigMap` (or upstream's resync kind of the GPG keys ConfigMap,
/// [`GPG_KEY_RESYNC_KIND`]) the same with `{}` when absent; for everything else sha256(Go-JSON
/// of `spec` without its `destination` field, which the agent rewrites).
/// `kind` overrides the object's own `kind` field when given.
pub fn spec_checksum(obj: &Value, kind: Option<&str>) -> Result<Vec<u8>, ChecksumError> {
    let kind = kind
        .or_else(|| obj.get("kind").and_then(Value::as_str))
        .unwrap_or_default();
    if kind == "Secret" || kind == REPOSITORY_RESYNC_KIND {
        return Ok(data_checksum(obj));
    }
    if kind == "ConfigMap" || kind == GPG_KEY_RESYNC_KIND {
        let data = obj
            .get("data")
            .filter(|d| !d.is_null())
            .cloned()
            .unwrap_or_else(|| Value::Object(Default::default()));
        return Ok(Sha256::digest(go_json::to_vec(&data)).to_vec());
    }
    let name = || {
        obj.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let spec = obj.get("spec").ok_or_else(|| ChecksumError::MissingSpec {
        kind: kind.to_string(),
        name: name(),
    })?;
    let Value::Object(map) = spec else {
        return Err(ChecksumError::SpecNotObject {
            kind: kind.to_string(),
            name: name(),
        });
    };
    let mut out = String::new();
    // Same as Go-JSON of the map with "destination" removed, without cloning the spec.
    let mut entries: Vec<(&String, &Value)> =
        map.iter().filter(|(k, _)| *k != "destination").collect();
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    out.push('{');
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        go_json::write_string(&mut out, k);
        out.push(':');
        go_json::write_value(&mut out, v);
    }
    out.push('}');
    Ok(Sha256::digest(out.as_bytes()).to_vec())
}

/// sha256 of the Go-JSON of an object's `data` field (`null` when absent).
pub fn data_checksum(obj: &Value) -> Vec<u8> {
    let data = obj.get("data").unwrap_or(&Value::Null);
    Sha256::digest(go_json::to_vec(data)).to_vec()
}
