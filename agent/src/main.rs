//! `argocd-agent` binary entry point.
fn main() {
    println!("argocd-agent");
}
