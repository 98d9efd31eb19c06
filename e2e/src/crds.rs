//! Installs the real Argo CD and OCM CustomResourceDefinitions (copied under `e2e/crds/`) into a
//! control plane and waits until every one is Established.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;

use crate::binaries::workspace_root;
use crate::wait::wait_until;

/// Directory holding the CRD YAML files.
pub fn crd_dir() -> PathBuf {
    workspace_root().join("e2e/crds")
}

/// Reads one CRD file, adapted to the 1.20 apiserver: it reads `default: ""` on string fields as
/// null ("default: Invalid value: null"), so such defaults are dropped, and a list keyed by a field that
/// thereby lost its default becomes an atomic list (1.20 requires list-map keys to be defaulted or
/// required). Newer apiservers take the files unchanged.
pub fn load_crd(path: &std::path::Path) -> anyhow::Result<DynamicObject> {
    let text = std::fs::read_to_string(path)?;
    let mut value: serde_json::Value =
        serde_yaml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    adapt_schema_for_1_20(&mut value);
    Ok(serde_json::from_value(value)?)
}

fn adapt_schema_for_1_20(node: &mut serde_json::Value) {
    match node {
        serde_json::Value::Object(map) => {
            if map.get("default").is_some_and(|d| d.as_str() == Some("")) {
                map.remove("default");
            }
            for child in map.values_mut() {
                adapt_schema_for_1_20(child);
            }
            let keys_without_default = map
                .get("x-kubernetes-list-map-keys")
                .and_then(|k| k.as_array())
                .is_some_and(|keys| {
                    let item = map.get("items");
                    let required = item
                        .and_then(|i| i.get("required"))
                        .and_then(|r| r.as_array());
                    keys.iter().any(|k| {
                        let prop = item
                            .and_then(|i| i.get("properties"))
                            .and_then(|p| k.as_str().and_then(|k| p.get(k)));
                        let defaulted = prop.is_some_and(|p| p.get("default").is_some());
                        let is_required = required.is_some_and(|r| r.contains(k));
                        !defaulted && !is_required
                    })
                });
            if keys_without_default {
                map.remove("x-kubernetes-list-map-keys");
                map.remove("x-kubernetes-list-type");
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(adapt_schema_for_1_20),
        _ => {}
    }
}

/// Creates every CRD from [`crd_dir`] (tolerating ones that exist) and waits for all to be Established.
pub async fn install_all(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let raw: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<CustomResourceDefinition>(&()),
    );
    let mut names = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(crd_dir())?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    for file in files {
        let crd = load_crd(&file)?;
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
