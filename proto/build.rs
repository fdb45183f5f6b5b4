// Uses the protoc shipped by `protoc-bin-vendored`, so a fresh machine needs no system protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure().compile_protos(
        &[
            "proto/gpuplane/v1/raft.proto",
            "proto/gpuplane/v1/controlplane.proto",
            "proto/gpuplane/v1/agent.proto",
            "proto/inference/grpc_predict_v2.proto",
        ],
        &["proto"],
    )?;
    Ok(())
}
