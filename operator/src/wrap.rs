//! `argocd-agentctl wrap`: renders every Kubernetes object in a folder (or in YAML piped on
//! stdin, e.g. `kustomize build . | argocd-agentctl wrap --cluster c1 --name app -`) into one
//! OCM ManifestWork on stdout. Usable as the `generate` command of an Argo CD config management
//! plugin (argocd-cmp-server beside the hub's repo-server, `charts/cmp/plugin.yaml`), so Argo CD on
//! the hub creates ManifestWorks and no Argo CD runs on the spoke: then the cluster and the work's
//! name come from what Argo CD gives a plugin ([`PluginEnv`]) when no flag names them.
//!
//! Owns reading the input (nested folders in a stable order; `.yaml`, `.yml` and `.json` files;
//! hidden entries and `kustomization.yaml` skipped), splitting multi-document YAML, checking that
//! each document is a Kubernetes object (errors name the file and line), expanding `v1` `List`s,
//! rejecting duplicates and oversized works, and the ManifestWork's YAML.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Value};

/// OCM rejects ManifestWorks whose manifests exceed this many bytes (its webhook's limit).
pub const MANIFEST_SIZE_LIMIT: usize = 500 * 1024;
/// File names holding kustomize configuration rather than Kubernetes objects.
const KUSTOMIZATION_FILES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// Where the manifests come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WrapInput {
    /// A folder (searched recursively) or a single file.
    Path(PathBuf),
    /// YAML text already read (stdin), with the name used in error messages.
    Text {
        /// Shown in errors, e.g. `<stdin>`.
        name: String,
        /// The YAML.
        text: String,
    },
}

impl WrapInput {
    /// `-` reads stdin; anything else is a path.
    pub fn from_source(source: &str) -> Result<WrapInput, WrapError> {
        if source == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| WrapError::Read {
                    path: "<stdin>".into(),
                    source: e,
                })?;
            return Ok(WrapInput::Text {
                name: "<stdin>".into(),
                text,
            });
        }
        Ok(WrapInput::Path(PathBuf::from(source)))
    }

    fn describe(&self) -> String {
        match self {
            WrapInput::Path(p) => p.display().to_string(),
            WrapInput::Text { name, .. } => name.clone(),
        }
    }
}

/// Why wrapping failed. Every variant names the input at fault.
#[derive(Debug, thiserror::Error)]
pub enum WrapError {
    /// A file or folder could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// YAML syntax error.
    #[error("{file}:{line}: invalid YAML: {message}")]
    InvalidYaml {
        /// The file.
        file: String,
        /// 1-based line.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// A document that is not a Kubernetes object.
    #[error("{file}:{line}: not a Kubernetes object: {reason}")]
    NotAnObject {
        /// The file.
        file: String,
        /// 1-based line where the document starts.
        line: usize,
        /// What is missing or wrong.
        reason: String,
    },
    /// The same object twice.
    #[error("{file}:{line}: duplicate {object}, first defined at {first}")]
    Duplicate {
        /// The file.
        file: String,
        /// 1-based line where the document starts.
        line: usize,
        /// `kind namespace/name`.
        object: String,
        /// `file:line` of the first definition.
        first: String,
    },
    /// Nothing to wrap.
    #[error("no Kubernetes manifests found in {input} (looked for .yaml, .yml and .json files)")]
    Empty {
        /// The input.
        input: String,
    },
    /// `--cluster` is not a namespace name.
    #[error("invalid --cluster {0:?}: a ManagedCluster name must be a DNS-1123 label (lowercase letters, digits, '-', at most 63)")]
    InvalidCluster(String),
    /// `--name` is not an object name.
    #[error("invalid --name {0:?}: a ManifestWork name must be a DNS-1123 subdomain (lowercase letters, digits, '-', '.', at most 253)")]
    InvalidName(String),
    /// Neither a flag nor the plugin environment names it.
    #[error("no {what} given: pass {how}")]
    Missing {
        /// What is missing.
        what: &'static str,
        /// Where it can come from.
        how: &'static str,
    },
    /// Over OCM's size limit.
    #[error("the manifests from {input} take {size} bytes; OCM accepts at most {MANIFEST_SIZE_LIMIT} bytes per ManifestWork: split the folder")]
    TooLarge {
        /// The input.
        input: String,
        /// Their size.
        size: usize,
    },
}

impl WrapError {
    /// Process exit code: 2 for bad input or usage, 1 for I/O failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            WrapError::Read { source, .. } if source.kind() != std::io::ErrorKind::NotFound => 1,
            _ => 2,
        }
    }
}

/// One object with where it came from.
#[derive(Clone, Debug)]
struct Located {
    file: String,
    line: usize,
    object: Value,
}

/// Splits multi-document YAML at `---` lines and returns each non-empty document with its
/// 1-based start line.
fn split_documents(text: &str) -> Vec<(usize, String)> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    for (index, line) in text.lines().enumerate() {
        let is_separator = line
            .strip_prefix("---")
            .is_some_and(|rest| rest.trim().is_empty() || rest.trim_start().starts_with('#'));
        let is_end = line.trim_end() == "...";
        if is_separator || is_end {
            docs.push((start, std::mem::take(&mut current)));
            start = index + 2;
            continue;
        }
        // Leading blank and comment lines are dropped, so a document starts at its first content
        // line (what errors point at) and parser line numbers stay relative to it.
        let is_filler = line.trim().is_empty() || line.trim_start().starts_with('#');
        if current.is_empty() && is_filler {
            start = index + 2;
            continue;
        }
        current.push_str(line);
        current.push('\n');
    }
    docs.push((start, current));
    docs.into_iter().filter(|(_, d)| !d.is_empty()).collect()
}

/// Parses the documents of one file into Kubernetes objects (`v1` `List`s expanded).
fn parse_file(file: &str, text: &str) -> Result<Vec<Located>, WrapError> {
    let mut out = Vec::new();
    for (start, doc) in split_documents(text) {
        let value: Value = serde_norway::from_str(&doc).map_err(|e| WrapError::InvalidYaml {
            file: file.to_string(),
            line: start + e.location().map(|l| l.line()).unwrap_or(1) - 1,
            message: strip_location(&e.to_string()),
        })?;
        if value.is_null() {
            continue;
        }
        let not_object = |reason: String| WrapError::NotAnObject {
            file: file.to_string(),
            line: start,
            reason,
        };
        check_object(&value).map_err(not_object)?;
        if value["apiVersion"] == "v1" && value["kind"] == "List" {
            let items = value
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for (i, item) in items.into_iter().enumerate() {
                check_object(&item).map_err(|r| not_object(format!("List item {i}: {r}")))?;
                out.push(Located {
                    file: file.to_string(),
                    line: start,
                    object: item,
                });
            }
            continue;
        }
        out.push(Located {
            file: file.to_string(),
            line: start,
            object: value,
        });
    }
    Ok(out)
}

/// The YAML parser's message ends in " at line X column Y"; the error already carries the absolute
/// line.
fn strip_location(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

fn check_object(value: &Value) -> Result<(), String> {
    let Some(map) = value.as_object() else {
        return Err(format!(
            "expected a mapping with apiVersion, kind and metadata, found {}",
            type_name(value)
        ));
    };
    let list = map.get("apiVersion").and_then(Value::as_str) == Some("v1")
        && map.get("kind").and_then(Value::as_str) == Some("List");
    for field in ["apiVersion", "kind"] {
        if map
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(format!("missing or empty {field}"));
        }
    }
    if list {
        return Ok(());
    }
    if value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err("missing or empty metadata.name".into());
    }
    Ok(())
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn is_manifest_file(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default();
    matches!(ext, "yaml" | "yml" | "json") && !KUSTOMIZATION_FILES.contains(&name)
}

/// Manifest files under `dir`, recursively, hidden entries skipped, in path order.
fn manifest_files(dir: &Path) -> Result<Vec<PathBuf>, WrapError> {
    let read_err = |path: &Path, source| WrapError::Read {
        path: path.display().to_string(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| read_err(dir, e))?
        .map(|e| e.map(|e| e.path()).map_err(|err| read_err(dir, err)))
        .collect::<Result<_, _>>()?;
    entries.sort();
    let mut files = Vec::new();
    for path in entries {
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'))
        {
            continue;
        }
        let is_symlink = std::fs::symlink_metadata(&path)
            .map_err(|e| read_err(&path, e))?
            .file_type()
            .is_symlink();
        let meta = std::fs::metadata(&path).map_err(|e| read_err(&path, e))?;
        if meta.is_dir() {
            if !is_symlink {
                files.extend(manifest_files(&path)?);
            }
        } else if is_manifest_file(&path) {
            files.push(path);
        }
    }
    Ok(files)
}

/// Reads and checks every object of the input, in a stable order.
fn collect(input: &WrapInput) -> Result<Vec<Located>, WrapError> {
    match input {
        WrapInput::Text { name, text } => parse_file(name, text),
        WrapInput::Path(path) => {
            let meta = std::fs::metadata(path).map_err(|e| WrapError::Read {
                path: path.display().to_string(),
                source: e,
            })?;
            let files = if meta.is_dir() {
                manifest_files(path)?
            } else {
                vec![path.clone()]
            };
            let mut objects = Vec::new();
            for file in files {
                let text = std::fs::read_to_string(&file).map_err(|e| WrapError::Read {
                    path: file.display().to_string(),
                    source: e,
                })?;
                objects.extend(parse_file(&file.display().to_string(), &text)?);
            }
            Ok(objects)
        }
    }
}

fn object_identity(object: &Value) -> String {
    let group = object["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .rsplit_once('/')
        .map(|(g, _)| g)
        .unwrap_or("");
    let kind = object["kind"].as_str().unwrap_or_default();
    let ns = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    if ns.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {ns}/{name}")
    }
}

fn is_dns1123_subdomain(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 253
        && value
            .split('.')
            .all(argocd_agent_proto::event::names::is_dns1123_label)
}

/// Renders all Kubernetes objects of `input` into one ManifestWork named `name` in the namespace
/// of `cluster`, as YAML.
pub fn wrap_manifests(input: WrapInput, cluster: &str, name: &str) -> Result<String, WrapError> {
    if !argocd_agent_proto::event::names::is_dns1123_label(cluster) {
        return Err(WrapError::InvalidCluster(cluster.to_string()));
    }
    if !is_dns1123_subdomain(name) {
        return Err(WrapError::InvalidName(name.to_string()));
    }
    let objects = collect(&input)?;
    if objects.is_empty() {
        return Err(WrapError::Empty {
            input: input.describe(),
        });
    }
    let mut seen: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for o in &objects {
        let identity = object_identity(&o.object);
        if let Some(first) = seen.get(&identity) {
            return Err(WrapError::Duplicate {
                file: o.file.clone(),
                line: o.line,
                object: identity,
                first: first.clone(),
            });
        }
        seen.insert(identity, format!("{}:{}", o.file, o.line));
    }
    let manifests: Vec<Value> = objects.into_iter().map(|o| o.object).collect();
    let size: usize = manifests
        .iter()
        .map(|m| serde_json::to_vec(m).map(|v| v.len()).unwrap_or(0))
        .sum();
    if size > MANIFEST_SIZE_LIMIT {
        return Err(WrapError::TooLarge {
            input: input.describe(),
            size,
        });
    }
    let work = json!({
        "apiVersion": "work.open-cluster-management.io/v1",
        "kind": "ManifestWork",
        "metadata": {"name": name, "namespace": cluster},
        "spec": {"workload": {"manifests": manifests}},
    });
    Ok(serde_norway::to_string(&work).expect("JSON values serialise as YAML"))
}

/// Arguments of `argocd-agentctl wrap`.
#[derive(clap::Args, Clone, Debug)]
#[command(
    about = "Render a folder of Kubernetes manifests into one OCM ManifestWork on stdout",
    long_about = "Render every Kubernetes object in a folder (recursively; .yaml, .yml and .json files; \
                  hidden entries and kustomization.yaml skipped) or in YAML read from stdin ('-', e.g. the \
                  output of `kustomize build`) into one ManifestWork for the given cluster, printed on stdout. \
                  Works as the generate command of an Argo CD config management plugin (argocd-cmp-server): \
                  without flags it wraps the current directory (the Application's source path), for the \
                  cluster named by the plugin env CLUSTER (spec.source.plugin.env, which Argo CD passes as \
                  ARGOCD_ENV_CLUSTER), in a ManifestWork named by the plugin env WORK_NAME or else after \
                  the Application (ARGOCD_APP_NAME)."
)]
pub struct WrapArgs {
    /// ManagedCluster to deliver to (the ManifestWork's namespace) [default: Argo CD plugin env
    /// ARGOCD_ENV_CLUSTER].
    #[arg(long, env = "ARGOCD_AGENTCTL_CLUSTER", value_name = "NAME")]
    pub cluster: Option<String>,
    /// Name of the ManifestWork [default: Argo CD plugin env ARGOCD_ENV_WORK_NAME, else the
    /// Application's name ARGOCD_APP_NAME].
    #[arg(long, env = "ARGOCD_AGENTCTL_NAME", value_name = "WORK")]
    pub name: Option<String>,
    /// Folder or file with the manifests, or '-' for stdin.
    #[arg(value_name = "DIR|-", default_value = ".")]
    pub source: String,
}

/// What Argo CD gives a config management plugin's generate command, read from the environment
/// (Argo CD prefixes an Application's `spec.source.plugin.env` entries with `ARGOCD_ENV_`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginEnv {
    /// `ARGOCD_ENV_CLUSTER`.
    pub cluster: Option<String>,
    /// `ARGOCD_ENV_WORK_NAME`.
    pub work_name: Option<String>,
    /// `ARGOCD_APP_NAME`.
    pub app_name: Option<String>,
}

impl PluginEnv {
    /// The plugin environment of this process (unset and empty variables count as absent).
    pub fn from_process() -> PluginEnv {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        PluginEnv {
            cluster: var("ARGOCD_ENV_CLUSTER"),
            work_name: var("ARGOCD_ENV_WORK_NAME"),
            app_name: var("ARGOCD_APP_NAME"),
        }
    }
}

impl WrapArgs {
    /// The cluster and ManifestWork name: the flags, else what Argo CD gives a plugin.
    pub fn target(&self, plugin: &PluginEnv) -> Result<(String, String), WrapError> {
        let given = |v: &Option<String>| v.clone().filter(|v| !v.trim().is_empty());
        let cluster = given(&self.cluster)
            .or_else(|| plugin.cluster.clone())
            .ok_or(WrapError::Missing {
                what: "cluster",
                how: "--cluster (or, as an Argo CD plugin, env CLUSTER in the Application's \
                      spec.source.plugin.env)",
            })?;
        let name = given(&self.name)
            .or_else(|| plugin.work_name.clone())
            .or_else(|| plugin.app_name.clone())
            .ok_or(WrapError::Missing {
                what: "ManifestWork name",
                how: "--name (or, as an Argo CD plugin, env WORK_NAME in spec.source.plugin.env; \
                      Argo CD's ARGOCD_APP_NAME is used when set)",
            })?;
        Ok((cluster, name))
    }
}

/// Runs `wrap`: the ManifestWork on stdout, or the error on stderr with exit code 2 (bad input)
/// or 1 (I/O failure).
pub fn run_wrap(args: WrapArgs) -> ExitCode {
    let result = args
        .target(&PluginEnv::from_process())
        .and_then(|(cluster, name)| {
            WrapInput::from_source(&args.source)
                .and_then(|input| wrap_manifests(input, &cluster, &name))
        });
    match result {
        Ok(yaml) => {
            let mut out = std::io::stdout().lock();
            match out.write_all(yaml.as_bytes()).and_then(|_| out.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("argocd-agentctl wrap: writing to stdout: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Err(e) => {
            eprintln!("argocd-agentctl wrap: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_split_with_their_start_lines() {
        let text = "# leading comment\napiVersion: v1\nkind: A\n---\n\n# only a comment\n---   # sep with comment\n\napiVersion: v1\nkind: B\n...\n";
        let docs = split_documents(text);
        assert_eq!(docs.len(), 2, "{docs:?}");
        assert_eq!(docs[0].0, 2, "the first content line, after the comment");
        assert_eq!(docs[1].0, 9);
        assert!(docs[1].1.starts_with("apiVersion: v1\nkind: B"));
    }

    #[test]
    fn yaml_errors_carry_the_absolute_line() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n   bad: indent\n";
        let err = parse_file("x.yaml", text).unwrap_err();
        match err {
            WrapError::InvalidYaml { line, .. } => assert_eq!(line, 10, "{err}"),
            other => panic!("expected invalid YAML, got {other}"),
        }
    }

    #[test]
    fn lists_are_expanded_and_checked() {
        let text = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: a}\n- apiVersion: v1\n  kind: Secret\n";
        let err = parse_file("l.yaml", text).unwrap_err().to_string();
        assert!(
            err.contains("l.yaml:1") && err.contains("List item 1: missing or empty metadata.name"),
            "{err}"
        );
    }

    #[test]
    fn names_are_validated() {
        let input = WrapInput::Text {
            name: "t".into(),
            text: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n".into(),
        };
        assert!(matches!(
            wrap_manifests(input.clone(), "Bad_Cluster", "w"),
            Err(WrapError::InvalidCluster(_))
        ));
        assert!(matches!(
            wrap_manifests(input.clone(), "c1", "-w"),
            Err(WrapError::InvalidName(_))
        ));
        assert!(wrap_manifests(input, "c1", "my.work").is_ok());
    }

    #[test]
    fn flags_win_then_the_plugin_env_then_the_application_name() {
        let args = |cluster: Option<&str>, name: Option<&str>| WrapArgs {
            cluster: cluster.map(str::to_owned),
            name: name.map(str::to_owned),
            source: ".".into(),
        };
        let plugin = PluginEnv {
            cluster: Some("spoke1".into()),
            work_name: None,
            app_name: Some("guestbook".into()),
        };
        assert_eq!(
            args(None, None).target(&plugin).unwrap(),
            ("spoke1".to_owned(), "guestbook".to_owned())
        );
        let named = PluginEnv {
            work_name: Some("gb-work".into()),
            ..plugin.clone()
        };
        assert_eq!(args(None, None).target(&named).unwrap().1, "gb-work");
        assert_eq!(
            args(Some("c2"), Some("w2")).target(&named).unwrap(),
            ("c2".to_owned(), "w2".to_owned())
        );
        let err = args(None, Some("w"))
            .target(&PluginEnv::default())
            .unwrap_err();
        assert!(err.to_string().contains("--cluster"), "{err}");
        assert!(err.to_string().contains("CLUSTER"), "{err}");
        assert_eq!(err.exit_code(), 2);
        let err = args(Some("c"), None)
            .target(&PluginEnv::default())
            .unwrap_err();
        assert!(err.to_string().contains("--name"), "{err}");
    }
}
