//! Resync pieces shared by principal and agent beyond upstream's spec checksum: the checksum of
//! what an autonomous agent owns of an object (so "nothing changed" costs one small message per
//! object, status included), the annotation a hub mirror carries it in, and the stable outbox
//! keys of resync messages (so repeated resyncs while the peer is away replace each other).

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::event::go_json;

/// Annotation on a hub mirror: hex [`owned_checksum`] of the spoke object it mirrors.
pub const MIRROR_CHECKSUM_ANNOTATION: &str = "argocd-agent.argoproj.io/source-checksum";
/// Annotation on a hub mirror: the autonomous agent that owns it.
pub const MIRROR_AGENT_ANNOTATION: &str = "argocd-agent.argoproj.io/agent";
/// Annotation never part of the checksum (kubectl's bookkeeping).
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// sha256 over the Go-JSON of what the owner of an object decides: spec, status, operation,
/// labels and annotations (without kubectl's last-applied copy).
pub fn owned_checksum(obj: &Value) -> Vec<u8> {
    let map = |ptr: &str| match obj.pointer(ptr) {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    let mut annotations = map("/metadata/annotations");
    annotations.remove(LAST_APPLIED);
    let owned = json!({
        "spec": obj.get("spec").cloned().unwrap_or(Value::Null),
        "status": obj.get("status").cloned().unwrap_or(Value::Null),
        "operation": obj.get("operation").cloned().unwrap_or(Value::Null),
        "labels": Value::Object(map("/metadata/labels")),
        "annotations": Value::Object(annotations),
    });
    Sha256::digest(go_json::to_vec(&owned)).to_vec()
}

/// Outbox key of a `request-update` about `kind`/`name`.
pub fn request_update_key(kind: &str, name: &str) -> String {
    format!("resync/request-update/{kind}/{name}")
}

/// Outbox key of a `response-synced-resource` about `kind`/`name`.
pub fn synced_resource_key(kind: &str, name: &str) -> String {
    format!("resync/synced-resource/{kind}/{name}")
}

/// Outbox key of the single `request-synced-resource-list` / `request-resource-resync`.
pub const RESYNC_REQUEST_KEY: &str = "resync/request";

/// `interval` plus up to 20% random jitter, so a fleet's periodic resyncs do not line up.
pub fn jittered(interval: std::time::Duration) -> std::time::Duration {
    let random = uuid::Uuid::new_v4().as_u128() as u64;
    let fraction = (random % 1000) as f64 / 1000.0;
    interval.mul_f64(1.0 + 0.2 * fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_covers_owned_fields_only() {
        let a = json!({"metadata": {"name": "a", "uid": "1", "resourceVersion": "5",
            "annotations": {LAST_APPLIED: "{}"}}, "spec": {"p": 1}, "status": {"s": 1}});
        let mut b = a.clone();
        b["metadata"]["resourceVersion"] = json!("6");
        b["metadata"]["annotations"] = json!({});
        assert_eq!(owned_checksum(&a), owned_checksum(&b));
        b["status"]["s"] = json!(2);
        assert_ne!(owned_checksum(&a), owned_checksum(&b));
    }
}
