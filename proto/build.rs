//! Compiles the .proto files with protox (a pure-Rust protoc) so that no system protoc is needed.

const PROTOS: &[&str] = &[
    "agent/admin.proto",
    "csi/v1/csi.proto",
    "csi/v0/csi.proto",
    "csi/v0.1/csi.proto",
    "csi-addons/identity/identity.proto",
    "csi-addons/reclaimspace/reclaimspace.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=proto/{proto}");
    }
    let fds = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
