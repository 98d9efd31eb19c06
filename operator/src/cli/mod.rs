//! The `argocd-agentctl` command line: argument definitions (clap) and command dispatch.
//!
//! Owns: the user contract of the CLI (subcommands, flags, environment variables, exit codes:
//! 0 ok, 2 bad usage or configuration, 1 runtime failure) and the
//! one-line summaries it prints. The work itself is done by [`crate::pki`] and
//! [`crate::registration`]; each command group lives in its own module so new groups
//! (blocklist, fleet, wrap, config) can be added beside them.

pub mod agent;
pub mod agent_config;
pub mod blocklist;
pub mod config;
pub mod contexts;
pub mod fleet;
pub mod jwt;
pub mod kubeconfig;
pub mod pki;
pub mod pki_ca;
pub mod validate;

use std::fmt;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::pki::PkiError;
use crate::registration::RegistrationError;

/// Exit code for bad usage or configuration.
pub const EXIT_USAGE: u8 = 2;
/// Exit code for runtime failures.
pub const EXIT_RUNTIME: u8 = 1;

/// Flags upstream's argocd-agentctl also reads from the environment: they keep upstream's
/// variable names (`ARGOCD_AGENT_<FLAG>`); every other flag is `ARGOCD_AGENTCTL_<FLAG>`.
pub const UPSTREAM_ENV_FLAGS: [&str; 4] = [
    "principal-context",
    "principal-namespace",
    "agent-context",
    "agent-namespace",
];

/// argocd-agentctl: PKI, JWT keys and agent registration for argocd-agent.
#[derive(Parser, Debug)]
#[command(
    name = "argocd-agentctl",
    version,
    about,
    propagate_version = true,
    after_help = "Every flag can also be set through the environment variable shown next to it: \
                  ARGOCD_AGENTCTL_<FLAG>, except upstream's --principal-context, \
                  --principal-namespace, --agent-context and --agent-namespace, which keep \
                  upstream's ARGOCD_AGENT_<FLAG>."
)]
pub struct Cli {
    /// Log level for diagnostics on stderr (error, warn, info, debug, trace).
    #[arg(
        long,
        global = true,
        env = "ARGOCD_AGENTCTL_LOG_LEVEL",
        default_value = "warn"
    )]
    pub log_level: String,

    /// The symbolic name of a principal in the config file: the hub commands act on (default:
    /// the file's default-principal). --context/--principal-context and --namespace/
    /// --principal-namespace override its fields.
    #[arg(
        long,
        global = true,
        env = "ARGOCD_AGENTCTL_PRINCIPAL",
        value_name = "NAME"
    )]
    pub principal: Option<String>,

    /// The symbolic name of an agent in the config file: the agent's cluster commands act on.
    /// --agent-context and --agent-namespace override its fields.
    #[arg(
        long,
        global = true,
        env = "ARGOCD_AGENTCTL_AGENT",
        value_name = "NAME"
    )]
    pub agent: Option<String>,

    /// The local config file of named principals and agents (upstream's format; see `config`).
    #[arg(
        long,
        global = true,
        env = "ARGOCD_AGENTCTL_CONFIG",
        value_name = "FILE",
        default_value_os_t = contexts::default_path()
    )]
    pub config: PathBuf,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level command groups.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// !!NON-PROD!! Manage the CA and issue certificates for principal, resource proxy and agents.
    #[command(subcommand)]
    Pki(pki::PkiCommand),
    /// Manage the principal's JWT signing key.
    #[command(subcommand)]
    Jwt(jwt::JwtCommand),
    /// Register agents on the hub (Argo CD cluster secrets).
    #[command(subcommand)]
    Agent(agent::AgentCommand),
    /// Render a folder of Kubernetes manifests (or stdin) into one OCM ManifestWork on stdout
    /// (usable as an Argo CD config-management-plugin generate command).
    Wrap(crate::wrap::WrapArgs),
    /// Fleet overview: agents, connection, mode, queue depth, certificate expiry.
    #[command(subcommand)]
    Fleet(fleet::FleetCommand),
    /// Refuse agents' client certificates (the principal's TLS blocklist).
    #[command(subcommand)]
    Blocklist(blocklist::BlocklistCommand),
    /// Validate principal and agent installations against their clusters.
    #[command(subcommand, visible_alias = "check-config")]
    Validate(validate::ValidateCommand),
    /// Named principals and agents in the local config file, selected with --principal/--agent.
    #[command(subcommand)]
    Config(config::ConfigCommand),
}

/// Where PKI material is read from and written to: a directory, or Secrets in a namespace.
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Keep PKI files in this directory instead of Kubernetes Secrets.
    #[arg(long, env = "ARGOCD_AGENTCTL_DIR", value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Kubeconfig of the hub cluster (default: $KUBECONFIG, ~/.kube/config or in-cluster).
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

    /// Namespace of the principal on the hub, where the PKI secrets live (default: the selected
    /// principal's, else argocd).
    #[arg(
        long,
        short = 'n',
        visible_alias = "principal-namespace",
        env = "ARGOCD_AGENTCTL_NAMESPACE",
        value_name = "NS"
    )]
    pub namespace: Option<String>,
}

/// Resolved storage choice.
pub enum Store {
    /// Files in a directory.
    Dir(crate::pki::directory::PkiDirectory),
    /// Secrets in the principal namespace.
    Secrets(Box<crate::pki::secrets::SecretStore>),
}

impl StoreArgs {
    /// Pick the backend: `--dir` or Kubernetes. Giving both is a usage error.
    pub async fn open(&self) -> Result<Store, CliError> {
        match &self.dir {
            Some(dir) => {
                if self.kubeconfig.is_some() || self.context.is_some() {
                    return Err(CliError::usage(
                        "--dir and --kubeconfig/--context are alternatives for this command; give one of them",
                    ));
                }
                Ok(Store::Dir(crate::pki::directory::PkiDirectory::new(dir)))
            }
            None => {
                let target = self.target()?;
                let client =
                    kubeconfig::client(self.kubeconfig.as_deref(), target.context.as_deref())
                        .await?;
                Ok(Store::Secrets(Box::new(
                    crate::pki::secrets::SecretStore::new(client, &target.namespace),
                )))
            }
        }
    }

    /// The hub context and principal namespace: the flags, else the selected principal.
    pub fn target(&self) -> Result<contexts::Target, CliError> {
        contexts::principal(self.context.as_deref(), self.namespace.as_deref())
    }
}

/// The `--output` flag of read commands.
#[derive(clap::Args, Debug)]
pub struct OutputArgs {
    /// Output format.
    #[arg(
        long,
        short = 'o',
        env = "ARGOCD_AGENTCTL_OUTPUT",
        value_enum,
        default_value_t
    )]
    pub output: OutputFormat,
}

/// Output format of read commands.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// Human-readable text.
    #[default]
    Text,
    /// JSON.
    Json,
}

/// A failed command: the message and which exit code it maps to.
#[derive(Debug)]
pub enum CliError {
    /// Bad usage or configuration (exit 2).
    Usage(String),
    /// Failure while doing the work (exit 1).
    Runtime(String),
}

impl CliError {
    /// A usage/configuration error.
    pub fn usage(msg: impl Into<String>) -> Self {
        Self::Usage(msg.into())
    }

    /// A runtime error.
    pub fn runtime(msg: impl Into<String>) -> Self {
        Self::Runtime(msg.into())
    }

    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => EXIT_USAGE,
            Self::Runtime(_) => EXIT_RUNTIME,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Usage(m) | Self::Runtime(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CliError {}

impl From<PkiError> for CliError {
    fn from(e: PkiError) -> Self {
        let msg = e.to_string();
        match &e {
            PkiError::CaNotInitialized { .. }
            | PkiError::NoCertificate { .. }
            | PkiError::BadCertificate { .. }
            | PkiError::BadKey { .. }
            | PkiError::KeyMismatch { .. }
            | PkiError::NotCa { .. }
            | PkiError::BadValidity { .. }
            | PkiError::InvalidName { .. }
            | PkiError::BadCsr(_)
            | PkiError::CsrRefused(_)
            | PkiError::NotIssuedByCa { .. }
            | PkiError::AlreadyExists { .. }
            | PkiError::SecretMissingKey { .. }
            | PkiError::WouldReplaceCa { .. } => Self::Usage(msg),
            PkiError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                Self::Usage(msg)
            }
            PkiError::Io { .. }
            | PkiError::KeyGeneration(_)
            | PkiError::Issue { .. }
            | PkiError::Kube { .. }
            | PkiError::JwtKey(_) => Self::Runtime(msg),
        }
    }
}

impl From<RegistrationError> for CliError {
    fn from(e: RegistrationError) -> Self {
        match e {
            RegistrationError::Pki(p) => p.into(),
            RegistrationError::InvalidAddress { .. }
            | RegistrationError::InvalidAgent { .. }
            | RegistrationError::AgentExists { .. } => Self::Usage(e.to_string()),
            RegistrationError::NotAClusterSecret { .. } | RegistrationError::Kube { .. } => {
                Self::Runtime(e.to_string())
            }
        }
    }
}

/// Run a parsed command line.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    contexts::select(&contexts::Selection {
        config: cli.config.clone(),
        principal: cli.principal.clone(),
        agent: cli.agent.clone(),
    });
    match cli.command {
        Command::Config(cmd) => config::run(cmd, &cli.config),
        Command::Pki(cmd) => pki::run(cmd).await,
        Command::Jwt(cmd) => jwt::run(cmd).await,
        Command::Agent(cmd) => agent::run(cmd).await,
        Command::Fleet(cmd) => fleet::run(cmd).await,
        Command::Blocklist(cmd) => blocklist::run(cmd).await,
        Command::Validate(cmd) => validate::run(cmd).await,
        Command::Wrap(_) => Err(CliError::Usage(
            "wrap runs without the async runtime: call wrap::run_wrap".into(),
        )),
    }
}

/// Asks `prompt` on stdout and reads one line from stdin: whether it was `expected`.
pub(crate) fn confirm(prompt: &str, expected: &str) -> Result<bool, CliError> {
    use std::io::Write;
    print!("{prompt}");
    std::io::stdout()
        .flush()
        .map_err(|e| CliError::runtime(format!("writing the prompt: {e}")))?;
    let mut answer = String::new();
    std::io::stdin()
        .read_line(&mut answer)
        .map_err(|e| CliError::runtime(format!("reading the answer: {e}")))?;
    Ok(answer.trim() == expected)
}

/// A timestamp as `YYYY-MM-DD HH:MM:SS UTC`, for summaries.
pub(crate) fn date(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every flag's variable: `ARGOCD_AGENT_<FLAG>` for upstream's four, else
    /// `ARGOCD_AGENTCTL_<FLAG>`.
    fn expected_env(flag: &str) -> String {
        let prefix = if UPSTREAM_ENV_FLAGS.contains(&flag) {
            "ARGOCD_AGENT_"
        } else {
            "ARGOCD_AGENTCTL_"
        };
        format!("{prefix}{}", flag.replace('-', "_").to_uppercase())
    }

    fn env_mismatches(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let (Some(flag), Some(env)) = (arg.get_long(), arg.get_env()) else {
                continue;
            };
            let env = env.to_string_lossy();
            if env != expected_env(flag) {
                out.push(format!(
                    "{path} --{flag}: {env}, want {}",
                    expected_env(flag)
                ));
            }
        }
        for sub in cmd.get_subcommands() {
            env_mismatches(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_flag_uses_one_environment_naming_scheme() {
        let mut mismatches = Vec::new();
        env_mismatches(&Cli::command(), "argocd-agentctl", &mut mismatches);
        assert!(mismatches.is_empty(), "{mismatches:#?}");
        assert_eq!(expected_env("agent-context"), "ARGOCD_AGENT_AGENT_CONTEXT");
        assert_eq!(expected_env("days"), "ARGOCD_AGENTCTL_DAYS");
    }

    #[test]
    fn bad_ip_is_a_usage_error_naming_the_flag() {
        let err = Cli::try_parse_from([
            "argocd-agentctl",
            "pki",
            "issue",
            "principal",
            "--dir",
            "/tmp/x",
            "--ip",
            "300.1.1.1",
        ])
        .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--ip"), "{err}");
    }
}
