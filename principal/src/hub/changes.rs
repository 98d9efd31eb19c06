//! Counts of the hub changes the principal handles for managed agents, under upstream
//! argocd-agent v0.9.0's names: `principal_{applications,app_projects,repositories,gpg_keys}_{created,updated,deleted}`
//! (served with OpenMetrics' `_total` suffix, as every counter here).
//!
//! Owns the twelve counters and which change of which kind moves which. A change is counted once
//! per hub object event, whatever number of agents it is routed to, as upstream counts its
//! informer callbacks; unlike upstream, the objects already there at the first list are not
//! counted as created, and neither are autonomous agents' mirrors (their writes are the agents').

use argocd_agent_runtime::telemetry::MetricsRegistry;
use prometheus_client::metrics::counter::Counter;

use super::view::Kind;

/// What happened to a hub object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// It appeared.
    Created,
    /// It changed.
    Updated,
    /// It was deleted.
    Deleted,
}

impl Change {
    /// `Created` when there was no `old` object, else `Updated`.
    pub fn of<T>(old: Option<T>) -> Change {
        match old {
            None => Change::Created,
            Some(_) => Change::Updated,
        }
    }
}

const KINDS: [(Kind, &str, &str); 4] = [
    (Kind::Application, "applications", "Applications"),
    (Kind::AppProject, "app_projects", "AppProjects"),
    (Kind::Repository, "repositories", "repository Secrets"),
    (Kind::GpgKey, "gpg_keys", "GPG keys ConfigMaps"),
];
const CHANGES: [(Change, &str); 3] = [
    (Change::Created, "created"),
    (Change::Updated, "updated"),
    (Change::Deleted, "deleted"),
];

/// The counters (cheap to clone: clones count into the same series).
#[derive(Debug, Clone, Default)]
pub struct HubChanges([[Counter; 3]; 4]);

impl HubChanges {
    /// Registers the twelve counters in `registry`.
    pub fn register(&self, registry: &MetricsRegistry) {
        for (k, (_, name, what)) in KINDS.iter().enumerate() {
            for (c, (_, verb)) in CHANGES.iter().enumerate() {
                registry.register(
                    format!("principal_{name}_{verb}"),
                    format!("Hub {what} {verb}, handled for managed agents"),
                    self.0[k][c].clone(),
                );
            }
        }
    }

    /// Counts one `change` of a hub object of `kind`.
    pub fn record(&self, kind: Kind, change: Change) {
        let k = KINDS
            .iter()
            .position(|(of, ..)| *of == kind)
            .expect("every kind is listed");
        let c = CHANGES
            .iter()
            .position(|(of, _)| *of == change)
            .expect("every change is listed");
        self.0[k][c].inc();
    }

    /// How many `change`s of `kind` were counted.
    #[cfg(test)]
    pub(crate) fn value(&self, kind: Kind, change: Change) -> u64 {
        let k = KINDS
            .iter()
            .position(|(of, ..)| *of == kind)
            .expect("listed");
        let c = CHANGES
            .iter()
            .position(|(of, _)| *of == change)
            .expect("listed");
        self.0[k][c].get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_change_moves_its_own_counter_under_upstreams_name() {
        let changes = HubChanges::default();
        let registry = MetricsRegistry::new("test");
        changes.register(&registry);
        changes.record(Kind::Application, Change::Created);
        changes.record(Kind::Application, Change::Created);
        changes.record(Kind::GpgKey, Change::Deleted);
        changes.record(Kind::AppProject, Change::of(Some(())));
        let text = registry.encode().unwrap();
        for line in [
            "principal_applications_created_total 2",
            "principal_applications_updated_total 0",
            "principal_gpg_keys_deleted_total 1",
            "principal_app_projects_updated_total 1",
            "principal_repositories_created_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}:\n{text}");
        }
    }
}
