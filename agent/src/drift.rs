//! What a managed agent does when it observes a change of a spoke object: the pure decisions
//! behind drift revert, unauthorised-delete recreation (and what the recreated object carries),
//! deletion confirmation, status reporting and the source-uid mismatch policy of one object.
//! The watcher in [`crate::managed`] feeds observations in and carries the decisions out; nothing
//! here talks to Kubernetes or the principal.

use argocd_agent_kube::argocd::ObjectMetaExt;
use argocd_agent_proto::event::{MISMATCH_POLICY_ANNOTATION, PRINCIPAL_UID_ANNOTATION};
use clap::ValueEnum;

use crate::config::SourceUidMismatchPolicy;
use crate::spoke_copy::{
    managed_view, reported_view, ManagedView, PackedObject, ReportedView, SpokeObject, SyncedKind,
};

/// The last hub copy received for one object, and what the apiserver stored when the agent last
/// wrote it (the apiserver may prune or normalise fields, so drift is judged against what was
/// stored, not against what was sent: otherwise a pruned field would be "reverted" forever).
/// The copy is kept packed (its JSON) with its managed view: it is compared on every hub event
/// but read whole only to revert, recreate or resync.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedCopy {
    /// The spoke copy built from the last hub object received.
    desired: PackedObject,
    /// [`managed_view`] of `desired`.
    desired_view: ManagedView,
    /// [`managed_view`] of the object as stored after the agent's last write of `desired`.
    pub applied: Option<ManagedView>,
}

impl CachedCopy {
    /// A copy of `desired` not yet written.
    pub fn new(desired: &SpokeObject) -> Self {
        Self::from_packed(PackedObject::pack(desired), desired)
    }

    /// A copy of `desired`, already packed as `packed` by its caller, not yet written.
    pub fn from_packed(packed: PackedObject, desired: &SpokeObject) -> Self {
        CachedCopy {
            desired: packed,
            desired_view: managed_view(desired),
            applied: None,
        }
    }

    /// The spoke copy built from the last hub object received.
    pub fn desired(&self) -> SpokeObject {
        self.desired.unpack()
    }

    /// Whether this is the copy of `desired`.
    pub fn holds(&self, desired: &SpokeObject) -> bool {
        self.holds_packed(&PackedObject::pack(desired))
    }

    /// Whether this is the copy whose packed form is `packed`.
    pub fn holds_packed(&self, packed: &PackedObject) -> bool {
        self.desired == *packed
    }

    /// What the live object should look like in its managed view.
    pub fn baseline(&self) -> ManagedView {
        self.applied.unwrap_or(self.desired_view)
    }
}

/// Whether a live object that was added or modified must be reverted to the hub copy.
pub fn needs_revert(live: &SpokeObject, cached: Option<&CachedCopy>) -> bool {
    let Some(cached) = cached else {
        return false;
    };
    // On its way out: a local delete is handled once the object is gone. (A removed source-uid
    // annotation is drift like any other: the hub copy exists, so the object is the hub's.)
    if live.is_terminating() {
        return false;
    }
    managed_view(live) != cached.baseline()
}

/// What to do about the status of a live Application.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusReport {
    /// Nothing changed since the last report.
    Unchanged,
    /// Remember this view but send nothing (a fresh object without status or operation).
    RecordOnly(ReportedView),
    /// Send a `status-update` and remember this view.
    Send(ReportedView),
}

/// Compares the status and operation of a live object with what was last reported.
pub fn status_report(
    kind: SyncedKind,
    live: &SpokeObject,
    last: Option<&ReportedView>,
) -> StatusReport {
    if kind != SyncedKind::Application || live.source_uid().is_none() {
        return StatusReport::Unchanged;
    }
    let view = reported_view(live);
    match last {
        Some(last) if *last == view => StatusReport::Unchanged,
        None if view.is_empty() => StatusReport::RecordOnly(view),
        _ => StatusReport::Send(view),
    }
}

/// The policy for a live copy whose source uid is not `desired`'s, as upstream's agent decides
/// it: a copy written for another principal (its principal-uid differs from the one `desired`
/// carries, or it has none: written before principals were told apart) is the same object after
/// a principal failover and is updated in place; otherwise the hub object's annotation
/// [`MISMATCH_POLICY_ANNOTATION`] (`recreate` or `upsert`), else `global`.
pub fn mismatch_policy(
    live: &SpokeObject,
    desired: &SpokeObject,
    global: SourceUidMismatchPolicy,
) -> SourceUidMismatchPolicy {
    if let Some(principal) = desired.annotation(PRINCIPAL_UID_ANNOTATION) {
        if live.annotation(PRINCIPAL_UID_ANNOTATION) != Some(principal) {
            return SourceUidMismatchPolicy::Upsert;
        }
    }
    match desired.annotation(MISMATCH_POLICY_ANNOTATION) {
        None => global,
        Some(value) => SourceUidMismatchPolicy::from_str(value, false).unwrap_or_else(|_| {
            tracing::warn!(namespace = desired.namespace_str(), name = desired.name_str(), value,
                "unknown {MISMATCH_POLICY_ANNOTATION} (recreate or upsert); using --source-uid-mismatch-policy");
            global
        }),
    }
}

/// The object that recreates an Application deleted locally: `desired` with the status `gone`
/// had, as upstream's agent recreates it (Argo CD's automated sync then does not run again for
/// a revision its last operation already synced; see `--on-application-recreate`). Other kinds
/// have no status: `desired` as it is.
pub fn recreated_from(kind: SyncedKind, desired: &SpokeObject, gone: &SpokeObject) -> SpokeObject {
    let mut body = desired.clone();
    if kind == SyncedKind::Application {
        body.status = gone.status.clone();
    }
    body
}

/// What to do once a spoke object is gone.
#[derive(Debug, Clone, PartialEq)]
pub enum DeletedAction {
    /// Not the agent's business (no source-uid), or nothing known to recreate it from.
    Ignore,
    /// The deletion was asked for by the hub: tell the principal (Applications) and forget it.
    Confirm,
    /// Deleted locally without the hub asking: create it again from this hub copy.
    Recreate(Box<SpokeObject>),
}

/// Decides about an object that disappeared from the spoke. `expected` means the hub asked for
/// the deletion; `cached` is the hub copy of an object of that name, if one is known.
pub fn on_deleted(
    gone: &SpokeObject,
    expected: bool,
    cached: Option<&CachedCopy>,
) -> DeletedAction {
    if expected {
        return match gone.source_uid() {
            Some(_) => DeletedAction::Confirm,
            None => DeletedAction::Ignore,
        };
    }
    match cached {
        Some(c) => DeletedAction::Recreate(Box::new(c.desired())),
        None => DeletedAction::Ignore,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::spoke_copy::spoke_copy;
    use serde_json::json;

    fn annotated(pairs: &[(&str, &str)]) -> SpokeObject {
        let mut obj = SpokeObject::default();
        obj.metadata.annotations = Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        obj
    }

    #[test]
    fn mismatch_policy_follows_the_principal_then_the_objects_annotation_then_the_flag() {
        use SourceUidMismatchPolicy::{Recreate, Upsert};
        let same_principal = annotated(&[(PRINCIPAL_UID_ANNOTATION, "p1")]);
        let plain = annotated(&[(PRINCIPAL_UID_ANNOTATION, "p1")]);
        assert_eq!(mismatch_policy(&same_principal, &plain, Recreate), Recreate);
        assert_eq!(mismatch_policy(&same_principal, &plain, Upsert), Upsert);
        let upsert = annotated(&[
            (PRINCIPAL_UID_ANNOTATION, "p1"),
            (MISMATCH_POLICY_ANNOTATION, "upsert"),
        ]);
        assert_eq!(mismatch_policy(&same_principal, &upsert, Recreate), Upsert);
        let recreate = annotated(&[
            (PRINCIPAL_UID_ANNOTATION, "p1"),
            (MISMATCH_POLICY_ANNOTATION, "recreate"),
        ]);
        assert_eq!(
            mismatch_policy(&same_principal, &recreate, Upsert),
            Recreate
        );
        let unknown = annotated(&[
            (PRINCIPAL_UID_ANNOTATION, "p1"),
            (MISMATCH_POLICY_ANNOTATION, "merge"),
        ]);
        assert_eq!(
            mismatch_policy(&same_principal, &unknown, Recreate),
            Recreate
        );
        // Another principal (a failover), or a copy from before principals were told apart:
        // the same object, taken over in place whatever the policy.
        let other_principal = annotated(&[(PRINCIPAL_UID_ANNOTATION, "p0")]);
        assert_eq!(
            mismatch_policy(&other_principal, &recreate, Recreate),
            Upsert
        );
        assert_eq!(mismatch_policy(&annotated(&[]), &plain, Recreate), Upsert);
        // An event without the principal's identity: no transition to detect.
        assert_eq!(
            mismatch_policy(&other_principal, &annotated(&[]), Recreate),
            Recreate
        );
    }

    #[test]
    fn a_recreated_application_keeps_the_status_it_had() {
        let desired = desired();
        let mut gone = desired.clone();
        gone.status = Some(json!({"operationState": {"phase": "Succeeded"}}));
        let body = recreated_from(SyncedKind::Application, &desired, &gone);
        assert_eq!(body.status, gone.status);
        assert_eq!(body.spec, desired.spec);
        assert_eq!(
            recreated_from(SyncedKind::AppProject, &desired, &gone).status,
            None
        );
    }

    fn desired() -> SpokeObject {
        let hub = serde_json::from_value(json!({
            "metadata": {"name": "app", "uid": "hub-1", "labels": {"a": "1"}},
            "spec": {"project": "default", "destination": {"namespace": "ns"}}
        }))
        .unwrap();
        spoke_copy(SyncedKind::Application, &hub, "argocd").unwrap()
    }

    fn live_of(desired: &SpokeObject) -> SpokeObject {
        let mut live = desired.clone();
        live.metadata.uid = Some("spoke-1".into());
        live.metadata.resource_version = Some("5".into());
        live
    }

    #[test]
    fn local_spec_or_label_edit_is_drift_status_change_is_not() {
        let cached = CachedCopy::new(&desired());
        let mut live = live_of(&cached.desired());
        assert!(!needs_revert(&live, Some(&cached)));
        live.status = Some(json!({"health": {"status": "Healthy"}}));
        assert!(!needs_revert(&live, Some(&cached)));
        live.spec = Some(json!({"project": "sneaky"}));
        assert!(needs_revert(&live, Some(&cached)));
        let mut live = live_of(&cached.desired());
        live.metadata.labels = Some(BTreeMap::from([("a".into(), "2".into())]));
        assert!(needs_revert(&live, Some(&cached)));
    }

    #[test]
    fn no_revert_without_hub_copy_or_while_terminating() {
        let cached = CachedCopy::new(&desired());
        let mut live = live_of(&cached.desired());
        live.spec = Some(json!({"project": "sneaky"}));
        assert!(!needs_revert(&live, None));
        let mut terminating = live.clone();
        terminating.metadata.deletion_timestamp =
            serde_json::from_value(json!("2024-01-01T00:00:00Z")).unwrap();
        assert!(!needs_revert(&terminating, Some(&cached)));
        let mut stripped = live_of(&cached.desired());
        stripped.metadata.annotations = Some(BTreeMap::new());
        assert!(
            needs_revert(&stripped, Some(&cached)),
            "removing the source-uid of a hub object is drift"
        );
    }

    #[test]
    fn drift_is_judged_against_what_the_apiserver_stored() {
        let mut sent = desired();
        sent.spec = Some(json!({"project": "default", "unknownField": true,
                                "destination": {"name": "in-cluster", "namespace": "ns"}}));
        let mut cached = CachedCopy::new(&sent);
        // The apiserver pruned the unknown field; that is not drift.
        let live = live_of(&desired());
        cached.applied = Some(managed_view(&live));
        assert!(!needs_revert(&live, Some(&cached)));
    }

    #[test]
    fn status_is_reported_on_change_only_and_not_for_a_fresh_object() {
        let k = SyncedKind::Application;
        let mut live = live_of(&desired());
        let StatusReport::RecordOnly(first) = status_report(k, &live, None) else {
            panic!("a fresh object without status is recorded, not sent");
        };
        assert_eq!(
            status_report(k, &live, Some(&first)),
            StatusReport::Unchanged
        );
        live.status = Some(json!({"sync": {"status": "Synced"}}));
        let StatusReport::Send(second) = status_report(k, &live, Some(&first)) else {
            panic!("status change is sent");
        };
        live.operation = Some(json!({"sync": {}}));
        assert!(matches!(
            status_report(k, &live, Some(&second)),
            StatusReport::Send(_)
        ));
        // After a restart nothing was reported yet: an existing status is sent once.
        assert!(matches!(
            status_report(k, &live, None),
            StatusReport::Send(_)
        ));
        assert_eq!(
            status_report(SyncedKind::AppProject, &live, None),
            StatusReport::Unchanged
        );
    }

    #[test]
    fn deletion_is_confirmed_when_expected_recreated_when_not() {
        let cached = CachedCopy::new(&desired());
        let gone = live_of(&cached.desired());
        assert_eq!(
            on_deleted(&gone, true, Some(&cached)),
            DeletedAction::Confirm
        );
        assert_eq!(
            on_deleted(&gone, false, Some(&cached)),
            DeletedAction::Recreate(Box::new(cached.desired()))
        );
        assert_eq!(on_deleted(&gone, false, None), DeletedAction::Ignore);
        let mut foreign = gone.clone();
        foreign.metadata.annotations = Some(BTreeMap::new());
        assert_eq!(
            on_deleted(&foreign, true, Some(&cached)),
            DeletedAction::Ignore,
            "a local object the hub never created is not confirmed"
        );
    }
}
