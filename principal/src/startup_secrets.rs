//! The Secrets the principal reads its TLS material and JWT key from, at start-up, in order:
//! with the embedded operator on, those of them it knows that are missing are created first
//! (create-only: [`argocd_agent_operator::gitops::bootstrap`]); then the principal waits, alive
//! but not ready, until every one is there and usable, saying which one is missing and the
//! `argocd-agentctl` command that creates it (in its log once per distinct problem, and as the
//! `/readyz` reason), and goes on by itself once they exist. A fresh install therefore neither
//! sits in ContainerCreating on a Secret volume nor crash-loops without saying why.

use std::collections::BTreeSet;
use std::time::Duration;

use argocd_agent_kube::secret_files::{self, KeptSecretFiles};
use argocd_agent_runtime::telemetry::HealthState;
use tracing::{info, warn};

use crate::config::PrincipalConfig;

/// Creates the missing Secrets the operator knows (when it runs), then writes every Secret-backed
/// file, waiting while a Secret is missing or unusable and re-reading it every `interval`
/// afterwards. `None` when nothing comes from a Secret.
pub async fn keep_secret_files(
    client: &kube::Client,
    config: &PrincipalConfig,
    health: &HealthState,
    interval: Duration,
) -> anyhow::Result<Option<KeptSecretFiles>> {
    if config.secret_files.is_empty() {
        return Ok(None);
    }
    if config.enable_operator {
        let wanted: BTreeSet<&str> = config
            .secret_files
            .iter()
            .map(|f| f.secret.as_str())
            .collect();
        let opts = argocd_agent_operator::gitops::OperatorOptions::with_settings(
            &config.namespace,
            &config.operator,
        );
        match argocd_agent_operator::gitops::bootstrap::bootstrap_principal_secrets(
            client, &opts, &wanted,
        )
        .await
        {
            Ok(created) if created.is_empty() => {}
            Ok(created) => info!(
                namespace = %config.namespace,
                secrets = ?created,
                "the embedded operator created the principal's missing Secrets"
            ),
            Err(e) => {
                warn!(error = %e, "the embedded operator could not create the principal's missing Secrets")
            }
        }
    }
    let mut last: Option<String> = None;
    let kept = secret_files::keep_when_available(
        client.clone(),
        &config.namespace,
        &config.secret_dir,
        config.secret_files.clone(),
        interval,
        |problem| {
            let problem = problem.to_string();
            health.set_ready(false, format!("waiting for a Secret: {problem}"));
            if last.as_deref() != Some(problem.as_str()) {
                warn!(error = %problem, "waiting for a Secret the principal reads; not ready until it is there");
                last = Some(problem);
            }
        },
    )
    .await?;
    if last.is_some() {
        info!("every Secret the principal reads is there; starting");
    }
    Ok(kept)
}
