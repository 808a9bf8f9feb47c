//! The Rust of the CSI spec's protobuf (`proto/csi.proto`, spec v1.3.0;
//! where it came from: docs/decisions.md, "The CSI driver"): compiled by
//! protox, a protobuf compiler in Rust, into the descriptors prost and
//! tonic generate the messages and services from, so the build needs no
//! `protoc`. The services' servers serve `ringfeed csi`; their clients are
//! generated too, for the tests that drive the driver as the kubelet does.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/csi.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // No `connect(addr)` on the clients: the tests make their channel
        // over the Unix socket themselves (and the driver has no client).
        .build_transport(false)
        // The Node service's calls the driver does not offer (staging,
        // volume stats, expansion) answer UNIMPLEMENTED.
        .generate_default_stubs(true)
        .compile_fds(descriptors)?;
    Ok(())
}
