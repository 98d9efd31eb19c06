//! `argocd-agentctl validate` against real kube-apiservers: a hub and a spoke set up with
//! `argocd-agentctl` itself pass; a spoke whose agent has no hub namespace, and a hub whose CA was
//! replaced after the certificates were issued, fail with the check, the reason and the command
//! that fixes it. Both clusters are reached from one merged `$KUBECONFIG` by context, as a user
//! with several hubs would.

use std::process::Output;

use e2e::binaries::project_binary;
use e2e::gateway::{agentctl, ensure_namespace};
use e2e::{shared_planes, TestContext};

/// `argocd-agentctl validate <args>` with `kubeconfig` as `$KUBECONFIG` and `env` set.
fn validate(kubeconfig: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(project_binary("argocd-agentctl").unwrap());
    cmd.arg("validate").args(args).env("KUBECONFIG", kubeconfig);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
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
