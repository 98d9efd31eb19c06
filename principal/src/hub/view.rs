//! The hub view: the one store per watched hub kind, and the lookups every hub part makes in it.
//!
//! Owns the informers' read sides for hub Applications (every namespace `--allowed-namespaces`
//! admits), AppProjects, repository / repo-creds Secrets and the GPG keys ConfigMap (principal
//! namespace), all narrowed by `--label-selector` (AppProjects, Secrets and the ConfigMap labelled
//! skip-sync are not watched), and answers "what does the hub hold": an agent's Application and
//! an AppProject, a repository Secret and the AppProject its `data.project` names (all typed), the GPG keys
//! ConfigMap (typed, if synced). It holds no copy
//! of its own: the informer stores are the only cache of these kinds in the principal. When the
//! embedded operator runs, the one Application watch selects every Application and its changes
//! are also handed on ([`HubInformers::app_events`]) to the operator's pull model, which keeps no
//! Application watch of its own; the hub then narrows what it serves and routes to its selection
//! in process ([`HubSelection`], with `kube`'s [`Narrowed`] handler), as the apiserver narrows
//! the watch when nothing else needs every Application.

use std::collections::BTreeMap;
use std::sync::Arc;

use argocd_agent_kube::argocd::{AppProject, Application};
use argocd_agent_kube::fanout::EventFanout;
use argocd_agent_kube::informer::{Handler, Informer, InformerReader, Scope};
use argocd_agent_kube::narrowed::Narrowed;
use argocd_agent_kube::repository::{RepositoryExt, REPOSITORY_SELECTOR};
use argocd_agent_kube::skip_sync::without_skip_sync;
use argocd_agent_proto::event::GPG_KEYS_CONFIGMAP;
use argocd_agent_runtime::label_selector::LabelSelector;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::runtime::watcher;
use serde_json::Value;

use super::mapping::AppMapping;
use crate::routing::{combined_selector, namespace_allowed};

/// The hub kinds the principal watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Applications, in agent namespaces.
    Application,
    /// AppProjects, in the principal namespace.
    AppProject,
    /// Repository and repo-creds Secrets, in the principal namespace.
    Repository,
    /// The GPG keys ConfigMap, in the principal namespace.
    GpgKey,
}

impl Kind {
    /// The kind's name, as in logs.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Application => "Application",
            Kind::AppProject => "AppProject",
            Kind::Repository => "Secret",
            Kind::GpgKey => "ConfigMap",
        }
    }
}

/// Which hub Applications the principal serves, and whether their watch is shared.
#[derive(Debug, Clone, Default)]
pub struct HubSelection {
    /// `--allowed-namespaces` (globs); empty = every namespace.
    pub allowed_namespaces: Vec<String>,
    /// `--label-selector` (also narrows AppProjects and repository Secrets).
    pub label_selector: Option<LabelSelector>,
    /// Whether another part of the process (the embedded operator's pull model) reads every
    /// Application: then the one Application watch selects them all, its changes are handed on
    /// ([`HubInformers::app_events`]), and the hub narrows its own view in process.
    pub share_applications: bool,
}

impl HubSelection {
    /// Whether the hub serves `app`: in an allowed namespace and matching the label selector.
    pub fn admits(&self) -> Scope<Application> {
        let (namespaces, selector) = (self.allowed_namespaces.clone(), self.label_selector.clone());
        Arc::new(move |app: &Application| {
            namespace_allowed(
                &namespaces,
                app.metadata.namespace.as_deref().unwrap_or_default(),
            ) && selector
                .as_ref()
                .is_none_or(|s| s.matches(app.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())))
        })
    }
}

/// The informers of the hub view, before handlers are attached.
pub struct HubInformers {
    principal_namespace: String,
    mapping: AppMapping,
    /// Which stored Applications the hub serves.
    admits: Scope<Application>,
    /// Applications.
    pub apps: Informer<Application>,
    /// AppProjects.
    pub projects: Informer<AppProject>,
    /// Repository Secrets.
    pub repositories: Informer<Secret>,
    /// The GPG keys ConfigMap.
    pub gpg_keys: Informer<ConfigMap>,
    /// The Applications' changes for other parts of the process, when `apps` is shared.
    pub app_events: Option<Arc<EventFanout<Application>>>,
}

impl HubInformers {
    /// The informers for `client`: Applications `selection` admits, AppProjects and repository
    /// Secrets in `principal_namespace`, narrowed by `selection`'s label selector; Applications
    /// map to agents by `mapping`.
    pub fn new(
        client: &kube::Client,
        principal_namespace: &str,
        selection: HubSelection,
        mapping: AppMapping,
    ) -> HubInformers {
        let user = selection.label_selector.as_ref().map(|s| s.to_string());
        let config = |fixed: Option<&str>| match combined_selector(fixed, user.as_deref()) {
            Some(selector) => watcher::Config::default().labels(&selector),
            None => watcher::Config::default(),
        };
        // AppProjects, repository Secrets and the GPG keys ConfigMap labelled skip-sync are not
        // watched at all (upstream's
        // selector); Applications are, so the operator can share their store, and map to no agent
        // instead ([`AppMapping::agent_of`]).
        let synced = |fixed: Option<&str>| {
            let selector = without_skip_sync(combined_selector(fixed, user.as_deref()).as_deref());
            watcher::Config::default().labels(&selector)
        };
        let admits = selection.admits();
        let apps_api = Api::all(client.clone());
        // Shared: one watch of every Application, narrowed here. Not shared: the apiserver
        // narrows by label and the informer keeps only the allowed namespaces.
        let (apps, app_events) = if selection.share_applications {
            let apps = Informer::new("hub Applications", apps_api, watcher::Config::default());
            let events = EventFanout::new(apps.reader());
            (apps, Some(events))
        } else {
            let scope = admits.clone();
            let apps = Informer::new("hub Applications", apps_api, config(None))
                .scope(move |app: &Application| scope(app));
            (apps, None)
        };
        let projects = Informer::new(
            "hub AppProjects",
            Api::namespaced(client.clone(), principal_namespace),
            synced(None),
        );
        let repositories = Informer::new(
            "hub repository Secrets",
            Api::namespaced(client.clone(), principal_namespace),
            synced(Some(REPOSITORY_SELECTOR)),
        );
        let gpg_keys = Informer::new(
            "hub GPG keys ConfigMap",
            Api::namespaced(client.clone(), principal_namespace),
            synced(None).fields(&super::gpg_keys::field_selector()),
        );
        HubInformers {
            principal_namespace: principal_namespace.to_string(),
            mapping,
            admits,
            app_events,
            apps,
            projects,
            repositories,
            gpg_keys,
        }
    }

    /// The informers with one handler each (applications, projects, repositories, GPG keys).
    pub fn with_handlers(
        mut self,
        apps: Arc<dyn Handler<Application>>,
        projects: Arc<dyn Handler<AppProject>>,
        repositories: Arc<dyn Handler<Secret>>,
        gpg_keys: Arc<dyn Handler<ConfigMap>>,
    ) -> HubInformers {
        self.apps = self.apps.handler(Narrowed::new(self.admits.clone(), apps));
        if let Some(events) = &self.app_events {
            self.apps = self.apps.handler(events.clone());
        }
        self.projects = self.projects.handler(projects);
        self.repositories = self.repositories.handler(repositories);
        self.gpg_keys = self.gpg_keys.handler(gpg_keys);
        self
    }

    /// The view over these informers' stores.
    pub fn view(&self) -> HubView {
        HubView {
            principal_namespace: self.principal_namespace.clone(),
            mapping: self.mapping,
            admits: self.admits.clone(),
            apps: self.apps.reader(),
            projects: self.projects.reader(),
            repositories: self.repositories.reader(),
            gpg_keys: self.gpg_keys.reader(),
        }
    }
}

/// Read access to the hub objects the principal watches.
#[derive(Clone)]
pub struct HubView {
    /// Where AppProjects and repository Secrets live.
    principal_namespace: String,
    /// How Applications (and AppProjects) map to agents.
    mapping: AppMapping,
    /// Which stored Applications the hub serves ([`HubSelection::admits`]).
    admits: Scope<Application>,
    apps: InformerReader<Application>,
    projects: InformerReader<AppProject>,
    repositories: InformerReader<Secret>,
    gpg_keys: InformerReader<ConfigMap>,
}

/// A stored object as JSON.
pub fn to_value<T: serde::Serialize + ?Sized>(obj: &T) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

impl HubView {
    /// Whether the first list of `kind` completed (before that, changes are not routed: the
    /// resync on connect covers them).
    pub fn is_listed(&self, kind: Kind) -> bool {
        match kind {
            Kind::Application => self.apps.is_listed(),
            Kind::AppProject => self.projects.is_listed(),
            Kind::Repository => self.repositories.is_listed(),
            Kind::GpgKey => self.gpg_keys.is_listed(),
        }
    }

    /// Waits until every kind has been listed once.
    pub async fn wait_listed(&self) {
        self.apps.wait_listed().await;
        self.projects.wait_listed().await;
        self.repositories.wait_listed().await;
        self.gpg_keys.wait_listed().await;
    }

    /// How Applications map to agents.
    pub fn mapping(&self) -> AppMapping {
        self.mapping
    }

    /// The namespace AppProjects and repository Secrets live in.
    pub fn principal_namespace(&self) -> &str {
        &self.principal_namespace
    }

    /// The hub Application `namespace`/`name`, if it belongs to `agent`.
    pub fn application(
        &self,
        agent: &str,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<Application>> {
        self.application_in(namespace, name)
            .filter(|app| self.mapping.owns(agent, app))
    }

    /// The hub Application `namespace`/`name`, whoever it belongs to (autonomous agents' mirrors
    /// live in the agent's namespace under either mapping).
    pub fn application_in(&self, namespace: &str, name: &str) -> Option<Arc<Application>> {
        self.apps
            .get(Some(namespace), name)
            .filter(|app| (self.admits)(app))
    }

    /// Every hub Application the hub serves.
    fn applications(&self) -> impl Iterator<Item = Arc<Application>> + '_ {
        self.apps
            .state()
            .into_iter()
            .filter(|app| (self.admits)(app))
    }

    /// Every hub Application in `namespace`, whoever it belongs to.
    pub fn applications_in(&self, namespace: &str) -> Vec<Arc<Application>> {
        self.applications()
            .filter(|a| a.metadata.namespace.as_deref() == Some(namespace))
            .collect()
    }

    /// Every hub Application that belongs to `agent`.
    pub fn applications_of(&self, agent: &str) -> Vec<Arc<Application>> {
        self.applications()
            .filter(|a| self.mapping.owns(agent, a))
            .collect()
    }

    /// Whether hub AppProject `project` applies to `agent`.
    pub fn project_applies(&self, project: &AppProject, agent: &str) -> bool {
        self.mapping.project_applies(project, agent)
    }

    /// Whether repository Secret `secret` goes to `agent`, given `project`, the hub AppProject
    /// its `data.project` names (if it exists).
    pub fn repository_routes_to(
        &self,
        secret: &Secret,
        project: Option<&AppProject>,
        agent: &str,
    ) -> bool {
        secret.repository().project.is_some()
            && project.is_some_and(|p| self.project_applies(p, agent))
    }

    /// The hub AppProject `name`.
    pub fn project(&self, name: &str) -> Option<Arc<AppProject>> {
        self.projects.get(Some(&self.principal_namespace), name)
    }

    /// Every hub AppProject.
    pub fn projects(&self) -> Vec<Arc<AppProject>> {
        self.projects.state()
    }

    /// Every hub repository Secret.
    pub fn repositories(&self) -> Vec<Arc<Secret>> {
        self.repositories.state()
    }

    /// The hub AppProject a repository Secret names, if it exists.
    pub fn project_of(&self, secret: &Secret) -> Option<Arc<AppProject>> {
        secret.repository().project.and_then(|p| self.project(p))
    }

    /// The hub repository Secret `name`, if the AppProject it names applies to `agent`.
    pub fn repository_for(&self, agent: &str, name: &str) -> Option<Arc<Secret>> {
        let secret = self
            .repositories
            .get(Some(&self.principal_namespace), name)?;
        let project = self.project_of(&secret);
        self.repository_routes_to(&secret, project.as_deref(), agent)
            .then_some(secret)
    }

    /// The hub's GPG keys ConfigMap, if it exists and is synced (every managed agent gets it).
    pub fn gpg_keys(&self) -> Option<Arc<ConfigMap>> {
        self.gpg_keys
            .get(Some(&self.principal_namespace), GPG_KEYS_CONFIGMAP)
            .filter(|cm| super::gpg_keys::if_synced(Some(cm)).is_some())
    }

    /// Every repository Secret that applies to `agent`.
    pub fn repositories_for(&self, agent: &str) -> Vec<Arc<Secret>> {
        self.repositories()
            .into_iter()
            .filter(|s| {
                let project = self.project_of(s);
                self.repository_routes_to(s, project.as_deref(), agent)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use argocd_agent_kube::argocd::ObjectMetaExt;

    use super::super::testing::*;
    use super::*;

    #[tokio::test]
    async fn the_view_serves_what_the_informers_stored_within_the_allowed_namespaces() {
        let informers = HubInformers::new(
            &offline_client(),
            "argocd",
            HubSelection {
                allowed_namespaces: vec!["team-*".into()],
                ..HubSelection::default()
            },
            AppMapping::Namespace,
        );
        let view = informers.view();
        let feeds = drive(informers);
        assert!(!view.is_listed(Kind::Application), "nothing listed yet");
        feeds
            .list_all(
                &view,
                vec![
                    app("team-a", "guestbook", "v1"),
                    app("elsewhere", "other", "v1"),
                ],
                vec![project("p", &["team-a"])],
                vec![repository("repo", "p", "https://git")],
                None,
            )
            .await;
        assert!(view.is_listed(Kind::Application) && view.is_listed(Kind::Repository));
        assert!(view.application("team-a", "team-a", "guestbook").is_some());
        assert!(
            view.application("team-b", "team-a", "guestbook").is_none(),
            "another agent cannot reach it by naming its namespace"
        );
        assert!(
            view.application("elsewhere", "elsewhere", "other")
                .is_none(),
            "outside --allowed-namespaces"
        );
        assert_eq!(view.applications_of("team-a").len(), 1);
        assert!(view.project("p").is_some());
        let secret = view
            .repository_for("team-a", "repo")
            .expect("routes to team-a");
        assert_eq!(
            view.project_of(&secret).unwrap().metadata.name.as_deref(),
            Some("p")
        );
        assert!(view.repository_for("team-b", "repo").is_none());
    }

    #[tokio::test]
    async fn a_repository_secret_goes_where_the_project_its_data_names_applies() {
        let mut no_project = repository("no-project", "p", "https://git/none");
        no_project["data"]
            .as_object_mut()
            .unwrap()
            .remove("project");
        let (view, _feeds) = listed(
            AppMapping::Namespace,
            vec![],
            vec![project("p", &["team-a"]), project("q", &["team-*"])],
            vec![
                repository("repo-p", "p", "https://git/p"),
                repository("repo-q", "q", "https://git/q"),
                repository("repo-gone", "missing", "https://git/gone"),
                no_project,
            ],
            None,
        )
        .await;
        let names = |agent: &str| {
            let mut names: Vec<String> = view
                .repositories_for(agent)
                .iter()
                .map(|s| s.name_str().to_string())
                .collect();
            names.sort();
            names
        };
        assert_eq!(names("team-a"), vec!["repo-p", "repo-q"]);
        assert_eq!(names("team-b"), vec!["repo-q"]);
        assert!(names("other").is_empty());
        assert_eq!(view.repositories().len(), 4, "all four are watched");
        assert!(view.repository_for("team-a", "repo-gone").is_none());
        assert!(view.repository_for("team-a", "no-project").is_none());
    }

    #[tokio::test]
    async fn under_destination_mapping_applications_belong_to_the_agent_their_destination_names() {
        let (view, _feeds) = listed(
            AppMapping::Destination,
            vec![
                app_to("apps", "one", "team-a"),
                app_to("team-b", "two", "team-a"),
                app_to("apps", "three", "team-b"),
                skip_sync(app_to("apps", "skipped", "team-a")),
            ],
            vec![],
            vec![],
            None,
        )
        .await;
        let mut of_a: Vec<String> = view
            .applications_of("team-a")
            .iter()
            .map(|a| format!("{}/{}", a.namespace_str(), a.name_str()))
            .collect();
        of_a.sort();
        assert_eq!(of_a, vec!["apps/one", "team-b/two"]);
        assert!(view.application("team-b", "team-b", "two").is_none());
        assert!(view.application("team-a", "team-b", "two").is_some());
        assert!(view.application_in("apps", "skipped").is_some());
        assert!(view.application("team-a", "apps", "skipped").is_none());
    }

    #[tokio::test]
    async fn the_gpg_keys_configmap_is_served_unless_labelled_skip_sync() {
        let (view, feeds) = listed(
            AppMapping::Namespace,
            vec![],
            vec![],
            vec![],
            Some(gpg_keys(&[("k", "v")])),
        )
        .await;
        assert!(view.gpg_keys().is_some());
        feeds.gpg_keys.apply(skip_sync(gpg_keys(&[("k", "v")])));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while view.gpg_keys().is_some() {
            assert!(std::time::Instant::now() < deadline, "still served");
            tokio::task::yield_now().await;
        }
    }
}
