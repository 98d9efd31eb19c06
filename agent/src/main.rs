//! `argocd-agent` binary entry point: flags/env → validated config → logging → run.
//!
//! Exit codes: 0 after a clean shutdown, 2 for bad usage or configuration (clap's own errors, or
//! `error: <message>` naming the flag and env var; also unusable certificate or kubeconfig files
//! and an unusable queue directory), 1 for a runtime failure.

use std::process::ExitCode;

use argocd_agent_agent::app;
use argocd_agent_agent::config::AgentArgs;
use argocd_agent_runtime::process_args::TlsPolicyArgs;
use argocd_agent_runtime::telemetry::init_logging;

#[tokio::main]
async fn main() -> ExitCode {
    let args = AgentArgs::from_env_and_args();
    if args.tls_policy.wants_suite_list() {
        TlsPolicyArgs::print_suite_list();
        return ExitCode::SUCCESS;
    }
    let config = match args.validate() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let otlp = config
        .otlp_address
        .as_deref()
        .map(|address| (address, "argocd-agent"));
    let _trace_export = match init_logging(config.log_format, &config.log_level, otlp) {
        Ok(export) => export,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match app::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<app::ConfigProblem>().is_some() => {
            tracing::error!(error = format!("{e:#}"), "argocd-agent cannot start");
            ExitCode::from(2)
        }
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "argocd-agent failed");
            ExitCode::FAILURE
        }
    }
}
