//! The real `helm` CLI (built from its Go module by `hack/peers.sh`, [`Peer::Helm`]) as a test
//! drives it: `lint --strict`, `template`, `install`, `upgrade` and `uninstall` of a chart directory
//! with values given as YAML text, against the plane behind a kubeconfig. Helm's caches and
//! configuration live in a private directory, so no user or machine setting takes part.
//!
//! It does not interpret what Helm renders: callers parse the manifest or read what `install`
//! created from the apiserver. Around an install it owns the two steps tests share: the Secrets a
//! chart expects to exist ([`create_secret`]) and finding the Deployment it created
//! ([`installed_deployment`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, ListParams, PostParams};

use crate::binaries::Peer;
use crate::gateway::Pki;

/// A `helm` command that exited non-zero: the command line and what Helm said.
#[derive(Debug)]
pub struct HelmFailed {
    /// `helm <args>` as run.
    pub command: String,
    /// Helm's stderr (its error message names the failing key or template).
    pub stderr: String,
}

impl std::fmt::Display for HelmFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` failed:\n{}", self.command, self.stderr)
    }
}

impl std::error::Error for HelmFailed {}

/// One release of one chart: what `helm install`/`template` is asked to make.
#[derive(Clone, Debug)]
pub struct Release {
    /// The release name.
    pub name: String,
    /// The release namespace (`--namespace`).
    pub namespace: String,
    /// The chart directory.
    pub chart: PathBuf,
    /// Values as YAML text (one `--values` file; "" = the chart's defaults).
    pub values: String,
}

impl Release {
    /// Release `name` of `chart` in `namespace` with `values` (YAML).
    pub fn new(name: &str, namespace: &str, chart: impl Into<PathBuf>, values: &str) -> Release {
        Release {
            name: name.to_string(),
            namespace: namespace.to_string(),
            chart: chart.into(),
            values: values.to_string(),
        }
    }
}

/// The `helm` binary with a private home, optionally bound to one cluster.
pub struct Helm {
    binary: PathBuf,
    home: PathBuf,
    kubeconfig: Option<PathBuf>,
}

impl Helm {
    /// Helm with its caches under `dir`, talking to the cluster of `kubeconfig` (None: commands
    /// that need no cluster only, such as `lint` and `template`).
    pub fn new(dir: &Path, kubeconfig: Option<&Path>) -> anyhow::Result<Helm> {
        let binary = Peer::Helm.binary("helm")?;
        let home = dir.join("helm-home");
        std::fs::create_dir_all(&home)?;
        Ok(Helm {
            binary,
            home,
            kubeconfig: kubeconfig.map(Path::to_path_buf),
        })
    }

    /// `helm lint --strict` of the release's chart with its values.
    pub fn lint(&self, release: &Release) -> Result<String, HelmFailed> {
        let values = self.values_file(release);
        let chart = release.chart.display().to_string();
        self.run(&[
            "lint",
            "--strict",
            &chart,
            "--namespace",
            &release.namespace,
            "--values",
            &values,
        ])
    }

    /// `helm template --include-crds` for Kubernetes `kube_version` (None: Helm's default): the
    /// manifest, or Helm's refusal (schema validation, a template's `fail`).
    pub fn template(
        &self,
        release: &Release,
        kube_version: Option<&str>,
    ) -> Result<String, HelmFailed> {
        let values = self.values_file(release);
        let chart = release.chart.display().to_string();
        let mut args = vec![
            "template",
            &release.name,
            &chart,
            "--namespace",
            &release.namespace,
            "--values",
            &values,
            "--include-crds",
        ];
        if let Some(v) = kube_version {
            args.extend(["--kube-version", v]);
        }
        self.run(&args)
    }

    /// `helm install` into the cluster (the namespace must exist); Helm's report.
    pub fn install(&self, release: &Release) -> Result<String, HelmFailed> {
        self.apply("install", release)
    }

    /// `helm upgrade` of an installed release with the release's values.
    pub fn upgrade(&self, release: &Release) -> Result<String, HelmFailed> {
        self.apply("upgrade", release)
    }

    /// `helm uninstall` of release `name` in `namespace`.
    pub fn uninstall(&self, name: &str, namespace: &str) -> Result<String, HelmFailed> {
        self.run(&["uninstall", name, "--namespace", namespace])
    }

    fn apply(&self, verb: &str, release: &Release) -> Result<String, HelmFailed> {
        let values = self.values_file(release);
        let chart = release.chart.display().to_string();
        self.run(&[
            verb,
            &release.name,
            &chart,
            "--namespace",
            &release.namespace,
            "--values",
            &values,
        ])
    }

    /// Writes the release's values to a fresh file and returns its path.
    fn values_file(&self, release: &Release) -> String {
        let path = self.home.join(format!(
            "values-{}-{}.yaml",
            release.name,
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&path, &release.values).expect("write a values file");
        path.display().to_string()
    }

    fn run(&self, args: &[&str]) -> Result<String, HelmFailed> {
        let mut cmd = Command::new(&self.binary);
        cmd.args(args)
            .env_remove("KUBECONFIG")
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_DATA_HOME", self.home.join("data"));
        if let Some(k) = &self.kubeconfig {
            cmd.arg("--kubeconfig").arg(k);
        }
        let command = format!("helm {}", args.join(" "));
        let out = cmd.output().map_err(|e| HelmFailed {
            command: command.clone(),
            stderr: format!("cannot run {}: {e}", self.binary.display()),
        })?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(HelmFailed {
                command,
                stderr: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            })
        }
    }
}

/// Creates Secret `name` in `namespace` with `files` (key → file), as a user does before
/// installing a chart (or as `argocd-agentctl pki` writes them).
pub async fn create_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    type_: &str,
    files: &[(&str, PathBuf)],
) -> anyhow::Result<()> {
    let mut data = std::collections::BTreeMap::new();
    for (key, path) in files {
        data.insert(key.to_string(), ByteString(std::fs::read(path)?));
    }
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        type_: Some(type_.into()),
        data: Some(data),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

/// The one Deployment `helm install` created in `namespace`: its name and ServiceAccount.
pub async fn installed_deployment(
    client: &kube::Client,
    namespace: &str,
) -> anyhow::Result<(String, String)> {
    let list = Api::<Deployment>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    anyhow::ensure!(
        list.items.len() == 1,
        "helm created {} Deployments in {namespace}",
        list.items.len()
    );
    let d = &list.items[0];
    let sa = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    Ok((d.metadata.name.clone().unwrap_or_default(), sa))
}

/// The Secrets the principal chart reads by default, in `namespace`, from `pki`: the gRPC and
/// resource proxy certificates, the CA (`kubernetes.io/tls` with its key when `with_ca_key`, as
/// `argocd-agentctl pki init` writes it, so the embedded operator can issue; else the
/// certificate alone) and the JWT signing key.
pub async fn create_principal_secrets(
    client: &kube::Client,
    namespace: &str,
    pki: &Pki,
    with_ca_key: bool,
) -> anyhow::Result<()> {
    let principal_tls = [
        ("tls.crt", pki.dir.join("principal.crt")),
        ("tls.key", pki.dir.join("principal.key")),
    ];
    let ca_only = [("tls.crt", pki.ca())];
    let ca_with_key = [("tls.crt", pki.ca()), ("tls.key", pki.dir.join("ca.key"))];
    let ca = if with_ca_key {
        ("kubernetes.io/tls", &ca_with_key[..])
    } else {
        ("Opaque", &ca_only[..])
    };
    for (name, type_, files) in [
        (
            "argocd-agent-principal-tls",
            "kubernetes.io/tls",
            &principal_tls[..],
        ),
        (
            "argocd-agent-resource-proxy-tls",
            "kubernetes.io/tls",
            &principal_tls[..],
        ),
        ("argocd-agent-ca", ca.0, ca.1),
        (
            "argocd-agent-jwt",
            "Opaque",
            &[("jwt.key", pki.dir.join("jwt.key"))][..],
        ),
    ] {
        create_secret(client, namespace, name, type_, files).await?;
    }
    Ok(())
}
