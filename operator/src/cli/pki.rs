//! `argocd-agentctl pki`: initialise the CA, issue certificates, inspect them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use argocd_agent_proto::identity::AgentName;
use clap::{Args, Subcommand};
use serde::Serialize;

use super::{date, kubeconfig, CliError, OutputArgs, OutputFormat, Store, StoreArgs};
use crate::pki::directory::PkiDirectory;
use crate::pki::secrets::{self, SecretStore, WriteOutcome};
use crate::pki::{
    days, inspect_labelled, CertInfo, CertRole, CertificateAuthority, IssuedCert,
    DEFAULT_CA_COMMON_NAME,
};

/// `pki` subcommands.
#[derive(Subcommand, Debug)]
pub enum PkiCommand {
    /// Create the CA (ca.crt/ca.key in --dir, or secret argocd-agent-ca).
    Init(InitArgs),
    /// Issue a certificate signed by the CA.
    #[command(subcommand)]
    Issue(IssueCommand),
    /// Show the CA and issued certificates, or one certificate file.
    Inspect(InspectArgs),
    /// Print the CA's certificate and/or private key (PEM) to stdout.
    Dump(super::pki_ca::DumpArgs),
    /// Delete the CA (asks to type YES).
    Delete(super::pki_ca::DeleteArgs),
    /// !!NON-PROD!! Copy the CA certificate to an agent's cluster as its CA secret.
    Propagate(super::pki_ca::PropagateArgs),
}

/// Arguments of `pki init`.
#[derive(Args, Debug)]
pub struct InitArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Validity of the CA certificate in days.
    #[arg(long, env = "ARGOCD_AGENTCTL_DAYS", default_value_t = 3650)]
    days: u32,
    /// Common name of the CA certificate.
    #[arg(long, env = "ARGOCD_AGENTCTL_COMMON_NAME", default_value = DEFAULT_CA_COMMON_NAME)]
    common_name: String,
    /// Replace an existing CA (every certificate it issued stops being trusted).
    #[arg(long, short = 'f', env = "ARGOCD_AGENTCTL_FORCE")]
    force: bool,
}

/// `pki issue` subcommands.
#[derive(Subcommand, Debug)]
pub enum IssueCommand {
    /// Server certificate for the principal's gRPC endpoint (principal.crt/key or secret argocd-agent-principal-tls).
    Principal(ServerIssueArgs),
    /// Server certificate for the resource proxy (resource-proxy.crt/key or secret argocd-agent-resource-proxy-tls).
    ResourceProxy(ServerIssueArgs),
    /// Client certificate for an agent, CN = NAME (agents/NAME.crt/key, or secrets argocd-agent-client-tls and argocd-agent-ca in the agent's namespace, on the agent's cluster when --agent-kubeconfig or --agent-context is given, else on the CA's).
    Agent(AgentIssueArgs),
}

/// Arguments of `pki issue principal|resource-proxy`.
#[derive(Args, Debug)]
pub struct ServerIssueArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// DNS names (SANs) the certificate is valid for; repeat or comma-separate.
    #[arg(
        long,
        env = "ARGOCD_AGENTCTL_DNS",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    dns: Vec<String>,
    /// IP addresses (SANs) the certificate is valid for; repeat or comma-separate.
    #[arg(
        long,
        env = "ARGOCD_AGENTCTL_IP",
        value_delimiter = ',',
        value_name = "ADDR"
    )]
    ip: Vec<IpAddr>,
    /// Validity in days.
    #[arg(long, env = "ARGOCD_AGENTCTL_DAYS", default_value_t = 365)]
    days: u32,
    /// Replace an existing certificate.
    #[arg(
        long,
        short = 'f',
        visible_alias = "upsert",
        env = "ARGOCD_AGENTCTL_FORCE"
    )]
    force: bool,
}

/// Arguments of `pki issue agent`.
#[derive(Args, Debug)]
pub struct AgentIssueArgs {
    /// Agent name (DNS label); becomes the certificate's CN.
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    store: StoreArgs,
    /// Validity in days.
    #[arg(long, env = "ARGOCD_AGENTCTL_DAYS", default_value_t = 365)]
    days: u32,
    /// Replace an existing certificate.
    #[arg(
        long,
        short = 'f',
        visible_alias = "upsert",
        env = "ARGOCD_AGENTCTL_FORCE"
    )]
    force: bool,
    /// The agent's cluster (secrets mode; default: the CA's).
    #[command(flatten)]
    agent: AgentClusterArgs,
}

/// The agent's cluster and namespace, for commands that write Secrets there.
#[derive(Args, Debug)]
pub struct AgentClusterArgs {
    /// Kubeconfig of the agent's cluster (default: $KUBECONFIG, which may list several files).
    #[arg(long, env = "ARGOCD_AGENTCTL_AGENT_KUBECONFIG", value_name = "FILE")]
    pub agent_kubeconfig: Option<PathBuf>,
    /// Kubeconfig context of the agent's cluster (upstream's flag and variable; default: the
    /// selected --agent's).
    #[arg(long, env = "ARGOCD_AGENT_AGENT_CONTEXT", value_name = "NAME")]
    pub agent_context: Option<String>,
    /// Namespace the agent runs in on its cluster (upstream's flag and variable; default: the
    /// selected --agent's, else argocd).
    #[arg(long, env = "ARGOCD_AGENT_AGENT_NAMESPACE", value_name = "NS")]
    pub agent_namespace: Option<String>,
}

impl AgentClusterArgs {
    /// The agent's context and namespace: the flags, else the selected agent.
    pub fn target(&self) -> Result<super::contexts::Target, CliError> {
        super::contexts::agent(
            self.agent_context.as_deref(),
            self.agent_namespace.as_deref(),
        )
    }

    /// Whether the agent's cluster was given (kubeconfig, context, or a selected agent).
    pub fn given(&self) -> Result<bool, CliError> {
        Ok(self.agent_kubeconfig.is_some() || self.target()?.context.is_some())
    }

    /// The Secrets of the agent's namespace on its cluster.
    pub async fn store(&self) -> Result<SecretStore, CliError> {
        let target = self.target()?;
        let client = kubeconfig::client_for(
            "--agent-kubeconfig",
            "--agent-context",
            self.agent_kubeconfig.as_deref(),
            target.context.as_deref(),
        )
        .await?;
        Ok(SecretStore::new(client, &target.namespace))
    }
}

/// Arguments of `pki inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Inspect this PEM certificate file instead of the PKI.
    #[arg(long, env = "ARGOCD_AGENTCTL_CERT", value_name = "FILE")]
    cert: Option<PathBuf>,
    #[command(flatten)]
    out: OutputArgs,
}

/// Run a `pki` subcommand.
pub async fn run(cmd: PkiCommand) -> Result<(), CliError> {
    match cmd {
        PkiCommand::Init(args) => init(args).await,
        PkiCommand::Issue(IssueCommand::Principal(args)) => {
            issue_server(CertRole::Principal, args, &[]).await
        }
        PkiCommand::Issue(IssueCommand::ResourceProxy(args)) => {
            issue_server(
                CertRole::ResourceProxy,
                args,
                &[crate::pki::RESOURCE_PROXY_COMMON_NAME],
            )
            .await
        }
        PkiCommand::Issue(IssueCommand::Agent(args)) => issue_agent(args).await,
        PkiCommand::Inspect(args) => inspect(args).await,
        PkiCommand::Dump(args) => super::pki_ca::dump(args).await,
        PkiCommand::Delete(args) => super::pki_ca::delete(args).await,
        PkiCommand::Propagate(args) => super::pki_ca::propagate(args).await,
    }
}

fn validity(days_flag: u32) -> Result<std::time::Duration, CliError> {
    if days_flag == 0 {
        return Err(CliError::usage("--days must be at least 1"));
    }
    Ok(days(days_flag))
}

fn describe(info: &CertInfo) -> String {
    let sans = if info.sans.is_empty() {
        String::new()
    } else {
        format!(", {}", info.sans.join(" "))
    };
    format!(
        "CN={}{sans}, valid until {}",
        info.subject_cn.as_deref().unwrap_or("-"),
        date(&info.not_after)
    )
}

pub(crate) async fn load_ca(store: &Store) -> Result<CertificateAuthority, CliError> {
    Ok(match store {
        Store::Dir(dir) => dir.load_ca()?,
        Store::Secrets(secrets) => secrets.load_ca().await?,
    })
}

fn outcome_word(outcome: WriteOutcome) -> &'static str {
    match outcome {
        WriteOutcome::Created => "created",
        WriteOutcome::Replaced => "replaced",
    }
}

async fn init(args: InitArgs) -> Result<(), CliError> {
    let lifetime = validity(args.days)?;
    let store = args.store.open().await?;
    let ca = CertificateAuthority::generate(&args.common_name, lifetime)?;
    let info = ca.info();
    let target = match &store {
        Store::Dir(dir) => {
            let files = dir.store_ca(&ca, args.force)?;
            format!("{} and {}", files.cert.display(), files.key.display())
        }
        Store::Secrets(s) => {
            let outcome = s
                .write(&secrets::ca_secret(s.namespace(), &ca), args.force)
                .await?;
            format!(
                "secret {}/{} ({})",
                s.namespace(),
                secrets::CA_SECRET,
                outcome_word(outcome)
            )
        }
    };
    println!(
        "CA {} (SHA-256 {}) written to {target}",
        describe(&info),
        info.fingerprint_sha256
    );
    Ok(())
}

async fn issue_server(
    role: CertRole,
    args: ServerIssueArgs,
    extra_default_dns: &[&str],
) -> Result<(), CliError> {
    let lifetime = validity(args.days)?;
    let (dns, ips) = if args.dns.is_empty() && args.ip.is_empty() {
        let mut dns = vec!["localhost".to_owned()];
        dns.extend(extra_default_dns.iter().map(|s| (*s).to_owned()));
        (dns, vec![IpAddr::from([127, 0, 0, 1])])
    } else {
        (args.dns, args.ip)
    };
    let store = args.store.open().await?;
    let ca = load_ca(&store).await?;
    let issued = ca.issue_server(role.common_name(), &dns, &ips, lifetime)?;
    let target = store_issued(&store, &role, &issued, &ca, args.force).await?;
    let info = inspect_labelled(&issued.cert_pem, "issued certificate")?;
    println!("{role} certificate {} written to {target}", describe(&info));
    Ok(())
}

async fn store_issued(
    store: &Store,
    role: &CertRole,
    issued: &IssuedCert,
    ca: &CertificateAuthority,
    force: bool,
) -> Result<String, CliError> {
    Ok(match store {
        Store::Dir(dir) => {
            let files = dir.store_issued(role, issued, force)?;
            format!("{} and {}", files.cert.display(), files.key.display())
        }
        Store::Secrets(s) => {
            let secret = secrets::role_secret(role, s.namespace(), issued, ca);
            let outcome = s.write(&secret, force).await?;
            format!(
                "secret {}/{} ({})",
                s.namespace(),
                secrets::role_secret_name(role),
                outcome_word(outcome)
            )
        }
    })
}

async fn issue_agent(args: AgentIssueArgs) -> Result<(), CliError> {
    let name =
        AgentName::new(args.name.as_str()).map_err(|e| CliError::usage(format!("NAME: {e}")))?;
    let lifetime = validity(args.days)?;
    let store = args.store.open().await?;
    let ca = load_ca(&store).await?;
    let role = CertRole::Agent(name.clone());
    let issued = ca.issue_agent(&name, lifetime)?;
    let info = inspect_labelled(&issued.cert_pem, "issued certificate")?;
    let target = match &store {
        Store::Dir(_) => store_issued(&store, &role, &issued, &ca, args.force).await?,
        Store::Secrets(hub) => {
            let agent_store = if args.agent.given()? {
                args.agent.store().await?
            } else {
                let agent_namespace = args.agent.target()?.namespace;
                if agent_namespace == hub.namespace() {
                    return Err(CliError::usage(format!(
                        "--agent-namespace {agent_namespace} is the principal namespace on the same cluster; the agent's CA secret would replace the hub CA. Use --agent-kubeconfig/--agent-context for the agent's cluster or another --agent-namespace"
                    )));
                }
                hub.with_namespace(&agent_namespace)
            };
            let client_secret = secrets::role_secret(&role, agent_store.namespace(), &issued, &ca);
            let o1 = agent_store.write(&client_secret, args.force).await?;
            let o2 = agent_store.write_agent_ca(ca.cert_pem(), true).await?;
            format!(
                "secrets {ns}/{} ({}) and {ns}/{} ({})",
                secrets::AGENT_CLIENT_TLS_SECRET,
                outcome_word(o1),
                secrets::AGENT_CA_SECRET,
                outcome_word(o2),
                ns = agent_store.namespace()
            )
        }
    };
    println!(
        "{role} client certificate {} written to {target}",
        describe(&info)
    );
    Ok(())
}

/// JSON shape of `pki inspect` over a whole PKI (upstream's keys plus agents).
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct PkiSummary {
    #[serde(skip_serializing_if = "Option::is_none")]
    ca: Option<CertInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    principal: Option<CertInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_proxy: Option<CertInfo>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    agents: BTreeMap<String, CertInfo>,
}

async fn inspect(args: InspectArgs) -> Result<(), CliError> {
    if let Some(path) = &args.cert {
        let pem = std::fs::read_to_string(path)
            .map_err(|e| CliError::usage(format!("--cert {}: {e}", path.display())))?;
        let info = inspect_labelled(&pem, &path.display().to_string())?;
        match args.out.output {
            OutputFormat::Json => print_json(&info)?,
            OutputFormat::Text => print!("{}", text_block(&path.display().to_string(), &info)),
        }
        return Ok(());
    }
    let store = args.store.open().await?;
    let summary = match &store {
        Store::Dir(dir) => summarise_dir(dir)?,
        Store::Secrets(s) => summarise_secrets(s).await?,
    };
    match args.out.output {
        OutputFormat::Json => print_json(&summary)?,
        OutputFormat::Text => {
            let mut out = String::new();
            let sections = [
                ("CA", &summary.ca),
                ("Principal", &summary.principal),
                ("Resource proxy", &summary.resource_proxy),
            ];
            for (title, info) in sections {
                if let Some(info) = info {
                    out.push_str(&text_block(title, info));
                }
            }
            for (name, info) in &summary.agents {
                out.push_str(&text_block(&format!("Agent {name}"), info));
            }
            print!("{out}");
        }
    }
    Ok(())
}

fn summarise_dir(dir: &PkiDirectory) -> Result<PkiSummary, CliError> {
    let ca_file = dir.ca_files().cert;
    if !ca_file.exists() {
        return Err(crate::pki::PkiError::CaNotInitialized {
            location: dir.root().display().to_string(),
        }
        .into());
    }
    let read = |path: &std::path::Path| -> Result<CertInfo, CliError> {
        let pem = std::fs::read_to_string(path)
            .map_err(|e| CliError::runtime(format!("{}: {e}", path.display())))?;
        Ok(inspect_labelled(&pem, &path.display().to_string())?)
    };
    let optional = |role: CertRole| -> Result<Option<CertInfo>, CliError> {
        let path = dir.role_files(&role).cert;
        if path.exists() {
            read(&path).map(Some)
        } else {
            Ok(None)
        }
    };
    let mut summary = PkiSummary {
        ca: Some(read(&ca_file)?),
        principal: optional(CertRole::Principal)?,
        resource_proxy: optional(CertRole::ResourceProxy)?,
        agents: BTreeMap::new(),
    };
    for agent in dir.agents()? {
        if let Some(info) = optional(CertRole::Agent(agent.clone()))? {
            summary.agents.insert(agent.to_string(), info);
        }
    }
    Ok(summary)
}

async fn summarise_secrets(store: &SecretStore) -> Result<PkiSummary, CliError> {
    let ca = store.load_ca().await?;
    let mut summary = PkiSummary {
        ca: Some(ca.info()),
        ..PkiSummary::default()
    };
    for (role, slot) in [
        (CertRole::Principal, &mut summary.principal),
        (CertRole::ResourceProxy, &mut summary.resource_proxy),
    ] {
        let name = secrets::role_secret_name(&role);
        if let Some(secret) = store.get(name).await? {
            let pem = secrets::secret_text(&secret, secrets::TLS_CERT_KEY)?;
            *slot = Some(inspect_labelled(
                &pem,
                &format!("secret {}/{name}", store.namespace()),
            )?);
        }
    }
    Ok(summary)
}

fn print_json<T: Serialize>(value: &T) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::runtime(format!("encoding JSON: {e}")))?;
    println!("{text}");
    Ok(())
}

fn text_block(title: &str, info: &CertInfo) -> String {
    let or_dash = |v: &[String]| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.join(", ")
        }
    };
    format!(
        "{title}\n  Subject:     {}\n  Issuer:      {}\n  SANs:        {}\n  Usages:      {}\n  Not before:  {}\n  Not after:   {}\n  CA:          {}\n  Key:         {}\n  Serial:      {}\n  SHA-256:     {}\n",
        info.subject,
        info.issuer,
        or_dash(&info.sans),
        or_dash(&info.extended_key_usages),
        date(&info.not_before),
        date(&info.not_after),
        info.is_ca,
        info.public_key,
        info.serial,
        info.fingerprint_sha256,
    )
}
