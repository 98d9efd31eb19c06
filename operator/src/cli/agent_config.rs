//! `argocd-agentctl agent inspect|print-tls|reconfigure`: an agent's Argo CD cluster Secret on the
//! hub read back (server, certificate validity), its resource-proxy TLS material printed, and its
//! server address or client certificate changed, as upstream's agentctl does.
//!
//! Owns those three commands; creating, listing and deleting registrations are
//! [`super::agent`]'s, the Secret's format [`crate::registration`]'s.

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::agent::{agent_name, HubArgs};
use super::{date, CliError, OutputArgs, OutputFormat};
use crate::pki::secrets::SecretStore;
use crate::pki::{days, inspect_labelled};
use crate::registration::{
    cluster_tls_material, parse_cluster_secret, resource_proxy_server_url, ClusterTlsMaterial,
};

/// Arguments of `agent inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Agent name.
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    hub: HubArgs,
    #[command(flatten)]
    out: OutputArgs,
}

/// What `agent print-tls` prints.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TlsPart {
    /// The client certificate.
    #[default]
    Cert,
    /// The client key.
    Key,
    /// The CA certificate.
    Ca,
}

/// Arguments of `agent print-tls`.
#[derive(Args, Debug)]
pub struct PrintTlsArgs {
    /// Agent name.
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    hub: HubArgs,
    /// Type of asset to print.
    #[arg(
        long = "type",
        short = 't',
        env = "ARGOCD_AGENTCTL_TYPE",
        value_enum,
        default_value_t
    )]
    part: TlsPart,
}

/// Arguments of `agent reconfigure`.
#[derive(Args, Debug)]
pub struct ReconfigureArgs {
    /// Agent name.
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    hub: HubArgs,
    /// New address of the principal's resource proxy as the hub's Argo CD reaches it (HOST:PORT).
    #[arg(
        long,
        env = "ARGOCD_AGENTCTL_RESOURCE_PROXY_SERVER",
        value_name = "HOST:PORT"
    )]
    resource_proxy_server: Option<String>,
    /// Issue a new resource-proxy client certificate from the CA (secret argocd-agent-ca).
    #[arg(long, env = "ARGOCD_AGENTCTL_REISSUE_CLIENT_CERT")]
    reissue_client_cert: bool,
    /// Principal namespace holding secret argocd-agent-ca (default: the selected principal's,
    /// else argocd).
    #[arg(
        long,
        short = 'n',
        env = "ARGOCD_AGENTCTL_NAMESPACE",
        value_name = "NS"
    )]
    namespace: Option<String>,
    /// Validity of a reissued client certificate in days.
    #[arg(long, env = "ARGOCD_AGENTCTL_DAYS", default_value_t = 365)]
    days: u32,
}

/// `agent inspect` output (upstream's fields).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Inspected {
    server: String,
    name: String,
    not_valid_before: String,
    not_valid_after: String,
}

async fn registered(
    hub: &HubArgs,
    name: &str,
) -> Result<
    (
        crate::registration::AgentRegistry,
        k8s_openapi::api::core::v1::Secret,
    ),
    CliError,
> {
    let agent = agent_name(name)?;
    let registry = hub.registry().await?;
    let secret = registry.get(&agent).await?.ok_or_else(|| {
        CliError::usage(format!(
            "No such agent configured: {agent} (create it with `argocd-agentctl agent create {agent}`)"
        ))
    })?;
    Ok((registry, secret))
}

/// `agent inspect`.
pub async fn inspect(args: InspectArgs) -> Result<(), CliError> {
    let (_, secret) = registered(&args.hub, &args.name).await?;
    let cluster = parse_cluster_secret(&secret)?;
    let cert = cluster.client_cert.as_ref().ok_or_else(|| {
        CliError::runtime("Not a valid certificate in the cluster secret; reissue it with `argocd-agentctl agent reconfigure --reissue-client-cert`")
    })?;
    let out = Inspected {
        server: cluster.server.clone(),
        name: cluster.name.clone(),
        not_valid_before: cert.not_before.to_rfc3339(),
        not_valid_after: cert.not_after.to_rfc3339(),
    };
    match args.out.output {
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&out)
                .map_err(|e| CliError::runtime(format!("encoding JSON: {e}")))?
        ),
        OutputFormat::Text => println!(
            "Server address:    {}\nServer name:       {}\nNot valid before:  {}\nNot valid after:   {}",
            out.server,
            out.name,
            date(&cert.not_before),
            date(&cert.not_after)
        ),
    }
    Ok(())
}

/// `agent print-tls`.
pub async fn print_tls(args: PrintTlsArgs) -> Result<(), CliError> {
    let (_, secret) = registered(&args.hub, &args.name).await?;
    let tls = cluster_tls_material(&secret)?;
    print!(
        "{}",
        match args.part {
            TlsPart::Cert => &tls.cert_pem,
            TlsPart::Key => &tls.key_pem,
            TlsPart::Ca => &tls.ca_pem,
        }
    );
    Ok(())
}

/// `agent reconfigure`.
pub async fn reconfigure(args: ReconfigureArgs) -> Result<(), CliError> {
    if args.resource_proxy_server.is_none() && !args.reissue_client_cert {
        return Err(CliError::usage(
            "nothing to change: give --resource-proxy-server and/or --reissue-client-cert",
        ));
    }
    if args.days == 0 {
        return Err(CliError::usage("--days must be at least 1"));
    }
    let (registry, secret) = registered(&args.hub, &args.name).await?;
    let agent = agent_name(&args.name)?;
    let cluster = parse_cluster_secret(&secret)?;
    let mut server = cluster.server.clone();
    let mut changed = Vec::new();
    if let Some(address) = &args.resource_proxy_server {
        let url = resource_proxy_server_url(address, &agent)
            .map_err(|e| CliError::usage(format!("--resource-proxy-server: {e}")))?;
        if url != server {
            server = url;
            changed.push("server address");
        }
    }
    let tls = if args.reissue_client_cert {
        let namespace = args.hub.principal_namespace(args.namespace.as_deref())?;
        let ca = SecretStore::new(registry.client(), &namespace)
            .load_ca()
            .await?;
        changed.push("client certificate");
        ClusterTlsMaterial::issue(&ca, &agent, days(args.days))?
    } else {
        cluster_tls_material(&secret)?
    };
    if changed.is_empty() {
        println!("Agent {agent}: nothing changed");
        return Ok(());
    }
    registry.reconfigure(&agent, &secret, &server, &tls).await?;
    let cert = inspect_labelled(&tls.cert_pem, "client certificate")?;
    println!(
        "Agent {agent}: {} changed (server {server}, client certificate valid until {})",
        changed.join(" and "),
        date(&cert.not_after)
    );
    Ok(())
}
