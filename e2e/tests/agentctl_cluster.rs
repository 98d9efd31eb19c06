//! `argocd-agentctl` against real kube-apiservers, both clusters reached from one merged
//! `$KUBECONFIG` by context, as a user with several hubs would: `validate` passes a hub and a spoke
//! set up with `argocd-agentctl` itself, and fails a spoke whose agent has no hub namespace and a
//! hub whose CA was replaced after the certificates were issued, with the check, the reason and
//! the command that fixes it; `pki dump|propagate|delete` and `jwt delete-key` do what upstream's
//! do, the deletions only once confirmed; named principals in a `config` file (upstream's contexts)
//! select the hub namespace a command acts on.

use std::process::Output;

use e2e::binaries::project_binary;
use e2e::gateway::{agentctl, ensure_namespace};
use e2e::{shared_planes, TestContext};

/// `argocd-agentctl <args>` with `kubeconfig` as `$KUBECONFIG`, `env` set and `stdin` typed in.
fn run(kubeconfig: &str, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut cmd = std::process::Command::new(project_binary("argocd-agentctl").unwrap());
    cmd.args(args)
        .env("KUBECONFIG", kubeconfig)
        // Not the user's ~/.config/argocd-agent/ctl.conf; a test names its own with --config.
        .env("ARGOCD_AGENTCTL_CONFIG", "/dev/null")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `argocd-agentctl validate <args>` with `kubeconfig` as `$KUBECONFIG` and `env` set.
fn validate(kubeconfig: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    run(kubeconfig, &[&["validate"][..], args].concat(), env, "")
}

/// `plane`'s kubeconfig rewritten under `dir` with a user named after the plane, so that several
/// can be listed in one `$KUBECONFIG` (the harness names every plane's user alike).
fn own_kubeconfig(dir: &std::path::Path, plane: &e2e::ControlPlane) -> anyhow::Result<String> {
    let mut config: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(&plane.kubeconfig)?)?;
    let user = format!("{}-user", plane.name);
    config["users"][0]["name"] = user.clone().into();
    config["contexts"][0]["context"]["user"] = user.into();
    let path = dir.join(format!("{}.kubeconfig", plane.name));
    std::fs::write(&path, serde_norway::to_string(&config)?)?;
    Ok(path.to_str().expect("utf-8 path").to_string())
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The lines of failed checks, with their ERROR lines.
fn failures(out: &Output) -> Vec<String> {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    stdout
        .split("\n* ")
        .filter(|c| c.contains("❌"))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn validate_passes_a_good_install_and_names_what_is_wrong_in_a_bad_one() -> anyhow::Result<()>
{
    let planes = shared_planes().await;
    let (hub, spoke) = (&planes.hub, &planes.spokes[0]);
    let ctx = TestContext::new("agentctl_validate")?;
    let ns = ctx.unique("argocd");
    let spoke_ns = ctx.unique("spoke-argocd");
    let agent = ctx.unique("agent");
    ensure_namespace(&hub.client().await?, &ns).await?;
    ensure_namespace(&spoke.client().await?, &spoke_ns).await?;
    let hub_kc = hub.kubeconfig.to_str().unwrap();
    let spoke_kc = spoke.kubeconfig.to_str().unwrap();
    let on_hub = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--kubeconfig", hub_kc, "-n", &ns]);
        agentctl(&all)
    };
    on_hub(&["pki", "init"])?;
    on_hub(&["pki", "issue", "principal", "--dns", "principal.example"])?;
    on_hub(&["pki", "issue", "resource-proxy", "--dns", "proxy.example"])?;
    on_hub(&["jwt", "create-key"])?;
    on_hub(&[
        "pki",
        "issue",
        "agent",
        &agent,
        "--agent-kubeconfig",
        spoke_kc,
        "--agent-namespace",
        &spoke_ns,
    ])?;
    // Both clusters in one $KUBECONFIG, chosen by context.
    let merged = format!(
        "{}:{}",
        own_kubeconfig(&ctx.dir, hub)?,
        own_kubeconfig(&ctx.dir, spoke)?
    );
    let principal_args = [
        "--principal-context",
        &hub.name,
        "--principal-namespace",
        &ns,
    ];

    let out = validate(
        &merged,
        &[&["principal"][..], &principal_args].concat(),
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(failures(&out).is_empty(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).matches("✅").count(),
        7,
        "{}",
        text(&out)
    );

    // The agent's hub namespace is missing: exactly that check fails, saying what to create.
    let agent_args = [
        "agent",
        "--agent-context",
        &spoke.name,
        "--agent-namespace",
        &spoke_ns,
    ];
    let out = validate(
        &merged,
        &agent_args,
        // The principal's options from their env mirrors.
        &[
            ("ARGOCD_AGENT_PRINCIPAL_CONTEXT", &hub.name),
            ("ARGOCD_AGENT_PRINCIPAL_NAMESPACE", &ns),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let failed = failures(&out);
    assert_eq!(failed.len(), 1, "{}", text(&out));
    assert!(
        failed[0].contains("Verifying namespace on principal matches agent certificate subject")
            && failed[0].contains(&format!(
                "namespace '{agent}' not found on principal cluster"
            ))
            && failed[0].contains(&format!("argocd-agentctl agent create {agent}")),
        "{}",
        failed[0]
    );
    assert!(text(&out).contains("one or more checks failed"));

    // Positive control: registered as the message says (which creates its hub namespace and its
    // cluster secret), every check of both sides passes.
    agentctl(&[
        "agent",
        "create",
        &agent,
        "--kubeconfig",
        hub_kc,
        "-n",
        &ns,
        "--argocd-namespace",
        &ns,
    ])?;
    let out = validate(&merged, &[&agent_args[..], &principal_args].concat(), &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).matches("✅").count(),
        11,
        "{}",
        text(&out)
    );

    // A new CA on the hub: the certificates issued by the old one are named, with the fix.
    on_hub(&["pki", "init", "--force"])?;
    let out = validate(&merged, &[&agent_args[..], &principal_args].concat(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let failed = failures(&out).join("\n");
    for expected in [
        "principal gRPC TLS certificate",
        "pki issue principal --force",
        "resource proxy TLS certificate",
        "pki issue resource-proxy --force",
        "agent certificate not signed by principal CA",
    ] {
        assert!(failed.contains(expected), "{expected:?} in\n{failed}");
    }
    assert_eq!(failures(&out).len(), 3, "{}", text(&out));
    Ok(())
}

/// The text of `key` in Secret `name` of `api`, if both exist.
async fn secret_key(
    api: &kube::Api<k8s_openapi::api::core::v1::Secret>,
    name: &str,
    key: &str,
) -> anyhow::Result<Option<String>> {
    Ok(api.get_opt(name).await?.and_then(|s| {
        s.data.and_then(|d| {
            d.get(key)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        })
    }))
}

#[tokio::test]
async fn pki_dump_propagate_delete_and_jwt_delete_key_act_only_when_confirmed() -> anyhow::Result<()>
{
    let planes = shared_planes().await;
    let (hub, spoke) = (&planes.hub, &planes.spokes[0]);
    let ctx = TestContext::new("agentctl_pki_ca")?;
    let ns = ctx.unique("argocd");
    let spoke_ns = ctx.unique("spoke-argocd");
    ensure_namespace(&hub.client().await?, &ns).await?;
    ensure_namespace(&spoke.client().await?, &spoke_ns).await?;
    let merged = format!(
        "{}:{}",
        own_kubeconfig(&ctx.dir, hub)?,
        own_kubeconfig(&ctx.dir, spoke)?
    );
    let on_hub = |args: &[&str], stdin: &str| {
        run(
            &merged,
            &[args, &["--context", &hub.name, "-n", &ns][..]].concat(),
            &[],
            stdin,
        )
    };
    for args in [&["pki", "init"][..], &["jwt", "create-key"][..]] {
        let out = on_hub(args, "");
        assert!(out.status.success(), "{}", text(&out));
    }
    let hub_secrets = kube::Api::namespaced(hub.client().await?, &ns);
    let ca_cert = secret_key(&hub_secrets, "argocd-agent-ca", "tls.crt")
        .await?
        .expect("pki init wrote the CA");

    // dump: what was asked for, nothing without asking.
    let out = on_hub(&["pki", "dump", "--cert"], "");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), ca_cert);
    let out = on_hub(&["pki", "dump", "--all"], "");
    let all = String::from_utf8_lossy(&out.stdout);
    assert!(
        all.starts_with(&ca_cert) && all.contains("PRIVATE KEY"),
        "{all}"
    );
    let out = on_hub(&["pki", "dump"], "");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("one of --all, --key or --cert"),
        "{}",
        text(&out)
    );

    // propagate: the CA certificate, never its key, as the agent's CA secret on the spoke.
    let spoke_secrets = kube::Api::namespaced(spoke.client().await?, &spoke_ns);
    let propagate = [
        "pki",
        "propagate",
        "--agent-context",
        &spoke.name,
        "--agent-namespace",
        &spoke_ns,
    ];
    let out = on_hub(&propagate, "");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        secret_key(&spoke_secrets, "argocd-agent-ca", "ca.crt").await?,
        Some(ca_cert.clone())
    );
    assert_eq!(
        secret_key(&spoke_secrets, "argocd-agent-ca", "tls.key").await?,
        None
    );
    let out = on_hub(&propagate, "");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("already exists"), "{}", text(&out));
    let out = on_hub(&[&propagate[..], &["--force"]].concat(), "");
    assert!(out.status.success(), "{}", text(&out));

    // jwt delete-key: kept unless confirmed.
    let out = on_hub(&["jwt", "delete-key"], "n\n");
    assert!(text(&out).contains("Aborted."), "{}", text(&out));
    assert!(hub_secrets.get_opt("argocd-agent-jwt").await?.is_some());
    let out = on_hub(&["jwt", "delete-key"], "y\n");
    assert!(
        text(&out).contains("deleted successfully"),
        "{}",
        text(&out)
    );
    assert!(hub_secrets.get_opt("argocd-agent-jwt").await?.is_none());
    let out = on_hub(&["jwt", "delete-key", "--force"], "");
    assert!(text(&out).contains("does not exist"), "{}", text(&out));

    // pki delete: only an uppercase YES deletes.
    let out = on_hub(&["pki", "delete"], "yes\n");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(hub_secrets.get_opt("argocd-agent-ca").await?.is_some());
    let out = on_hub(&["pki", "delete"], "YES\n");
    assert!(out.status.success(), "{}", text(&out));
    assert!(hub_secrets.get_opt("argocd-agent-ca").await?.is_none());
    let out = on_hub(&["pki", "delete"], "YES\n");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("pki init"), "{}", text(&out));
    Ok(())
}

#[tokio::test]
async fn agent_inspect_print_tls_and_reconfigure_read_and_rewrite_the_cluster_secret(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let hub = &planes.hub;
    let ctx = TestContext::new("agentctl_agent_config")?;
    let ns = ctx.unique("argocd");
    let agent = ctx.unique("agent");
    ensure_namespace(&hub.client().await?, &ns).await?;
    let kubeconfig = own_kubeconfig(&ctx.dir, hub)?;
    let on_hub = |args: &[&str]| {
        run(
            &kubeconfig,
            &[
                args,
                &["--context", &hub.name, "--argocd-namespace", &ns][..],
            ]
            .concat(),
            &[],
            "",
        )
    };
    let ok = |out: Output| {
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let in_ns = |args: &[&str]| {
        run(
            &kubeconfig,
            &[args, &["--context", &hub.name, "-n", &ns][..]].concat(),
            &[],
            "",
        )
    };
    ok(in_ns(&["pki", "init"]));
    let ca = ok(in_ns(&["pki", "dump", "--cert"]));
    ok(on_hub(&[
        "agent",
        "create",
        &agent,
        "--resource-proxy-server",
        "proxy-a.example:9090",
        "-n",
        &ns,
    ]));

    let inspected: serde_json::Value =
        serde_json::from_str(&ok(on_hub(&["agent", "inspect", &agent, "-o", "json"])))?;
    assert_eq!(
        inspected["server"],
        format!("https://proxy-a.example:9090?agentName={agent}")
    );
    assert_eq!(inspected["name"], agent.as_str());
    assert_eq!(ok(on_hub(&["agent", "print-tls", &agent, "-t", "ca"])), ca);
    let first_cert = ok(on_hub(&["agent", "print-tls", &agent]));
    assert!(
        first_cert.starts_with("-----BEGIN CERTIFICATE-----"),
        "{first_cert}"
    );
    assert!(ok(on_hub(&["agent", "print-tls", &agent, "--type", "key"])).contains("PRIVATE KEY"));

    // A new server address: the certificate is kept.
    ok(on_hub(&[
        "agent",
        "reconfigure",
        &agent,
        "--resource-proxy-server",
        "proxy-b.example:9443",
    ]));
    let inspected: serde_json::Value =
        serde_json::from_str(&ok(on_hub(&["agent", "inspect", &agent, "-o", "json"])))?;
    assert_eq!(
        inspected["server"],
        format!("https://proxy-b.example:9443?agentName={agent}")
    );
    assert_eq!(ok(on_hub(&["agent", "print-tls", &agent])), first_cert);
    // A reissued certificate: the server is kept.
    ok(on_hub(&[
        "agent",
        "reconfigure",
        &agent,
        "--reissue-client-cert",
        "-n",
        &ns,
    ]));
    assert_ne!(ok(on_hub(&["agent", "print-tls", &agent])), first_cert);
    let inspected: serde_json::Value =
        serde_json::from_str(&ok(on_hub(&["agent", "inspect", &agent, "-o", "json"])))?;
    assert_eq!(
        inspected["server"],
        format!("https://proxy-b.example:9443?agentName={agent}")
    );

    let out = on_hub(&["agent", "reconfigure", &agent]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("nothing to change"), "{}", text(&out));
    let out = on_hub(&["agent", "inspect", "nobody"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("No such agent configured: nobody"),
        "{}",
        text(&out)
    );
    Ok(())
}

/// Two principals in one config file, made with `config add`, on one hub in two namespaces: the
/// default one, `--principal NAME` and `ARGOCD_AGENTCTL_PRINCIPAL` each select where `pki init`
/// and `jwt create-key` write; a namespace flag still wins over the selected entry; an unknown
/// name is refused naming the file and the known names.
#[tokio::test]
async fn config_contexts_select_the_hub_a_command_acts_on() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Secret;
    let planes = shared_planes().await;
    let hub = &planes.hub;
    let ctx = TestContext::new("agentctl_contexts")?;
    let (ns_a, ns_b, ns_c) = (
        ctx.unique("hub-a"),
        ctx.unique("hub-b"),
        ctx.unique("hub-c"),
    );
    let client = hub.client().await?;
    for ns in [&ns_a, &ns_b, &ns_c] {
        ensure_namespace(&client, ns).await?;
    }
    let kc = hub.kubeconfig.to_str().unwrap();
    let config = ctx.dir.join("ctl.conf");
    let config = config.to_str().unwrap();
    let ctl = |args: &[&str], env: &[(&str, &str)]| {
        run(kc, &[&["--config", config][..], args].concat(), env, "")
    };
    let ok = |out: Output| {
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let has = |ns: &str, name: &'static str| {
        let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), ns);
        async move { anyhow::Ok(api.get_opt(name).await?.is_some()) }
    };

    for (name, ns, default) in [("hub-a", &ns_a, true), ("hub-b", &ns_b, false)] {
        let mut args = vec!["config", "add", "principal", "--name", name];
        args.extend(["--context", &hub.name, "--namespace", ns]);
        if default {
            args.push("--set-default");
        }
        let out = ok(ctl(&args, &[]));
        assert!(
            out.contains(&format!("New principal {name} added successfully")),
            "{out}"
        );
    }
    let listed = ok(ctl(&["config", "list", "principal"], &[]));
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("hub-a ") && l.trim_end().ends_with('X')),
        "{listed}"
    );

    // No --principal: the default one.
    ok(ctl(&["pki", "init"], &[]));
    assert!(has(&ns_a, "argocd-agent-ca").await?);
    assert!(!has(&ns_b, "argocd-agent-ca").await?);
    // --principal NAME.
    ok(ctl(&["--principal", "hub-b", "pki", "init"], &[]));
    assert!(has(&ns_b, "argocd-agent-ca").await?);
    // Its environment variable, placed after the subcommand as a global flag may be.
    ok(ctl(
        &["jwt", "create-key"],
        &[("ARGOCD_AGENTCTL_PRINCIPAL", "hub-b")],
    ));
    assert!(has(&ns_b, "argocd-agent-jwt").await?);
    assert!(!has(&ns_a, "argocd-agent-jwt").await?);
    // A namespace flag beats the selected entry's namespace (the context still comes from it).
    ok(ctl(
        &["jwt", "create-key", "--principal", "hub-b", "-n", &ns_c],
        &[],
    ));
    assert!(has(&ns_c, "argocd-agent-jwt").await?);

    // Unknown name: exit 2, naming the file and the known principals; nothing written.
    let out = ctl(&["--principal", "hub-x", "pki", "init", "-n", &ns_c], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    for expected in [config, "\"hub-x\" does not exist", "hub-a, hub-b"] {
        assert!(
            text(&out).contains(expected),
            "{expected:?} in {}",
            text(&out)
        );
    }
    assert!(!has(&ns_c, "argocd-agent-ca").await?);

    // A malformed file: exit 2 naming the file and the line.
    std::fs::write(config, "contexts:\n  principals: [\n")?;
    let out = ctl(&["pki", "init"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(config) && text(&out).contains("line "),
        "{}",
        text(&out)
    );
    Ok(())
}
