//! The Argo CD resource kinds this project reads and writes (`argoproj.io/v1alpha1`).
//!
//! Owns their group, version, kind and plural, once, as [`ApiResource`]s for dynamic APIs.

use kube::core::{ApiResource, GroupVersionKind};

/// Argo CD's API group.
pub const ARGOPROJ_GROUP: &str = "argoproj.io";
/// The version of every Argo CD kind used here.
pub const ARGOPROJ_VERSION: &str = "v1alpha1";

fn argoproj(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(ARGOPROJ_GROUP, ARGOPROJ_VERSION, kind),
        plural,
    )
}

/// `argoproj.io/v1alpha1` Application.
pub fn application() -> ApiResource {
    argoproj("Application", "applications")
}

/// `argoproj.io/v1alpha1` AppProject.
pub fn appproject() -> ApiResource {
    argoproj("AppProject", "appprojects")
}
