//! `/version` through the resource proxy (what `kubectl version` and argocd-server's cluster
//! version read ask): the agent's answer when it is a cluster version (ours reads the spoke
//! apiserver's `/version`), else the stand-in upstream v0.9.0's principal answers for every agent
//! (`proxyVersion`, principal/server.go). Upstream's Go agents know no `/version` request: they
//! answer it with the API group list, in which clients find an empty version ("could not parse
//! \"\" as version") and argocd-server cannot validate an Application for that cluster.

use http::{Response, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::apimachinery::pkg::version::Info;

use super::{full, ProxyBody};

/// The stand-in's `gitVersion`, upstream's.
pub const STAND_IN_GIT_VERSION: &str = "1.28.5+argocd-agent";

/// Whether `body` is a cluster version (a `version.Info` with a `gitVersion`).
fn is_cluster_version(body: &[u8]) -> bool {
    serde_json::from_slice::<Info>(body).is_ok_and(|info| !info.git_version.is_empty())
}

/// Upstream's stand-in version, with the field names of `version.Info` (upstream's are Go's
/// untagged field names, which Go clients read case-insensitively and others do not).
fn stand_in() -> Vec<u8> {
    serde_json::to_vec(&Info {
        major: "1".into(),
        minor: "28".into(),
        git_version: STAND_IN_GIT_VERSION.into(),
        git_commit: "841856557ef0f6a399096c42635d114d6f2cf7f4".into(),
        git_tree_state: "clean".into(),
        build_date: "n/a".into(),
        go_version: "n/a".into(),
        compiler: "n/a".into(),
        platform: format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        ..Info::default()
    })
    .expect("a version serializes")
}

/// The answer to `/version` given the agent's: passed on when it is a refusal or a cluster
/// version, else upstream's stand-in (see the module docs).
pub async fn answer(agent: &str, from_agent: Response<ProxyBody>) -> Response<ProxyBody> {
    if !from_agent.status().is_success() {
        return from_agent;
    }
    let (parts, body) = from_agent.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return super::status_response(
                StatusCode::BAD_GATEWAY,
                "ServiceUnavailable",
                format!("agent {agent}'s answer to /version broke off: {e}"),
            )
        }
    };
    if is_cluster_version(&body) {
        return Response::from_parts(parts, full(body.to_vec()));
    }
    tracing::debug!(
        agent,
        "the agent answered /version with no cluster version (an upstream agent); answering upstream's stand-in"
    );
    Response::from_parts(parts, full(stand_in()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_version_is_told_from_an_api_group_list() {
        let apiserver = br#"{"major":"1","minor":"36","emulationMajor":"1","emulationMinor":"36",
            "minCompatibilityMajor":"1","minCompatibilityMinor":"35","gitVersion":"v1.36.0",
            "gitCommit":"abc","gitTreeState":"clean","buildDate":"2026-01-01T00:00:00Z",
            "goVersion":"go1.25","compiler":"gc","platform":"linux/amd64"}"#;
        assert!(is_cluster_version(apiserver));
        let go_agent = br#"{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"apps",
            "versions":[{"groupVersion":"apps/v1","version":"v1"}],
            "preferredVersion":{"groupVersion":"apps/v1","version":"v1"}}]}"#;
        assert!(!is_cluster_version(go_agent));
        assert!(!is_cluster_version(b"not json"));
    }

    #[test]
    fn the_stand_in_is_upstreams_version_in_kubernetes_field_names() {
        let info: serde_json::Value = serde_json::from_slice(&stand_in()).unwrap();
        assert_eq!(info["gitVersion"], STAND_IN_GIT_VERSION);
        assert_eq!(
            (&info["major"], &info["minor"]),
            (&"1".into(), &"28".into())
        );
        assert!(is_cluster_version(&stand_in()));
    }
}
