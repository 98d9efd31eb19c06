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
    let mut out = cm.clone();
    out.metadata.managed_fields = None;
    if let Some(annotations) = out.metadata.annotations.as_mut() {
        annotations.remove(crate::routing::LAST_APPLIED);
    }
    out
}
