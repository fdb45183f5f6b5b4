// Uses the protoc shipped by `protoc-bin-vendored`, so a fresh machine needs no system protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto");
    // Tensors' raw contents as `Bytes`: a request the router may send again to another
    // backend (its first died under it) is kept by reference, not copied.
    tonic_prost_build::configure()
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .compile_protos(
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
