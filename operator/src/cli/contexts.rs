//! argocd-agentctl's local config file of named principals and agents (upstream's `ctl.conf`),
//! and which kube context and namespace a command acts on.
//!
//! Owns:
//! - the file's format and location: upstream v0.9's `cmd/ctl/config.go`, so a file either CLI
//!   wrote works with the other (`contexts.principals|agents.NAME.{kube-context,namespace}`,
//!   `default-principal`; `--config`, default `~/.config/argocd-agent/ctl.conf`; written with mode
//!   0600). A missing file is an empty config; a malformed one is an error naming the file and
//!   line; an invalid one (a blank name, kube-context or namespace, a default principal that is not
//!   listed) is refused with upstream's message (upstream warns and ignores the whole file, which
//!   silently sends the command to the current kube context instead);
//! - the precedence that picks a principal's (or agent's) kube context and namespace, per field:
//!   the command's flag, else its environment variable (clap), else the entry selected with the
//!   global `--principal NAME` (`--agent NAME`), else the file's `default-principal` (principals
//!   only, as upstream), else the current kube context and namespace `argocd`. As upstream, a
//!   context given by flag or environment replaces the selected entry as a whole (its namespace
//!   then comes from the namespace flag or `argocd`): the entry describes another cluster. Unlike
//!   upstream, a namespace flag alone overrides the entry's namespace (upstream drops it).
//!
//! The selection (global flags and the file's contents) is made once per process by [`select`];
//! the commands' argument structs ask [`principal`] and [`agent`] for their target.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Deserializer, Serialize};

use super::CliError;

/// Namespace a component is assumed to be installed in when nothing says otherwise.
pub const DEFAULT_NAMESPACE: &str = "argocd";

/// One principal or agent: the kube context of its cluster and the namespace it runs in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentConfig {
    /// Kubeconfig context of the component's cluster.
    #[serde(rename = "kube-context", default, deserialize_with = "null_default")]
    pub kube_context: String,
    /// Namespace the component is installed in.
    #[serde(default, deserialize_with = "null_default")]
    pub namespace: String,
}

/// The named principals and agents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contexts {
    /// Principals by symbolic name.
    #[serde(default, deserialize_with = "null_default")]
    pub principals: BTreeMap<String, ComponentConfig>,
    /// Agents by symbolic name.
    #[serde(default, deserialize_with = "null_default")]
    pub agents: BTreeMap<String, ComponentConfig>,
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalConfig {
    /// Named principals and agents.
    #[serde(default, deserialize_with = "null_default")]
    pub contexts: Contexts,
    /// The principal commands act on when no `--principal` is given ("" for none).
    #[serde(
        rename = "default-principal",
        default,
        deserialize_with = "null_default"
    )]
    pub default_principal: String,
}

/// A YAML `null` (e.g. `principals:` with nothing under it) reads as the empty value, as Go's
/// yaml.v3 does.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Which side of the agent/principal pair an entry describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    /// A principal (hub).
    Principal,
    /// An agent (spoke).
    Agent,
}

impl Component {
    /// `principal` or `agent`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Principal => "principal",
            Self::Agent => "agent",
        }
    }
}

/// `~/.config/argocd-agent/ctl.conf` (upstream's default), from `$HOME` as Go's
/// `os.UserHomeDir`.
pub fn default_path() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_default();
    Path::new(&home).join(".config/argocd-agent/ctl.conf")
}

impl LocalConfig {
    /// Reads `path`: a missing file is an empty config; unreadable or malformed YAML is a usage
    /// error naming the file (and the line).
    pub fn load(path: &Path) -> Result<Self, CliError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => {
                return Err(CliError::usage(format!(
                    "reading config {}: {e}",
                    path.display()
                )))
            }
        };
        Self::parse(&text).map_err(|e| CliError::usage(format!("config {}: {e}", path.display())))
    }

    /// Parses the file's text (empty text is an empty config, as Go's yaml.Unmarshal).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        serde_norway::from_str(text).map_err(|e| match e.location() {
            Some(at) => format!("line {} column {}: {e}", at.line(), at.column()),
            None => e.to_string(),
        })
    }

    /// Upstream's `validateConfig`: no blank names, kube-contexts or namespaces; the default
    /// principal, if any, is listed.
    pub fn validate(&self) -> Result<(), String> {
        for (component, entries) in [
            (Component::Agent, &self.contexts.agents),
            (Component::Principal, &self.contexts.principals),
        ] {
            let kind = component.as_str();
            for (name, c) in entries {
                if name.is_empty() {
                    return Err(format!("invalid config: {kind} name cannot be empty"));
                }
                if c.kube_context.is_empty() {
                    return Err(format!(
                        "invalid config: {kind} {name} has blank kube-context"
                    ));
                }
                if c.namespace.is_empty() {
                    return Err(format!("invalid config: {kind} {name} has blank namespace"));
                }
            }
        }
        if !self.default_principal.is_empty()
            && !self
                .contexts
                .principals
                .contains_key(&self.default_principal)
        {
            return Err(format!(
                "invalid config: the default principal {} does not exist in principal contexts",
                self.default_principal
            ));
        }
        Ok(())
    }

    /// Writes the file (creating its directory), readable by the owner only.
    pub fn write(&self, path: &Path) -> Result<(), CliError> {
        let err = |e: std::io::Error| {
            CliError::runtime(format!("writing config {}: {e}", path.display()))
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let text = serde_norway::to_string(self)
            .map_err(|e| CliError::runtime(format!("encoding config: {e}")))?;
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(err)?;
        f.write_all(text.as_bytes()).map_err(err)
    }

    /// The entries of one component kind.
    pub fn entries(&self, component: Component) -> &BTreeMap<String, ComponentConfig> {
        match component {
            Component::Principal => &self.contexts.principals,
            Component::Agent => &self.contexts.agents,
        }
    }

    /// The entries of one component kind, to change.
    pub fn entries_mut(&mut self, component: Component) -> &mut BTreeMap<String, ComponentConfig> {
        match component {
            Component::Principal => &mut self.contexts.principals,
            Component::Agent => &mut self.contexts.agents,
        }
    }

    /// The entry `name` selects (`None`: the default principal for principals, none for
    /// agents); an unknown name is an error listing the known ones.
    pub fn selected(
        &self,
        component: Component,
        name: Option<&str>,
    ) -> Result<Option<&ComponentConfig>, String> {
        let entries = self.entries(component);
        let kind = component.as_str();
        match name {
            Some(name) => entries.get(name).map(Some).ok_or_else(|| {
                let known: Vec<&str> = entries.keys().map(String::as_str).collect();
                format!(
                    "{kind} {name:?} does not exist in the config (known {kind}s: {}); add it with `argocd-agentctl config add {kind}`",
                    if known.is_empty() { "none".to_owned() } else { known.join(", ") }
                )
            }),
            None if component == Component::Principal && !self.default_principal.is_empty() => {
                Ok(entries.get(&self.default_principal))
            }
            None => Ok(None),
        }
    }
}

/// What a command acts on: a kube context (`None`: the kubeconfig's current one) and a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Kubeconfig context.
    pub context: Option<String>,
    /// Namespace of the component.
    pub namespace: String,
}

/// The precedence (module doc): flags (already merged with their environment variables by clap)
/// over the selected entry over the defaults.
pub fn resolve(
    entry: Option<&ComponentConfig>,
    flag_context: Option<&str>,
    flag_namespace: Option<&str>,
) -> Target {
    let entry = entry.filter(|_| flag_context.is_none());
    Target {
        context: flag_context
            .map(str::to_owned)
            .or_else(|| entry.map(|e| e.kube_context.clone())),
        namespace: flag_namespace
            .map(str::to_owned)
            .or_else(|| entry.map(|e| e.namespace.clone()))
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned()),
    }
}

/// The global flags that select entries of the config file.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// The config file.
    pub config: PathBuf,
    /// `--principal NAME`.
    pub principal: Option<String>,
    /// `--agent NAME`.
    pub agent: Option<String>,
}

/// The selected entries, or why there are none (reported when a command needs one).
#[derive(Debug)]
struct Selected {
    principal: Result<Option<ComponentConfig>, String>,
    agent: Result<Option<ComponentConfig>, String>,
}

impl Default for Selected {
    fn default() -> Self {
        Self {
            principal: Ok(None),
            agent: Ok(None),
        }
    }
}

static SELECTED: OnceLock<Selected> = OnceLock::new();

/// Reads the config file and records the selected entries for this process. Errors (malformed
/// or invalid file, unknown name) surface when a command asks for a target, so commands that
/// need no cluster (`pki ... --dir`) are not stopped by a broken config.
pub fn select(selection: &Selection) {
    let loaded = LocalConfig::load(&selection.config).and_then(|cfg| {
        cfg.validate()
            .map(|()| cfg)
            .map_err(|e| CliError::usage(format!("config {}: {e}", selection.config.display())))
    });
    let pick = |component, name: Option<&str>| match &loaded {
        Ok(cfg) => cfg
            .selected(component, name)
            .map(|e| e.cloned())
            .map_err(|e| format!("config {}: {e}", selection.config.display())),
        Err(e) => Err(e.to_string()),
    };
    let selected = Selected {
        principal: pick(Component::Principal, selection.principal.as_deref()),
        agent: pick(Component::Agent, selection.agent.as_deref()),
    };
    // A second call (tests running several commands in one process) keeps the first selection.
    let _ = SELECTED.set(selected);
}

fn target(
    entry: &Result<Option<ComponentConfig>, String>,
    flag_context: Option<&str>,
    flag_namespace: Option<&str>,
) -> Result<Target, CliError> {
    match entry {
        // A context flag replaces the entry: the config is not needed.
        _ if flag_context.is_some() => Ok(resolve(None, flag_context, flag_namespace)),
        Ok(e) => Ok(resolve(e.as_ref(), flag_context, flag_namespace)),
        Err(e) => Err(CliError::usage(e.clone())),
    }
}

/// The principal (hub) a command acts on, from its flags and the selection.
pub fn principal(
    flag_context: Option<&str>,
    flag_namespace: Option<&str>,
) -> Result<Target, CliError> {
    let selected = SELECTED.get_or_init(Selected::default);
    target(&selected.principal, flag_context, flag_namespace)
}

/// The agent (spoke) a command acts on, from its flags and the selection.
pub fn agent(flag_context: Option<&str>, flag_namespace: Option<&str>) -> Result<Target, CliError> {
    let selected = SELECTED.get_or_init(Selected::default);
    target(&selected.agent, flag_context, flag_namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file as upstream's `config create`/`config add` write it (yaml.v3, indent 2), with the
    /// shapes of upstream's config_test.go.
    const UPSTREAM_FILE: &str = "\
contexts:
  principals:
    test-principal:
      kube-context: kind-test-principal
      namespace: argocd
    test-principal-aws:
      kube-context: eks-test-principal
      namespace: argocd
  agents:
    test-agent:
      kube-context: kind-test-agent
      namespace: argocd
    test-agent-on-prem:
      kube-context: test-agent
      namespace: argocd
default-principal: test-principal-aws
";

    fn entry(ctx: &str, ns: &str) -> ComponentConfig {
        ComponentConfig {
            kube_context: ctx.into(),
            namespace: ns.into(),
        }
    }

    fn upstream() -> LocalConfig {
        LocalConfig::parse(UPSTREAM_FILE).unwrap()
    }

    #[test]
    fn reads_a_file_in_upstreams_format() {
        let cfg = upstream();
        assert_eq!(cfg.default_principal, "test-principal-aws");
        assert_eq!(
            cfg.contexts.principals["test-principal"],
            entry("kind-test-principal", "argocd")
        );
        assert_eq!(
            cfg.contexts.agents["test-agent-on-prem"],
            entry("test-agent", "argocd")
        );
        assert_eq!(cfg.validate(), Ok(()));
    }

    #[test]
    fn nulls_and_empty_files_read_as_empty_as_go_does() {
        assert_eq!(LocalConfig::parse("").unwrap(), LocalConfig::default());
        let cfg =
            LocalConfig::parse("contexts:\n  principals:\n  agents: {}\ndefault-principal:\n")
                .unwrap();
        assert_eq!(cfg, LocalConfig::default());
    }

    #[test]
    fn file_round_trips_through_write_and_load_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/dir/ctl.conf");
        let cfg = upstream();
        cfg.write(&path).unwrap();
        assert_eq!(LocalConfig::load(&path).unwrap(), cfg);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // What we write is what upstream writes: its keys, block style.
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, UPSTREAM_FILE);
    }

    #[test]
    fn missing_file_is_empty_malformed_file_names_path_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.conf");
        assert_eq!(LocalConfig::load(&path).unwrap(), LocalConfig::default());
        std::fs::write(
            &path,
            "contexts:\n  principals:\n    hub:\n      kube-context: [not, a, string]\n",
        )
        .unwrap();
        let err = LocalConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("line 4"), "{err}");
    }

    #[test]
    fn validation_has_upstreams_rules() {
        type Case = (&'static str, fn(&mut LocalConfig), Option<&'static str>);
        let cases: [Case; 6] = [
            ("valid", |_| {}, None),
            (
                "blank agent kube-context",
                |c| {
                    c.contexts
                        .agents
                        .get_mut("test-agent")
                        .unwrap()
                        .kube_context
                        .clear()
                },
                Some("agent test-agent has blank kube-context"),
            ),
            (
                "blank principal namespace",
                |c| {
                    c.contexts
                        .principals
                        .get_mut("test-principal")
                        .unwrap()
                        .namespace
                        .clear()
                },
                Some("principal test-principal has blank namespace"),
            ),
            (
                "blank agent name",
                |c| {
                    c.contexts.agents.insert(String::new(), entry("x", "y"));
                },
                Some("agent name cannot be empty"),
            ),
            (
                "blank principal name",
                |c| {
                    c.contexts.principals.insert(String::new(), entry("x", "y"));
                },
                Some("principal name cannot be empty"),
            ),
            (
                "unknown default principal",
                |c| c.default_principal = "nope".into(),
                Some("the default principal nope does not exist"),
            ),
        ];
        for (name, change, want) in cases {
            let mut cfg = upstream();
            change(&mut cfg);
            match (cfg.validate(), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => assert!(e.contains(w), "{name}: {e}"),
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// Upstream's TestDetermineConfigs, plus the per-field namespace rule.
    #[test]
    fn precedence_flag_over_named_entry_over_default_principal_over_defaults() {
        let cfg = upstream();
        let p = |name: Option<&str>, ctx, ns| {
            resolve(cfg.selected(Component::Principal, name).unwrap(), ctx, ns)
        };
        let a = |name: Option<&str>, ctx, ns| {
            resolve(cfg.selected(Component::Agent, name).unwrap(), ctx, ns)
        };
        let t = |ctx: Option<&str>, ns: &str| Target {
            context: ctx.map(str::to_owned),
            namespace: ns.into(),
        };
        // Flags are highest.
        assert_eq!(
            p(
                Some("test-principal"),
                Some("elsewhere"),
                Some("not-argocd")
            ),
            t(Some("elsewhere"), "not-argocd")
        );
        // A context flag replaces the entry as a whole: its namespace is the default's.
        assert_eq!(
            p(Some("test-principal"), Some("elsewhere"), None),
            t(Some("elsewhere"), "argocd")
        );
        // The named entry.
        assert_eq!(
            p(Some("test-principal"), None, None),
            t(Some("kind-test-principal"), "argocd")
        );
        assert_eq!(
            a(Some("test-agent"), None, None),
            t(Some("kind-test-agent"), "argocd")
        );
        // A namespace flag alone overrides the entry's namespace only.
        assert_eq!(
            p(Some("test-principal"), None, Some("ns2")),
            t(Some("kind-test-principal"), "ns2")
        );
        // Nothing named: the default principal; agents have no default.
        assert_eq!(p(None, None, None), t(Some("eks-test-principal"), "argocd"));
        assert_eq!(a(None, None, None), t(None, "argocd"));
        // No config at all: current context, namespace argocd.
        assert_eq!(resolve(None, None, None), t(None, "argocd"));
    }

    #[test]
    fn unknown_name_is_an_error_listing_the_known_ones() {
        let err = upstream()
            .selected(Component::Principal, Some("hub9"))
            .unwrap_err();
        assert!(err.contains("principal \"hub9\" does not exist"), "{err}");
        assert!(err.contains("test-principal, test-principal-aws"), "{err}");
        let err = LocalConfig::default()
            .selected(Component::Agent, Some("a"))
            .unwrap_err();
        assert!(err.contains("known agents: none"), "{err}");
    }

    #[test]
    fn a_broken_selection_fails_only_commands_that_need_the_config() {
        let broken: Result<Option<ComponentConfig>, String> = Err("config x: line 1".into());
        assert!(target(&broken, None, None).is_err());
        assert!(target(&broken, None, Some("ns")).is_err());
        assert_eq!(
            target(&broken, Some("ctx"), Some("ns")).unwrap(),
            Target {
                context: Some("ctx".into()),
                namespace: "ns".into()
            }
        );
    }
}
