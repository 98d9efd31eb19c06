//! `argocd-agentctl agent create|list|delete` against a real hub: the agent's hub namespace and its
//! Argo CD cluster secret (server URL through the resource proxy, a client certificate whose CN is
//! the agent, signed by the fleet CA), listed and removed again.

use std::collections::BTreeMap;

use e2e::gateway::{agentctl, ensure_namespace, Pki};
use e2e::{shared_planes, TestContext};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::Api;
use serde_json::Value;

use e2e::secret_text;

#[tokio::test]
async fn agent_create_registers_the_agent_with_the_hub_argo_cd() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let ctx = TestContext::new("registration")?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let hub = planes.hub.client().await?;
    let argocd_ns = ctx.unique("argocd");
    ensure_namespace(&hub, &argocd_ns).await?;
    let agent = ctx.unique("edge");
    let kubeconfig = planes
        .hub
        .kubeconfig
        .to_str()
        .expect("utf-8 path")
        .to_string();
    let dir = pki.dir.to_str().expect("utf-8 path").to_string();
    let hub_args = [
        "--kubeconfig",
        &kubeconfig,
        "--argocd-namespace",
        &argocd_ns,
    ];

    let mut create = vec![
        "agent",
        "create",
        &agent,
        "--dir",
        &dir,
        "--resource-proxy-server",
        "proxy.example:9090",
    ];
    create.extend(hub_args);
    agentctl(&create)?;

    // The agent's namespace on the hub (where its Applications live) exists.
    let namespaces: Api<Namespace> = Api::all(hub.clone());
    assert!(
        namespaces.get_opt(&agent).await?.is_some(),
        "hub namespace {agent} was not created"
    );

    // The cluster secret is what Argo CD and the principal expect.
    let secrets: Api<Secret> = Api::namespaced(hub.clone(), &argocd_ns);
    let secret = secrets.get(&format!("cluster-{agent}")).await?;
    let labels: BTreeMap<String, String> = secret.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("argocd.argoproj.io/secret-type")
            .map(String::as_str),
        Some("cluster")
    );
    assert_eq!(
        labels.get("argocd-agent.argoproj-labs.io/agent-name"),
        Some(&agent)
    );
    assert_eq!(secret_text(&secret, "name"), agent);
    assert_eq!(
        secret_text(&secret, "server"),
        format!("https://proxy.example:9090?agentName={agent}")
    );
    let config: Value = serde_json::from_str(&secret_text(&secret, "config"))?;
    let cert_pem = base64_decode(
        config["tlsClientConfig"]["certData"]
            .as_str()
            .unwrap_or_default(),
    )?;
    let cert_file = ctx.dir.join("proxy-client.crt");
    std::fs::write(&cert_file, &cert_pem)?;
    let inspected = agentctl(&[
        "pki",
        "inspect",
        "--cert",
        cert_file.to_str().expect("utf-8"),
        "-o",
        "json",
    ])?;
    let info: Value = serde_json::from_str(&inspected)?;
    let info = info
        .as_array()
        .and_then(|a| a.first())
        .cloned()
        .unwrap_or(info);
    assert_eq!(
        info["subjectCn"],
        agent.as_str(),
        "resource-proxy client certificate must name the agent: {info}"
    );
    assert_eq!(
        info["issuerCn"], "argocd-agent-ca",
        "signed by the fleet CA: {info}"
    );
    assert!(config["tlsClientConfig"]["keyData"]
        .as_str()
        .is_some_and(|k| !k.is_empty()));

    // Listed, refused twice, and removed.
    let mut list = vec!["agent", "list", "-o", "json"];
    list.extend(hub_args);
    assert!(agentctl(&list)?.contains(&agent));
    assert!(
        agentctl(&create).is_err(),
        "creating the same agent twice must be refused"
    );
    let mut delete = vec!["agent", "delete", &agent];
    delete.extend(hub_args);
    agentctl(&delete)?;
    assert!(
        secrets
            .get_opt(&format!("cluster-{agent}"))
            .await?
            .is_none(),
        "cluster secret left behind"
    );
    Ok(())
}

fn base64_decode(s: &str) -> anyhow::Result<Vec<u8>> {
    use base64::Engine;
    Ok(base64::engine::general_purpose::STANDARD.decode(s)?)
}
