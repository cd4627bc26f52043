//! Compiles the kubelet's device plugin and pod resources APIs (vendored in `proto/`) with
//! protox, a protobuf compiler in Rust, so building needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/deviceplugin/v1beta1/api.proto", "proto/podresources/v1/api.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(descriptors)?;
    Ok(())
}
