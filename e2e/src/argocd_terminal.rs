//! argocd-server's web terminal as the Argo CD UI opens it: a WebSocket to `/terminal` with the
//! pod, container, application, project and namespaces in the query and the session token in the
//! `argocd.token` cookie, carrying JSON messages (`{"operation":"stdin","data":..}`,
//! `{"operation":"resize","cols":..,"rows":..}` in; `{"operation":"stdout","data":..}` out).
//!
//! Owns the client side only, turning `exec.enabled` on in a hub Argo CD's `argocd-cm` (the
//! built-in `role:admin` already holds `exec, create`), and the checks every web terminal test
//! makes of a session into a pod on a [`FakeKubelet`] ([`check_shell_session`]).

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::argocd::ArgoCd;
use crate::kubelet::FakeKubelet;
use crate::wait::wait_until;

/// Which container of which Application's pod to open a terminal into.
#[derive(Debug, Clone)]
pub struct TerminalTarget {
    /// The pod.
    pub pod: String,
    /// The container.
    pub container: String,
    /// The pod's namespace (on the destination cluster).
    pub namespace: String,
    /// The Application.
    pub app: String,
    /// The Application's namespace (on the hub).
    pub app_namespace: String,
    /// The Application's project.
    pub project: String,
    /// The shell to run (one of argocd-server's `exec.shells`, default `bash,sh,powershell,cmd`).
    /// Named, argocd-server runs only it; unnamed, it tries the next shell whenever one fails,
    /// and a session that ended with an error would be opened again with the next one.
    pub shell: String,
}

/// An open terminal; output read so far is kept in [`Terminal::output`].
pub struct Terminal {
    ws: WebSocketStream<TcpStream>,
    /// Everything the terminal printed so far.
    pub output: String,
}

/// Sets `exec.enabled: "true"` in the `argocd-cm` of `argocd` (argocd-server reads its settings
/// on each terminal request).
pub async fn enable_exec(client: &kube::Client, argocd: &ArgoCd) -> anyhow::Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &argocd.namespace);
    let patch = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "argocd-cm"}, "data": {"exec.enabled": "true"}});
    cms.patch(
        "argocd-cm",
        &PatchParams::apply("e2e-terminal").force(),
        &Patch::Apply(patch),
    )
    .await?;
    Ok(())
}

impl Terminal {
    /// Opens a terminal through the argocd-server on `port` with session `token`. Fails with the
    /// server's status and body when it refuses the upgrade.
    pub async fn open(port: u16, token: &str, t: &TerminalTarget) -> anyhow::Result<Terminal> {
        let url = format!(
            "ws://127.0.0.1:{port}/terminal?pod={}&container={}&appName={}&appNamespace={}&projectName={}&namespace={}&shell={}",
            t.pod, t.container, t.app, t.app_namespace, t.project, t.namespace, t.shell
        );
        let mut request = url.into_client_request()?;
        request.headers_mut().insert(
            http::header::COOKIE,
            http::HeaderValue::from_str(&format!("argocd.token={token}"))?,
        );
        let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
        let (ws, _) = tokio_tungstenite::client_async(request, tcp)
            .await
            .map_err(|e| match e {
                tokio_tungstenite::tungstenite::Error::Http(resp) => anyhow::anyhow!(
                    "argocd-server refused the terminal: {} {}",
                    resp.status(),
                    String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default())
                ),
                e => e.into(),
            })?;
        Ok(Terminal {
            ws,
            output: String::new(),
        })
    }

    async fn send_json(&mut self, msg: serde_json::Value) -> anyhow::Result<()> {
        self.ws.send(Message::text(msg.to_string())).await?;
        Ok(())
    }

    /// Types `text`.
    pub async fn input(&mut self, text: &str) -> anyhow::Result<()> {
        self.send_json(json!({"operation": "stdin", "data": text}))
            .await
    }

    /// Resizes the terminal.
    pub async fn resize(&mut self, cols: u16, rows: u16) -> anyhow::Result<()> {
        self.send_json(json!({"operation": "resize", "cols": cols, "rows": rows}))
            .await
    }

    /// Reads output until it contains `needle` (within `timeout`); the output so far on failure.
    pub async fn read_until(&mut self, needle: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.output.contains(needle) {
            match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => anyhow::bail!(
                    "no {needle:?} within {timeout:?}; the terminal printed {:?}",
                    self.output
                ),
                Ok(None) => anyhow::bail!(
                    "the terminal closed before {needle:?}; it printed {:?}",
                    self.output
                ),
                Ok(Some(msg)) => self.take(msg?),
            }
        }
        Ok(())
    }

    /// Reads until the server ends the session (within `timeout`).
    pub async fn wait_closed(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => anyhow::bail!(
                    "the terminal was not closed within {timeout:?}; it printed {:?}",
                    self.output
                ),
                Ok(None) | Ok(Some(Err(_))) | Ok(Some(Ok(Message::Close(_)))) => return Ok(()),
                Ok(Some(Ok(msg))) => self.take(msg),
            }
        }
    }

    fn take(&mut self, msg: Message) {
        if let Message::Text(text) = msg {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                if v["operation"] == "stdout" {
                    self.output.push_str(v["data"].as_str().unwrap_or_default());
                }
            }
        }
    }

    /// Closes the WebSocket, as a browser tab being closed does.
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// [`Terminal::open`], retried for up to a minute: argocd-server picks `exec.enabled` up from its
/// settings watch ([`enable_exec`]), so the first opens may be refused. Fails with the last
/// refusal.
pub async fn open_once_enabled(
    port: u16,
    token: &str,
    target: &TerminalTarget,
) -> anyhow::Result<Terminal> {
    let last_error = std::sync::Mutex::new(String::new());
    wait_until("the terminal opens", Duration::from_secs(60), || async {
        let t = Terminal::open(port, token, target).await;
        if let Err(e) = &t {
            *last_error.lock().unwrap_or_else(|e| e.into_inner()) = e.to_string();
        }
        Ok::<_, anyhow::Error>(t.ok())
    })
    .await
    .map_err(|e| {
        let last = last_error.lock().unwrap_or_else(|e| e.into_inner());
        anyhow::anyhow!("{e}: {last}")
    })
}

/// Checks a session `term` just opened into `target`, a pod on `kubelet`: a command's output
/// comes back, stderr too (the web terminal asks for a TTY, and a terminal merges them), the
/// kubelet ran the one exec of `target`'s shell with a TTY in its container, and a resize
/// reaches the kubelet, each within `wait`.
pub async fn check_shell_session(
    term: &mut Terminal,
    kubelet: &FakeKubelet,
    target: &TerminalTarget,
    wait: Duration,
) -> anyhow::Result<()> {
    let marker = &uuid::Uuid::new_v4().simple().to_string()[..8];
    term.resize(100, 30).await?;
    term.input(&format!("echo hello-$((6*7))-{marker}\n"))
        .await?;
    term.read_until(&format!("hello-42-{marker}"), wait).await?;
    term.input("echo to-stderr-$((1+1)) >&2\n").await?;
    term.read_until("to-stderr-2", wait).await?;
    let execs = kubelet
        .stats
        .execs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    anyhow::ensure!(execs.len() == 1, "one exec at the kubelet: {execs:?}");
    let seen = &execs[0];
    let want = format!("{}/{}/{}", target.namespace, target.pod, target.container);
    anyhow::ensure!(seen.target == want, "exec into {want}: {seen:?}");
    anyhow::ensure!(
        seen.command == [target.shell.as_str()],
        "the shell: {seen:?}"
    );
    anyhow::ensure!(seen.tty, "the web terminal asks for a TTY: {seen:?}");
    wait_until("the resize at the kubelet", wait, || async {
        let resizes = kubelet
            .stats
            .resizes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Ok::<_, anyhow::Error>(resizes.contains(&(100, 30)).then_some(()))
    })
    .await
}
