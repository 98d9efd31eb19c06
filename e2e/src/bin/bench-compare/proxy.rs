//! The live-view reads through the principal, each next to its direct baseline measured in the
//! same cell, interleaved sample by sample:
//! - a resource-proxy GET (a hub client with the agent's client certificate, as the hub's Argo CD
//!   cluster Secret has it → principal → agent → spoke apiserver) beside the same GET sent
//!   straight to the spoke apiserver;
//! - a resource-tree read through the principal's Redis proxy, as the hub's argocd-server asks it
//!   (`auth`, then `get app|resources-tree|<agent>_<app>|1.8.3.gz` on one kept connection) beside
//!   the same key read straight from the spoke's Redis.
//!
//! Both Redis servers require a password, as Argo CD's install configures them. No
//! application-controller runs here, so what it would write is bench-written: the tree value, in
//! Argo CD's cache format (gzipped `encoding/json` with its newline, under the key Argo CD's cache
//! gives it), and the tracking annotation and label on the ConfigMap read through the resource
//! proxy (both agents serve only tracked resources).
//!
//! Also owns what a cell needs for this ([`LiveView`]): the two Redis servers, the flags that
//! switch either principal's proxies on and point either agent at the spoke Redis, and, for
//! upstream's principal, the fixed ports 9090 and 6379 it listens on.

use std::path::Path;
use std::time::{Duration, Instant};

use argocd_agent_kube::argocd_cache::{self, RedisCompression, CACHE_VERSION};
use e2e::gateway::Pki;
use e2e::redis::{resp_exchange_bytes, Redis};
use e2e::sides::{AnyPrincipal, Side};
use e2e::upstream::{FixedPortHold, REDIS_PROXY_PORT, RESOURCE_PROXY_PORT};
use e2e::wait::wait_until;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{json, Value};
use tokio::net::TcpStream;

use crate::report::{pooled, Row};

/// Nodes in the bench-written resource tree (a Deployment with its ReplicaSet, Pods, Service...).
const TREE_NODES: usize = 12;
/// How long the first read through the principal may take (the agent connects first).
const FIRST_READ_LIMIT: Duration = Duration::from_secs(60);

/// The Redis servers and port guards of a cell whose principal serves the live view.
pub struct LiveView {
    hub_redis: Redis,
    spoke_redis: Redis,
    /// Held while an upstream principal has the machine's one resource-proxy and Redis-proxy port.
    _ports: Option<(FixedPortHold, FixedPortHold)>,
}

impl LiveView {
    /// Starts the hub Redis (as Argo CD's install protects it, password laid out as the mounted
    /// `argocd-redis` secret) and the spoke Redis (with a password); for an upstream principal,
    /// takes its fixed ports, failing with what to do when another process has one.
    pub async fn start(side: Side, name: &str, dir: &Path) -> anyhow::Result<LiveView> {
        let ports = match side {
            Side::Ours => None,
            Side::Upstream => {
                let guards = (
                    e2e::upstream::hold_resource_proxy_port().await?,
                    e2e::upstream::hold_redis_proxy_port().await?,
                );
                for port in [RESOURCE_PROXY_PORT, REDIS_PROXY_PORT] {
                    std::net::TcpListener::bind(("0.0.0.0", port)).map_err(|e| {
                        anyhow::anyhow!(
                            "port {port} is taken ({e}): upstream v0.9.0's principal listens on \
                             it and no flag moves it; stop what holds it (another upstream \
                             principal with its proxies on?) and run again"
                        )
                    })?;
                }
                Some(guards)
            }
        };
        Ok(LiveView {
            hub_redis: Redis::start_as_hub(
                &format!("hub-{name}"),
                &dir.join(format!("hub-redis-creds-{name}")),
            )?,
            spoke_redis: Redis::start_with_password(
                &format!("spoke-{name}"),
                &format!("spoke-{}", uuid::Uuid::new_v4().simple()),
            )?,
            _ports: ports,
        })
    }

    /// The principal's flags for its resource proxy and its Redis proxy in front of the hub Redis.
    pub fn principal_args(&self, side: Side, pki: &Pki) -> Vec<String> {
        match side {
            Side::Ours => self.hub_redis.principal_flags(),
            Side::Upstream => {
                let mut args = e2e::upstream::resource_proxy_args(pki);
                args.extend(e2e::upstream::redis_proxy_args(&self.hub_redis));
                args
            }
        }
    }

    /// The agent's flags for the spoke Redis (each side's own names).
    pub fn agent_args(&self, side: Side) -> Vec<String> {
        let password = self.spoke_redis.password.as_deref().unwrap_or_default();
        match side {
            Side::Ours => vec![
                format!("--redis-address={}", self.spoke_redis.address()),
                format!("--redis-password={password}"),
            ],
            Side::Upstream => vec![
                format!("--redis-addr={}", self.spoke_redis.address()),
                format!("--redis-password={password}"),
            ],
        }
    }
}

/// Samples of one cell's live-view reads.
#[derive(Debug, Default)]
pub struct ProxyFigures {
    get_direct: Vec<Duration>,
    get_proxied: Vec<Duration>,
    tree_direct: Vec<Duration>,
    tree_proxied: Vec<Duration>,
}

impl ProxyFigures {
    pub fn to_json(&self) -> Value {
        let ms = |v: &[Duration]| v.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>();
        json!({
            "get_direct_ms": ms(&self.get_direct), "get_proxied_ms": ms(&self.get_proxied),
            "tree_direct_ms": ms(&self.tree_direct), "tree_proxied_ms": ms(&self.tree_proxied),
        })
    }
}

/// What [`measure`] reads through: the cell's principal, its agent and where that agent keeps
/// its Applications on the spoke.
pub struct Target<'a> {
    pub principal: &'a AnyPrincipal,
    pub agent: &'a str,
    pub spoke_ns: &'a str,
    /// An Application of the agent that exists on the hub, whose tree is read.
    pub app: &'a str,
    pub spoke: kube::Client,
    pub pki: &'a Pki,
}

/// `count` GETs and `count` tree reads through the principal, each right after its direct
/// baseline. Fails when what comes through the principal is not what is on the spoke.
pub async fn measure(
    live: &LiveView,
    target: &Target<'_>,
    count: usize,
) -> anyhow::Result<ProxyFigures> {
    let mut figures = ProxyFigures::default();
    let (resource_port, redis_port) = match target.principal {
        AnyPrincipal::Ours(p) => (p.resource_proxy_port, p.redis_proxy_port),
        AnyPrincipal::Upstream(_) => (RESOURCE_PROXY_PORT, REDIS_PROXY_PORT),
    };

    // The resource proxy: one ConfigMap on the spoke, read both ways. Both agents serve only
    // what Argo CD tracks, by the tracking settings in `argocd-cm`: the bench writes the
    // annotation and label Argo CD's sync would (annotation tracking, Argo CD's default).
    let configmaps: Api<ConfigMap> = Api::namespaced(target.spoke.clone(), target.spoke_ns);
    let argocd_cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "argocd-cm", "labels": {"app.kubernetes.io/part-of": "argocd"}},
    }))?;
    configmaps
        .create(&PostParams::default(), &argocd_cm)
        .await?;
    let configmap: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "bench-proxy",
            "labels": {"app.kubernetes.io/instance": target.app},
            "annotations": {"argocd.argoproj.io/tracking-id":
                format!("{}:/ConfigMap:{}/bench-proxy", target.app, target.spoke_ns)}},
        "data": {"greeting": target.agent},
    }))?;
    configmaps
        .create(&PostParams::default(), &configmap)
        .await?;
    let proxied = proxy_client(target, resource_port).await?;
    let path = format!(
        "/api/v1/namespaces/{}/configmaps/bench-proxy",
        target.spoke_ns
    );
    let get = |client: kube::Client| {
        let path = path.clone();
        async move {
            let body = client
                .request_text(http::Request::get(path).body(Vec::new())?)
                .await?;
            let read: ConfigMap = serde_json::from_str(&body)?;
            anyhow::Ok(read.metadata.uid)
        }
    };
    let uid = get(target.spoke.clone()).await?;
    let last = std::sync::Mutex::new(String::new());
    wait_until(
        "a GET through the resource proxy",
        FIRST_READ_LIMIT,
        || async {
            match get(proxied.clone()).await {
                Ok(read) => Ok::<_, anyhow::Error>((read == uid).then_some(())),
                Err(e) => {
                    *last.lock().unwrap() = format!("{e:#}");
                    Ok(None)
                }
            }
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: {}", last.lock().unwrap()))?;
    eprintln!("    {count} GETs direct and through the resource proxy");
    for i in 0..count + 5 {
        let t0 = Instant::now();
        get(target.spoke.clone()).await?;
        let direct = t0.elapsed();
        let t0 = Instant::now();
        let read = get(proxied.clone()).await?;
        let through = t0.elapsed();
        anyhow::ensure!(read == uid, "the proxied GET read {read:?}, not {uid:?}");
        // The first few warm connections and caches up.
        if i >= 5 {
            figures.get_direct.push(direct);
            figures.get_proxied.push(through);
        }
    }

    // The Redis proxy: the tree key written on the spoke as Argo CD's controller would, read both
    // ways on one kept connection each.
    let tree = argocd_cache::encode(&bench_tree(target.spoke_ns), RedisCompression::Gzip);
    let local_key = format!("app|resources-tree|{}|{CACHE_VERSION}.gz", target.app);
    let hub_key = format!(
        "app|resources-tree|{}_{}|{CACHE_VERSION}.gz",
        target.agent, target.app
    );
    let mut spoke = authenticated(&live.spoke_redis.address(), &live.spoke_redis).await?;
    let set = resp_exchange_bytes(&mut spoke, &[b"set", local_key.as_bytes(), &tree]).await?;
    anyhow::ensure!(set == b"+OK\r\n", "SET on the spoke Redis: {set:?}");
    let expected = resp_exchange_bytes(&mut spoke, &[b"get", local_key.as_bytes()]).await?;
    let mut hub = authenticated(&format!("127.0.0.1:{redis_port}"), &live.hub_redis).await?;
    let mut last = Vec::new();
    let started = Instant::now();
    while last != expected {
        anyhow::ensure!(
            started.elapsed() < FIRST_READ_LIMIT,
            "the tree through the Redis proxy is not the spoke's after {FIRST_READ_LIMIT:?}: {:?}",
            String::from_utf8_lossy(&last)
        );
        last = resp_exchange_bytes(&mut hub, &[b"get", hub_key.as_bytes()]).await?;
        if last != expected {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    eprintln!("    {count} resource-tree reads direct and through the Redis proxy");
    for i in 0..count + 5 {
        let t0 = Instant::now();
        resp_exchange_bytes(&mut spoke, &[b"get", local_key.as_bytes()]).await?;
        let direct = t0.elapsed();
        let t0 = Instant::now();
        let read = resp_exchange_bytes(&mut hub, &[b"get", hub_key.as_bytes()]).await?;
        let through = t0.elapsed();
        anyhow::ensure!(
            read == expected,
            "the tree through the Redis proxy differs: {:?}",
            String::from_utf8_lossy(&read)
        );
        if i >= 5 {
            figures.tree_direct.push(direct);
            figures.tree_proxied.push(through);
        }
    }
    Ok(figures)
}

/// A kube client for the principal's resource proxy at `port` as the hub's Argo CD has the
/// agent's cluster: the agent's client certificate, the PKI's CA.
async fn proxy_client(target: &Target<'_>, port: u16) -> anyhow::Result<kube::Client> {
    let (cert, key) = target.pki.agent_files(target.agent);
    let kubeconfig: Kubeconfig = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
        "clusters": [{"name": "proxy", "cluster": {"server": format!("https://127.0.0.1:{port}"),
            "certificate-authority": target.pki.ca()}}],
        "users": [{"name": "argocd", "user": {"client-certificate": cert, "client-key": key}}],
        "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "argocd"}}],
    }))?;
    Ok(kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?,
    )?)
}

/// A connection to `address` after `auth` with `redis`'s password, as go-redis opens one.
async fn authenticated(address: &str, redis: &Redis) -> anyhow::Result<TcpStream> {
    let mut conn = TcpStream::connect(address).await?;
    conn.set_nodelay(true)?;
    let password = redis.password.as_deref().unwrap_or_default();
    let ok = resp_exchange_bytes(&mut conn, &[b"auth", password.as_bytes()]).await?;
    anyhow::ensure!(ok == b"+OK\r\n", "AUTH at {address}: {ok:?}");
    Ok(conn)
}

/// A resource tree of [`TREE_NODES`] nodes in `namespace`, shaped as Argo CD's
/// `v1alpha1.ApplicationTree` JSON (bench-written: no application-controller runs here).
fn bench_tree(namespace: &str) -> Value {
    let nodes: Vec<Value> = (0..TREE_NODES)
        .map(|i| {
            json!({
                "version": "v1", "kind": "Pod", "namespace": namespace,
                "name": format!("web-{i}"), "uid": uuid::Uuid::new_v4().to_string(),
                "parentRefs": [{"group": "apps", "kind": "ReplicaSet", "namespace": namespace,
                                "name": "web-5d9c7", "uid": "00000000-0000-0000-0000-000000000001"}],
                "info": [{"name": "Status Reason", "value": "Running"},
                         {"name": "Containers", "value": "1/1"}],
                "networkingInfo": {"labels": {"app": "web"}},
                "resourceVersion": "1234", "health": {"status": "Healthy"},
                "createdAt": "2026-01-01T00:00:00Z",
            })
        })
        .collect();
    json!({"nodes": nodes, "hosts": [{"name": "node-1",
        "resourcesInfo": [{"resourceName": "cpu", "requestedByApp": 100, "capacity": 2000}]}]})
}

/// The rows: each read through the principal and direct, p50 and p99 pooled over rounds, and
/// the through/direct ratio of each side.
pub fn rows<'a>(of: impl Fn(Side) -> Vec<&'a ProxyFigures>) -> Vec<Row> {
    type Pick = fn(&ProxyFigures) -> &Vec<Duration>;
    let mut rows = Vec::new();
    for (name, through, direct) in [
        (
            "resource-proxy GET",
            (|f: &ProxyFigures| &f.get_proxied) as Pick,
            (|f: &ProxyFigures| &f.get_direct) as Pick,
        ),
        (
            "resource-tree read (bench-written key)",
            |f: &ProxyFigures| &f.tree_proxied,
            |f: &ProxyFigures| &f.tree_direct,
        ),
    ] {
        for (label, p) in [("p50", 0.5), ("p99", 0.99)] {
            let ms = |pick: Pick, side: Side| {
                pooled(of(side).into_iter().flat_map(pick).copied(), p)
                    .map(|d| d.as_secs_f64() * 1e3)
            };
            let ratio = |side: Side| match (ms(through, side), ms(direct, side)) {
                (Some(t), Some(d)) if d > 0.0 => Some(t / d),
                _ => None,
            };
            rows.push(Row {
                figure: format!("{name} through the principal {label}"),
                unit: "ms",
                ours: ms(through, Side::Ours),
                upstream: ms(through, Side::Upstream),
            });
            rows.push(Row {
                figure: format!("{name} direct (baseline) {label}"),
                unit: "ms",
                ours: ms(direct, Side::Ours),
                upstream: ms(direct, Side::Upstream),
            });
            rows.push(Row {
                figure: format!("{name} through / direct {label}"),
                unit: "x",
                ours: ratio(Side::Ours),
                upstream: ratio(Side::Upstream),
            });
        }
    }
    rows
}
