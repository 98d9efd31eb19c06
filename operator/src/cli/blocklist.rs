//! `argocd-agentctl blocklist tls add|remove|list`: edits the principal's TLS certificate
//! blocklist, the ConfigMap `argocd-agent-tls-blocklist` in the principal's namespace whose data
//! keys are the uppercase hex SHA-256 fingerprints of refused client certificates (DER), the
//! values a free-text reason. The principal watches it: a listed agent is disconnected within
//! seconds and refused until removed.
//!
//! Owns the ConfigMap's writes (created on the first `add`, merge-patched afterwards) and turning
//! a certificate file into its fingerprint.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde_json::json;

use super::{kubeconfig, CliError};

/// Name of the blocklist ConfigMap (the principal's `blocklist::BLOCKLIST_CONFIGMAP`).
pub const BLOCKLIST_CONFIGMAP: &str = "argocd-agent-tls-blocklist";

/// `blocklist` subcommands.
#[derive(Subcommand, Debug)]
pub enum BlocklistCommand {
    /// Client certificates refused by the principal's mTLS listeners.
    #[command(subcommand)]
    Tls(TlsBlocklistCommand),
}

/// `blocklist tls` subcommands.
#[derive(Subcommand, Debug)]
pub enum TlsBlocklistCommand {
    /// Refuse a certificate: give its SHA-256 fingerprint or the certificate file.
    Add(AddArgs),
    /// Accept a certificate again.
    Remove(RemoveArgs),
    /// Show the refused fingerprints.
    List(ClusterArgs),
}

/// The hub cluster and the principal's namespace.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// Kubeconfig of the hub cluster.
    #[arg(long, env = "ARGOCD_AGENTCTL_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context of the hub cluster (default: the selected principal's, else the
    /// current context).
    #[arg(
        long,
        visible_alias = "principal-context",
        env = "ARGOCD_AGENTCTL_CONTEXT",
        value_name = "NAME"
    )]
    pub context: Option<String>,
    /// Namespace of the principal on the hub (default: the selected principal's, else argocd).
    #[arg(
        long,
        short = 'n',
        visible_alias = "principal-namespace",
        env = "ARGOCD_AGENTCTL_NAMESPACE",
        value_name = "NS"
    )]
    pub namespace: Option<String>,
}

impl ClusterArgs {
    /// The hub context and principal namespace: the flags, else the selected principal.
    pub fn target(&self) -> Result<super::contexts::Target, CliError> {
        super::contexts::principal(self.context.as_deref(), self.namespace.as_deref())
    }

    /// A client of the hub and the principal's namespace.
    pub async fn client(&self) -> Result<(kube::Client, String), CliError> {
        let target = self.target()?;
        let client =
            kubeconfig::client(self.kubeconfig.as_deref(), target.context.as_deref()).await?;
        Ok((client, target.namespace))
    }
}

/// `blocklist tls add` flags.
#[derive(Args, Debug)]
pub struct AddArgs {
    /// SHA-256 fingerprint of the certificate's DER, 64 hex digits (colons allowed).
    #[arg(
        value_name = "FINGERPRINT",
        required_unless_present = "cert",
        conflicts_with = "cert"
    )]
    pub fingerprint: Option<String>,
    /// A PEM certificate file whose (first) certificate to refuse.
    #[arg(long, value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// Why it is refused (kept as the ConfigMap value).
    #[arg(long, default_value = "", value_name = "TEXT")]
    pub reason: String,
    /// Hub cluster and namespace.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `blocklist tls remove` flags.
#[derive(Args, Debug)]
pub struct RemoveArgs {
    /// SHA-256 fingerprint to accept again.
    #[arg(value_name = "FINGERPRINT")]
    pub fingerprint: String,
    /// Hub cluster and namespace.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `fp` as 64 uppercase hex digits (colons dropped), or a usage error saying what is expected.
pub fn normalize_fingerprint(fp: &str) -> Result<String, CliError> {
    let hex: String = fp.trim().chars().filter(|c| *c != ':').collect();
    if hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(hex.to_ascii_uppercase())
    } else {
        Err(CliError::usage(format!(
            "{fp:?} is not a SHA-256 certificate fingerprint: expected 64 hex digits \
             (e.g. from `openssl x509 -noout -fingerprint -sha256`), or use --cert FILE"
        )))
    }
}

/// The fingerprint of the first certificate in a PEM file.
pub fn fingerprint_of_file(path: &std::path::Path) -> Result<String, CliError> {
    let pem = std::fs::read(path)
        .map_err(|e| CliError::usage(format!("--cert {}: {e}", path.display())))?;
    let der = CertificateDer::pem_slice_iter(&pem)
        .next()
        .ok_or_else(|| {
            CliError::usage(format!(
                "--cert {}: no PEM certificate (-----BEGIN CERTIFICATE-----) found",
                path.display()
            ))
        })?
        .map_err(|e| CliError::usage(format!("--cert {}: malformed PEM: {e}", path.display())))?;
    Ok(argocd_agent_proto::identity::cert_fingerprint(der.as_ref()))
}

async fn api(cluster: &ClusterArgs) -> Result<Api<ConfigMap>, CliError> {
    let (client, namespace) = cluster.client().await?;
    Ok(Api::namespaced(client, &namespace))
}

fn kube_error(what: &str, e: kube::Error) -> CliError {
    CliError::runtime(format!("{what} {BLOCKLIST_CONFIGMAP}: {e}"))
}

async fn add(args: AddArgs) -> Result<(), CliError> {
    let fp = match (&args.fingerprint, &args.cert) {
        (Some(fp), None) => normalize_fingerprint(fp)?,
        (None, Some(path)) => fingerprint_of_file(path)?,
        _ => return Err(CliError::usage("give a FINGERPRINT or --cert FILE")),
    };
    let api = api(&args.cluster).await?;
    let existing = api
        .get_opt(BLOCKLIST_CONFIGMAP)
        .await
        .map_err(|e| kube_error("reading", e))?;
    if existing.is_none() {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": BLOCKLIST_CONFIGMAP},
            "data": {fp.as_str(): args.reason}
        }))
        .map_err(|e| CliError::runtime(e.to_string()))?;
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => {
                println!(
                    "blocklisted {fp} (created {}/{BLOCKLIST_CONFIGMAP})",
                    args.cluster.target()?.namespace
                );
                return Ok(());
            }
            // Created meanwhile: fall through to the patch.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(kube_error("creating", e)),
        }
    }
    let patch = json!({"data": {fp.as_str(): args.reason}});
    api.patch(
        BLOCKLIST_CONFIGMAP,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|e| kube_error("updating", e))?;
    println!("blocklisted {fp}");
    Ok(())
}

async fn remove(args: RemoveArgs) -> Result<(), CliError> {
    let fp = normalize_fingerprint(&args.fingerprint)?;
    let api = api(&args.cluster).await?;
    let listed = api
        .get_opt(BLOCKLIST_CONFIGMAP)
        .await
        .map_err(|e| kube_error("reading", e))?
        .and_then(|cm| cm.data)
        .is_some_and(|d| d.contains_key(&fp));
    if !listed {
        println!("{fp} was not blocklisted");
        return Ok(());
    }
    let patch = json!({"data": {fp.as_str(): null}});
    api.patch(
        BLOCKLIST_CONFIGMAP,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|e| kube_error("updating", e))?;
    println!("removed {fp} from the blocklist");
    Ok(())
}

async fn list(args: ClusterArgs) -> Result<(), CliError> {
    let api = api(&args).await?;
    let data = api
        .get_opt(BLOCKLIST_CONFIGMAP)
        .await
        .map_err(|e| kube_error("reading", e))?
        .and_then(|cm| cm.data)
        .unwrap_or_default();
    for (fp, reason) in data {
        if reason.is_empty() {
            println!("{fp}");
        } else {
            println!("{fp}\t{reason}");
        }
    }
    Ok(())
}

/// Runs a `blocklist` command.
pub async fn run(cmd: BlocklistCommand) -> Result<(), CliError> {
    match cmd {
        BlocklistCommand::Tls(TlsBlocklistCommand::Add(a)) => add(a).await,
        BlocklistCommand::Tls(TlsBlocklistCommand::Remove(a)) => remove(a).await,
        BlocklistCommand::Tls(TlsBlocklistCommand::List(a)) => list(a).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_normalised_or_refused_with_a_hint() {
        let fp = "ab:".repeat(31) + "ab";
        assert_eq!(normalize_fingerprint(&fp).unwrap(), "AB".repeat(32));
        let err = normalize_fingerprint("abc").unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("64 hex digits"), "{err}");
    }

    #[test]
    fn a_certificate_file_gives_the_fingerprint_the_principal_computes() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["a".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.crt");
        std::fs::write(&path, cert.pem()).unwrap();
        assert_eq!(
            fingerprint_of_file(&path).unwrap(),
            argocd_agent_proto::identity::cert_fingerprint(cert.der())
        );
        std::fs::write(&path, "nothing").unwrap();
        assert_eq!(fingerprint_of_file(&path).unwrap_err().exit_code(), 2);
    }
}
