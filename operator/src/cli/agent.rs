//! `argocd-agentctl agent`: register, list and remove agents on the hub.

use std::collections::BTreeMap;
use std::path::PathBuf;

use argocd_agent_proto::identity::AgentName;
use clap::{Args, Subcommand};

use super::{date, kubeconfig, CliError, OutputArgs, OutputFormat};
use crate::pki::days;
use crate::pki::directory::PkiDirectory;
use crate::pki::secrets::SecretStore;
use crate::registration::{
    AgentRegistry, DEFAULT_CLIENT_CERT_DAYS, DEFAULT_RESOURCE_PROXY_ADDRESS,
};

/// `agent` subcommands.
#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// Create the Argo CD cluster secret cluster-NAME and the hub namespace NAME.
    Create(CreateArgs),
    /// List agents registered on the hub.
    List(ListArgs),
    /// Remove an agent's cluster secret (and optionally its hub namespace).
    Delete(DeleteArgs),
    /// Show an agent's registration: server address and client certificate validity.
    #[command(visible_alias = "show")]
    Inspect(super::agent_config::InspectArgs),
    /// Print an agent's resource-proxy client certificate, key or CA (PEM) to stdout.
    #[command(visible_alias = "dump-tls")]
    PrintTls(super::agent_config::PrintTlsArgs),
    /// Change an agent's resource-proxy server address or reissue its client certificate.
    Reconfigure(super::agent_config::ReconfigureArgs),
}

/// Connection to the hub cluster.
#[derive(Args, Debug, Clone)]
pub struct HubArgs {
    /// Kubeconfig of the hub cluster (default: $KUBECONFIG, ~/.kube/config or in-cluster).
    #[arg(long, env = "ARGOCD_AGENTCTL_KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context of the hub cluster (default: the selected principal's, else the
    /// current context).
    #[arg(
        long,
        visible_alias = "principal-context",
        env = "ARGOCD_AGENTCTL_CONTEXT",
        value_name = "NAME"
    )]
    context: Option<String>,
    /// Argo CD namespace on the hub, where cluster secrets live (default: the selected
    /// principal's namespace, else argocd).
    #[arg(long, env = "ARGOCD_AGENTCTL_ARGOCD_NAMESPACE", value_name = "NS")]
    argocd_namespace: Option<String>,
}

impl HubArgs {
    /// The hub context and namespace: the flags, else the selected principal.
    pub(crate) fn target(&self) -> Result<super::contexts::Target, CliError> {
        super::contexts::principal(self.context.as_deref(), self.argocd_namespace.as_deref())
    }

    /// The principal's namespace on the hub (where secret argocd-agent-ca is): `flag`, else the
    /// selected principal's, else argocd.
    pub(crate) fn principal_namespace(&self, flag: Option<&str>) -> Result<String, CliError> {
        Ok(super::contexts::principal(self.context.as_deref(), flag)?.namespace)
    }

    pub(crate) async fn registry(&self) -> Result<AgentRegistry, CliError> {
        let target = self.target()?;
        let client =
            kubeconfig::client(self.kubeconfig.as_deref(), target.context.as_deref()).await?;
        Ok(AgentRegistry::new(client, &target.namespace))
    }
}

/// Arguments of `agent create`.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// Agent name (DNS label).
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    hub: HubArgs,
    /// Address of the principal's resource proxy as the hub's Argo CD reaches it (HOST:PORT).
    #[arg(
        long,
        env = "ARGOCD_AGENTCTL_RESOURCE_PROXY_SERVER",
        default_value = DEFAULT_RESOURCE_PROXY_ADDRESS,
        value_name = "HOST:PORT"
    )]
    resource_proxy_server: String,
    /// Read the CA from this PKI directory instead of secret argocd-agent-ca.
    #[arg(long, env = "ARGOCD_AGENTCTL_DIR", value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Principal namespace holding secret argocd-agent-ca (when --dir is not given; default: the
    /// selected principal's, else argocd).
    #[arg(
        long,
        short = 'n',
        env = "ARGOCD_AGENTCTL_NAMESPACE",
        value_name = "NS"
    )]
    namespace: Option<String>,
    /// Validity of the resource-proxy client certificate in days.
    #[arg(long, env = "ARGOCD_AGENTCTL_DAYS", default_value_t = DEFAULT_CLIENT_CERT_DAYS)]
    days: u32,
    /// Extra label for the cluster secret (KEY=VALUE); repeatable.
    #[arg(
        long = "label",
        short = 'l',
        env = "ARGOCD_AGENTCTL_LABEL",
        value_delimiter = ',',
        value_name = "KEY=VALUE"
    )]
    labels: Vec<String>,
}

/// Arguments of `agent list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    hub: HubArgs,
    #[command(flatten)]
    out: OutputArgs,
}

/// Arguments of `agent delete`.
#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// Agent name.
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    hub: HubArgs,
    /// Also delete the hub namespace NAME, and with it the agent's Applications on the hub.
    #[arg(long, env = "ARGOCD_AGENTCTL_DELETE_NAMESPACE")]
    delete_namespace: bool,
}

/// Run an `agent` subcommand.
pub async fn run(cmd: AgentCommand) -> Result<(), CliError> {
    match cmd {
        AgentCommand::Create(args) => create(args).await,
        AgentCommand::List(args) => list(args).await,
        AgentCommand::Delete(args) => delete(args).await,
        AgentCommand::Inspect(args) => super::agent_config::inspect(args).await,
        AgentCommand::PrintTls(args) => super::agent_config::print_tls(args).await,
        AgentCommand::Reconfigure(args) => super::agent_config::reconfigure(args).await,
    }
}

pub(crate) fn agent_name(name: &str) -> Result<AgentName, CliError> {
    AgentName::new(name).map_err(|e| CliError::usage(format!("NAME: {e}")))
}

/// Parse `KEY=VALUE` label flags.
pub fn parse_labels(labels: &[String]) -> Result<BTreeMap<String, String>, CliError> {
    let mut out = BTreeMap::new();
    for label in labels {
        let (k, v) = label
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| CliError::usage(format!("--label {label:?}: expected KEY=VALUE")))?;
        if out.insert(k.to_owned(), v.to_owned()).is_some() {
            return Err(CliError::usage(format!("--label: {k:?} given twice")));
        }
    }
    Ok(out)
}

async fn create(args: CreateArgs) -> Result<(), CliError> {
    let agent = agent_name(&args.name)?;
    if args.days == 0 {
        return Err(CliError::usage("--days must be at least 1"));
    }
    let labels = parse_labels(&args.labels)?;
    crate::registration::validate_resource_proxy_address(&args.resource_proxy_server)
        .map_err(|e| CliError::usage(format!("--resource-proxy-server: {e}")))?;
    // A file-based CA is checked before anything talks to the cluster.
    let dir_ca = match &args.dir {
        Some(dir) => Some(PkiDirectory::new(dir).load_ca()?),
        None => None,
    };
    let registry = args.hub.registry().await?;
    let ca = match dir_ca {
        Some(ca) => ca,
        None => {
            let namespace = args.hub.principal_namespace(args.namespace.as_deref())?;
            SecretStore::new(registry.client(), &namespace)
                .load_ca()
                .await?
        }
    };
    let created = registry
        .create(
            &agent,
            &ca,
            &args.resource_proxy_server,
            days(args.days),
            &labels,
        )
        .await?;
    println!(
        "Agent {agent} created: secret {} (server {}), hub namespace {} ({})",
        created.secret,
        created.server_url,
        created.namespace,
        if created.namespace_created {
            "created"
        } else {
            "already existed"
        }
    );
    Ok(())
}

async fn list(args: ListArgs) -> Result<(), CliError> {
    let registry = args.hub.registry().await?;
    let agents = registry.list().await?;
    match args.out.output {
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&agents)
                .map_err(|e| CliError::runtime(format!("encoding JSON: {e}")))?
        ),
        OutputFormat::Text => {
            if agents.is_empty() {
                println!(
                    "No agents registered in namespace {}.",
                    args.hub.target()?.namespace
                );
                return Ok(());
            }
            let width = agents
                .iter()
                .map(|a| a.agent.as_str().len())
                .max()
                .unwrap_or(4)
                .max(4);
            println!("{:width$}  {:23}  SERVER", "NAME", "CLIENT CERT EXPIRES");
            for a in &agents {
                let expires = a
                    .client_cert
                    .as_ref()
                    .map(|c| date(&c.not_after))
                    .unwrap_or_else(|| "-".to_owned());
                println!("{:width$}  {:23}  {}", a.agent, expires, a.server);
            }
        }
    }
    Ok(())
}

async fn delete(args: DeleteArgs) -> Result<(), CliError> {
    let agent = agent_name(&args.name)?;
    let registry = args.hub.registry().await?;
    let deleted = registry.delete(&agent, args.delete_namespace).await?;
    if !deleted.secret_deleted && !deleted.namespace_deleted {
        return Err(CliError::runtime(format!(
            "agent {agent} is not registered in namespace {}",
            args.hub.target()?.namespace
        )));
    }
    let ns = if args.delete_namespace {
        if deleted.namespace_deleted {
            format!("; hub namespace {agent} deleted")
        } else {
            format!("; hub namespace {agent} did not exist")
        }
    } else {
        format!("; hub namespace {agent} kept (use --delete-namespace to remove it)")
    };
    println!(
        "Agent {agent}: secret {}/cluster-{agent} {}{ns}",
        args.hub.target()?.namespace,
        if deleted.secret_deleted {
            "deleted"
        } else {
            "did not exist"
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_and_reject_malformed_input() {
        let m = parse_labels(&["a=b".into(), "c=".into()]).unwrap();
        assert_eq!(m["a"], "b");
        assert_eq!(m["c"], "");
        assert!(parse_labels(&["nokey".into()]).is_err());
        assert!(parse_labels(&["=v".into()]).is_err());
        assert_eq!(
            parse_labels(&["a=1".into(), "a=2".into()])
                .unwrap_err()
                .exit_code(),
            2
        );
    }
}
