//! `argocd-agentctl`: PKI, JWT signing keys and agent registration for argocd-agent.
//!
//! Parses the command line (clap; usage errors exit 2), sets up logging on stderr and runs
//! the command from `argocd_agent_operator::cli`, mapping its error to exit code 2 (bad usage
//! or configuration) or 1 (runtime failure).

use std::process::ExitCode;

use anyhow::Context;
use argocd_agent_operator::cli::{self, Cli};
use clap::Parser;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level).unwrap_or_else(|e| {
        eprintln!("error: --log-level {:?}: {e}", cli.log_level);
        std::process::exit(i32::from(cli::EXIT_USAGE));
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let cli = match cli.command {
        cli::Command::Wrap(args) => return argocd_agent_operator::wrap::run_wrap(args),
        _ => cli,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(cli::EXIT_RUNTIME);
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
