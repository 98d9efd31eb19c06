//! Leader election with a coordination.k8s.io/v1 Lease, so that among several replicas exactly
//! one does a singular job: the operator's reconcile passes and the principal's active role under
//! `--ha-enabled`, both through [`run_election`].
//!
//! Owns the acquire/renew/take-over rule: a Lease held by someone else is taken only after its
//! `renewTime + leaseDurationSeconds` has passed; every write carries the resourceVersion read,
//! so two candidates cannot both win. A holder that cannot renew steps down one retry interval
//! before its Lease can expire, so the old and the new holder never overlap. Leadership is
//! published on a `watch` channel.

use std::time::Duration;

use chrono::Utc;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Lease timings.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// This candidate's identity.
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub duration: Duration,
    /// How often the holder renews and candidates retry.
    pub retry: Duration,
}

/// Whether `identity` may (re)take a lease now.
pub fn may_acquire(lease: &Lease, identity: &str, now: chrono::DateTime<Utc>) -> bool {
    let Some(spec) = &lease.spec else { return true };
    match spec.holder_identity.as_deref() {
        None | Some("") => true,
        Some(h) if h == identity => true,
        Some(_) => {
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
            spec.renew_time
                .as_ref()
                .map(|t| t.0.as_second() + duration < now.timestamp())
                .unwrap_or(true)
        }
    }
}

fn desired(cfg: &LeaseConfig, previous: Option<&Lease>) -> Lease {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let prev_spec = previous.and_then(|l| l.spec.as_ref());
    let same_holder = prev_spec.and_then(|s| s.holder_identity.as_deref()) == Some(&cfg.identity);
    Lease {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            namespace: Some(cfg.namespace.clone()),
            resource_version: previous.and_then(|l| l.metadata.resource_version.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(cfg.identity.clone()),
            lease_duration_seconds: Some(cfg.duration.as_secs().max(1) as i32),
            acquire_time: if same_holder {
                prev_spec.and_then(|s| s.acquire_time.clone())
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(
                prev_spec.and_then(|s| s.lease_transitions).unwrap_or(0)
                    + i32::from(!same_holder && previous.is_some()),
            ),
            ..LeaseSpec::default()
        }),
    }
}

/// What one election round found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseStatus {
    /// This candidate holds the Lease.
    pub held: bool,
    /// The holder the Lease names (this candidate when `held`; `None` when free or unread).
    pub holder: Option<String>,
}

/// One acquire-or-renew attempt, saying who holds the Lease afterwards.
pub async fn acquire(api: &Api<Lease>, cfg: &LeaseConfig) -> Result<LeaseStatus, kube::Error> {
    let pp = PostParams::default();
    let won = LeaseStatus {
        held: true,
        holder: Some(cfg.identity.clone()),
    };
    let lost_race = LeaseStatus::default();
    match api.get_opt(&cfg.name).await? {
        None => match api.create(&pp, &desired(cfg, None)).await {
            Ok(_) => Ok(won),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(lost_race),
            Err(e) => Err(e),
        },
        Some(lease) if may_acquire(&lease, &cfg.identity, Utc::now()) => {
            match api
                .replace(&cfg.name, &pp, &desired(cfg, Some(&lease)))
                .await
            {
                Ok(_) => Ok(won),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(lost_race),
                Err(e) => Err(e),
            }
        }
        Some(lease) => Ok(LeaseStatus {
            held: false,
            holder: lease.spec.and_then(|s| s.holder_identity),
        }),
    }
}

/// Runs the election until `shutdown`, publishing on `published` what each round found, as
/// whatever the caller watches: `bool` (whether this candidate leads) or the whole
/// [`LeaseStatus`] (the holder too, for readiness reasons and metrics). A leader that cannot
/// renew steps down before its lease can expire.
pub async fn run_election<S>(
    client: kube::Client,
    cfg: LeaseConfig,
    published: watch::Sender<S>,
    shutdown: CancellationToken,
) where
    S: From<LeaseStatus> + PartialEq,
{
    campaign(client, cfg, shutdown, |status| {
        let new = S::from(status);
        published.send_if_modified(|old| {
            let changed = *old != new;
            if changed {
                *old = new;
            }
            changed
        });
    })
    .await
}

impl From<LeaseStatus> for bool {
    fn from(status: LeaseStatus) -> bool {
        status.held
    }
}

/// How long a holder keeps leadership without a successful renewal: one retry interval less
/// than the lease, so it has stepped down before any other candidate may take over.
fn renew_deadline(cfg: &LeaseConfig) -> std::time::Duration {
    cfg.duration.saturating_sub(cfg.retry)
}

async fn campaign(
    client: kube::Client,
    cfg: LeaseConfig,
    shutdown: CancellationToken,
    mut publish: impl FnMut(LeaseStatus),
) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut last_renewed = tokio::time::Instant::now();
    let mut leader = false;
    loop {
        let status = match acquire(&api, &cfg).await {
            Ok(s) => {
                if s.held {
                    last_renewed = tokio::time::Instant::now();
                }
                s
            }
            Err(e) => {
                tracing::warn!(lease = %cfg.name, error = %e, "leader election: lease not reachable");
                let keep = leader && last_renewed.elapsed() < renew_deadline(&cfg);
                LeaseStatus {
                    held: keep,
                    holder: keep.then(|| cfg.identity.clone()),
                }
            }
        };
        if status.held != leader {
            tracing::info!(lease = %cfg.name, identity = %cfg.identity, leader = status.held, "leadership changed");
            leader = status.held;
        }
        publish(status);
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tokio::time::sleep(cfg.retry) => {}
        }
    }
    if leader {
        // Step down so another replica takes over at once instead of after the lease expires.
        if let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await {
            if let Some(spec) = lease.spec.as_mut() {
                if spec.holder_identity.as_deref() == Some(&cfg.identity) {
                    spec.holder_identity = None;
                    let _ = api.replace(&cfg.name, &PostParams::default(), &lease).await;
                }
            }
        }
        publish(LeaseStatus::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed_secs_ago: i64) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(
                    k8s_openapi::jiff::Timestamp::from_second(
                        Utc::now().timestamp() - renewed_secs_ago,
                    )
                    .unwrap(),
                )),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn a_live_lease_of_another_holder_is_respected_an_expired_one_taken() {
        let now = Utc::now();
        assert!(may_acquire(&lease(None, 0), "me", now));
        assert!(may_acquire(&lease(Some("me"), 0), "me", now));
        assert!(!may_acquire(&lease(Some("other"), 5), "me", now));
        assert!(may_acquire(&lease(Some("other"), 60), "me", now));
    }

    #[test]
    fn a_holder_steps_down_a_retry_interval_before_its_lease_can_be_taken() {
        let cfg = LeaseConfig {
            name: "l".into(),
            namespace: "ns".into(),
            identity: "me".into(),
            duration: std::time::Duration::from_secs(10),
            retry: std::time::Duration::from_secs(2),
        };
        assert_eq!(renew_deadline(&cfg), std::time::Duration::from_secs(8));
    }
}
