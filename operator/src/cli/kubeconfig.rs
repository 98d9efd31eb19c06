//! Building a Kubernetes client from `--kubeconfig`/`--context` flags.
//!
//! Owns: the lookup order (explicit file, else `$KUBECONFIG`/`~/.kube/config` with the given
//! context, else in-cluster) and turning unreadable or invalid kubeconfigs into usage errors
//! that name the flag and file.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::CliError;

/// A client for the cluster selected by `kubeconfig` and `context`.
pub async fn client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Client, CliError> {
    client_for("--kubeconfig", "--context", kubeconfig, context).await
}

/// Like [`client`], naming other flags in errors (e.g. `--agent-kubeconfig`).
pub async fn client_for(
    kubeconfig_flag: &str,
    context_flag: &str,
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<kube::Client, CliError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let config = match (kubeconfig, context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path).map_err(|e| {
                CliError::usage(format!("{kubeconfig_flag} {}: {e}", path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| {
                    CliError::usage(format!(
                        "{kubeconfig_flag} {} {context_flag} {}: {e}",
                        path.display(),
                        context.unwrap_or("(current)")
                    ))
                })?
        }
        (None, Some(ctx)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| CliError::usage(format!("{context_flag} {ctx}: {e}")))?,
        (None, None) => kube::Config::infer().await.map_err(|e| {
            CliError::usage(format!(
                "no Kubernetes configuration found ({e}); pass {kubeconfig_flag} or set KUBECONFIG"
            ))
        })?,
    };
    kube::Client::try_from(config)
        .map_err(|e| CliError::runtime(format!("creating Kubernetes client: {e}")))
}
