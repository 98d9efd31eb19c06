//! What a managed agent does when it observes a change of a spoke object: the pure decisions
//! behind drift revert, unauthorised-delete recreation, deletion confirmation and status
//! reporting. The watcher in [`crate::managed`] feeds observations in and carries the decisions
//! out; nothing here talks to Kubernetes or the principal.

use argocd_agent_kube::argocd::ObjectMetaExt;

use crate::spoke_copy::{
    managed_view, reported_view, ManagedView, ReportedView, SpokeObject, SyncedKind,
};

/// The last hub copy received for one object, and what the apiserver stored when the agent last
/// wrote it (the apiserver may prune or normalise fields, so drift is judged against what was
/// stored, not against what was sent: otherwise a pruned field would be "reverted" forever).
#[derive(Debug, Clone, PartialEq)]
pub struct CachedCopy {
    /// The spoke copy built from the last hub object received.
    pub desired: SpokeObject,
    /// [`managed_view`] of the object as stored after the agent's last write of `desired`.
    pub applied: Option<ManagedView>,
}

impl CachedCopy {
    /// A copy not yet written.
    pub fn new(desired: SpokeObject) -> Self {
        CachedCopy {
            desired,
            applied: None,
        }
    }

    /// What the live object should look like in its managed view.
    pub fn baseline(&self) -> ManagedView {
        self.applied
            .clone()
            .unwrap_or_else(|| managed_view(&self.desired))
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
        None if view.status.is_none() && view.operation.is_none() => StatusReport::RecordOnly(view),
        _ => StatusReport::Send(view),
    }
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
        Some(c) => DeletedAction::Recreate(Box::new(c.desired.clone())),
        None => DeletedAction::Ignore,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::spoke_copy::spoke_copy;
    use serde_json::json;

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
        let cached = CachedCopy::new(desired());
        let mut live = live_of(&cached.desired);
        assert!(!needs_revert(&live, Some(&cached)));
        live.status = Some(json!({"health": {"status": "Healthy"}}));
        assert!(!needs_revert(&live, Some(&cached)));
        live.spec = Some(json!({"project": "sneaky"}));
        assert!(needs_revert(&live, Some(&cached)));
        let mut live = live_of(&cached.desired);
        live.metadata.labels = Some(BTreeMap::from([("a".into(), "2".into())]));
        assert!(needs_revert(&live, Some(&cached)));
    }

    #[test]
    fn no_revert_without_hub_copy_or_while_terminating() {
        let cached = CachedCopy::new(desired());
        let mut live = live_of(&cached.desired);
        live.spec = Some(json!({"project": "sneaky"}));
        assert!(!needs_revert(&live, None));
        let mut terminating = live.clone();
        terminating.metadata.deletion_timestamp =
            serde_json::from_value(json!("2024-01-01T00:00:00Z")).unwrap();
        assert!(!needs_revert(&terminating, Some(&cached)));
        let mut stripped = live_of(&cached.desired);
        stripped.metadata.annotations = Some(BTreeMap::new());
        assert!(
            needs_revert(&stripped, Some(&cached)),
            "removing the source-uid of a hub object is drift"
        );
    }

    #[test]
    fn drift_is_judged_against_what_the_apiserver_stored() {
        let mut cached = CachedCopy::new(desired());
        cached.desired.spec = Some(json!({"project": "default", "unknownField": true,
                                          "destination": {"name": "in-cluster", "namespace": "ns"}}));
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
        let cached = CachedCopy::new(desired());
        let gone = live_of(&cached.desired);
        assert_eq!(
            on_deleted(&gone, true, Some(&cached)),
            DeletedAction::Confirm
        );
        assert_eq!(
            on_deleted(&gone, false, Some(&cached)),
            DeletedAction::Recreate(Box::new(cached.desired.clone()))
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
