//! Upstream's skip-sync label: an object labelled `argocd-agent.argoproj-labs.io/ignore-sync:
//! "true"` is not synced between the hub and agents, in either direction.
//!
//! Owns the label, the rule (the value must be exactly `"true"`, as upstream's
//! `config.SkipSyncLabel` checks) and the two ways to apply it: [`is_skip_sync`] for an object at
//! hand, and [`without_skip_sync`], the label selector a watch uses so such objects never enter its
//! store. A watch narrowed that way sees an object that gains the label as deleted, which is
//! upstream's behaviour too: the other side then deletes its copy.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The label that keeps an object from being synced (upstream's `config.SkipSyncLabel`).
pub const SKIP_SYNC_LABEL: &str = "argocd-agent.argoproj-labs.io/ignore-sync";

/// The label selector requirement admitting every object not labelled skip-sync.
pub const NOT_SKIP_SYNC: &str = "argocd-agent.argoproj-labs.io/ignore-sync!=true";

/// Whether labels `labels` mark their object as not synced.
pub fn labels_skip_sync(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels
        .and_then(|l| l.get(SKIP_SYNC_LABEL))
        .map(String::as_str)
        == Some("true")
}

/// Whether the object with metadata `meta` is not synced.
pub fn is_skip_sync(meta: &ObjectMeta) -> bool {
    labels_skip_sync(meta.labels.as_ref())
}

/// The label selector of a watch of synced objects: `selector` (if any) and not skip-sync, both
/// required (Kubernetes ANDs comma-separated requirements), as upstream's `config.LabelSelector`.
///
/// While the apiserver's watch cache of the kind initialises (kube-apiserver builds a custom
/// resource's cache on the first request after it starts or the CRD changes), a list with a label
/// selector is refused with 429 and `Retry-After: 1` (KEP-4568, on by default since 1.31; only an
/// unselected paged list is sent to etcd instead). kube's client retries it silently, so such a
/// watch's first list can come a second or more late.
pub fn without_skip_sync(selector: Option<&str>) -> String {
    match selector.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => format!("{NOT_SKIP_SYNC},{s}"),
        None => NOT_SKIP_SYNC.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(value: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            labels: value.map(|v| BTreeMap::from([(SKIP_SYNC_LABEL.to_string(), v.to_string())])),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn only_the_exact_value_true_skips_as_upstream() {
        assert!(is_skip_sync(&meta(Some("true"))));
        for other in ["True", "TRUE", "false", "", "yes"] {
            assert!(!is_skip_sync(&meta(Some(other))), "{other:?}");
        }
        assert!(!is_skip_sync(&meta(None)));
    }

    #[test]
    fn the_watch_selector_ands_the_users_selector() {
        assert_eq!(without_skip_sync(None), NOT_SKIP_SYNC);
        assert_eq!(without_skip_sync(Some(" ")), NOT_SKIP_SYNC);
        assert_eq!(
            without_skip_sync(Some("team=a")),
            format!("{NOT_SKIP_SYNC},team=a")
        );
    }
}
