//! `argocd-principal` binary entry point.
fn main() {
    println!("argocd-principal");
}
