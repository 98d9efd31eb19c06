//! Reading a process's Prometheus `/metrics` in tests: one scrape, parsed by `prometheus-parse`,
//! with lookups that tell "declared but not counted yet" (0) apart from "not declared at all" (an
//! error), so a renamed or misspelt metric fails its test instead of reading as 0.
//!
//! A labelled family is declared only once it has a sample, so a baseline read before anything
//! happened uses [`Scrape::baseline`] and the read after it [`Scrape::value`].
//!
//! Names are family names as registered (`principal_events_received`) or counter sample names
//! (`principal_events_received_total`); both find the same samples.

use prometheus_parse::Value;

use crate::gateway::http_get;

/// One parsed `/metrics` body.
#[derive(Debug, Clone)]
pub struct Scrape {
    parsed: prometheus_parse::Scrape,
}

impl Scrape {
    /// Scrapes `/metrics` of the process serving its ops endpoints on 127.0.0.1:`port`.
    pub async fn of(port: u16) -> anyhow::Result<Scrape> {
        let (status, body) = http_get(port, "/metrics").await?;
        anyhow::ensure!(
            status == 200,
            "/metrics on port {port} answered {status}: {body}"
        );
        Scrape::parse(&body)
    }

    /// Parses a `/metrics` body (Prometheus or OpenMetrics text).
    pub fn parse(body: &str) -> anyhow::Result<Scrape> {
        let parsed = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))?;
        Ok(Scrape { parsed })
    }

    fn family(name: &str) -> &str {
        name.strip_suffix("_total").unwrap_or(name)
    }

    /// Whether the process declares the metric family `name` (a `# HELP` line), counted or not.
    pub fn declares(&self, name: &str) -> bool {
        let family = Self::family(name);
        self.parsed.docs.contains_key(family) || self.parsed.docs.contains_key(name)
    }

    /// The values of the samples of `name` whose labels include every pair of `labels`.
    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = f64> + 'a {
        let family = Self::family(name);
        self.parsed
            .samples
            .iter()
            .filter(move |s| s.metric == family || s.metric == format!("{family}_total"))
            .filter(move |s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .filter_map(|s| match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
                Value::Histogram(_) | Value::Summary(_) => None,
            })
    }

    /// The sum of the samples of `name` whose labels include every pair of `labels`: 0 when the
    /// family is declared but has no such sample yet (a counter never incremented), an error when
    /// the process does not declare the family at all.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<f64> {
        anyhow::ensure!(
            self.declares(name),
            "the process does not declare the metric {name} (misspelt or renamed?)"
        );
        Ok(self.matching(name, labels).sum())
    }

    /// The current sum of `name`'s samples with `labels`, as the baseline of a later difference:
    /// 0 while nothing is exposed (prometheus-client declares a labelled family only with its
    /// first sample). Read the later value with [`Scrape::value`], which fails for a family that
    /// is still not declared, so a misspelt name fails the test all the same.
    pub fn baseline(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).sum()
    }

    /// The sample of `name` with labels including `labels`, if one is exposed.
    pub fn sample(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.matching(name, labels).next()
    }

    /// The samples of `name` (and their labels), for reports.
    pub fn series(&self, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
        let family = Self::family(name);
        self.parsed
            .samples
            .iter()
            .filter(|s| s.metric == family || s.metric == format!("{family}_total"))
            .filter_map(|s| {
                let v = match s.value {
                    Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                    Value::Histogram(_) | Value::Summary(_) => return None,
                };
                let mut labels: Vec<(String, String)> = s
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                labels.sort();
                Some((labels, v))
            })
            .collect()
    }
}

/// The sample of `name` with `labels` exposed on `port`'s `/metrics`, if any; an error if the
/// process does not declare the metric at all.
pub async fn read(port: u16, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<Option<f64>> {
    let scrape = Scrape::of(port).await?;
    scrape.value(name, labels)?;
    Ok(scrape.sample(name, labels))
}

/// Whether the agent serving ops on `port` reports its event stream up
/// (`argocd_agent_connection_status` 1).
pub async fn agent_connected(port: u16) -> anyhow::Result<bool> {
    Ok(read(port, "argocd_agent_connection_status", &[]).await? == Some(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &str = "\
# HELP principal_events_received Events received from agents.
# TYPE principal_events_received counter
principal_events_received_total{event_type=\"status-update\"} 3
principal_events_received_total{event_type=\"request-update\"} 8
# HELP argocd_agent_outbox_resources Resources queued.
# TYPE argocd_agent_outbox_resources gauge
argocd_agent_outbox_resources 0
# HELP principal_event_errors Errors.
# TYPE principal_event_errors counter
# EOF
";

    #[test]
    fn counters_are_found_by_family_or_sample_name_and_filtered_by_labels() {
        let s = Scrape::parse(BODY).unwrap();
        let status = [("event_type", "status-update")];
        assert_eq!(s.value("principal_events_received", &status).unwrap(), 3.0);
        assert_eq!(
            s.value("principal_events_received_total", &status).unwrap(),
            3.0
        );
        assert_eq!(s.value("principal_events_received", &[]).unwrap(), 11.0);
        assert_eq!(s.sample("argocd_agent_outbox_resources", &[]), Some(0.0));
    }

    #[test]
    fn a_declared_family_without_samples_reads_0_and_an_undeclared_one_is_an_error() {
        let s = Scrape::parse(BODY).unwrap();
        assert_eq!(s.value("principal_event_errors_total", &[]).unwrap(), 0.0);
        assert!(s.sample("principal_event_errors", &[]).is_none());
        let err = s.value("principal_events_recieved", &[]).unwrap_err();
        assert!(err.to_string().contains("does not declare"), "{err}");
    }
}
