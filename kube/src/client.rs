//! Building a Kubernetes client from `--kubeconfig` / `--kubecontext` style flags.
//!
//! Owns the lookup order every binary uses: an explicit kubeconfig file (with the given context,
//! else its current one); else, with only a context given, `$KUBECONFIG` or `~/.kube/config` with
//! that context; else the in-cluster configuration, then `$KUBECONFIG`, then `~/.kube/config`.
//! Failures name the flags the caller took the values from ([`ClientFlags`]), so the binary can
//! show them as usage errors.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// How the caller's flags are spelled, for error messages (e.g. `--kubeconfig (env
/// ARGOCD_AGENT_KUBECONFIG)`).
#[derive(Clone, Copy, Debug)]
pub struct ClientFlags<'a> {
    /// The flag giving the kubeconfig file.
    pub kubeconfig: &'a str,
    /// The flag giving the context.
    pub context: &'a str,
}

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The configuration could not be loaded: a usage problem the flags can fix.
    #[error("{0}")]
    Config(String),
    /// A loaded configuration could not be turned into a client (e.g. unusable TLS material).
    #[error("{0}")]
    Build(String),
}

/// A client for the cluster `kubeconfig` and `context` select (see the module doc for the order).
pub async fn client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    flags: ClientFlags<'_>,
) -> Result<kube::Client, ClientError> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let shown_context = context.unwrap_or("(current)");
    let config = match (kubeconfig, context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path).map_err(|e| {
                ClientError::Config(format!("{} {}: {e}", flags.kubeconfig, path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| {
                    ClientError::Config(format!(
                        "{} {} {} {shown_context}: {e}",
                        flags.kubeconfig,
                        path.display(),
                        flags.context
                    ))
                })?
        }
        (None, Some(ctx)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| ClientError::Config(format!("{} {ctx}: {e}", flags.context)))?,
        (None, None) => kube::Config::infer().await.map_err(|e| {
            ClientError::Config(format!(
                "no Kubernetes configuration found ({e}); pass {} or set KUBECONFIG",
                flags.kubeconfig
            ))
        })?,
    };
    kube::Client::try_from(config).map_err(|e| {
        ClientError::Build(format!(
            "{}: cannot build a Kubernetes client: {e}",
            flags.kubeconfig
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: ClientFlags<'static> = ClientFlags {
        kubeconfig: "--kubeconfig (env X_KUBECONFIG)",
        context: "--kubecontext (env X_KUBECONTEXT)",
    };

    fn kubeconfig(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("config");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: a\nclusters:\n\
             - name: a\n  cluster:\n    server: https://127.0.0.1:1\n\
             - name: b\n  cluster:\n    server: https://127.0.0.2:2\n\
             contexts:\n- name: a\n  context:\n    cluster: a\n    user: u\n\
             - name: b\n  context:\n    cluster: b\n    user: u\n\
             users:\n- name: u\n  user:\n    token: t\n",
        )
        .unwrap();
        path
    }

    #[tokio::test]
    async fn an_explicit_file_honours_the_context_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = kubeconfig(dir.path());
        let current = client(Some(&path), None, FLAGS).await.unwrap();
        assert_eq!(current.default_namespace(), "default");
        let Err(err) = client(Some(&path), Some("missing"), FLAGS).await else {
            panic!("an unknown context was accepted");
        };
        assert!(matches!(err, ClientError::Config(_)), "{err}");
        assert!(err.to_string().contains("--kubecontext"), "{err}");
        client(Some(&path), Some("b"), FLAGS).await.unwrap();
    }

    #[tokio::test]
    async fn an_unreadable_file_names_the_flag() {
        let Err(err) = client(Some(Path::new("/nonexistent/kubeconfig")), None, FLAGS).await else {
            panic!("a missing kubeconfig was accepted");
        };
        assert!(
            err.to_string()
                .starts_with("--kubeconfig (env X_KUBECONFIG) /nonexistent"),
            "{err}"
        );
    }
}
