//! Installs the real CustomResourceDefinitions into a control plane and waits until every one is
//! Established: Argo CD's from the Argo CD module the peers are built from (`manifests/crds/`, so
//! the schema is the one the running Argo CD writes), OCM's and GitOpsCluster's copied under
//! `e2e/crds/`.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;

use crate::binaries::{workspace_root, Peer};
use crate::wait::wait_until;

/// Directory holding the OCM and GitOpsCluster CRD YAML files.
pub fn crd_dir() -> PathBuf {
    workspace_root().join("e2e/crds")
}

/// Every CRD file to install: Argo CD's (`*-crd.yaml` of the built Argo CD module) and ours.
pub fn crd_files() -> anyhow::Result<Vec<PathBuf>> {
    let argocd = Peer::ArgoCd.dir()?.join("manifests/crds");
    let mut files = Vec::new();
    for (dir, suffix) in [(argocd, "-crd.yaml"), (crd_dir(), ".yaml")] {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(suffix))
            {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Reads one CRD file.
pub fn load_crd(path: &std::path::Path) -> anyhow::Result<DynamicObject> {
    let text = std::fs::read_to_string(path)?;
    serde_norway::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Creates every CRD of [`crd_files`] (tolerating ones that exist) and waits for all to be
/// Established.
pub async fn install_all(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    install_files(client, &crd_files()?).await
}

/// Creates the CRDs in `files` (tolerating ones that exist) and waits for all to be Established;
/// returns their names.
pub async fn install_files(
    client: &kube::Client,
    files: &[PathBuf],
) -> anyhow::Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let raw: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<CustomResourceDefinition>(&()),
    );
    let mut names = Vec::new();
    for file in files {
        let crd = load_crd(file)?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        match raw.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => anyhow::bail!("creating CRD {name} from {}: {e}", file.display()),
        }
        names.push(name);
    }
    for name in &names {
        wait_until(
            &format!("CRD {name} Established"),
            Duration::from_secs(60),
            || async {
                let crd = api.get(name).await?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok::<_, kube::Error>(established.then_some(()))
            },
        )
        .await?;
    }
    Ok(names)
}
