//! Compiles the `.proto` files with `protox` (a pure-Rust protobuf compiler), so a fresh
//! machine with nothing but cargo can build knic: no `protoc` on the host.

use std::error::Error;

const PROTOS: &[&str] = &[
    "pluginregistration/api.proto",
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "dra-health/v1alpha1/api.proto",
    "dra-health/v1/api.proto",
    "kni/api.proto",
];

/// NRI and ttrpc's envelope: plain prost messages. NRI runs on ttrpc, not gRPC, and knic frames
/// ttrpc by hand, so no tonic client or server code is generated for them.
const MESSAGE_ONLY_PROTOS: &[&str] = &["nri/api.proto", "ttrpc/ttrpc.proto"];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let files = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(files)?;
    let files = protox::compile(MESSAGE_ONLY_PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_fds(files)?;
    Ok(())
}
