//! A real HTTP/1.1-only reverse proxy in front of the principal, for the `--enable-websocket`
//! tests: Debian's nginx (`hack/peers.sh` installs it) in the place of the proxies and load
//! balancers the flag exists for. Its TLS listener has no `http2`, so ALPN offers `http/1.1`
//! alone and an HTTP/2 client cannot even negotiate; it passes WebSocket upgrades the way nginx's
//! documentation says (`proxy_http_version 1.1`, `Upgrade` and `Connection` set); and it
//! terminates the agent's TLS with the principal's certificate and re-encrypts to the principal
//! presenting the agent's client certificate, which is what upstream argocd-agent's own e2e proxy
//! does (`test/proxy/proxy.go`, v0.9.0), so the principal still names the agent by certificate.
//! Every request is logged as `<protocol> <method> <path> <status> upgrade=<Upgrade header>`
//! ([`Http1Proxy::requests`]). Listens on 127.0.0.1 only; stops when dropped.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::gateway::Pki;
use crate::ports::free_port;
use crate::process::{ManagedProcess, ProcessSpec};
use crate::wait_until;

/// A running nginx proxying to one principal for one agent.
pub struct Http1Proxy {
    /// The process (single-process nginx, `daemon off; master_process off`).
    pub process: ManagedProcess,
    /// Its TLS port on 127.0.0.1.
    pub port: u16,
    access_log: PathBuf,
}

/// Where Debian's nginx is: on PATH, or in /usr/sbin (not on every user's PATH).
fn nginx_binary() -> anyhow::Result<PathBuf> {
    crate::binaries::system_binary("nginx", "nginx").or_else(|e| {
        let sbin = PathBuf::from("/usr/sbin/nginx");
        if sbin.is_file() {
            Ok(sbin)
        } else {
            Err(e)
        }
    })
}

impl Http1Proxy {
    /// Starts nginx for agent `agent` (its client certificate from `pki`) in front of `principal`
    /// (`127.0.0.1:<port>`, its certificate valid for `localhost`), with files under `dir`;
    /// waits until it accepts connections.
    pub async fn start(
        name: &str,
        dir: &Path,
        principal: &str,
        pki: &Pki,
        agent: &str,
    ) -> anyhow::Result<Http1Proxy> {
        let dir = dir.join(format!("nginx-{name}"));
        std::fs::create_dir_all(&dir)?;
        let port = free_port();
        let (agent_cert, agent_key) = pki.agent_files(agent);
        let access_log = dir.join("access.log");
        let d = dir.display();
        let config = format!(
            r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log stderr info;
events {{ worker_connections 512; }}
http {{
  client_body_temp_path {d}/client_body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  log_format wire '$server_protocol $request_method $uri $status upgrade=$http_upgrade';
  access_log {access} wire;
  map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate {principal_cert};
    ssl_certificate_key {principal_key};
    location / {{
      proxy_pass https://{principal};
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_ssl_certificate {agent_cert};
      proxy_ssl_certificate_key {agent_key};
      proxy_ssl_trusted_certificate {ca};
      proxy_ssl_verify on;
      proxy_ssl_name localhost;
      proxy_ssl_protocols TLSv1.3;
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 1h;
      proxy_send_timeout 1h;
    }}
  }}
}}
"#,
            access = access_log.display(),
            principal_cert = pki.dir.join("principal.crt").display(),
            principal_key = pki.dir.join("principal.key").display(),
            agent_cert = agent_cert.display(),
            agent_key = agent_key.display(),
            ca = pki.ca().display(),
        );
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config)?;
        let spec = ProcessSpec::new(
            format!("nginx-{name}"),
            nginx_binary()?,
            dir.join("nginx.log"),
        )
        .arg("-e")
        .arg(dir.join("error.log"))
        .arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(&conf);
        let proxy = Http1Proxy {
            process: ManagedProcess::spawn(spec)?,
            port,
            access_log,
        };
        proxy.wait_listening().await?;
        Ok(proxy)
    }

    /// Waits until the port accepts connections (after a start or a restart).
    pub async fn wait_listening(&self) -> anyhow::Result<()> {
        let address = self.address();
        wait_until("nginx listening", Duration::from_secs(20), || {
            let address = address.clone();
            async move {
                Ok::<_, anyhow::Error>(
                    tokio::net::TcpStream::connect(&address)
                        .await
                        .ok()
                        .map(|_| ()),
                )
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", self.process.log_tail(20)))
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Every request nginx finished so far, one `<protocol> <method> <path> <status>
    /// upgrade=<Upgrade header>` line each (a WebSocket's line appears when it closes).
    pub fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(&self.access_log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}
