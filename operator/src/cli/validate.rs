//! `argocd-agentctl validate principal|agent`: upstream's configuration check of an installation
//! against its clusters, each check printed as upstream prints it (`* <check>: ✅`, or `❌` and an
//! `ERROR:` line saying what is wrong and what to do), exit 1 when any failed.
//!
//! Owns the checks and where they look: `--principal-context`/`--principal-namespace` select the
//! hub (the principal's PKI Secrets, its namespace, the agents' cluster Secrets),
//! `--agent-context`/`--agent-namespace` the spoke (the agent's CA and client certificate), each
//! defaulting to the entry the global `--principal`/`--agent` select ([`super::contexts`]), both
//! from one kubeconfig (`--kubeconfig`, else `$KUBECONFIG`, which may list several files, or
//! `~/.kube/config`), so one command reaches several clusters. Upstream's checks of an Argo CD
//! operator CR, OpenShift Routes, network policies and deployed components are not made here:
//! this project installs with its own charts.

use std::path::PathBuf;

use chrono::Utc;
use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DynamicObject, ListParams};

use super::{kubeconfig, CliError};
use crate::pki::jwt::inspect_jwt_key;
use crate::pki::secrets::{
    ca_from_secret, secret_text, AGENT_CA_SECRET, AGENT_CLIENT_TLS_SECRET, CA_CERT_KEY, CA_SECRET,
    JWT_KEY_KEY, JWT_SECRET, PRINCIPAL_TLS_SECRET, RESOURCE_PROXY_TLS_SECRET, TLS_CERT_KEY,
};
use crate::pki::{inspect_labelled, CertInfo, CertificateAuthority};
use crate::registration::{
    MANAGED_BY_ANNOTATION, MANAGED_BY_VALUE, SECRET_TYPE_CLUSTER, SECRET_TYPE_LABEL,
    SKIP_RECONCILE_ANNOTATION,
};

/// `validate` subcommands (upstream's alias: `check-config`).
#[derive(Subcommand, Debug)]
pub enum ValidateCommand {
    /// Validate the principal's installation on the hub.
    Principal(PrincipalArgs),
    /// Validate an agent's installation on its cluster, with the principal's checks and the
    /// cross-checks against the hub.
    Agent(AgentArgs),
}

/// The kubeconfig both sides are read from.
#[derive(Args, Debug, Clone)]
pub struct KubeconfigArgs {
    /// Kubeconfig holding the contexts (default: $KUBECONFIG, which may list several files
    /// separated by ':', else ~/.kube/config, else in-cluster).
    #[arg(long, env = "ARGOCD_AGENTCTL_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// Where the principal is installed.
#[derive(Args, Debug, Clone)]
pub struct PrincipalSide {
    /// The Kubernetes context of the principal (default: the selected principal's, else the
    /// current context).
    #[arg(long, env = "ARGOCD_AGENT_PRINCIPAL_CONTEXT", value_name = "NAME")]
    pub principal_context: Option<String>,
    /// The Kubernetes namespace the principal is installed in (default: the selected
    /// principal's, else argocd).
    #[arg(long, env = "ARGOCD_AGENT_PRINCIPAL_NAMESPACE", value_name = "NS")]
    pub principal_namespace: Option<String>,
}

/// Arguments of `validate principal`.
#[derive(Args, Debug)]
pub struct PrincipalArgs {
    #[command(flatten)]
    kube: KubeconfigArgs,
    #[command(flatten)]
    principal: PrincipalSide,
}

/// Arguments of `validate agent`.
#[derive(Args, Debug)]
pub struct AgentArgs {
    #[command(flatten)]
    kube: KubeconfigArgs,
    #[command(flatten)]
    principal: PrincipalSide,
    /// The Kubernetes context of the agent (required unless --agent selects it from the config:
    /// the agent's cluster is not the hub's).
    #[arg(long, env = "ARGOCD_AGENT_AGENT_CONTEXT", value_name = "NAME")]
    agent_context: Option<String>,
    /// The Kubernetes namespace the agent is installed in (default: the selected agent's, else
    /// argocd).
    #[arg(long, env = "ARGOCD_AGENT_AGENT_NAMESPACE", value_name = "NS")]
    agent_namespace: Option<String>,
}

/// One check: what was checked and, if it failed, why and what to do.
#[derive(Debug)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// `Err` says what is wrong and what to do.
    pub result: Result<(), String>,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.result {
            Ok(()) => write!(f, "* {}: ✅", self.name),
            Err(e) => write!(f, "* {}: ❌\nERROR: {e}", self.name),
        }
    }
}

fn check(name: impl Into<String>, result: Result<(), String>) -> Check {
    Check {
        name: name.into(),
        result,
    }
}

/// Run a `validate` subcommand.
pub async fn run(cmd: ValidateCommand) -> Result<(), CliError> {
    let checks = match cmd {
        ValidateCommand::Principal(args) => {
            let hub = Side::open(&args.kube, &args.principal).await?;
            principal_checks(&hub).await
        }
        ValidateCommand::Agent(args) => {
            let hub = Side::open(&args.kube, &args.principal).await?;
            let target = super::contexts::agent(
                args.agent_context.as_deref(),
                args.agent_namespace.as_deref(),
            )?;
            let Some(context) = target.context else {
                return Err(CliError::usage(
                    "the agent's cluster is required: give --agent-context, or --agent NAME from the config",
                ));
            };
            let spoke = Side {
                client: kubeconfig::client_for(
                    "--kubeconfig",
                    "--agent-context",
                    args.kube.kubeconfig.as_deref(),
                    Some(&context),
                )
                .await?,
                namespace: target.namespace,
            };
            let mut checks = principal_checks(&hub).await;
            checks.extend(agent_checks(&spoke, &hub).await);
            checks
        }
    };
    println!("Configuration validation results:");
    for c in &checks {
        println!("{c}");
    }
    if checks.iter().any(|c| c.result.is_err()) {
        return Err(CliError::runtime("one or more checks failed"));
    }
    Ok(())
}

/// One cluster and the namespace a component is installed in.
pub struct Side {
    /// The cluster.
    pub client: kube::Client,
    /// The component's namespace.
    pub namespace: String,
}

impl Side {
    async fn open(kube: &KubeconfigArgs, principal: &PrincipalSide) -> Result<Side, CliError> {
        let target = super::contexts::principal(
            principal.principal_context.as_deref(),
            principal.principal_namespace.as_deref(),
        )?;
        if target.namespace.trim().is_empty() {
            return Err(CliError::usage("--principal-namespace is required"));
        }
        Ok(Side {
            client: kubeconfig::client_for(
                "--kubeconfig",
                "--principal-context",
                kube.kubeconfig.as_deref(),
                target.context.as_deref(),
            )
            .await?,
            namespace: target.namespace,
        })
    }

    async fn secret(&self, name: &str, fix: &str) -> Result<Secret, String> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        match api.get_opt(name).await {
            Ok(Some(s)) => Ok(s),
            Ok(None) => Err(format!(
                "secret {}/{name} does not exist; {fix}",
                self.namespace
            )),
            Err(e) => Err(format!("cannot read secret {}/{name}: {e}", self.namespace)),
        }
    }
}

/// The principal's checks, on the hub.
pub async fn principal_checks(hub: &Side) -> Vec<Check> {
    let ns = &hub.namespace;
    let mut out = Vec::new();
    let ca = principal_ca(hub).await;
    out.push(check(
        format!("Verifying principal public CA certificate exists and is valid ({ns}/{CA_SECRET})"),
        ca.as_ref().map(drop).map_err(Clone::clone),
    ));
    for (what, name, fix) in [
        (
            "principal gRPC TLS",
            PRINCIPAL_TLS_SECRET,
            "argocd-agentctl pki issue principal",
        ),
        (
            "resource proxy TLS",
            RESOURCE_PROXY_TLS_SECRET,
            "argocd-agentctl pki issue resource-proxy",
        ),
    ] {
        let result = match hub.secret(name, &format!("create it with `{fix}`")).await {
            Ok(secret) => issued_cert_valid(&secret, ca.as_ref().ok(), fix),
            Err(e) => Err(e),
        };
        out.push(check(
            format!(
                "Verifying {what} certificate exists, is valid and signed by the CA ({ns}/{name})"
            ),
            result,
        ));
    }
    let jwt = match hub
        .secret(
            JWT_SECRET,
            "create it with `argocd-agentctl jwt create-key`",
        )
        .await
    {
        Ok(secret) => secret_text(&secret, JWT_KEY_KEY)
            .map_err(|e| e.to_string())
            .and_then(|pem| inspect_jwt_key(&pem).map_err(|e| e.to_string()))
            .map(drop)
            .map_err(|e| format!("{e}; replace it with `argocd-agentctl jwt create-key --force`")),
        Err(e) => Err(e),
    };
    out.push(check(
        format!("Verifying JWT signing key exists and is parseable ({ns}/{JWT_SECRET})"),
        jwt,
    ));
    out.push(check(
        format!(
            "Verifying no Application CRs defined within the principal's Argo CD namespace: {ns}"
        ),
        no_applications(hub).await,
    ));
    let clusters = agent_cluster_secrets(hub).await;
    out.push(check(
        "Verifying agent cluster secrets contain correct query parameter on server url",
        clusters
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|secrets| cluster_servers_valid(ns, secrets)),
    ));
    out.push(check(
        "Verifying agent cluster secrets contain the skip-reconcile annotation and that it's set to true",
        clusters
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|secrets| cluster_annotations_valid(ns, secrets)),
    ));
    out
}

/// The agent's checks, on its cluster and against the hub.
pub async fn agent_checks(spoke: &Side, hub: &Side) -> Vec<Check> {
    let ns = &spoke.namespace;
    let mut out = Vec::new();
    let fix_ca = "copy the hub CA to the agent with `argocd-agentctl pki propagate`";
    let agent_ca = match spoke.secret(AGENT_CA_SECRET, fix_ca).await {
        Ok(secret) => secret_text(&secret, CA_CERT_KEY)
            .and_then(|pem| {
                inspect_labelled(&pem, &format!("{ns}/{AGENT_CA_SECRET} {CA_CERT_KEY}"))
            })
            .map(drop)
            .map_err(|e| format!("{e}; {fix_ca}")),
        Err(e) => Err(e),
    };
    out.push(check(
        format!("Verifying agent CA secret exists and contains CA cert ({ns}/{AGENT_CA_SECRET})"),
        agent_ca,
    ));
    let fix_cert = "issue it with `argocd-agentctl pki issue agent <name>`";
    let client_cert = spoke
        .secret(AGENT_CLIENT_TLS_SECRET, fix_cert)
        .await
        .and_then(|secret| {
            let pem = secret_text(&secret, TLS_CERT_KEY).map_err(|e| e.to_string())?;
            let info = inspect_labelled(&pem, &format!("{ns}/{AGENT_CLIENT_TLS_SECRET}"))
                .map_err(|e| e.to_string())?;
            Ok((pem, info))
        });
    out.push(check(
        format!(
            "Verifying agent mTLS certificate exists and is not expired ({ns}/{AGENT_CLIENT_TLS_SECRET})"
        ),
        client_cert
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|(_, info)| in_validity(info, "agent certificate", fix_cert)),
    ));
    let subject = match &client_cert {
        Ok((_, info)) => match info.subject_cn.as_deref().map(str::trim) {
            Some(cn) if !cn.is_empty() => hub_namespace_exists(hub, cn).await,
            _ => Err(format!(
                "agent certificate subject (CN) is empty; {fix_cert}"
            )),
        },
        Err(e) => Err(e.clone()),
    };
    out.push(check(
        "Verifying namespace on principal matches agent certificate subject",
        subject,
    ));
    let signed = match (&client_cert, &principal_ca(hub).await) {
        (Ok((pem, _)), Ok(ca)) => ca.verify_issued(pem).map_err(|e| {
            format!("agent certificate not signed by principal CA: {e}; re-issue it with `argocd-agentctl pki issue agent <name> --force`")
        }),
        (Err(e), _) | (_, Err(e)) => Err(e.clone()),
    };
    out.push(check(
        "Verifying agent mTLS certificate is signed by principal CA certificate",
        signed,
    ));
    out
}

async fn principal_ca(hub: &Side) -> Result<CertificateAuthority, String> {
    let fix = "create it with `argocd-agentctl pki init`";
    let secret = hub.secret(CA_SECRET, fix).await?;
    let ca = ca_from_secret(&secret).map_err(|e| format!("{e}; {fix} --force"))?;
    in_validity(
        &ca.info(),
        "CA certificate",
        "renew it with `argocd-agentctl pki init --force` and re-issue every certificate",
    )?;
    Ok(ca)
}

/// A leaf certificate Secret: parseable, within its validity, issued by `ca` (when readable).
fn issued_cert_valid(
    secret: &Secret,
    ca: Option<&CertificateAuthority>,
    fix: &str,
) -> Result<(), String> {
    let at = format!(
        "{}/{}",
        secret.metadata.namespace.as_deref().unwrap_or_default(),
        secret.metadata.name.as_deref().unwrap_or_default()
    );
    let pem = secret_text(secret, TLS_CERT_KEY)
        .map_err(|e| format!("{e}; re-issue it with `{fix} --force`"))?;
    let info = inspect_labelled(&pem, &at)
        .map_err(|e| format!("{e}; re-issue it with `{fix} --force`"))?;
    in_validity(
        &info,
        &format!("certificate in secret {at}"),
        &format!("re-issue it with `{fix} --force`"),
    )?;
    if let Some(ca) = ca {
        ca.verify_issued(&pem)
            .map_err(|e| format!("{e}; re-issue it with `{fix} --force`"))?;
    }
    Ok(())
}

fn in_validity(info: &CertInfo, what: &str, fix: &str) -> Result<(), String> {
    let now = Utc::now();
    if now < info.not_before {
        return Err(format!(
            "{what} is not yet valid (valid from {}); check the clock, or {fix}",
            super::date(&info.not_before)
        ));
    }
    if now > info.not_after {
        return Err(format!(
            "{what} expired at {}; {fix}",
            super::date(&info.not_after)
        ));
    }
    Ok(())
}

async fn hub_namespace_exists(hub: &Side, name: &str) -> Result<(), String> {
    let api: Api<Namespace> = Api::all(hub.client.clone());
    match api.get_opt(name).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(format!(
            "namespace '{name}' not found on principal cluster; register the agent with `argocd-agentctl agent create {name}` (which creates it) or `kubectl create namespace {name}` on the hub, or issue the agent's certificate for the right name"
        )),
        Err(e) => Err(format!("cannot read namespace {name} on the principal cluster: {e}")),
    }
}

async fn no_applications(hub: &Side) -> Result<(), String> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        hub.client.clone(),
        &hub.namespace,
        &argocd_agent_kube::resources::application(),
    );
    let apps = api.list(&ListParams::default()).await.map_err(|e| {
        format!(
            "failed to list applications in namespace {}: {e}",
            hub.namespace
        )
    })?;
    if apps.items.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = apps
        .items
        .iter()
        .filter_map(|a| a.metadata.name.as_deref())
        .collect();
    Err(format!(
        "applications exist in principal namespace {}: {}; Applications for an agent belong in its namespace (or, with --destination-based-mapping, in any allowed namespace), move them there",
        hub.namespace,
        names.join(", ")
    ))
}

/// The Argo CD cluster Secrets of agents (upstream's filter: `managed-by: argocd-agent` and
/// `argocd.argoproj.io/secret-type: cluster`).
async fn agent_cluster_secrets(hub: &Side) -> Result<Vec<Secret>, String> {
    let api: Api<Secret> = Api::namespaced(hub.client.clone(), &hub.namespace);
    let list = api
        .list(&ListParams::default().labels(&format!("{SECRET_TYPE_LABEL}={SECRET_TYPE_CLUSTER}")))
        .await
        .map_err(|e| format!("failed to list secrets in namespace {}: {e}", hub.namespace))?;
    Ok(list
        .items
        .into_iter()
        .filter(|s| {
            s.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(MANAGED_BY_ANNOTATION))
                .is_some_and(|v| v == MANAGED_BY_VALUE)
        })
        .collect())
}

fn name(s: &Secret) -> &str {
    s.metadata.name.as_deref().unwrap_or_default()
}

/// Every agent cluster Secret's `server` is https and names its agent (`?agentName=`).
fn cluster_servers_valid(ns: &str, secrets: &[Secret]) -> Result<(), String> {
    let mut no_https = Vec::new();
    let mut no_agent = Vec::new();
    for s in secrets {
        let server = s
            .data
            .as_ref()
            .and_then(|d| d.get("server"))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .unwrap_or_default();
        if !server.starts_with("https://") {
            no_https.push(name(s));
        }
        let agent = server
            .split_once('?')
            .map(|(_, query)| {
                query.split('&').any(|kv| {
                    kv.split_once('=')
                        .is_some_and(|(k, v)| k == "agentName" && !v.trim().is_empty())
                })
            })
            .unwrap_or(false);
        if !agent {
            no_agent.push(name(s));
        }
    }
    let mut parts = Vec::new();
    if !no_https.is_empty() {
        parts.push(format!(
            "the following agent cluster secrets in {ns} are not https: {}",
            no_https.join(", ")
        ));
    }
    if !no_agent.is_empty() {
        parts.push(format!(
            "the following agent cluster secrets in {ns} are missing the agentName param: {}",
            no_agent.join(", ")
        ));
    }
    if parts.is_empty() {
        return Ok(());
    }
    parts.push("recreate them with `argocd-agentctl agent create <name>`".into());
    Err(parts.join("\n"))
}

/// Every agent cluster Secret carries `argocd.argoproj.io/skip-reconcile: "true"`.
fn cluster_annotations_valid(ns: &str, secrets: &[Secret]) -> Result<(), String> {
    let missing: Vec<&str> = secrets
        .iter()
        .filter(|s| {
            s.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SKIP_RECONCILE_ANNOTATION))
                .is_none_or(|v| v != "true")
        })
        .map(name)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the following agent cluster secrets in {ns} are missing the skip-reconcile annotation or it is not set to true: {}; annotate them with {SKIP_RECONCILE_ANNOTATION}=true",
        missing.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn cluster_secret(name: &str, server: &str, skip: Option<&str>) -> Secret {
        let mut annotations = BTreeMap::new();
        annotations.insert(
            MANAGED_BY_ANNOTATION.to_string(),
            MANAGED_BY_VALUE.to_string(),
        );
        if let Some(v) = skip {
            annotations.insert(SKIP_RECONCILE_ANNOTATION.to_string(), v.to_string());
        }
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.annotations = Some(annotations);
        s.data = Some(BTreeMap::from([(
            "server".to_string(),
            k8s_openapi::ByteString(server.as_bytes().to_vec()),
        )]));
        s
    }

    #[test]
    fn cluster_secrets_need_https_the_agent_name_and_skip_reconcile() {
        let good = cluster_secret("a", "https://proxy:9090?agentName=a", Some("true"));
        assert_eq!(
            cluster_servers_valid("argocd", std::slice::from_ref(&good)),
            Ok(())
        );
        assert_eq!(
            cluster_annotations_valid("argocd", std::slice::from_ref(&good)),
            Ok(())
        );
        let bad = [
            cluster_secret("plain", "http://proxy:9090?agentName=p", None),
            cluster_secret("anon", "https://proxy:9090?agentName=", Some("false")),
        ];
        let err = cluster_servers_valid("argocd", &bad).unwrap_err();
        assert!(err.contains("not https: plain"), "{err}");
        assert!(err.contains("missing the agentName param: anon"), "{err}");
        assert!(err.contains("argocd-agentctl agent create"), "{err}");
        let err = cluster_annotations_valid("argocd", &bad).unwrap_err();
        assert!(err.contains("plain, anon"), "{err}");
    }

    #[test]
    fn results_print_as_upstream_prints_them() {
        assert_eq!(check("x", Ok(())).to_string(), "* x: ✅");
        assert_eq!(
            check("x", Err("broken; fix it".into())).to_string(),
            "* x: ❌\nERROR: broken; fix it"
        );
    }
}
