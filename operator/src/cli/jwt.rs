//! `argocd-agentctl jwt`: create and inspect the principal's JWT signing key.

use clap::{Args, Subcommand};

use super::{CliError, OutputArgs, OutputFormat, Store, StoreArgs};
use crate::pki::jwt::{generate_jwt_signing_key, inspect_jwt_key, JwtKeyAlgorithm};
use crate::pki::secrets;

/// `jwt` subcommands.
#[derive(Subcommand, Debug)]
pub enum JwtCommand {
    /// Generate a signing key (jwt.key in --dir, or secret argocd-agent-jwt key jwt.key).
    CreateKey(CreateKeyArgs),
    /// Show the type and public-key fingerprint of the signing key.
    InspectKey(InspectKeyArgs),
    /// Delete the signing key (every issued token becomes invalid); asks unless --force.
    DeleteKey(DeleteKeyArgs),
}

/// Arguments of `jwt delete-key`.
#[derive(Args, Debug)]
pub struct DeleteKeyArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Force deletion without confirmation.
    #[arg(long, short = 'f', env = "ARGOCD_AGENTCTL_FORCE")]
    force: bool,
}

/// Arguments of `jwt create-key`.
#[derive(Args, Debug)]
pub struct CreateKeyArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Key type: es256 (default), rsa2048, rsa3072 or rsa4096 (upstream uses RSA-4096).
    #[arg(long, env = "ARGOCD_AGENTCTL_ALGORITHM", default_value = "es256", value_parser = parse_algorithm)]
    algorithm: JwtKeyAlgorithm,
    /// Replace an existing key (every issued token becomes invalid).
    #[arg(
        long,
        short = 'f',
        visible_alias = "upsert",
        env = "ARGOCD_AGENTCTL_FORCE"
    )]
    force: bool,
}

/// Arguments of `jwt inspect-key`.
#[derive(Args, Debug)]
pub struct InspectKeyArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    out: OutputArgs,
}

fn parse_algorithm(s: &str) -> Result<JwtKeyAlgorithm, String> {
    s.parse()
}

/// Run a `jwt` subcommand.
pub async fn run(cmd: JwtCommand) -> Result<(), CliError> {
    match cmd {
        JwtCommand::CreateKey(args) => create_key(args).await,
        JwtCommand::InspectKey(args) => inspect_key(args).await,
        JwtCommand::DeleteKey(args) => delete_key(args).await,
    }
}

async fn delete_key(args: DeleteKeyArgs) -> Result<(), CliError> {
    let store = args.store.open().await?;
    if !args.force
        && !super::confirm(
            "Are you sure you want to delete the JWT signing key? [y/N]: ",
            "y",
        )?
    {
        println!("Aborted.");
        return Ok(());
    }
    let (location, deleted) = match &store {
        Store::Dir(dir) => {
            let path = dir.jwt_key_path();
            let deleted = match std::fs::remove_file(&path) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => {
                    return Err(CliError::runtime(format!(
                        "cannot delete {}: {e}",
                        path.display()
                    )))
                }
            };
            (path.display().to_string(), deleted)
        }
        Store::Secrets(s) => (
            format!("secret {}/{}", s.namespace(), secrets::JWT_SECRET),
            s.delete(secrets::JWT_SECRET).await?,
        ),
    };
    if deleted {
        println!("JWT signing key {location} deleted successfully.");
    } else {
        println!("JWT signing key {location} does not exist.");
    }
    Ok(())
}

async fn create_key(args: CreateKeyArgs) -> Result<(), CliError> {
    let store = args.store.open().await?;
    // Check before spending seconds on an RSA key that would not be written.
    if let (Store::Dir(dir), false) = (&store, args.force) {
        if dir.jwt_key_path().exists() {
            return Err(crate::pki::PkiError::AlreadyExists {
                location: dir.jwt_key_path().display().to_string(),
            }
            .into());
        }
    }
    let pem = generate_jwt_signing_key(args.algorithm)?;
    let info = inspect_jwt_key(&pem)?;
    let target = match &store {
        Store::Dir(dir) => dir.store_jwt_key(&pem, args.force)?.display().to_string(),
        Store::Secrets(s) => {
            let outcome = s
                .write(&secrets::jwt_secret(s.namespace(), &pem), args.force)
                .await?;
            format!(
                "secret {}/{} key {} ({})",
                s.namespace(),
                secrets::JWT_SECRET,
                secrets::JWT_KEY_KEY,
                match outcome {
                    secrets::WriteOutcome::Created => "created",
                    secrets::WriteOutcome::Replaced => "replaced",
                }
            )
        }
    };
    println!(
        "JWT signing key ({} {}-bit, for {}; public key SHA-256 {}) written to {target}",
        info.key_type, info.bits, info.jwt_algorithm, info.public_key_sha256
    );
    Ok(())
}

async fn inspect_key(args: InspectKeyArgs) -> Result<(), CliError> {
    let store = args.store.open().await?;
    let pem = match &store {
        Store::Dir(dir) => {
            let path = dir.jwt_key_path();
            std::fs::read_to_string(&path)
                .map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?
        }
        Store::Secrets(s) => {
            let secret = s.get(secrets::JWT_SECRET).await?.ok_or_else(|| {
                CliError::usage(format!(
                    "secret {}/{} not found; create it with `argocd-agentctl jwt create-key`",
                    s.namespace(),
                    secrets::JWT_SECRET
                ))
            })?;
            secrets::secret_text(&secret, secrets::JWT_KEY_KEY)?
        }
    };
    let info = inspect_jwt_key(&pem)?;
    match args.out.output {
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&info)
                .map_err(|e| CliError::runtime(format!("encoding JSON: {e}")))?
        ),
        OutputFormat::Text => println!(
            "Key type:    {} {}-bit\nAlgorithm:   {}\nPublic key SHA-256: {}",
            info.key_type, info.bits, info.jwt_algorithm, info.public_key_sha256
        ),
    }
    Ok(())
}
