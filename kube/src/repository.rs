//! Argo CD's repository and repository-credential Secrets, typed.
//!
//! Owns which `v1` Secrets are Argo CD repositories ([`REPOSITORY_SELECTOR`]: label
//! `argocd.argoproj.io/secret-type` = `repository` or `repo-creds`) and the fields of Argo CD's
//! repository this project reads from their `data` ([`RepositoryExt::repository`]: the AppProject
//! it belongs to, its URL). The Secret itself is `k8s_openapi`'s [`Secret`], so every field is kept
//! as read and a Secret sent on is the one the apiserver gave (its `data` base64 on the wire,
//! as Kubernetes writes it).

use k8s_openapi::api::core::v1::Secret;

/// The label that makes a Secret an Argo CD repository (or repository credential).
pub const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";

/// The Secrets synced between hub and managed agents: Argo CD repositories and repository
/// credentials.
pub const REPOSITORY_SELECTOR: &str = "argocd.argoproj.io/secret-type in (repository,repo-creds)";

/// The Argo CD repository fields of a repository Secret's `data` that this project reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Repository<'a> {
    /// `data.project`: the AppProject the repository is scoped to (`None` when absent, empty or
    /// not UTF-8: such a Secret belongs to no AppProject).
    pub project: Option<&'a str>,
    /// `data.url`: the repository URL (or URL prefix, for `repo-creds`).
    pub url: Option<&'a str>,
}

/// Reads the Argo CD repository fields of a Secret.
pub trait RepositoryExt {
    /// The repository fields of the Secret's `data`.
    fn repository(&self) -> Repository<'_>;
}

impl RepositoryExt for Secret {
    fn repository(&self) -> Repository<'_> {
        let text = |key: &str| {
            self.data
                .as_ref()?
                .get(key)
                .and_then(|v| std::str::from_utf8(&v.0).ok())
                .filter(|s| !s.is_empty())
        };
        Repository {
            project: text("project"),
            url: text("url"),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn secret(v: serde_json::Value) -> Secret {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_project_and_url_are_read_from_the_base64_data() {
        let s = secret(json!({"metadata": {"name": "repo"},
                              "data": {"project": "dGVhbS1h", "url": "aHR0cHM6Ly9naXQ="}}));
        assert_eq!(
            s.repository(),
            Repository {
                project: Some("team-a"),
                url: Some("https://git"),
            }
        );
    }

    #[test]
    fn an_absent_empty_or_non_utf8_project_is_none() {
        for data in [
            json!({}),
            json!({"project": ""}),
            json!({"project": "/w=="}),
        ] {
            let s = secret(json!({"metadata": {"name": "repo"}, "data": data}));
            assert_eq!(s.repository().project, None, "{data}");
        }
        assert_eq!(secret(json!({})).repository(), Repository::default());
    }

    #[test]
    fn a_secret_round_trips_without_losing_fields() {
        let v = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": false,
                       "metadata": {"name": "repo", "labels": {SECRET_TYPE_LABEL: "repository"}},
                       "data": {"project": "dGVhbS1h"}});
        assert_eq!(serde_json::to_value(secret(v.clone())).unwrap(), v);
    }
}
