//! Compiles the wire contract in `proto/*.proto` with `protox` (pure Rust, no system `protoc`)
//! and generates prost messages plus tonic clients and servers into `OUT_DIR`.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "cloudevents.proto",
    "auth.proto",
    "version.proto",
    "eventstream.proto",
    "logstream.proto",
    "terminalstream.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    let files: Vec<PathBuf> = PROTOS.iter().map(|f| dir.join(f)).collect();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    println!("cargo:rerun-if-changed=build.rs");

    let fds = protox::compile(&files, [&dir])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .emit_rerun_if_changed(false)
        .compile_fds(fds)?;
    Ok(())
}
