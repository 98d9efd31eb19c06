//! `argocd-agentctl wrap` on fixture folders (tests/fixtures/wrap): nested folders, multi-document
//! files, JSON Lists, kustomize output piped in, and the errors users see for bad input.

use std::path::PathBuf;

use argocd_agent_operator::pull::manifestwork::ManifestWork;
use argocd_agent_operator::wrap::{wrap_manifests, WrapArgs, WrapError, WrapInput};
use clap::Parser;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/wrap")
        .join(name)
}

fn parse_work(yaml: &str) -> ManifestWork {
    serde_norway::from_str(yaml)
        .unwrap_or_else(|e| panic!("output is not a ManifestWork: {e}\n{yaml}"))
}

fn kinds_and_names(work: &ManifestWork) -> Vec<(String, String)> {
    work.spec
        .workload
        .manifests
        .iter()
        .map(|m| {
            (
                m["kind"].as_str().unwrap().to_string(),
                m["metadata"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn nested_folder_becomes_one_manifest_work_in_path_order() {
    let yaml =
        wrap_manifests(WrapInput::Path(fixture("app")), "cluster1", "guestbook").expect("wraps");
    let work = parse_work(&yaml);
    assert_eq!(work.metadata.name.as_deref(), Some("guestbook"));
    assert_eq!(work.metadata.namespace.as_deref(), Some("cluster1"));
    let pairs: Vec<(String, String)> = kinds_and_names(&work);
    let expected = [
        ("ConfigMap", "guestbook-config"), // config/configmap.yml
        ("ConfigMap", "from-list"),        // config/extra/list.json, List expanded
        ("ServiceAccount", "guestbook"),   // ... second item
        ("Deployment", "guestbook-ui"),    // deployment.yaml, first document
        ("Service", "guestbook-ui"),       // ... after an empty document
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(k, n)| (k.to_string(), n.to_string()))
        .collect();
    assert_eq!(
        pairs, expected,
        "hidden folders, README.md and kustomization.yaml are not wrapped"
    );
    assert_eq!(work.spec.workload.manifests[0]["data"]["greeting"], "hello");
    assert_eq!(
        work.spec.workload.manifests[3]["spec"]["template"]["spec"]["containers"][0]["ports"][0]
            ["containerPort"],
        80
    );
}

#[test]
fn output_is_stable_across_runs() {
    let a = wrap_manifests(WrapInput::Path(fixture("app")), "cluster1", "guestbook").unwrap();
    let b = wrap_manifests(WrapInput::Path(fixture("app")), "cluster1", "guestbook").unwrap();
    assert_eq!(a, b);
}

#[test]
fn kustomize_output_piped_on_stdin_is_wrapped() {
    let text = std::fs::read_to_string(fixture("kustomize-output.yaml")).unwrap();
    let yaml = wrap_manifests(
        WrapInput::Text {
            name: "<stdin>".into(),
            text,
        },
        "prod-east",
        "guestbook-prod",
    )
    .unwrap();
    let work = parse_work(&yaml);
    assert_eq!(
        kinds_and_names(&work),
        vec![
            ("Namespace".to_string(), "guestbook".to_string()),
            ("Service".to_string(), "prod-guestbook-ui".to_string()),
            ("Deployment".to_string(), "prod-guestbook-ui".to_string()),
        ]
    );
    assert_eq!(work.metadata.namespace.as_deref(), Some("prod-east"));
}

#[test]
fn a_single_file_can_be_wrapped() {
    let yaml = wrap_manifests(WrapInput::Path(fixture("app/deployment.yaml")), "c1", "w").unwrap();
    assert_eq!(parse_work(&yaml).spec.workload.manifests.len(), 2);
}

#[test]
fn invalid_yaml_names_the_file_and_line() {
    let err =
        wrap_manifests(WrapInput::Path(fixture("invalid-yaml")), "cluster1", "w").unwrap_err();
    let message = err.to_string();
    let expected_file = fixture("invalid-yaml/broken.yaml").display().to_string();
    assert!(
        matches!(err, WrapError::InvalidYaml { line: 10, .. }),
        "{message}"
    );
    assert!(
        message.starts_with(&format!("{expected_file}:10: invalid YAML")),
        "{message}"
    );
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn invalid_yaml_on_stdin_names_stdin_and_line() {
    let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: [unclosed\n".to_string();
    let err = wrap_manifests(
        WrapInput::Text {
            name: "<stdin>".into(),
            text,
        },
        "c1",
        "w",
    )
    .unwrap_err();
    assert!(err.to_string().starts_with("<stdin>:"), "{err}");
    assert!(matches!(err, WrapError::InvalidYaml { .. }), "{err}");
}

#[test]
fn a_document_that_is_not_an_object_names_the_file_and_line() {
    let err =
        wrap_manifests(WrapInput::Path(fixture("not-an-object")), "cluster1", "w").unwrap_err();
    let message = err.to_string();
    let file = fixture("not-an-object/values.yaml").display().to_string();
    assert_eq!(
        message,
        format!("{file}:6: not a Kubernetes object: missing or empty apiVersion")
    );
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn duplicate_objects_are_rejected_with_both_places() {
    let err = wrap_manifests(WrapInput::Path(fixture("duplicate")), "cluster1", "w")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("b.yaml:2: duplicate ConfigMap guestbook/same, first defined at"),
        "{err}"
    );
    assert!(err.contains("a.yaml:1"), "{err}");
}

#[test]
fn empty_folder_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err =
        wrap_manifests(WrapInput::Path(dir.path().to_path_buf()), "cluster1", "w").unwrap_err();
    assert!(matches!(err, WrapError::Empty { .. }), "{err}");
    assert!(
        err.to_string().contains("no Kubernetes manifests found in"),
        "{err}"
    );
    assert_eq!(err.exit_code(), 2);
    // A folder with only non-manifest files is just as empty.
    let err = wrap_manifests(WrapInput::Path(fixture("only-docs")), "cluster1", "w").unwrap_err();
    assert!(matches!(err, WrapError::Empty { .. }), "{err}");
    // So is blank stdin.
    let err = wrap_manifests(
        WrapInput::Text {
            name: "<stdin>".into(),
            text: "\n# nothing\n---\n".into(),
        },
        "c1",
        "w",
    );
    assert!(matches!(err, Err(WrapError::Empty { .. })));
}

#[test]
fn missing_folder_is_a_usage_error() {
    let err =
        wrap_manifests(WrapInput::Path(fixture("does-not-exist")), "cluster1", "w").unwrap_err();
    assert!(err.to_string().contains("does-not-exist"), "{err}");
    assert_eq!(err.exit_code(), 2);
}

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    Wrap(WrapArgs),
}

#[test]
fn wrap_args_parse_like_the_cli() {
    let cli = Cli::try_parse_from([
        "argocd-agentctl",
        "wrap",
        "--cluster",
        "c1",
        "--name",
        "guestbook",
        "-",
    ])
    .unwrap();
    let Command::Wrap(args) = cli.command;
    assert_eq!(
        (
            args.cluster.as_deref(),
            args.name.as_deref(),
            args.source.as_str()
        ),
        (Some("c1"), Some("guestbook"), "-")
    );
    // As an Argo CD plugin's generate command: no flags, the current directory.
    let Command::Wrap(plugin) = Cli::try_parse_from(["argocd-agentctl", "wrap"])
        .unwrap()
        .command;
    assert_eq!(plugin.source, ".");
    assert!(plugin
        .target(&argocd_agent_operator::wrap::PluginEnv::default())
        .is_err_and(|e| e.to_string().contains("--cluster")));
}
