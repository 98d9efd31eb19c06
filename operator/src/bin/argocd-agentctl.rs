//! `argocd-agentctl`: PKI, agent registration and fleet tooling.
fn main() {
    println!("argocd-agentctl");
}
