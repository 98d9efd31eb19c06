//! What a managed agent does when it observes a change of a spoke object: the pure decisions
//! behind drift revert, unauthorised-delete recreation, deletion confirmation and status
//! reporting. The watcher in [`crate::managed`] feeds observations in and carries the decisions
//! out; nothing here talks to Kubernetes or the principal.

use serde_json::Value;

use crate::spoke_copy::{is_terminating, managed_view, reported_view, source_uid, SyncedKind};

/// The last hub copy received for one object, and what the apiserver stored when the agent last
/// wrote it (the apiserver may prune or normalise fields, so drift is judged against what was
/// stored, not against what was sent: otherwise a pruned field would be "reverted" forever).
#[derive(Debug, Clone, PartialEq)]
pub struct CachedCopy {
    /// The spoke copy built from the last hub object received.
    pub desired: Value,
    /// [`managed_view`] of the object as stored after the agent's last write of `desired`.
    pub applied: Option<Value>,
}

impl CachedCopy {
    /// A copy not yet written.
    pub fn new(desired: Value) -> Self {
        CachedCopy {
            desired,
            applied: None,
        }
    }

    /// What the live object should look like in its managed view.
    pub fn baseline(&self) -> Value {
        self.applied
            .clone()
            .unwrap_or_else(|| managed_view(&self.desired))
    }
}

/// Whether a live object that was added or modified must be reverted to the hub copy.
pub fn needs_revert(live: &Value, cached: Option<&CachedCopy>) -> bool {
    let Some(cached) = cached else {
        return false;
    };
    // On its way out: a local delete is handled once the object is gone. (A removed source-uid
    // annotation is drift like any other: the hub copy exists, so the object is the hub's.)
    if is_terminating(live) {
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
    RecordOnly(Value),
    /// Send a `status-update` and remember this view.
    Send(Value),
}

/// Compares the status and operation of a live object with what was last reported.
pub fn status_report(kind: SyncedKind, live: &Value, last: Option<&Value>) -> StatusReport {
    if kind != SyncedKind::Application || source_uid(live).is_none() {
        return StatusReport::Unchanged;
    }
    let view = reported_view(live);
    match last {
        Some(last) if *last == view => StatusReport::Unchanged,
        None if view["status"].is_null() && view["operation"].is_null() => {
            StatusReport::RecordOnly(view)
        }
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
    Recreate(Value),
}

/// Decides about an object that disappeared from the spoke. `expected` means the hub asked for
/// the deletion; `cached` is the hub copy of an object of that name, if one is known.
pub fn on_deleted(gone: &Value, expected: bool, cached: Option<&CachedCopy>) -> DeletedAction {
    if expected {
        return match source_uid(gone) {
            Some(_) => DeletedAction::Confirm,
            None => DeletedAction::Ignore,
        };
    }
    match cached {
        Some(c) => DeletedAction::Recreate(c.desired.clone()),
        None => DeletedAction::Ignore,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spoke_copy::spoke_copy;
    use serde_json::json;

    fn desired() -> Value {
        spoke_copy(
            SyncedKind::Application,
            &json!({
                "metadata": {"name": "app", "uid": "hub-1", "labels": {"a": "1"}},
                "spec": {"project": "default", "destination": {"namespace": "ns"}}
            }),
            "argocd",
        )
        .unwrap()
    }

    fn live_of(desired: &Value) -> Value {
        let mut live = desired.clone();
        live["metadata"]["uid"] = json!("spoke-1");
        live["metadata"]["resourceVersion"] = json!("5");
        live
    }

    #[test]
    fn local_spec_or_label_edit_is_drift_status_change_is_not() {
        let cached = CachedCopy::new(desired());
        let mut live = live_of(&cached.desired);
        assert!(!needs_revert(&live, Some(&cached)));
        live["status"] = json!({"health": {"status": "Healthy"}});
        assert!(!needs_revert(&live, Some(&cached)));
        live["spec"]["project"] = json!("sneaky");
        assert!(needs_revert(&live, Some(&cached)));
        let mut live = live_of(&cached.desired);
        live["metadata"]["labels"]["a"] = json!("2");
        assert!(needs_revert(&live, Some(&cached)));
    }

    #[test]
    fn no_revert_without_hub_copy_or_while_terminating() {
        let cached = CachedCopy::new(desired());
        let mut live = live_of(&cached.desired);
        live["spec"]["project"] = json!("sneaky");
        assert!(!needs_revert(&live, None));
        let mut terminating = live.clone();
        terminating["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        assert!(!needs_revert(&terminating, Some(&cached)));
        let mut stripped = live_of(&cached.desired);
        stripped["metadata"]["annotations"] = json!({});
        assert!(
            needs_revert(&stripped, Some(&cached)),
            "removing the source-uid of a hub object is drift"
        );
    }

    #[test]
    fn drift_is_judged_against_what_the_apiserver_stored() {
        let mut cached = CachedCopy::new(desired());
        cached.desired["spec"]["unknownField"] = json!(true);
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
        live["status"] = json!({"sync": {"status": "Synced"}});
        let StatusReport::Send(second) = status_report(k, &live, Some(&first)) else {
            panic!("status change is sent");
        };
        live["operation"] = json!({"sync": {}});
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
            DeletedAction::Recreate(cached.desired.clone())
        );
        assert_eq!(on_deleted(&gone, false, None), DeletedAction::Ignore);
        let mut foreign = gone.clone();
        foreign["metadata"]["annotations"] = json!({});
        assert_eq!(
            on_deleted(&foreign, true, Some(&cached)),
            DeletedAction::Ignore,
            "a local object the hub never created is not confirmed"
        );
    }
}
