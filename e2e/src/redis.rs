//! A real `redis-server` (Debian's) on a free loopback port, for the Redis proxy tests and for
//! Argo CD's cache — with a password where Argo CD's default install sets one (`requirepass`, the
//! secret `argocd-redis`) — and the RESP client side the tests speak to it and to the principal's
//! Redis proxy, framed by the `redis-protocol` crate.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::encode::encode;
use redis_protocol::resp2::types::{OwnedFrame, Resp2Frame};

use crate::binaries::system_binary;
use crate::ports::free_port;
use crate::process::{temp_dir, ManagedProcess, ProcessSpec};

/// A running redis-server.
pub struct Redis {
    /// Port on 127.0.0.1.
    pub port: u16,
    /// The server process.
    pub process: ManagedProcess,
    /// The password clients must send with AUTH, if any.
    pub password: Option<String>,
    /// The password laid out as the mounted `argocd-redis` secret (file `auth`), when started
    /// with [`Redis::start_as_hub`].
    pub creds_dir: Option<std::path::PathBuf>,
    /// The CA of its certificate, when it serves TLS only ([`Redis::start_tls`]).
    pub tls_ca: Option<PathBuf>,
}

/// A server certificate, its key and the CA it chains to.
pub struct TlsFiles<'a> {
    /// Certificate (PEM).
    pub cert: &'a Path,
    /// Private key (PEM).
    pub key: &'a Path,
    /// CA certificate (PEM).
    pub ca: &'a Path,
}

impl Redis {
    /// Starts redis-server without persistence and waits until it answers PING.
    pub fn start(name: &str) -> anyhow::Result<Redis> {
        Redis::start_with(name, None)
    }

    /// Starts redis-server requiring `password` (as Argo CD's default install does) and waits until
    /// it answers PING after AUTH.
    pub fn start_with_password(name: &str, password: &str) -> anyhow::Result<Redis> {
        Redis::start_with(name, Some(password))
    }

    /// Starts the hub's Redis as Argo CD's install protects it (a fresh random password) and lays
    /// the password out in `creds_dir` as the `argocd-redis` secret is mounted (file `auth`), for
    /// our principal's `--redis-creds-dir-path` (see [`Redis::principal_flags`]).
    pub fn start_as_hub(name: &str, creds_dir: &std::path::Path) -> anyhow::Result<Redis> {
        let password = format!("hub-{}", uuid::Uuid::new_v4().simple());
        std::fs::create_dir_all(creds_dir)?;
        std::fs::write(creds_dir.join("auth"), &password)?;
        let mut redis = Redis::start_with(name, Some(&password))?;
        redis.creds_dir = Some(creds_dir.to_path_buf());
        Ok(redis)
    }

    /// Our principal's flags for this Redis as the hub's: its address and, when started with
    /// [`Redis::start_as_hub`], the credentials directory.
    pub fn principal_flags(&self) -> Vec<String> {
        let mut flags = vec![format!("--redis-server-address={}", self.address())];
        if let Some(dir) = &self.creds_dir {
            flags.push(format!("--redis-creds-dir-path={}", dir.display()));
        }
        flags
    }

    /// Starts redis-server serving TLS only (as Argo CD's Redis with TLS enabled), with `tls`'s
    /// certificate, clients not asked for certificates, requiring `password` if given; waits until
    /// it answers PING over TLS.
    pub fn start_tls(
        name: &str,
        tls: TlsFiles<'_>,
        password: Option<&str>,
    ) -> anyhow::Result<Redis> {
        Redis::start_on(name, password, Some(tls))
    }

    fn start_with(name: &str, password: Option<&str>) -> anyhow::Result<Redis> {
        Redis::start_on(name, password, None)
    }

    fn start_on(
        name: &str,
        password: Option<&str>,
        tls: Option<TlsFiles<'_>>,
    ) -> anyhow::Result<Redis> {
        let bin = system_binary("redis-server", "redis-server")?;
        let dir = temp_dir(&format!("redis-{name}"))?;
        let port = free_port();
        let spec = ProcessSpec::new(format!("redis-{name}"), bin, dir.join("redis.log")).args([
            "--port".to_string(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--protected-mode".into(),
            "no".into(),
            "--dir".into(),
            dir.display().to_string(),
        ]);
        let spec = match password {
            Some(p) => spec.args(["--requirepass", p]),
            None => spec,
        };
        let spec = match &tls {
            Some(tls) => spec.args([
                "--tls-port".to_string(),
                port.to_string(),
                "--port".into(),
                "0".into(),
                "--tls-cert-file".into(),
                tls.cert.display().to_string(),
                "--tls-key-file".into(),
                tls.key.display().to_string(),
                "--tls-ca-cert-file".into(),
                tls.ca.display().to_string(),
                "--tls-auth-clients".into(),
                "no".into(),
            ]),
            None => spec,
        };
        let process = ManagedProcess::spawn(spec)?;
        let redis = Redis {
            port,
            process,
            password: password.map(str::to_string),
            creds_dir: None,
            tls_ca: tls.map(|tls| tls.ca.to_path_buf()),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !redis.ping() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "redis-server on port {port} did not answer PING within 10 s:\n{}",
                redis.process.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(redis)
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this server (over TLS and with its password when it has them);
    /// returns stdout.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = std::process::Command::new(system_binary("redis-cli", "redis-tools")?);
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(ca) = &self.tls_ca {
            cmd.arg("--tls").arg("--cacert").arg(ca);
        }
        if let Some(p) = &self.password {
            cmd.args(["--no-auth-warning", "-a", p]);
        }
        let out = cmd.args(args).output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
    }

    /// True if the server answers `PING` with `+PONG` (after AUTH when it has a password).
    pub fn ping(&self) -> bool {
        if self.tls_ca.is_some() {
            return self.cli(&["PING"]).is_ok_and(|out| out == "PONG");
        }
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if let Some(p) = &self.password {
            let mut ok = [0u8; 5];
            if s.write_all(&resp_command(&["AUTH", p])).is_err()
                || s.read_exact(&mut ok).is_err()
                || &ok != b"+OK\r\n"
            {
                return false;
            }
        }
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }
}

/// `args` as one RESP command (an array of bulk strings).
pub fn resp_command(args: &[&str]) -> Vec<u8> {
    resp_command_bytes(&args.iter().map(|a| a.as_bytes()).collect::<Vec<_>>())
}

/// [`resp_command`] for arguments that need not be text (e.g. a gzipped cache value to `SET`).
pub fn resp_command_bytes(args: &[&[u8]]) -> Vec<u8> {
    let frame = OwnedFrame::Array(
        args.iter()
            .map(|a| OwnedFrame::BulkString(a.to_vec()))
            .collect(),
    );
    let mut out = vec![0; frame.encode_len(false)];
    encode(&mut out, &frame, false).expect("the buffer is the frame's length");
    out
}

/// Whether `buf` holds one whole RESP2 reply, or bytes that no reply starts with (more bytes
/// would not make them one: the caller shows them as they are).
fn whole_reply(buf: &[u8]) -> bool {
    !matches!(decode(buf), Ok(None))
}

/// Sends `args` as one command on `conn` (a client of a Redis server or of the principal's Redis
/// proxy) and returns its reply as text, e.g. `+OK\r\n` or `$-1\r\n`; waits at most 10 s.
pub async fn resp_exchange(
    conn: &mut tokio::net::TcpStream,
    args: &[&str],
) -> anyhow::Result<String> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let reply = resp_exchange_bytes(conn, &args).await?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// [`resp_exchange`] with arguments and reply as bytes (the whole reply frame, e.g.
/// `$<len>\r\n<bytes>\r\n` for a `GET` of a binary value).
pub async fn resp_exchange_bytes(
    conn: &mut tokio::net::TcpStream,
    args: &[&[u8]],
) -> anyhow::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(&resp_command_bytes(args)).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !whole_reply(&buf) {
            if conn.read_buf(&mut buf).await? == 0 {
                anyhow::bail!(
                    "connection closed after {:?}",
                    String::from_utf8_lossy(&buf)
                );
            }
        }
        anyhow::Ok(())
    })
    .await
    .map_err(|_| {
        let command: Vec<_> = args.iter().map(|a| String::from_utf8_lossy(a)).collect();
        anyhow::anyhow!("no whole reply to {command:?} within 10 s: {buf:?}")
    })??;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        assert_eq!(
            resp_command(&["SET", "k", "10"]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n10\r\n"
        );
    }

    #[test]
    fn a_reply_is_whole_once_all_its_bytes_arrived() {
        for (bytes, whole) in [
            (&b"+OK\r\n"[..], true),
            (b"-ERR no\r\n", true),
            (b":0\r\n", true),
            (b"$-1\r\n", true),
            (b"$5\r\nhello\r\n", true),
            (b"*2\r\n$1\r\na\r\n:1\r\n", true),
            (b"?not resp\r\n", true),
            (b"", false),
            (b"+OK", false),
            (b"$5\r\nhel", false),
            (b"$5\r\nhello", false),
            (b"*2\r\n$1\r\na\r\n", false),
        ] {
            assert_eq!(
                whole_reply(bytes),
                whole,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}
