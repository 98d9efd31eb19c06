//! `argocd-agentctl pki dump|delete|propagate`: what upstream's agentctl does with the CA once it
//! exists: print it, delete it (after typing `YES`), and copy its certificate to an agent's
//! cluster as the agent's CA Secret.
//!
//! Owns those three commands; creating the CA and issuing from it are [`super::pki`]'s.

use clap::Args;

use super::{confirm, pki::load_ca, pki::AgentClusterArgs, CliError, Store, StoreArgs};
use crate::pki::directory::{CA_CERT_FILE, CA_KEY_FILE};
use crate::pki::secrets::{WriteOutcome, AGENT_CA_SECRET, CA_SECRET};

/// Arguments of `pki dump`.
#[derive(Args, Debug)]
pub struct DumpArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Print both, key and cert.
    #[arg(long, env = "ARGOCD_AGENTCTL_ALL")]
    all: bool,
    /// Print the CA's private key (PKCS#8 PEM).
    #[arg(long, env = "ARGOCD_AGENTCTL_KEY")]
    key: bool,
    /// Print the CA's public certificate (PEM).
    #[arg(long, env = "ARGOCD_AGENTCTL_CERT")]
    cert: bool,
}

/// Arguments of `pki delete`.
#[derive(Args, Debug)]
pub struct DeleteArgs {
    #[command(flatten)]
    store: StoreArgs,
}

/// Arguments of `pki propagate`.
#[derive(Args, Debug)]
pub struct PropagateArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    agent: AgentClusterArgs,
    /// Replace the agent's existing CA Secret.
    #[arg(long, short = 'f', env = "ARGOCD_AGENTCTL_FORCE")]
    force: bool,
}

/// `pki dump`: the CA's certificate and/or key on stdout.
pub async fn dump(args: DumpArgs) -> Result<(), CliError> {
    let (cert, key) = (args.cert || args.all, args.key || args.all);
    if !cert && !key {
        return Err(CliError::usage(
            "one of --all, --key or --cert must be specified",
        ));
    }
    let ca = load_ca(&args.store.open().await?).await?;
    if cert {
        print!("{}", ca.cert_pem());
    }
    if key {
        print!("{}", ca.key_pem());
    }
    Ok(())
}

/// `pki delete`: removes the CA once the user typed `YES` (issued certificates stay valid until
/// they expire; nothing can be issued until `pki init` runs again).
pub async fn delete(args: DeleteArgs) -> Result<(), CliError> {
    let store = args.store.open().await?;
    let location = match &store {
        Store::Dir(dir) => dir.root().display().to_string(),
        Store::Secrets(s) => format!("secret {}/{CA_SECRET}", s.namespace()),
    };
    // Fails with "CA not initialised" (and what to run) when there is none.
    load_ca(&store).await?;
    if !confirm(
        &format!("Really delete CA in {location} (use uppercase YES to delete)? "),
        "YES",
    )? {
        return Err(CliError::runtime("Aborted."));
    }
    match &store {
        Store::Dir(dir) => {
            for file in [CA_CERT_FILE, CA_KEY_FILE] {
                let path = dir.root().join(file);
                std::fs::remove_file(&path).map_err(|e| {
                    CliError::runtime(format!("cannot delete {}: {e}", path.display()))
                })?;
            }
        }
        Store::Secrets(s) => {
            s.delete(CA_SECRET).await?;
        }
    }
    println!("CA successfully deleted.");
    Ok(())
}

/// `pki propagate`: the hub CA's certificate (never its key) as the agent's CA Secret on the
/// agent's cluster.
pub async fn propagate(args: PropagateArgs) -> Result<(), CliError> {
    let store = args.store.open().await?;
    let ca = load_ca(&store).await?;
    if !args.agent.given()? {
        return Err(CliError::usage(
            "give the agent's cluster with --agent-context (and --agent-kubeconfig unless $KUBECONFIG holds it); the CA and the agent cannot share a context",
        ));
    }
    if args.agent.agent_kubeconfig.is_none()
        && args.agent.target()?.context == args.store.target()?.context
    {
        return Err(CliError::usage(
            "PKI and agent cannot reside within the same context: --agent-context names the hub's",
        ));
    }
    let agent = args.agent.store().await?;
    if !args.force && agent.get(AGENT_CA_SECRET).await?.is_some() {
        return Err(CliError::usage(format!(
            "agent CA secret {}/{AGENT_CA_SECRET} already exists; delete it or pass --force to replace it",
            agent.namespace()
        )));
    }
    let outcome = agent.write_agent_ca(ca.cert_pem(), args.force).await?;
    println!(
        "Agent CA secret {}/{AGENT_CA_SECRET} {}",
        agent.namespace(),
        match outcome {
            WriteOutcome::Created => "created",
            WriteOutcome::Replaced => "replaced",
        }
    );
    Ok(())
}
