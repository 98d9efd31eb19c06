//! The hub's GPG keys ConfigMap: Argo CD's `argocd-gpg-keys-cm` in the principal namespace, which
//! the principal sends to every managed agent (upstream's `GPGKeyEvent`, target `gpgkey`, the
//! ConfigMap as payload) so their Argo CD verifies commit signatures with the hub's keys.
//!
//! Owns which ConfigMap that is (the watch's field selector), whether it is synced at all
//! ([`synced`]: not when labelled skip-sync) and the payload sent for it
//! ([`payload`]). Routing to agents is [`super::managed`]'s.

use std::collections::BTreeMap;

use argocd_agent_proto::event::GPG_KEYS_CONFIGMAP;
use k8s_openapi::api::core::v1::ConfigMap;

/// The field selector of the watch: the one ConfigMap named [`GPG_KEYS_CONFIGMAP`].
pub fn field_selector() -> String {
    format!("metadata.name={GPG_KEYS_CONFIGMAP}")
}

/// Whether the hub's GPG keys ConfigMap with `labels` is sent to agents: not when labelled
/// skip-sync (upstream's `hasSkipSyncLabel`; the hub view's watch leaves such a ConfigMap out
/// too). One that is not counts as absent (agents delete their copy).
pub fn synced(labels: &BTreeMap<String, String>) -> bool {
    !argocd_agent_kube::skip_sync::labels_skip_sync(Some(labels))
}

/// The ConfigMap `cm` if it is synced ([`synced`]).
pub fn if_synced(cm: Option<&ConfigMap>) -> Option<&ConfigMap> {
    cm.filter(|cm| synced(cm.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())))
}

/// What is sent for hub ConfigMap `cm`: the object without `managedFields` and kubectl's
/// last-applied annotation (bulky, and nothing an agent keeps).
pub fn payload(cm: &ConfigMap) -> ConfigMap {
    crate::routing::without_bookkeeping(cm)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn configmap(v: serde_json::Value) -> ConfigMap {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_configmap_labelled_skip_sync_counts_as_absent() {
        let plain = configmap(json!({"metadata": {"name": GPG_KEYS_CONFIGMAP}}));
        assert!(if_synced(Some(&plain)).is_some());
        let skipped = configmap(json!({"metadata": {"name": GPG_KEYS_CONFIGMAP,
            "labels": {argocd_agent_kube::skip_sync::SKIP_SYNC_LABEL: "true"}}}));
        assert!(if_synced(Some(&skipped)).is_none());
        let not_true = configmap(json!({"metadata": {"name": GPG_KEYS_CONFIGMAP,
            "labels": {argocd_agent_kube::skip_sync::SKIP_SYNC_LABEL: "false"}}}));
        assert!(if_synced(Some(&not_true)).is_some());
        assert!(if_synced(None).is_none());
        assert_eq!(
            field_selector(),
            format!("metadata.name={GPG_KEYS_CONFIGMAP}")
        );
    }

    #[test]
    fn the_payload_keeps_the_keys_and_drops_bookkeeping() {
        let cm = configmap(json!({"metadata": {"name": GPG_KEYS_CONFIGMAP, "uid": "u",
            "managedFields": [{"manager": "kubectl"}],
            "annotations": {crate::routing::LAST_APPLIED_ANNOTATION: "{}", "team": "a"}},
            "data": {"4AEE18F83AFDEB23": "-----BEGIN PGP PUBLIC KEY BLOCK-----"}}));
        let payload = payload(&cm);
        assert_eq!(payload.data, cm.data);
        assert_eq!(payload.metadata.uid.as_deref(), Some("u"));
        assert!(payload.metadata.managed_fields.is_none());
        assert_eq!(
            payload.metadata.annotations,
            Some([("team".to_string(), "a".to_string())].into())
        );
    }
}
