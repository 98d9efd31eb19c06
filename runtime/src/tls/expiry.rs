//! Certificate expiry reporting for the TLS material a process presents.
//!
//! Owns: the `<prefix>_certificate_expiry_timestamp_seconds{certificate}` gauge (the earliest
//! `notAfter` of the chain a [`ReloadingConfig`] currently presents, as a Unix time, so an alert
//! can be `... - time() < 7*86400`) and the log lines that go with it: one warning per certificate
//! that expires within the warning window, one error once it has expired. Hot reload
//! ([`super::reload`]) swaps the certificate; the next check picks up the new date and logs the
//! change once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::reload::{ReloadingConfig, TlsFiles};
use crate::telemetry::MetricsRegistry;

type Labels = Vec<(String, String)>;

/// How close to `notAfter` a certificate is reported as expiring soon.
pub const DEFAULT_WARN_BEFORE: Duration = Duration::from_secs(14 * 24 * 3600);

/// How often the presented certificates are checked.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(60);

/// What a check found about one certificate, relative to now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiryState {
    /// Valid for longer than the warning window.
    Valid,
    /// Expires within the warning window.
    ExpiringSoon,
    /// `notAfter` is in the past.
    Expired,
}

/// Classifies `not_after` at `now` with the warning window `warn_before`.
pub fn expiry_state(
    not_after: DateTime<Utc>,
    now: DateTime<Utc>,
    warn_before: Duration,
) -> ExpiryState {
    if not_after <= now {
        ExpiryState::Expired
    } else if not_after - now
        <= chrono::Duration::from_std(warn_before).unwrap_or(chrono::Duration::MAX)
    {
        ExpiryState::ExpiringSoon
    } else {
        ExpiryState::Valid
    }
}

/// The expiry gauge of one process; [`CertificateExpiry::watch`] one [`ReloadingConfig`] per
/// certificate it presents.
#[derive(Debug, Clone)]
pub struct CertificateExpiry {
    gauge: Family<Labels, Gauge>,
    warn_before: Duration,
}

impl CertificateExpiry {
    /// Registers `<prefix>_certificate_expiry_timestamp_seconds` in `registry`.
    pub fn register(registry: &MetricsRegistry, prefix: &str, warn_before: Duration) -> Self {
        let gauge = Family::<Labels, Gauge>::default();
        registry.register(
            format!("{prefix}_certificate_expiry_timestamp_seconds"),
            "Earliest notAfter (Unix seconds) of the certificate chain this process presents, by certificate",
            gauge.clone(),
        );
        Self { gauge, warn_before }
    }

    /// Records `config`'s current expiry under `certificate` now and then every `interval`; logs
    /// once per (certificate, notAfter, state) when it expires soon or has expired. The task ends
    /// when every clone of `config` is gone.
    pub fn watch<F: TlsFiles>(
        &self,
        certificate: &str,
        config: &ReloadingConfig<F>,
        interval: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        let certificate = certificate.to_string();
        let weak = config.downgrade();
        let last = Arc::new(Mutex::new(None::<(DateTime<Utc>, ExpiryState)>));
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(config) = weak.upgrade() else {
                    return;
                };
                if let Some(not_after) = config.not_after() {
                    this.record(&certificate, not_after, Utc::now(), &last);
                }
            }
        })
    }

    fn record(
        &self,
        certificate: &str,
        not_after: DateTime<Utc>,
        now: DateTime<Utc>,
        last: &Mutex<Option<(DateTime<Utc>, ExpiryState)>>,
    ) {
        self.gauge
            .get_or_create(&vec![("certificate".to_string(), certificate.to_string())])
            .set(not_after.timestamp());
        let state = expiry_state(not_after, now, self.warn_before);
        let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
        if *last == Some((not_after, state)) {
            return;
        }
        *last = Some((not_after, state));
        match state {
            ExpiryState::Valid => {}
            ExpiryState::ExpiringSoon => tracing::warn!(
                certificate,
                %not_after,
                "TLS certificate expires soon: renew it (the new files are picked up without a restart)"
            ),
            ExpiryState::Expired => tracing::error!(
                certificate,
                %not_after,
                "TLS certificate has expired: peers will refuse it until it is renewed"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_follow_the_warning_window() {
        let now = Utc::now();
        let day = Duration::from_secs(86400);
        let in_days = |d: i64| now + chrono::Duration::days(d);
        assert_eq!(expiry_state(in_days(30), now, 14 * day), ExpiryState::Valid);
        assert_eq!(
            expiry_state(in_days(3), now, 14 * day),
            ExpiryState::ExpiringSoon
        );
        assert_eq!(
            expiry_state(in_days(-1), now, 14 * day),
            ExpiryState::Expired
        );
    }

    #[test]
    fn gauge_carries_not_after_per_certificate() {
        let registry = MetricsRegistry::empty();
        let expiry =
            CertificateExpiry::register(&registry, "argocd_principal", DEFAULT_WARN_BEFORE);
        let not_after = DateTime::from_timestamp(1_900_000_000, 0).unwrap();
        let last = Mutex::new(None);
        expiry.record(
            "grpc",
            not_after,
            not_after - chrono::Duration::days(1),
            &last,
        );
        assert_eq!(
            *last.lock().unwrap(),
            Some((not_after, ExpiryState::ExpiringSoon))
        );
        let text = registry.encode().unwrap();
        assert!(
            text.contains(
                "argocd_principal_certificate_expiry_timestamp_seconds{certificate=\"grpc\"} 1900000000"
            ),
            "{text}"
        );
    }
}
