//! Fails when `src/gen/` is stale against `edgebeat/v1/*.proto`.
//!
//! Regenerate with `EDGEBEAT_REGENERATE=1 cargo test -p edgebeat-proto --test generated`.

use std::path::Path;

#[test]
fn generated_code_is_current() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fds = protox::compile(["edgebeat/v1/heartbeat.proto"], [root]).expect("proto compiles");
    let tmp = tempfile::tempdir().expect("temp dir");
    let out = tmp.path().to_path_buf();
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .codec_path("crate::codec::SmallBufferCodec")
        .client_mod_attribute("edgebeat.v1", "#[cfg(feature = \"grpc-client\")]")
        .server_mod_attribute("edgebeat.v1", "#[cfg(feature = \"grpc-server\")]")
        .out_dir(&out)
        .compile_fds(fds)
        .expect("code generation");
    let fresh = std::fs::read_to_string(out.join("edgebeat.v1.rs")).expect("generated file");
    let committed_path = root.join("src/gen/edgebeat.v1.rs");
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    if fresh != committed {
        if std::env::var_os("EDGEBEAT_REGENERATE").is_some() {
            std::fs::write(&committed_path, &fresh).expect("write generated code");
        } else {
            panic!(
                "src/gen/edgebeat.v1.rs is stale: run \
                 EDGEBEAT_REGENERATE=1 cargo test -p edgebeat-proto --test generated"
            );
        }
    }
}
