//! `argocd-agentctl config create|add|edit|delete|list`: edits the local config file of named
//! principals and agents ([`super::contexts`] owns its format and what the names select), with
//! upstream v0.9's command names, flags and messages.
//!
//! Owns the edits: every change is read, applied, validated with upstream's rules and written
//! back (a change that would make the file invalid is refused and nothing is written), and
//! `create`'s interactive walk over the kubeconfig's contexts. A missing file is an empty config
//! (upstream requires `config create` first). The entry flags (`--name`, `--context`,
//! `--namespace`) have no environment variables: `ARGOCD_AGENTCTL_CONTEXT`/`_NAMESPACE` already
//! name the hub for the other commands and must not leak into the file.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use super::contexts::{Component, ComponentConfig, LocalConfig};
use super::CliError;

/// `config` subcommands.
#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Create the config file interactively from the kubeconfig's contexts.
    Create(CreateArgs),
    /// Add a principal or agent.
    #[command(subcommand)]
    Add(EntryCommand<AddArgs>),
    /// Change a principal or agent.
    #[command(subcommand)]
    Edit(EntryCommand<EditArgs>),
    /// Remove a principal or agent.
    #[command(subcommand)]
    Delete(EntryCommand<DeleteArgs>),
    /// List the principals and agents.
    List(ListArgs),
}

/// `principal` or `agent`, with the same flags.
#[derive(Subcommand, Debug)]
pub enum EntryCommand<A: Args> {
    /// A principal.
    Principal(A),
    /// An agent.
    Agent(A),
}

impl<A: Args> EntryCommand<A> {
    fn split(self) -> (Component, A) {
        match self {
            Self::Principal(a) => (Component::Principal, a),
            Self::Agent(a) => (Component::Agent, a),
        }
    }
}

/// `config create` flags.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The kubeconfig whose contexts to walk through.
    #[arg(
        long,
        env = "ARGOCD_AGENTCTL_KUBECONFIG_PATH",
        value_name = "FILE",
        default_value_os_t = default_kubeconfig()
    )]
    kubeconfig_path: PathBuf,
    /// Where to write the config (default: the global --config).
    #[arg(long, env = "ARGOCD_AGENTCTL_OUTPUT_PATH", value_name = "FILE")]
    output_path: Option<PathBuf>,
}

fn default_kubeconfig() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_default();
    Path::new(&home).join(".kube/config")
}

/// `config add principal|agent` flags.
#[derive(Args, Debug)]
pub struct AddArgs {
    /// The symbolic name of the new entry.
    #[arg(long, value_name = "NAME")]
    name: String,
    /// Its kubeconfig context.
    #[arg(long, value_name = "NAME")]
    context: String,
    /// The namespace it is installed in.
    #[arg(long, value_name = "NS")]
    namespace: String,
    /// Make it the default principal (principals only).
    #[arg(long)]
    set_default: bool,
}

/// `config edit principal|agent` flags.
#[derive(Args, Debug)]
pub struct EditArgs {
    /// The symbolic name of the entry to change.
    #[arg(long, value_name = "NAME")]
    name: String,
    /// Its new kubeconfig context.
    #[arg(long, value_name = "NAME")]
    context: Option<String>,
    /// Its new namespace.
    #[arg(long, value_name = "NS")]
    namespace: Option<String>,
    /// Make it the default principal (principals only).
    #[arg(long)]
    set_default: bool,
}

/// `config delete principal|agent` flags.
#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// The symbolic name of the entry to remove.
    #[arg(long, value_name = "NAME")]
    name: String,
}

/// `config list [principal|agent]`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only principals or only agents.
    #[command(subcommand)]
    only: Option<ListOnly>,
}

/// What `config list` narrows to.
#[derive(Subcommand, Debug, Clone, Copy)]
pub enum ListOnly {
    /// List the principals (with which is the default).
    Principal,
    /// List the agents.
    Agent,
}

/// Runs a `config` command on the file at `path` (the global `--config`).
pub fn run(cmd: ConfigCommand, path: &Path) -> Result<(), CliError> {
    match cmd {
        ConfigCommand::Create(args) => {
            let kubeconfig =
                kube::config::Kubeconfig::read_from(&args.kubeconfig_path).map_err(|e| {
                    CliError::usage(format!(
                        "--kubeconfig-path {}: {e}",
                        args.kubeconfig_path.display()
                    ))
                })?;
            let names: Vec<String> = kubeconfig.contexts.into_iter().map(|c| c.name).collect();
            let stdin = std::io::stdin();
            let cfg = create(&names, &mut stdin.lock(), &mut std::io::stdout())?;
            let out = args.output_path.as_deref().unwrap_or(path);
            cfg.write(out)?;
            println!("Successfully wrote config to {}", out.display());
            Ok(())
        }
        ConfigCommand::Add(cmd) => {
            let (component, args) = cmd.split();
            update(path, |cfg| add(cfg, component, args))
        }
        ConfigCommand::Edit(cmd) => {
            let (component, args) = cmd.split();
            update(path, |cfg| edit(cfg, component, args))
        }
        ConfigCommand::Delete(cmd) => {
            let (component, args) = cmd.split();
            update(path, |cfg| delete(cfg, component, &args.name))
        }
        ConfigCommand::List(args) => {
            let cfg = LocalConfig::load(path)?;
            print!("{}", list(&cfg, args.only));
            Ok(())
        }
    }
}

/// Reads the file, applies `change`, validates and writes it; prints `change`'s message.
fn update(
    path: &Path,
    change: impl FnOnce(&mut LocalConfig) -> Result<String, CliError>,
) -> Result<(), CliError> {
    let mut cfg = LocalConfig::load(path)?;
    let message = change(&mut cfg)?;
    cfg.validate().map_err(CliError::usage)?;
    cfg.write(path)?;
    println!("{message}");
    Ok(())
}

fn set_default(
    cfg: &mut LocalConfig,
    component: Component,
    name: &str,
    set: bool,
) -> Result<(), CliError> {
    match (set, component) {
        (false, _) => Ok(()),
        (true, Component::Principal) => {
            cfg.default_principal = name.to_owned();
            Ok(())
        }
        (true, Component::Agent) => Err(CliError::usage(
            "--set-default applies to principals only: agents have no default",
        )),
    }
}

/// `config add`.
pub fn add(cfg: &mut LocalConfig, component: Component, args: AddArgs) -> Result<String, CliError> {
    let kind = component.as_str();
    if cfg.entries(component).contains_key(&args.name) {
        let article = if component == Component::Agent {
            "An"
        } else {
            "A"
        };
        return Err(CliError::usage(format!(
            "{article} {kind} with the name {} already exists",
            args.name
        )));
    }
    set_default(cfg, component, &args.name, args.set_default)?;
    cfg.entries_mut(component).insert(
        args.name.clone(),
        ComponentConfig {
            kube_context: args.context,
            namespace: args.namespace,
        },
    );
    Ok(format!("New {kind} {} added successfully", args.name))
}

fn missing(component: Component, name: &str) -> CliError {
    let kind = component.as_str();
    CliError::usage(format!("The {kind} {name} does not exist in the config"))
}

/// `config edit`.
pub fn edit(
    cfg: &mut LocalConfig,
    component: Component,
    args: EditArgs,
) -> Result<String, CliError> {
    set_default(cfg, component, &args.name, args.set_default)?;
    let entry = cfg
        .entries_mut(component)
        .get_mut(&args.name)
        .ok_or_else(|| missing(component, &args.name))?;
    if let Some(c) = args.context {
        entry.kube_context = c;
    }
    if let Some(n) = args.namespace {
        entry.namespace = n;
    }
    let kind = match component {
        Component::Principal => "Principal",
        Component::Agent => "Agent",
    };
    Ok(format!("{kind} {} updated successfully", args.name))
}

/// `config delete` (the default principal cannot be deleted, as upstream).
pub fn delete(cfg: &mut LocalConfig, component: Component, name: &str) -> Result<String, CliError> {
    if !cfg.entries(component).contains_key(name) {
        return Err(missing(component, name));
    }
    if component == Component::Principal && cfg.default_principal == name {
        return Err(CliError::usage(
            "Cannot delete the default principal (make another one the default with `config edit principal --set-default`)",
        ));
    }
    cfg.entries_mut(component).remove(name);
    let kind = match component {
        Component::Principal => "Principal",
        Component::Agent => "Agent",
    };
    Ok(format!("{kind} {name} deleted successfully"))
}

/// `config list`'s table (upstream's columns, entries sorted by name).
pub fn list(cfg: &LocalConfig, only: Option<ListOnly>) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let entries = |component| cfg.entries(component).iter();
    match only {
        None => {
            rows.push(vec![
                "COMPONENT".into(),
                "NAME".into(),
                "CONTEXT".into(),
                "NAMESPACE".into(),
            ]);
            for component in [Component::Principal, Component::Agent] {
                for (name, e) in entries(component) {
                    rows.push(vec![
                        component.as_str().into(),
                        name.clone(),
                        e.kube_context.clone(),
                        e.namespace.clone(),
                    ]);
                }
            }
        }
        Some(ListOnly::Principal) => {
            rows.push(vec![
                "NAME".into(),
                "CONTEXT".into(),
                "NAMESPACE".into(),
                "DEFAULT".into(),
            ]);
            for (name, e) in entries(Component::Principal) {
                let default = if *name == cfg.default_principal {
                    "X"
                } else {
                    ""
                };
                rows.push(vec![
                    name.clone(),
                    e.kube_context.clone(),
                    e.namespace.clone(),
                    default.into(),
                ]);
            }
        }
        Some(ListOnly::Agent) => {
            rows.push(vec!["NAME".into(), "CONTEXT".into(), "NAMESPACE".into()]);
            for (name, e) in entries(Component::Agent) {
                rows.push(vec![
                    name.clone(),
                    e.kube_context.clone(),
                    e.namespace.clone(),
                ]);
            }
        }
    }
    table(&rows)
}

/// Columns padded to their widest cell plus two spaces (Go's tabwriter as upstream sets it up).
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == columns {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:w$}  ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Asks `prompt` until `valid` accepts the trimmed answer; end of input is an error.
fn ask(
    input: &mut impl BufRead,
    out: &mut impl Write,
    prompt: &str,
    valid: impl Fn(&str) -> bool,
) -> Result<String, CliError> {
    loop {
        write!(out, "{prompt} ")
            .and_then(|()| out.flush())
            .map_err(|e| CliError::runtime(format!("writing the prompt: {e}")))?;
        let mut line = String::new();
        let n = input
            .read_line(&mut line)
            .map_err(|e| CliError::runtime(format!("reading the answer: {e}")))?;
        if n == 0 {
            return Err(CliError::usage("no answer: input ended"));
        }
        let answer = line.trim();
        if valid(answer) {
            return Ok(answer.to_owned());
        }
    }
}

/// `config create`'s questions: for each kubeconfig context whether it is a principal or an
/// agent (blank: skip), its namespace and symbolic name; then the default principal.
pub fn create(
    contexts: &[String],
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> Result<LocalConfig, CliError> {
    let one_word = |s: &str| !s.is_empty() && !s.contains(char::is_whitespace);
    let mut cfg = LocalConfig::default();
    for context in contexts {
        let kind = ask(
            input,
            out,
            &format!(
                "Found context {context}, is this a principal or agent? If is neither type leave blank to skip."
            ),
            |s| matches!(s, "principal" | "agent" | ""),
        )?;
        let component = match kind.as_str() {
            "principal" => Component::Principal,
            "agent" => Component::Agent,
            _ => continue,
        };
        let namespace = ask(
            input,
            out,
            &format!("Which namespace is the {kind} installed in?"),
            one_word,
        )?;
        let name = ask(
            input,
            out,
            &format!("What name would you like to use for this {kind}?"),
            |s| one_word(s) && !cfg.entries(component).contains_key(s),
        )?;
        cfg.entries_mut(component).insert(
            name,
            ComponentConfig {
                kube_context: context.clone(),
                namespace,
            },
        );
    }
    if !cfg.contexts.principals.is_empty() {
        for name in cfg.contexts.principals.keys() {
            writeln!(out, "> {name}").map_err(|e| CliError::runtime(e.to_string()))?;
        }
        cfg.default_principal = ask(
            input,
            out,
            "Which of the above principals do you want to use as the default?",
            |s| cfg.contexts.principals.contains_key(s),
        )?;
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add_args(name: &str, ctx: &str, ns: &str, set_default: bool) -> AddArgs {
        AddArgs {
            name: name.into(),
            context: ctx.into(),
            namespace: ns.into(),
            set_default,
        }
    }

    #[test]
    fn add_edit_delete_keep_the_file_valid() {
        let mut cfg = LocalConfig::default();
        add(
            &mut cfg,
            Component::Principal,
            add_args("hub1", "kind-hub1", "argocd", true),
        )
        .unwrap();
        add(
            &mut cfg,
            Component::Principal,
            add_args("hub2", "kind-hub2", "ops", false),
        )
        .unwrap();
        add(
            &mut cfg,
            Component::Agent,
            add_args("a1", "kind-a1", "argocd", false),
        )
        .unwrap();
        assert_eq!(cfg.default_principal, "hub1");
        let dup = add(&mut cfg, Component::Agent, add_args("a1", "x", "y", false)).unwrap_err();
        assert_eq!(dup.to_string(), "An agent with the name a1 already exists");
        let err = add(&mut cfg, Component::Agent, add_args("a2", "x", "y", true)).unwrap_err();
        assert!(err.to_string().contains("principals only"), "{err}");

        edit(
            &mut cfg,
            Component::Principal,
            EditArgs {
                name: "hub2".into(),
                context: None,
                namespace: Some("ops2".into()),
                set_default: true,
            },
        )
        .unwrap();
        assert_eq!(cfg.default_principal, "hub2");
        assert_eq!(cfg.contexts.principals["hub2"].kube_context, "kind-hub2");
        assert_eq!(cfg.contexts.principals["hub2"].namespace, "ops2");
        let err = delete(&mut cfg, Component::Principal, "hub2").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("Cannot delete the default principal"),
            "{err}"
        );
        delete(&mut cfg, Component::Principal, "hub1").unwrap();
        let err = delete(&mut cfg, Component::Agent, "nope").unwrap_err();
        assert_eq!(
            err.to_string(),
            "The agent nope does not exist in the config"
        );
        assert_eq!(cfg.validate(), Ok(()));
    }

    #[test]
    fn update_refuses_a_change_that_makes_the_file_invalid_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.conf");
        update(&path, |cfg| {
            add(cfg, Component::Agent, add_args("a", "ctx", "ns", false))
        })
        .unwrap();
        let before = std::fs::read_to_string(&path).unwrap();
        let err = update(&path, |cfg| {
            add(cfg, Component::Principal, add_args("p", "ctx", "", false))
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config: principal p has blank namespace"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
    }

    #[test]
    fn list_shows_upstreams_columns_sorted() {
        let cfg = LocalConfig::parse(
            "contexts:\n  principals:\n    zeta: {kube-context: kz, namespace: n1}\n    alpha: {kube-context: ka, namespace: n2}\n  agents:\n    ag: {kube-context: kg, namespace: n3}\ndefault-principal: zeta\n",
        )
        .unwrap();
        assert_eq!(
            list(&cfg, None),
            "COMPONENT  NAME   CONTEXT  NAMESPACE\n\
             principal  alpha  ka       n2\n\
             principal  zeta   kz       n1\n\
             agent      ag     kg       n3\n"
        );
        assert_eq!(
            list(&cfg, Some(ListOnly::Principal)),
            "NAME   CONTEXT  NAMESPACE  DEFAULT\nalpha  ka       n2\nzeta   kz       n1         X\n"
        );
        assert_eq!(
            list(&cfg, Some(ListOnly::Agent)),
            "NAME  CONTEXT  NAMESPACE\nag    kg       n3\n"
        );
    }

    #[test]
    fn create_walks_the_contexts_and_reasks_invalid_answers() {
        let contexts = [
            "kind-hub".to_owned(),
            "kind-other".to_owned(),
            "kind-spoke".to_owned(),
        ];
        // hub: a principal; other: skipped; spoke: "both" is re-asked, then an agent whose
        // namespace "two words" is re-asked; then the default principal ("x" re-asked).
        let answers = "principal\nargocd\nhub\n\nboth\nagent\ntwo words\nagents\nspoke\nx\nhub\n";
        let mut out = Vec::new();
        let cfg = create(&contexts, &mut answers.as_bytes(), &mut out).unwrap();
        assert_eq!(cfg.default_principal, "hub");
        assert_eq!(cfg.contexts.principals["hub"].kube_context, "kind-hub");
        assert_eq!(cfg.contexts.agents["spoke"].namespace, "agents");
        assert_eq!(cfg.contexts.agents.len(), 1);
        let err = create(&contexts, &mut "principal\n".as_bytes(), &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("input ended"), "{err}");
    }
}
