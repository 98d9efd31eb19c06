//! A kubelet for the workloads we ship: starts the pods of a Deployment that Helm created on a test
//! plane the way a kubelet would, so the principal and the agent run with exactly what their charts
//! give them and nothing the test adds.
//!
//! Owns, per pod: the container's command and args (the image's `ENTRYPOINT`, read from our
//! Dockerfiles, served by the cargo-built binary), its environment (`value`, `valueFrom`
//! `fieldRef`/`secretKeyRef`/`configMapKeyRef`, `envFrom`, `$(VAR)` expansion, and the
//! `KUBERNETES_SERVICE_HOST`/`_PORT` a kubelet adds), its volumes materialised from the apiserver
//! (Secret, ConfigMap, emptyDir, persistentVolumeClaim as a local directory, projected
//! serviceAccountToken/configMap/secret/downwardAPI) and mounted at their `mountPath`, the
//! ServiceAccount's token from the TokenRequest API in the `kube-api-access` volume a kubelet
//! mounts at `/var/run/secrets/kubernetes.io/serviceaccount`, the security context
//! (`runAsUser`/`runAsGroup` in a user namespace, `runAsNonRoot`, `readOnlyRootFilesystem`,
//! capabilities, no_new_privs) and a network namespace of its own, reached through forwards.
//!
//! The sandbox is bubblewrap (`bwrap`, Debian's `bubblewrap`): the root is a tmpfs holding the
//! host's directories read-only (so the binaries find their libraries, as in a distroless image),
//! the volumes bind-mounted at their mount paths, then remounted read-only when the container asks
//! for `readOnlyRootFilesystem`. Each pod gets a network namespace created here and entered with
//! `nsenter`; its container ports are forwarded from host loopback ports ([`Pod::port`],
//! [`service`]), and the pod reaches the apiserver (and any host port the caller names) at
//! `127.0.0.1:<same port>` inside, as through a Service. If this machine cannot create a user
//! namespace the pod runs as root inside its sandbox, loudly logged; without mount or network
//! namespaces nothing can be placed at a mount path, so the runner refuses with the reason.
//!
//! Not done, deliberately: liveness probes and restarts, token refresh (tokens last an hour, a
//! test does not), seccomp profiles, resource limits, init and sidecar containers (refused).

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, KeyToPath, ObjectFieldSelector, PersistentVolumeClaim, PodSpec,
    PodTemplateSpec, Secret, ServiceAccount, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, PostParams};

use crate::binaries::{project_binary, workspace_root};
use crate::control_plane::ControlPlane;
use crate::process::{ManagedProcess, ProcessSpec};
use crate::wait::wait_until;

/// Where a kubelet mounts the ServiceAccount's token, CA and namespace (and kube-rs reads them).
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The ConfigMap kube-controller-manager's root-ca publisher keeps in every namespace.
const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
/// A kubelet's default lifetime of the projected token (`expirationSeconds`).
const DEFAULT_TOKEN_SECONDS: i64 = 3607;
/// `defaultMode` of Secret, ConfigMap and projected volumes.
const DEFAULT_FILE_MODE: i32 = 0o644;

/// A container image as the pod runner serves it: the repository a Deployment names, the
/// image's exec-form `ENTRYPOINT`, user and environment, and the host binary that is its program.
#[derive(Clone, Debug)]
pub struct Image {
    /// `registry/name` without tag or digest.
    pub repository: String,
    /// The image's `ENTRYPOINT` (its first element is where `binary` is mounted).
    pub entrypoint: Vec<String>,
    /// `USER uid[:gid]` of the image, as numbers.
    pub user: Option<(i64, Option<i64>)>,
    /// The image's `ENV` (distroless sets `PATH` and `SSL_CERT_FILE`).
    pub env: Vec<(String, String)>,
    /// The program on the host.
    pub binary: PathBuf,
}

impl Image {
    /// The image `dockerfile` builds, published as `repository`, with `binary` (built by cargo
    /// from the same sources) as its program.
    pub fn from_dockerfile(
        repository: &str,
        dockerfile: &Path,
        binary: PathBuf,
    ) -> anyhow::Result<Image> {
        let text = std::fs::read_to_string(dockerfile)?;
        // Only the final stage makes the image.
        let last_stage = text.rsplit_once("\nFROM ").map(|(_, s)| s).unwrap_or(&text);
        let mut entrypoint = None;
        let mut user = None;
        let env = vec![
            (
                "PATH".to_string(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            ),
            (
                "SSL_CERT_FILE".to_string(),
                "/etc/ssl/certs/ca-certificates.crt".to_string(),
            ),
        ];
        for line in last_stage.lines().map(str::trim) {
            if let Some(json) = line.strip_prefix("ENTRYPOINT ") {
                let exec: Vec<String> = serde_json::from_str(json).map_err(|e| {
                    anyhow::anyhow!("{}: ENTRYPOINT is not exec form: {e}", dockerfile.display())
                })?;
                entrypoint = Some(exec);
            } else if let Some(u) = line.strip_prefix("USER ") {
                let mut parts = u.split(':');
                let uid = parts.next().and_then(|s| s.parse().ok());
                let gid = parts.next().and_then(|s| s.parse().ok());
                user = uid.map(|uid| (uid, gid));
            }
        }
        let entrypoint = entrypoint
            .filter(|e| !e.is_empty())
            .ok_or_else(|| anyhow::anyhow!("{}: no ENTRYPOINT", dockerfile.display()))?;
        Ok(Image {
            repository: repository.to_string(),
            entrypoint,
            user,
            env,
            binary,
        })
    }

    /// Our two images: `Dockerfile.principal` and `Dockerfile.agent` as the charts name them,
    /// served by the cargo-built `argocd-principal` and `argocd-agent`.
    pub fn ours() -> anyhow::Result<Vec<Image>> {
        let root = workspace_root();
        Ok(vec![
            Image::from_dockerfile(
                "ghcr.io/argocd-agent-rs/argocd-principal",
                &root.join("Dockerfile.principal"),
                project_binary("argocd-principal")?,
            )?,
            Image::from_dockerfile(
                "ghcr.io/argocd-agent-rs/argocd-agent",
                &root.join("Dockerfile.agent"),
                project_binary("argocd-agent")?,
            )?,
        ])
    }

    fn serves(&self, image: &str) -> bool {
        let repo = image.split('@').next().unwrap_or(image);
        // A tag follows the last ':' after the last '/' (a registry may have a port).
        let repo = match repo.rsplit_once(':') {
            Some((r, tag)) if !tag.contains('/') => r,
            _ => repo,
        };
        repo == self.repository
    }
}

/// How far this machine lets bubblewrap isolate a pod (probed once per process).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// User, mount, pid, ipc, uts namespaces: `runAsUser` honoured.
    Full,
    /// No user namespace: the container runs as root inside its mount namespace.
    WithoutUserNamespace(String),
}

/// What bubblewrap can do here; Err with the reason when it cannot create a mount namespace.
pub fn isolation() -> Result<Isolation, String> {
    static PROBED: OnceLock<Result<Isolation, String>> = OnceLock::new();
    PROBED
        .get_or_init(|| {
            let bwrap = crate::binaries::system_binary("bwrap", "bubblewrap")
                .map_err(|e| format!("{e:#}"))?;
            let probe = |extra: &[&str]| -> Result<(), String> {
                let out = std::process::Command::new(&bwrap)
                    .args(extra)
                    .args(["--ro-bind", "/", "/", "--unshare-pid", "--", "/bin/true"])
                    .output()
                    .map_err(|e| format!("cannot run {}: {e}", bwrap.display()))?;
                if out.status.success() {
                    Ok(())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
                }
            };
            match probe(&["--unshare-user", "--uid", "65532"]) {
                Ok(()) => Ok(Isolation::Full),
                Err(userns) => match probe(&[]) {
                    Ok(()) => {
                        eprintln!(
                            "[pod-runner] WARNING: bwrap cannot create a user namespace here \
                             ({userns}): pods run as root inside their sandbox, runAsUser is NOT \
                             honoured (the read-only root and the mounts are)"
                        );
                        Ok(Isolation::WithoutUserNamespace(userns))
                    }
                    Err(e) => Err(format!(
                        "bwrap cannot create namespaces on this machine ({e}); without a mount \
                         namespace no volume can be placed at its mountPath"
                    )),
                },
            }
        })
        .clone()
}

/// Starts pods on one plane, as that plane's only kubelet.
pub struct PodRunner {
    client: kube::Client,
    apiserver_port: u16,
    ca_pem: String,
    dir: PathBuf,
    images: Vec<Image>,
}

impl PodRunner {
    /// A runner for `plane` keeping pods' files under `dir`, serving `images`.
    pub async fn new(
        plane: &ControlPlane,
        dir: &Path,
        images: Vec<Image>,
    ) -> anyhow::Result<PodRunner> {
        isolation().map_err(anyhow::Error::msg)?;
        let apiserver_port = plane
            .url
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no port in {}", plane.url))?;
        Ok(PodRunner {
            client: plane.client().await?,
            apiserver_port,
            ca_pem: std::fs::read_to_string(&plane.ca_file)?,
            dir: dir.join(format!("kubelet-{}", plane.name)),
            images,
        })
    }

    /// Runs the pods Deployment `name` in `namespace` asks for (`spec.replicas`, as the apiserver
    /// has it), named like a ReplicaSet's pods. `egress`: host ports the pods may reach at
    /// `127.0.0.1:<port>` besides the apiserver.
    pub async fn run_deployment(
        &self,
        namespace: &str,
        name: &str,
        egress: &[u16],
    ) -> anyhow::Result<Vec<Pod>> {
        let deployment = Api::<Deployment>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await?;
        let spec = deployment
            .spec
            .ok_or_else(|| anyhow::anyhow!("Deployment {namespace}/{name} has no spec"))?;
        let hash = &uuid::Uuid::new_v4().simple().to_string()[..10];
        let mut pods = Vec::new();
        for _ in 0..spec.replicas.unwrap_or(1) {
            let pod_name = format!(
                "{name}-{hash}-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..5]
            );
            pods.push(
                self.run_pod(namespace, &pod_name, &spec.template, egress)
                    .await?,
            );
        }
        Ok(pods)
    }

    /// Runs one pod from `template` as `namespace/pod_name`.
    pub async fn run_pod(
        &self,
        namespace: &str,
        pod_name: &str,
        template: &PodTemplateSpec,
        egress: &[u16],
    ) -> anyhow::Result<Pod> {
        let isolation = isolation().map_err(anyhow::Error::msg)?;
        let spec = template
            .spec
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("pod template without spec"))?;
        anyhow::ensure!(
            spec.init_containers.as_ref().is_none_or(Vec::is_empty) && spec.containers.len() == 1,
            "the pod runner starts pods of one container and no init containers"
        );
        let container = &spec.containers[0];
        let image = container.image.as_deref().unwrap_or_default();
        let image = self
            .images
            .iter()
            .find(|i| i.serves(image))
            .ok_or_else(|| anyhow::anyhow!("no program for image {image}"))?;
        let meta = PodMeta {
            name: pod_name.to_string(),
            namespace: namespace.to_string(),
            uid: uuid::Uuid::new_v4().to_string(),
            service_account: spec
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".to_string()),
            labels: template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.clone())
                .unwrap_or_default(),
            annotations: template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.clone())
                .unwrap_or_default(),
        };
        let pod_dir = self.dir.join(namespace).join(pod_name);
        std::fs::create_dir_all(&pod_dir)?;

        // Volumes, plus the kube-api-access volume the ServiceAccount admission adds.
        let mut volumes: Vec<Volume> = spec.volumes.clone().unwrap_or_default();
        let mut mounts = container.volume_mounts.clone().unwrap_or_default();
        if self.automounts_token(spec, &meta).await?
            && !mounts.iter().any(|m| m.mount_path == SERVICE_ACCOUNT_DIR)
        {
            let (volume, mount) = kube_api_access();
            volumes.push(volume);
            mounts.push(mount);
        }
        let mut sources = BTreeMap::new();
        for v in &volumes {
            if mounts.iter().any(|m| m.name == v.name) {
                let dir = pod_dir.join("volumes").join(&v.name);
                self.materialise(v, &dir, &meta).await?;
                sources.insert(v.name.clone(), dir);
            }
        }

        // The sandbox.
        let security = container.security_context.clone().unwrap_or_default();
        let pod_security = spec.security_context.clone().unwrap_or_default();
        let uid = security
            .run_as_user
            .or(pod_security.run_as_user)
            .or(image.user.map(|u| u.0))
            .unwrap_or(0);
        let gid = security
            .run_as_group
            .or(pod_security.run_as_group)
            .or(image.user.and_then(|u| u.1))
            .unwrap_or(uid);
        let non_root = security
            .run_as_non_root
            .or(pod_security.run_as_non_root)
            .unwrap_or(false);
        anyhow::ensure!(
            !(non_root && uid == 0),
            "container has runAsNonRoot and would run as root"
        );
        let read_only_root = security.read_only_root_filesystem.unwrap_or(false);
        let mut binds: Vec<Bind> = Vec::new();
        for m in &mounts {
            let source = sources
                .get(&m.name)
                .ok_or_else(|| anyhow::anyhow!("volumeMount {} names no volume", m.name))?;
            let source = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => source.join(relative(sub)?),
                None => source.clone(),
            };
            binds.push(Bind {
                source,
                target: resolve_host_symlinks(Path::new(&m.mount_path)),
                writable: !m.read_only.unwrap_or(false),
            });
        }
        binds.push(Bind {
            source: image.binary.clone(),
            target: resolve_host_symlinks(Path::new(&image.entrypoint[0])),
            writable: false,
        });

        let mut args: Vec<String> = vec!["--die-with-parent".into()];
        match &isolation {
            Isolation::Full => args.extend([
                "--unshare-user".into(),
                "--uid".into(),
                uid.to_string(),
                "--gid".into(),
                gid.to_string(),
            ]),
            Isolation::WithoutUserNamespace(why) => eprintln!(
                "[pod-runner] WARNING: {namespace}/{pod_name} runs as root, not uid {uid} ({why})"
            ),
        }
        args.extend(
            [
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--hostname",
                pod_name,
            ]
            .map(String::from),
        );
        args.extend(root_filesystem(&binds));
        for b in &binds {
            let how = if b.writable { "--bind" } else { "--ro-bind" };
            args.extend([how.into(), path_str(&b.source)?, path_str(&b.target)?]);
        }
        if read_only_root {
            args.extend(["--remount-ro".into(), "/".into()]);
        }
        let caps = security.capabilities.unwrap_or_default();
        for cap in caps.drop.unwrap_or_default() {
            args.extend(["--cap-drop".into(), cap_name(&cap)]);
        }
        for cap in caps.add.unwrap_or_default() {
            args.extend(["--cap-add".into(), cap_name(&cap)]);
        }
        args.push("--clearenv".into());
        let env = self.environment(container, image, &meta).await?;
        for (k, v) in &env {
            args.extend(["--setenv".into(), k.clone(), v.clone()]);
        }
        args.extend([
            "--chdir".into(),
            container.working_dir.clone().unwrap_or_else(|| "/".into()),
        ]);
        args.push("--".into());
        args.extend(command_line(container, image, &env));

        // The pod's network, then the container in it.
        let network = Arc::new(PodNetwork::new()?);
        let mut forwards = Vec::new();
        for port in std::iter::once(self.apiserver_port).chain(egress.iter().copied()) {
            forwards.push(network.clone().egress(port).await?);
        }
        let mut ports = BTreeMap::new();
        for p in container.ports.clone().unwrap_or_default() {
            let (host, task) = network.clone().inbound(p.container_port as u16)?;
            forwards.push(task);
            ports.insert(
                p.name
                    .clone()
                    .unwrap_or_else(|| p.container_port.to_string()),
                (p.container_port as u16, host),
            );
        }
        let nsenter = crate::binaries::system_binary("nsenter", "util-linux")?;
        let bwrap = crate::binaries::system_binary("bwrap", "bubblewrap")?;
        let process_spec = ProcessSpec::new(
            format!("pod-{namespace}-{pod_name}"),
            nsenter,
            pod_dir.join("container.log"),
        )
        .arg(format!(
            "--net=/proc/{}/fd/{}",
            std::process::id(),
            network.netns.as_raw_fd()
        ))
        .arg("--")
        .arg(bwrap)
        .args(args);
        std::fs::write(
            pod_dir.join("sandbox.args"),
            format!("{:?}", process_spec.args),
        )?;
        let process = ManagedProcess::spawn(process_spec)?;
        let readiness = container
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .map(|h| {
                let port = match &h.port {
                    IntOrString::Int(n) => Some(*n as u16),
                    IntOrString::String(name) => ports.get(name).map(|(c, _)| *c),
                };
                (port, h.path.clone().unwrap_or_else(|| "/".into()))
            })
            .and_then(|(port, path)| port.map(|p| (p, path)));
        Ok(Pod {
            name: pod_name.to_string(),
            namespace: namespace.to_string(),
            dir: pod_dir,
            isolation,
            env,
            process,
            network,
            ports,
            readiness,
            _forwards: Forwards(forwards),
        })
    }

    /// Whether the pod gets the ServiceAccount token mounted (pod spec wins over the account).
    async fn automounts_token(&self, spec: &PodSpec, meta: &PodMeta) -> anyhow::Result<bool> {
        if let Some(a) = spec.automount_service_account_token {
            return Ok(a);
        }
        let sa = Api::<ServiceAccount>::namespaced(self.client.clone(), &meta.namespace)
            .get(&meta.service_account)
            .await?;
        Ok(sa.automount_service_account_token.unwrap_or(true))
    }

    /// Writes volume `v`'s files into `dir` (created), as a kubelet's volume plugins would.
    async fn materialise(&self, v: &Volume, dir: &Path, meta: &PodMeta) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        let what = |kind: &str| format!("volume {} ({kind})", v.name);
        if let Some(s) = &v.secret {
            let name = s.secret_name.clone().unwrap_or_default();
            let data = self.secret_data(&meta.namespace, &name, s.optional).await?;
            write_items(dir, &data, s.items.as_deref(), s.default_mode)
                .map_err(|e| anyhow::anyhow!("{}: {e}", what("secret")))?;
        } else if let Some(c) = &v.config_map {
            let data = self
                .config_map_data(&meta.namespace, &c.name, c.optional)
                .await?;
            write_items(dir, &data, c.items.as_deref(), c.default_mode)
                .map_err(|e| anyhow::anyhow!("{}: {e}", what("configMap")))?;
        } else if v.empty_dir.is_some() {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
        } else if let Some(claim) = &v.persistent_volume_claim {
            // A local-path provisioner: the claim's data is one directory of this kubelet, kept
            // across the pods that mount it.
            Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &meta.namespace)
                .get(&claim.claim_name)
                .await?;
            let data = self
                .dir
                .join("claims")
                .join(&meta.namespace)
                .join(&claim.claim_name);
            std::fs::create_dir_all(&data)?;
            std::fs::remove_dir(dir)?;
            std::os::unix::fs::symlink(&data, dir)?;
        } else if let Some(p) = &v.projected {
            for source in p.sources.iter().flatten() {
                self.project(source, dir, p.default_mode, meta).await?;
            }
        } else {
            anyhow::bail!("volume {}: this kind of volume is not supported", v.name);
        }
        Ok(())
    }

    async fn project(
        &self,
        source: &VolumeProjection,
        dir: &Path,
        default_mode: Option<i32>,
        meta: &PodMeta,
    ) -> anyhow::Result<()> {
        if let Some(t) = &source.service_account_token {
            let token = self
                .token(
                    meta,
                    t.audience.clone(),
                    t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
                )
                .await?;
            let data = BTreeMap::from([(t.path.clone(), token.into_bytes())]);
            write_items(dir, &data, None, default_mode)?;
        } else if let Some(c) = &source.config_map {
            if c.name == ROOT_CA_CONFIGMAP {
                self.publish_root_ca(&meta.namespace).await?;
            }
            let data = self
                .config_map_data(&meta.namespace, &c.name, c.optional)
                .await?;
            write_items(dir, &data, c.items.as_deref(), default_mode)?;
        } else if let Some(s) = &source.secret {
            let data = self
                .secret_data(&meta.namespace, &s.name, s.optional)
                .await?;
            write_items(dir, &data, s.items.as_deref(), default_mode)?;
        } else if let Some(d) = &source.downward_api {
            let mut data = BTreeMap::new();
            for item in d.items.iter().flatten() {
                let field = item.field_ref.as_ref().ok_or_else(|| {
                    anyhow::anyhow!("downwardAPI {}: only fieldRef is supported", item.path)
                })?;
                data.insert(item.path.clone(), meta.field(field)?.into_bytes());
            }
            write_items(dir, &data, None, default_mode)?;
        } else {
            anyhow::bail!("unsupported projected volume source");
        }
        Ok(())
    }

    /// A token for the pod's ServiceAccount from the TokenRequest API, as a kubelet requests it.
    async fn token(
        &self,
        meta: &PodMeta,
        audience: Option<String>,
        seconds: i64,
    ) -> anyhow::Result<String> {
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: audience.map(|a| vec![a]),
                expiration_seconds: Some(seconds),
                bound_object_ref: None,
            }),
            ..Default::default()
        };
        let answer = Api::<ServiceAccount>::namespaced(self.client.clone(), &meta.namespace)
            .create_token_request(&meta.service_account, &PostParams::default(), &request)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "TokenRequest for ServiceAccount {}/{}: {e}",
                    meta.namespace,
                    meta.service_account
                )
            })?;
        answer
            .status
            .and_then(|s| s.token)
            .ok_or_else(|| anyhow::anyhow!("TokenRequest answered without a token"))
    }

    /// What kube-controller-manager's root-ca-cert-publisher keeps in every namespace (no
    /// controller-manager runs on the test planes): ConfigMap `kube-root-ca.crt` with the CA that
    /// signed the apiserver's serving certificate.
    async fn publish_root_ca(&self, namespace: &str) -> anyhow::Result<()> {
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), namespace);
        if api.get_opt(ROOT_CA_CONFIGMAP).await?.is_some() {
            return Ok(());
        }
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(ROOT_CA_CONFIGMAP.into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([("ca.crt".into(), self.ca_pem.clone())])),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// A Secret's data; empty when missing and `optional`.
    async fn secret_data(
        &self,
        namespace: &str,
        name: &str,
        optional: Option<bool>,
    ) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
        let secret = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await?;
        match secret {
            Some(s) => Ok(s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .chain(
                    s.string_data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes())),
                )
                .collect()),
            None if optional == Some(true) => Ok(BTreeMap::new()),
            None => anyhow::bail!("Secret {namespace}/{name} not found"),
        }
    }

    /// A ConfigMap's data; empty when missing and `optional`.
    async fn config_map_data(
        &self,
        namespace: &str,
        name: &str,
        optional: Option<bool>,
    ) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
        let cm = Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await?;
        match cm {
            Some(c) => Ok(c
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .chain(
                    c.binary_data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0)),
                )
                .collect()),
            None if optional == Some(true) => Ok(BTreeMap::new()),
            None => anyhow::bail!("ConfigMap {namespace}/{name} not found"),
        }
    }

    /// The container's environment in a kubelet's order: the Service variables of the
    /// `kubernetes` Service, the image's `ENV`, `envFrom`, then `env` with `$(VAR)` expanded.
    async fn environment(
        &self,
        c: &Container,
        image: &Image,
        meta: &PodMeta,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let port = self.apiserver_port.to_string();
        let mut env: Vec<(String, String)> = vec![
            ("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()),
            ("KUBERNETES_SERVICE_PORT".into(), port.clone()),
            ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.clone()),
            ("KUBERNETES_PORT".into(), format!("tcp://127.0.0.1:{port}")),
            ("HOSTNAME".into(), meta.name.clone()),
        ];
        env.extend(image.env.iter().cloned());
        let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
            env.retain(|(name, _)| *name != k);
            env.push((k, v));
        };
        for from in c.env_from.iter().flatten() {
            let prefix = from.prefix.clone().unwrap_or_default();
            let data = if let Some(s) = &from.secret_ref {
                self.secret_data(&meta.namespace, &s.name, s.optional)
                    .await?
            } else if let Some(m) = &from.config_map_ref {
                self.config_map_data(&meta.namespace, &m.name, m.optional)
                    .await?
            } else {
                BTreeMap::new()
            };
            for (k, v) in data {
                set(
                    &mut env,
                    format!("{prefix}{k}"),
                    String::from_utf8_lossy(&v).into_owned(),
                );
            }
        }
        for EnvVar {
            name,
            value,
            value_from,
        } in c.env.iter().flatten()
        {
            let value = match (value, value_from) {
                (Some(v), _) => expand(v, &env),
                (None, Some(from)) => {
                    if let Some(f) = &from.field_ref {
                        meta.field(f)?
                    } else if let Some(s) = &from.secret_key_ref {
                        let data = self
                            .secret_data(&meta.namespace, &s.name, s.optional)
                            .await?;
                        match data.get(&s.key) {
                            Some(v) => String::from_utf8_lossy(v).into_owned(),
                            None if s.optional == Some(true) => continue,
                            None => anyhow::bail!(
                                "env {name}: key {} not in Secret {}/{}",
                                s.key,
                                meta.namespace,
                                s.name
                            ),
                        }
                    } else if let Some(m) = &from.config_map_key_ref {
                        let data = self
                            .config_map_data(&meta.namespace, &m.name, m.optional)
                            .await?;
                        match data.get(&m.key) {
                            Some(v) => String::from_utf8_lossy(v).into_owned(),
                            None if m.optional == Some(true) => continue,
                            None => anyhow::bail!(
                                "env {name}: key {} not in ConfigMap {}/{}",
                                m.key,
                                meta.namespace,
                                m.name
                            ),
                        }
                    } else {
                        anyhow::bail!("env {name}: resourceFieldRef is not supported")
                    }
                }
                (None, None) => String::new(),
            };
            set(&mut env, name.clone(), value);
        }
        Ok(env)
    }
}

/// The pod's identity, as `fieldRef`s and the downward API see it.
struct PodMeta {
    name: String,
    namespace: String,
    uid: String,
    service_account: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

impl PodMeta {
    fn field(&self, f: &ObjectFieldSelector) -> anyhow::Result<String> {
        let path = f.field_path.as_str();
        let keyed = |prefix: &str, map: &BTreeMap<String, String>| {
            path.strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix("']"))
                .map(|key| map.get(key).cloned().unwrap_or_default())
        };
        Ok(match path {
            "metadata.name" => self.name.clone(),
            "metadata.namespace" => self.namespace.clone(),
            "metadata.uid" => self.uid.clone(),
            "spec.serviceAccountName" => self.service_account.clone(),
            "spec.nodeName" => "pod-runner".into(),
            "status.podIP" | "status.hostIP" => "127.0.0.1".into(),
            _ => keyed("metadata.labels['", &self.labels)
                .or_else(|| keyed("metadata.annotations['", &self.annotations))
                .ok_or_else(|| anyhow::anyhow!("fieldRef {path} is not supported"))?,
        })
    }
}

/// The volume and mount the ServiceAccount admission plugin adds to a pod that automounts its
/// token: a projected token, the cluster CA from `kube-root-ca.crt`, and the namespace.
fn kube_api_access() -> (Volume, k8s_openapi::api::core::v1::VolumeMount) {
    use k8s_openapi::api::core::v1::{
        ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, ProjectedVolumeSource,
        ServiceAccountTokenProjection, VolumeMount,
    };
    let name = "kube-api-access".to_string();
    let volume = Volume {
        name: name.clone(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(DEFAULT_FILE_MODE),
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".into(),
                        expiration_seconds: Some(DEFAULT_TOKEN_SECONDS),
                        audience: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: ROOT_CA_CONFIGMAP.into(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".into(),
                            path: "ca.crt".into(),
                            mode: None,
                        }]),
                        optional: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                api_version: Some("v1".into()),
                                field_path: "metadata.namespace".into(),
                            }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                },
            ]),
        }),
        ..Default::default()
    };
    let mount = VolumeMount {
        name,
        mount_path: SERVICE_ACCOUNT_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    };
    (volume, mount)
}

/// Writes `data` (all keys, or the `items` chosen) as files of mode `mode` under `dir`.
fn write_items(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    mode: Option<i32>,
) -> anyhow::Result<()> {
    let chosen: Vec<(String, String, Option<i32>)> = match items {
        Some(items) => items
            .iter()
            .map(|i| (i.key.clone(), i.path.clone(), i.mode))
            .collect(),
        None => data.keys().map(|k| (k.clone(), k.clone(), None)).collect(),
    };
    for (key, path, item_mode) in chosen {
        let bytes = data
            .get(&key)
            .ok_or_else(|| anyhow::anyhow!("key {key} not found"))?;
        let file = dir.join(relative(&path)?);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&file, bytes)?;
        let mode = item_mode.or(mode).unwrap_or(DEFAULT_FILE_MODE) as u32;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// `path` if it is relative and stays inside its directory (no `..`), as the API validates.
fn relative(path: &str) -> anyhow::Result<&Path> {
    let p = Path::new(path);
    anyhow::ensure!(
        p.components().all(|c| matches!(c, Component::Normal(_))),
        "path {path} must be relative without '..'"
    );
    Ok(p)
}

/// Expands `$(VAR)` from `env` (`$$` is a literal `$`; unknown references stay as written).
fn expand(value: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some((name, r)) = after.strip_prefix('(').and_then(|a| a.split_once(')')) {
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&format!("$({name})")),
            }
            rest = r;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// `command` (or the image's ENTRYPOINT) and `args`, with `$(VAR)` expanded.
fn command_line(c: &Container, image: &Image, env: &[(String, String)]) -> Vec<String> {
    let command = c
        .command
        .clone()
        .unwrap_or_else(|| image.entrypoint.clone());
    command
        .iter()
        .chain(c.args.iter().flatten())
        .map(|a| expand(a, env))
        .collect()
}

/// `CAP_X` from a Kubernetes capability name (`X`, `ALL`).
fn cap_name(cap: &str) -> String {
    if cap == "ALL" || cap.starts_with("CAP_") {
        cap.to_string()
    } else {
        format!("CAP_{cap}")
    }
}

/// One bind mount into the sandbox.
struct Bind {
    source: PathBuf,
    target: PathBuf,
    writable: bool,
}

/// Where `path` lands when the host's symlinks on the way are followed (`/var/run` → `/run`), so
/// a mount point is created where the container will look for it.
fn resolve_host_symlinks(path: &Path) -> PathBuf {
    let mut resolved = PathBuf::from("/");
    let mut parts: Vec<_> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            _ => None,
        })
        .collect();
    parts.reverse();
    let mut hops = 0;
    while let Some(part) = parts.pop() {
        let next = resolved.join(&part);
        match std::fs::read_link(&next) {
            Ok(target) if hops < 16 && !parts.is_empty() => {
                hops += 1;
                if target.is_absolute() {
                    resolved = PathBuf::from("/");
                }
                let mut more: Vec<_> = target
                    .components()
                    .filter_map(|c| match c {
                        Component::Normal(s) => Some(s.to_os_string()),
                        _ => None,
                    })
                    .collect();
                more.reverse();
                parts.extend(more);
            }
            _ => resolved = next,
        }
    }
    resolved
}

/// The bwrap arguments that build the root: a tmpfs holding the host's entries read-only, with
/// directories on the way to a mount point recreated (so the mount point can be made in them)
/// and their other entries bound one by one; `/dev` and `/proc` of the sandbox's own.
fn root_filesystem(binds: &[Bind]) -> Vec<String> {
    fn walk(dir: &Path, binds: &[Bind], out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        entries.sort();
        for path in entries {
            if dir == Path::new("/") && (path == Path::new("/proc") || path == Path::new("/dev")) {
                continue;
            }
            let s = path.display().to_string();
            if binds.iter().any(|b| b.target == path) {
                continue;
            }
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(_) => continue,
            };
            if meta.file_type().is_symlink() {
                if let Ok(target) = std::fs::read_link(&path) {
                    out.extend(["--symlink".into(), target.display().to_string(), s]);
                }
            } else if meta.is_dir() && binds.iter().any(|b| b.target.starts_with(&path)) {
                out.extend(["--dir".into(), s]);
                walk(&path, binds, out);
            } else if meta.is_dir() || meta.is_file() {
                out.extend(["--ro-bind".into(), s.clone(), s]);
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new("/"), binds, &mut out);
    out.extend(["--dev", "/dev", "--proc", "/proc"].map(String::from));
    out
}

fn path_str(p: &Path) -> anyhow::Result<String> {
    p.to_str()
        .map(String::from)
        .ok_or_else(|| anyhow::anyhow!("path {} is not UTF-8", p.display()))
}

/// A running pod: its container's process, its network, and forwards to its ports.
pub struct Pod {
    /// The pod's name (its hostname and `metadata.name`).
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its files: `volumes/<name>`, `container.log`, `sandbox.args`.
    pub dir: PathBuf,
    /// How it is isolated.
    pub isolation: Isolation,
    /// The container's environment as started.
    pub env: Vec<(String, String)>,
    /// The container's process (the sandbox).
    pub process: ManagedProcess,
    network: Arc<PodNetwork>,
    /// Port name (or number) → (container port, host port forwarded to it).
    ports: BTreeMap<String, (u16, u16)>,
    /// (container port, path) of the readiness probe's httpGet.
    readiness: Option<(u16, String)>,
    _forwards: Forwards,
}

impl Pod {
    /// The host loopback port forwarded to the container port named `name` (or numbered).
    pub fn port(&self, name: &str) -> Option<u16> {
        self.ports.get(name).map(|(_, host)| *host)
    }

    /// Whether the readiness probe passes now (HTTP 2xx/3xx on the pod's network); a pod
    /// without one is ready while its container runs.
    pub async fn is_ready(&self) -> bool {
        probe(&self.network, self.readiness.clone()).await
    }

    /// Waits until the readiness probe passes; fails with the container's log.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        wait_until(
            &format!("pod {}/{} ready", self.namespace, self.name),
            timeout,
            || async { Ok::<_, anyhow::Error>(self.is_ready().await.then_some(())) },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", self.process.log_tail(30)))
    }

    /// The container's value of environment variable `name`.
    pub fn env(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The last `n` lines of the container's output.
    pub fn log_tail(&self, n: usize) -> String {
        self.process.log_tail(n)
    }
}

/// A Service over `pods`' port `port` (a name or number): a host loopback port whose connections
/// go to a pod that is ready at connect time (so an HA standby gets nothing, as behind a real
/// Service). Lives as long as the returned guard.
pub fn service(pods: &[Pod], port: &str) -> anyhow::Result<(u16, ServiceForward)> {
    /// One pod behind the Service: its network, the target port there, its readiness probe.
    struct Endpoint {
        network: Arc<PodNetwork>,
        port: u16,
        readiness: Option<(u16, String)>,
    }
    let backends: Vec<Endpoint> = pods
        .iter()
        .map(|p| {
            p.ports
                .get(port)
                .map(|(container, _)| Endpoint {
                    network: p.network.clone(),
                    port: *container,
                    readiness: p.readiness.clone(),
                })
                .ok_or_else(|| anyhow::anyhow!("pod {} has no port {port}", p.name))
        })
        .collect::<anyhow::Result<_>>()?;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let host_port = listener.local_addr()?.port();
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let backends = Arc::new(backends);
    let task = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let backends = backends.clone();
            tokio::spawn(async move {
                for e in backends.iter() {
                    if probe(&e.network, e.readiness.clone()).await {
                        if let Ok(upstream) = e.network.clone().connect(e.port).await {
                            relay(client, upstream).await;
                        }
                        return;
                    }
                }
            });
        }
    });
    Ok((
        host_port,
        ServiceForward {
            _forwards: Forwards(vec![task]),
        },
    ))
}

/// Keeps a [`service`]'s forward running; dropping it closes the port.
pub struct ServiceForward {
    _forwards: Forwards,
}

/// Forwarding tasks, stopped on drop.
struct Forwards(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Forwards {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Whether an HTTP GET of `readiness` answers 2xx/3xx inside `net` (true without a probe).
async fn probe(net: &Arc<PodNetwork>, readiness: Option<(u16, String)>) -> bool {
    let Some((port, path)) = readiness else {
        return true;
    };
    let net = net.clone();
    tokio::task::spawn_blocking(move || {
        net.in_netns(move || {
            let mut s = TcpStream::connect_timeout(
                &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                Duration::from_secs(1),
            )?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: kube-probe\r\nConnection: close\r\n\r\n"
            )?;
            let mut head = [0u8; 12];
            s.read_exact(&mut head)?;
            let status = String::from_utf8_lossy(&head[9..12]).parse::<u16>().unwrap_or(0);
            Ok((200..400).contains(&status))
        })
        .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}

/// A network namespace with only loopback, held open by a file descriptor.
struct PodNetwork {
    netns: OwnedFd,
}

impl PodNetwork {
    /// A fresh network namespace with `lo` up.
    fn new() -> anyhow::Result<PodNetwork> {
        let netns = std::thread::spawn(|| -> io::Result<OwnedFd> {
            // SAFETY: unshare affects only this short-lived thread's network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            loopback_up()?;
            Ok(std::fs::File::open("/proc/thread-self/ns/net")?.into())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("network namespace thread panicked"))?
        .map_err(|e| anyhow::anyhow!("cannot create a network namespace for a pod: {e}"))?;
        Ok(PodNetwork { netns })
    }

    /// Runs `f` on a fresh thread inside the namespace (sockets it creates stay in it).
    fn in_netns<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let fd: RawFd = self.netns.as_raw_fd();
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    // SAFETY: moves only this thread, which ends after `f`.
                    if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    f()
                })
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("thread in the pod network panicked")))
        })
    }

    /// A connection to `127.0.0.1:port` inside the pod.
    async fn connect(self: Arc<Self>, port: u16) -> io::Result<tokio::net::TcpStream> {
        let stream = tokio::task::spawn_blocking(move || {
            self.in_netns(move || {
                let s = TcpStream::connect_timeout(
                    &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                    Duration::from_secs(2),
                )?;
                s.set_nonblocking(true)?;
                Ok(s)
            })
        })
        .await
        .map_err(io::Error::other)??;
        tokio::net::TcpStream::from_std(stream)
    }

    /// Forwards a fresh host loopback port to `container_port` in the pod.
    fn inbound(
        self: Arc<Self>,
        container_port: u16,
    ) -> anyhow::Result<(u16, tokio::task::JoinHandle<()>)> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let net = self.clone();
                tokio::spawn(async move {
                    if let Ok(upstream) = net.connect(container_port).await {
                        relay(client, upstream).await;
                    }
                });
            }
        });
        Ok((port, task))
    }

    /// Makes host `127.0.0.1:port` reachable at `127.0.0.1:port` inside the pod.
    async fn egress(self: Arc<Self>, port: u16) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        let net = self.clone();
        let listener = tokio::task::spawn_blocking(move || {
            net.in_netns(move || {
                let l = TcpListener::bind((Ipv4Addr::LOCALHOST, port))?;
                l.set_nonblocking(true)?;
                Ok(l)
            })
        })
        .await??;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        Ok(tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(upstream) =
                        tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await
                    {
                        relay(client, upstream).await;
                    }
                });
            }
        }))
    }
}

/// Copies both ways until either side closes. Both sockets send at once (no Nagle): a Service's
/// packet forwarding adds no coalescing delay, and a relay must not add one either (a small reply
/// would wait for the peer's delayed ACK).
async fn relay(mut a: tokio::net::TcpStream, mut b: tokio::net::TcpStream) {
    let _ = (a.set_nodelay(true), b.set_nodelay(true));
    let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
}

/// Sets the calling thread's network namespace's `lo` up.
fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket and ioctl calls on a zeroed, correctly sized ifreq.
    unsafe {
        let sock = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if sock < 0 {
            return Err(io::Error::last_os_error());
        }
        let sock = OwnedFd::from_raw_fd(sock);
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_expand_like_a_kubelet() {
        let env = vec![("A".to_string(), "x".to_string())];
        assert_eq!(expand("$(A)-$(B)-$$(A)-$", &env), "x-$(B)-$(A)-$");
    }

    #[test]
    fn images_are_matched_by_repository_not_tag() {
        let image = Image {
            repository: "ghcr.io/o/p".into(),
            entrypoint: vec!["/p".into()],
            user: None,
            env: vec![],
            binary: PathBuf::from("/bin/true"),
        };
        assert!(image.serves("ghcr.io/o/p:0.1.0"));
        assert!(image.serves("ghcr.io/o/p@sha256:abc"));
        assert!(!image.serves("ghcr.io/o/pp:0.1.0"));
    }

    #[test]
    fn mount_points_follow_host_symlinks() {
        let resolved = resolve_host_symlinks(Path::new(SERVICE_ACCOUNT_DIR));
        let var_run = std::fs::read_link("/var/run").ok();
        if var_run.is_some() {
            assert!(resolved.starts_with("/run"), "{}", resolved.display());
        }
        assert!(resolved.ends_with("secrets/kubernetes.io/serviceaccount"));
    }
}
