//! Resync pieces shared by principal and agent beyond upstream's spec checksum: the checksum of
//! what an autonomous agent owns of an object (so "nothing changed" costs one small message per
//! object, status included), the annotation a hub mirror carries it in, and the stable outbox
//! keys of resync messages (so repeated resyncs while the peer is away replace each other), and
//! the decisions of the checksum resync both modes share ([`answer_request_update`],
//! [`keys_to_announce`], [`needs_object`]): when nothing changed, each object costs one small
//! message and no full object crosses the link.
//!
//! Beyond upstream, a managed agent's `request-update` carries two more checksums as event
//! extensions ([`with_checksum`], [`checksum_of`]): [`METADATA_CHECKSUM`] (labels and
//! annotations, which upstream's spec checksum ignores, so edits of them while the agent was down
//! are found) and, for Applications, [`STATUS_CHECKSUM`] (so a restarted agent need not resend
//! every status: the principal asks only for those that differ from the hub's). A peer that does
//! not know them ignores them.

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::event::{
    go_json, set_checksum, Event, ExtensionValue, ResourceKey, LAST_APPLIED_ANNOTATION,
    PRINCIPAL_UID_ANNOTATION, REFRESH_ANNOTATION, SOURCE_UID_ANNOTATION,
};

/// Annotation on a hub mirror: hex [`owned_checksum`] of the spoke object it mirrors.
pub const MIRROR_CHECKSUM_ANNOTATION: &str = "argocd-agent.argoproj.io/source-checksum";
/// Annotation on a hub mirror: the autonomous agent that owns it.
pub const MIRROR_AGENT_ANNOTATION: &str = "argocd-agent.argoproj.io/agent";

/// Event extension of a managed agent's `request-update`: hex [`metadata_checksum`] of its copy.
pub const METADATA_CHECKSUM: &str = "metadatachecksum";
/// Event extension of a managed agent's `request-update` for an Application: hex
/// [`status_checksum`] of its copy. Sent by the principal on its own `request-update` to a managed
/// agent (asking for that Application's status) as the hub's.
pub const STATUS_CHECKSUM: &str = "statuschecksum";

/// sha256 over the Go-JSON of an object's labels and annotations as hub and spoke copy share
/// them: without kubectl's last-applied copy, the refresh request and the source-uid and
/// principal-uid annotations (only the spoke copy has them). Absent maps equal empty ones.
pub fn metadata_checksum(obj: &Value) -> Vec<u8> {
    let map = |ptr: &str| match obj.pointer(ptr) {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    let mut annotations = map("/metadata/annotations");
    for a in [
        LAST_APPLIED_ANNOTATION,
        REFRESH_ANNOTATION,
        SOURCE_UID_ANNOTATION,
        PRINCIPAL_UID_ANNOTATION,
    ] {
        annotations.remove(a);
    }
    let meta = json!({
        "labels": Value::Object(map("/metadata/labels")),
        "annotations": Value::Object(annotations),
    });
    Sha256::digest(go_json::to_vec(&meta)).to_vec()
}

/// sha256 over the Go-JSON of an object's `status` (`null` when absent).
pub fn status_checksum(obj: &Value) -> Vec<u8> {
    Sha256::digest(go_json::to_vec(obj.get("status").unwrap_or(&Value::Null))).to_vec()
}

/// `event` with extension `name` = hex `checksum`.
pub fn with_checksum(mut event: Event, name: &str, checksum: &[u8]) -> Event {
    event.extensions.insert(
        name.to_string(),
        ExtensionValue::String(hex::encode(checksum)),
    );
    event
}

/// The checksum in extension `name` of `event`, if it carries a valid one.
pub fn checksum_of(event: &Event, name: &str) -> Option<Vec<u8>> {
    event
        .extensions
        .get(name)
        .and_then(ExtensionValue::as_str)
        .and_then(|h| hex::decode(h).ok())
}

/// sha256 over the Go-JSON of what the owner of an object decides: spec, status, operation,
/// labels and annotations (without kubectl's last-applied copy).
pub fn owned_checksum(obj: &Value) -> Vec<u8> {
    let map = |ptr: &str| match obj.pointer(ptr) {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    let mut annotations = map("/metadata/annotations");
    annotations.remove(LAST_APPLIED_ANNOTATION);
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

/// What the source of truth answers to a peer's `request-update`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateAnswer {
    /// The peer's copy matches: send nothing.
    UpToDate,
    /// Send the object (`spec-update`); its payload also carries a pending deletion.
    SendObject,
    /// The source no longer has that object (or has another one by that name): `delete`.
    Delete,
}

/// The source's side of one object, as [`answer_request_update`] compares it.
#[derive(Debug, Clone, Copy)]
pub struct SourceObject<'a> {
    /// `metadata.uid` on the source.
    pub uid: &'a str,
    /// Spec checksum of the payload the peer would receive.
    pub checksum: &'a [u8],
    /// Whether the source is deleting it (the peer must be told even if the spec is equal).
    pub terminating: bool,
}

/// Answer to a `request-update{uid, checksum}` given the source's object of that name
/// (`None` = it has none). An empty `uid` in the request matches any object (a peer that only
/// knows the name).
pub fn answer_request_update(
    source: Option<SourceObject<'_>>,
    uid: &str,
    checksum: &[u8],
) -> UpdateAnswer {
    match source {
        None => UpdateAnswer::Delete,
        Some(s) if !uid.is_empty() && s.uid != uid => UpdateAnswer::Delete,
        Some(s) if s.terminating || s.checksum != checksum => UpdateAnswer::SendObject,
        Some(_) => UpdateAnswer::UpToDate,
    }
}

/// The keys to announce (`response-synced-resource` each) after the peer sent the checksum of
/// its key set: none when the sets agree, else all of ours (the peer asks for what it lacks).
pub fn keys_to_announce<'a>(ours: &'a [ResourceKey], peer_checksum: &[u8]) -> &'a [ResourceKey] {
    if set_checksum(ours) == peer_checksum {
        &[]
    } else {
        ours
    }
}

/// [`answer_request_update`] for a peer that also sent the [`metadata_checksum`] of its copy
/// (`None`: it did not): an up-to-date spec with other labels or annotations than `payload`, the
/// object the source would send, still needs the object.
pub fn answer_with_metadata(
    answer: UpdateAnswer,
    payload: Option<&Value>,
    peer_metadata: Option<&[u8]>,
) -> UpdateAnswer {
    match (answer, payload, peer_metadata) {
        (UpdateAnswer::UpToDate, Some(p), Some(m)) if metadata_checksum(p) != m => {
            UpdateAnswer::SendObject
        }
        _ => answer,
    }
}

/// Whether a peer must ask for an announced key: it has no object of that kind and name
/// (`local_source_uid` = `None`) or one made from another source object.
pub fn needs_object(local_source_uid: Option<&str>, key_uid: &str) -> bool {
    local_source_uid != Some(key_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source<'a>(uid: &'a str, checksum: &'a [u8], terminating: bool) -> Option<SourceObject<'a>> {
        Some(SourceObject {
            uid,
            checksum,
            terminating,
        })
    }

    #[test]
    fn request_update_is_answered_only_where_the_copies_differ() {
        use UpdateAnswer::*;
        assert_eq!(
            answer_request_update(source("u1", b"c", false), "u1", b"c"),
            UpToDate
        );
        assert_eq!(
            answer_request_update(source("u1", b"c", false), "u1", b"d"),
            SendObject
        );
        assert_eq!(
            answer_request_update(source("u1", b"c", false), "u1", b""),
            SendObject
        );
        assert_eq!(
            answer_request_update(source("u1", b"c", true), "u1", b"c"),
            SendObject
        );
        assert_eq!(
            answer_request_update(source("u2", b"c", false), "u1", b"c"),
            Delete
        );
        assert_eq!(answer_request_update(None, "u1", b"c"), Delete);
        assert_eq!(
            answer_request_update(source("u2", b"c", false), "", b"c"),
            UpToDate
        );
    }

    #[test]
    fn keys_are_announced_only_when_the_key_sets_differ() {
        let a = ResourceKey::new("Application", "a", "hub-ns", "1");
        let b = ResourceKey::new("AppProject", "b", "hub-ns", "2");
        let ours = vec![a.clone(), b.clone()];
        // Same set, other order and namespace (the spoke's): nothing to announce.
        let theirs = [
            ResourceKey::new("AppProject", "b", "argocd", "2"),
            ResourceKey::new("Application", "a", "argocd", "1"),
        ];
        assert!(keys_to_announce(&ours, &set_checksum(&theirs)).is_empty());
        // The peer lacks one, or has one from an older object: announce all of ours.
        assert_eq!(keys_to_announce(&ours, &set_checksum([&a])).len(), 2);
        let older = ResourceKey::new("AppProject", "b", "argocd", "old");
        assert_eq!(
            keys_to_announce(&ours, &set_checksum([&a, &older])).len(),
            2
        );
        // Both empty agree (the empty set's checksum is empty).
        assert!(keys_to_announce(&[], b"").is_empty());
        assert_eq!(keys_to_announce(&ours, b"").len(), 2);
    }

    #[test]
    fn an_announced_key_is_requested_when_missing_or_from_another_object() {
        assert!(needs_object(None, "1"));
        assert!(needs_object(Some("0"), "1"));
        assert!(!needs_object(Some("1"), "1"));
    }

    #[test]
    fn metadata_checksum_ignores_what_only_one_side_has_and_answers_follow_it() {
        let hub = json!({"metadata": {"name": "a", "uid": "1", "labels": {"team": "a"},
            "annotations": {"note": "x", LAST_APPLIED_ANNOTATION: "{}", REFRESH_ANNOTATION: "normal"}}});
        let spoke = json!({"metadata": {"name": "a", "uid": "2", "resourceVersion": "9",
            "labels": {"team": "a"},
            "annotations": {"note": "x", SOURCE_UID_ANNOTATION: "1",
                PRINCIPAL_UID_ANNOTATION: "p"}}, "status": {"s": 1}});
        let same = metadata_checksum(&spoke);
        assert_eq!(metadata_checksum(&hub), same);
        let mut edited = spoke.clone();
        edited["metadata"]["labels"]["team"] = json!("b");
        let other = metadata_checksum(&edited);
        assert_ne!(other, same);
        assert_eq!(
            metadata_checksum(&json!({"metadata": {}})),
            metadata_checksum(&json!({"metadata": {"labels": {}, "annotations": {}}}))
        );
        use UpdateAnswer::*;
        let answer = |a, m: Option<&[u8]>| answer_with_metadata(a, Some(&hub), m);
        assert_eq!(answer(UpToDate, Some(&same)), UpToDate);
        assert_eq!(answer(UpToDate, Some(&other)), SendObject);
        assert_eq!(answer(UpToDate, None), UpToDate, "an upstream peer");
        assert_eq!(answer(Delete, Some(&other)), Delete);
        assert_eq!(answer_with_metadata(Delete, None, Some(&other)), Delete);
    }

    #[test]
    fn checksums_travel_as_hex_extensions() {
        let ev = Event::new(
            crate::event::EventType::RequestUpdate,
            crate::event::Target::ResourceResync,
            "t",
        );
        assert_eq!(checksum_of(&ev, STATUS_CHECKSUM), None);
        let sum = status_checksum(&json!({"status": {"sync": {"status": "Synced"}}}));
        assert_ne!(sum, status_checksum(&json!({})));
        let ev = with_checksum(ev, STATUS_CHECKSUM, &sum);
        assert_eq!(checksum_of(&ev, STATUS_CHECKSUM), Some(sum));
    }

    #[test]
    fn checksum_covers_owned_fields_only() {
        let a = json!({"metadata": {"name": "a", "uid": "1", "resourceVersion": "5",
            "annotations": {LAST_APPLIED_ANNOTATION: "{}"}}, "spec": {"p": 1}, "status": {"s": 1}});
        let mut b = a.clone();
        b["metadata"]["resourceVersion"] = json!("6");
        b["metadata"]["annotations"] = json!({});
        assert_eq!(owned_checksum(&a), owned_checksum(&b));
        b["status"]["s"] = json!(2);
        assert_ne!(owned_checksum(&a), owned_checksum(&b));
    }
}
