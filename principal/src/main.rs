//! `argocd-principal` binary entry point: flags/env → validated config → logging → run.
//!
//! Exit codes: 0 after a clean shutdown, 2 for bad usage or configuration (clap's own errors, or
//! `error: <message>` naming the flag and env var), 1 for a runtime failure.

use std::process::ExitCode;

use argocd_agent_principal::app;
use argocd_agent_principal::config::PrincipalArgs;
use argocd_agent_runtime::process_args::TlsPolicyArgs;
use argocd_agent_runtime::telemetry::init_logging;

#[tokio::main]
async fn main() -> ExitCode {
    let args = PrincipalArgs::from_env_and_args();
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
        .map(|address| (address, "argocd-principal"));
    let _trace_export = match init_logging(config.log_format, &config.log_level, otlp) {
        Ok(export) => export,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match app::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "argocd-principal failed");
            ExitCode::FAILURE
        }
    }
}
