//! The principal's own Secrets on a fresh install: before the principal first reads its TLS
//! material and JWT key, the embedded operator creates those of them that are missing (the CA,
//! the principal's and the resource proxy's server certificates, the JWT signing key), with the
//! same functions its reconciliation keeps them with ([`ensure_ca`], [`ensure_server_cert`],
//! [`ensure_jwt_secret`]).
//!
//! Owns the create-only rule: a Secret that exists, whoever wrote it, is never replaced here (a
//! user's certificate with other names, or from another CA, stays as it is). Only the names the
//! principal reads are considered, so a principal pointed at Secrets of its own choosing (e.g.
//! cert-manager's) gets nothing it did not ask for.

use std::collections::BTreeSet;

use super::certs::{ensure_ca, ensure_server_cert, principal_sans, resource_proxy_sans};
use super::controller::ensure_jwt_secret;
use super::{OperatorError, OperatorOptions};
use crate::pki::secrets::{
    SecretStore, CA_SECRET, JWT_SECRET, PRINCIPAL_TLS_SECRET, RESOURCE_PROXY_TLS_SECRET,
};

/// Creates those of the principal's Secrets in `wanted` (the names it reads) that do not exist
/// in `opts.namespace`; returns the names created. A CA Secret that is there but unusable (no
/// key, expired) is not replaced: the certificates it would sign are then not created either, and
/// the error says why.
pub async fn bootstrap_principal_secrets(
    client: &kube::Client,
    opts: &OperatorOptions,
    wanted: &BTreeSet<&str>,
) -> Result<Vec<&'static str>, OperatorError> {
    let store = SecretStore::new(client.clone(), &opts.namespace);
    let mut missing = Vec::new();
    for name in [
        CA_SECRET,
        PRINCIPAL_TLS_SECRET,
        RESOURCE_PROXY_TLS_SECRET,
        JWT_SECRET,
    ] {
        if wanted.contains(name) && store.get(name).await?.is_none() {
            missing.push(name);
        }
    }
    let mut created = Vec::new();
    if missing.contains(&JWT_SECRET) {
        match ensure_jwt_secret(&store).await {
            Ok(()) => created.push(JWT_SECRET),
            Err(e) => {
                // Another replica created it meanwhile: that key is the one.
                if store.get(JWT_SECRET).await?.is_none() {
                    return Err(OperatorError::Bootstrap(format!("{JWT_SECRET}: {e}")));
                }
            }
        }
    }
    let certs: Vec<(&'static str, Vec<String>)> = [
        (PRINCIPAL_TLS_SECRET, principal_sans(opts, &[])),
        (RESOURCE_PROXY_TLS_SECRET, resource_proxy_sans(opts)),
    ]
    .into_iter()
    .filter(|(name, _)| missing.contains(name))
    .collect();
    if missing.contains(&CA_SECRET) || !certs.is_empty() {
        // Creates the CA only when there is none (else loads it).
        let (ca, ca_created) = ensure_ca(&store, &opts.certs)
            .await
            .map_err(|e| OperatorError::Bootstrap(e.to_string()))?;
        if ca_created {
            created.push(CA_SECRET);
        }
        for (name, sans) in certs {
            // Absent a moment ago, so this issues it; a Secret created meanwhile by someone
            // else would be kept only if it already fits (ensure_server_cert's rule).
            ensure_server_cert(&store, &ca, &opts.certs, name, &sans).await?;
            created.push(name);
        }
    }
    Ok(created)
}
