//! The gateway image as `scripts/gateway-image.sh` builds it (buildah, from
//! `deploy/gateway/Dockerfile`): one OCI image index for linux/amd64 and linux/arm64, each
//! image the one static binary the script built, run as 65532 with the gateway as its
//! entrypoint, no shell, the gRPC and metrics ports declared. The amd64 image runs under a
//! real OCI runtime (runc, the image unpacked by umoci) with `deploy/gateway`'s arguments and
//! mounts, as `deploy/gateway`'s ServiceAccount through the in-cluster configuration (its
//! token and CA mounted where kubelet mounts them), against the real control plane: its
//! `/healthz` answers, and an agent's Node is written through it.
//!
//! Needs root, runc, umoci, skopeo, the built control plane and the archive
//! (`EDGEBEAT_GATEWAY_IMAGE`, the script's first word; the staged binaries beside it in
//! `context/`): `scripts/test.sh` builds it and runs this.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use edgebeat_tests::control_plane::{ControlPlane, deployed_agent_config};
use edgebeat_tests::harness::{http_get, start_agent};
use edgebeat_tests::pki::Ca;
use edgebeat_tests::process::{output, spawn_async};
use edgebeat_tests::wait::eventually;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

/// Runs `program` with `args`, asserting that it succeeds: its stdout.
fn run(program: &str, args: &[&str]) -> String {
    let out = output(Command::new(program).args(args)).unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn archive() -> PathBuf {
    PathBuf::from(std::env::var("EDGEBEAT_GATEWAY_IMAGE").expect("EDGEBEAT_GATEWAY_IMAGE"))
}

/// The image of `arch` unpacked by umoci into `dir/bundle` (an OCI runtime bundle: its
/// `config.json` and `rootfs/`).
fn unpack(arch: &str, dir: &Path) -> PathBuf {
    let layout = format!("oci:{}:gateway", dir.join("layout").display());
    run(
        "skopeo",
        &[
            "copy",
            "--quiet",
            "--override-arch",
            arch,
            &format!("oci-archive:{}", archive().display()),
            &layout,
        ],
    );
    let bundle = dir.join("bundle");
    run(
        "umoci",
        &[
            "unpack",
            "--image",
            &format!("{}:gateway", dir.join("layout").display()),
            bundle.to_str().unwrap(),
        ],
    );
    bundle
}

/// Every path under `root`, relative to it.
fn files(root: &Path) -> Vec<String> {
    let mut all = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            all.push(path.strip_prefix(root).unwrap().display().to_string());
            if path.is_dir() && !path.is_symlink() {
                stack.push(path);
            }
        }
    }
    all.sort();
    all
}

#[test]
#[ignore = "needs the image, skopeo and umoci (scripts/test.sh)"]
fn one_index_of_two_images_each_the_static_binary_alone_as_65532() {
    let raw: serde_json::Value = serde_json::from_str(&run(
        "skopeo",
        &[
            "inspect",
            "--raw",
            &format!("oci-archive:{}", archive().display()),
        ],
    ))
    .unwrap();
    let mut platforms: Vec<String> = raw["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}/{}",
                m["platform"]["os"].as_str().unwrap(),
                m["platform"]["architecture"].as_str().unwrap()
            )
        })
        .collect();
    platforms.sort();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"], "{raw}");
    let staged = archive().parent().unwrap().join("context");
    for (arch, machine) in [("amd64", 0x3e_u16), ("arm64", 0xb7)] {
        let config: serde_json::Value = serde_json::from_str(&run(
            "skopeo",
            &[
                "inspect",
                "--config",
                "--override-arch",
                arch,
                &format!("oci-archive:{}", archive().display()),
            ],
        ))
        .unwrap();
        assert_eq!(config["architecture"], arch);
        assert_eq!(config["config"]["User"], "65532:65532", "{arch}");
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!(["/edgebeat-gateway"])
        );
        assert_eq!(
            config["config"]["ExposedPorts"],
            serde_json::json!({"7443/tcp": {}, "9102/tcp": {}}),
            "{arch}"
        );
        assert_eq!(
            config["created"], "1970-01-01T00:00:00Z",
            "{arch}: --timestamp 0"
        );
        let dir = tempfile::tempdir().unwrap();
        let bundle = unpack(arch, dir.path());
        let rootfs = bundle.join("rootfs");
        assert_eq!(
            files(&rootfs),
            ["edgebeat-gateway"],
            "{arch}: the binary alone, no shell"
        );
        let binary = std::fs::read(rootfs.join("edgebeat-gateway")).unwrap();
        assert_eq!(
            u16::from_le_bytes([binary[18], binary[19]]),
            machine,
            "{arch}: the ELF machine"
        );
        assert!(
            binary == std::fs::read(staged.join(arch).join("edgebeat-gateway")).unwrap(),
            "{arch}: the image holds the binary the script built"
        );
    }
}

/// A free TCP port of 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A container run by runc (its state in a directory of its own), killed and deleted when
/// dropped.
struct Container {
    root: PathBuf,
    id: String,
    process: tokio::process::Child,
}

impl Drop for Container {
    fn drop(&mut self) {
        let root = format!("--root={}", self.root.display());
        let _ = output(Command::new("runc").args([&root, "kill", &self.id, "KILL"]));
        let _ = output(Command::new("runc").args([&root, "delete", "--force", &self.id]));
        let _ = self.process.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, runc, umoci, skopeo, the image and the built control plane (scripts/test.sh)"]
async fn the_amd64_image_runs_under_runc_as_deployed_and_writes_a_node() {
    let control_plane = ControlPlane::shared().unwrap();
    control_plane
        .kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-k",
            "deploy/gateway",
        ])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bundle = unpack("amd64", dir.path());

    // What the Deployment mounts: its Secrets, and the ServiceAccount's token, CA and
    // namespace where kubelet mounts them.
    let site = Arc::new(Ca::new("edgebeat-image-site"));
    let server = site.server();
    let write = |sub: &str, files: &[(&str, &str)]| {
        let path = dir.path().join("mounts").join(sub);
        std::fs::create_dir_all(&path).unwrap();
        for (name, text) in files {
            std::fs::write(path.join(name), text).unwrap();
        }
        path
    };
    let tls = write(
        "tls",
        &[("tls.crt", &server.cert_pem), ("tls.key", &server.key_pem)],
    );
    let site_ca = write("site-ca", &[("ca.crt", &site.cert_pem)]);
    let token = control_plane
        .kubectl(&[
            "-n",
            "edgebeat-system",
            "create",
            "token",
            "edgebeat-gateway",
        ])
        .unwrap();
    let sa = write(
        "serviceaccount",
        &[
            ("token", token.trim()),
            (
                "ca.crt",
                &std::fs::read_to_string(&control_plane.ca).unwrap(),
            ),
            ("namespace", "edgebeat-system"),
        ],
    );
    for path in [&tls, &site_ca, &sa] {
        // Readable by 65532, as kubelet's defaultMode 0644 makes them.
        run("chmod", &["-R", "a+rX", path.to_str().unwrap()]);
    }

    // The Deployment's container arguments, its listeners on ports of 127.0.0.1 (the
    // container shares this host's network: no CNI here).
    let deployment: serde_json::Value = serde_json::from_str(
        &control_plane
            .kubectl(&[
                "-n",
                "edgebeat-system",
                "get",
                "deployment",
                "edgebeat-gateway",
                "-o",
                "json",
            ])
            .unwrap(),
    )
    .unwrap();
    let container = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "gateway")
        .unwrap()
        .clone();
    let (grpc_port, metrics_port) = (free_port(), free_port());
    let mut args = vec!["/edgebeat-gateway".to_owned()];
    for arg in container["args"].as_array().unwrap() {
        let arg = arg
            .as_str()
            .unwrap()
            .replace("$(POD_NAME)", "edgebeat-gateway-image")
            .replace("0.0.0.0:7443", &format!("127.0.0.1:{grpc_port}"))
            .replace("0.0.0.0:9102", &format!("127.0.0.1:{metrics_port}"));
        args.push(arg);
    }
    let apiserver = url_host_port(&control_plane.url);
    let config_path = bundle.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["process"]["args"] = serde_json::json!(args);
    config["process"]["terminal"] = serde_json::json!(false);
    let env = config["process"]["env"].as_array_mut().unwrap();
    env.push(serde_json::json!(format!(
        "KUBERNETES_SERVICE_HOST={}",
        apiserver.0
    )));
    env.push(serde_json::json!(format!(
        "KUBERNETES_SERVICE_PORT={}",
        apiserver.1
    )));
    env.push(serde_json::json!("POD_NAME=edgebeat-gateway-image"));
    config["root"]["readonly"] = serde_json::json!(true);
    config["linux"]["namespaces"]
        .as_array_mut()
        .unwrap()
        .retain(|n| n["type"] != "network");
    let mounts = config["mounts"].as_array_mut().unwrap();
    for (source, target) in [
        (&tls, "/etc/edgebeat/tls"),
        (&site_ca, "/etc/edgebeat/site-ca"),
        (&sa, "/var/run/secrets/kubernetes.io/serviceaccount"),
    ] {
        mounts.push(serde_json::json!({
            "destination": target,
            "type": "bind",
            "source": source,
            "options": ["rbind", "ro"],
        }));
    }
    std::fs::write(&config_path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();

    let state = dir.path().join("runc");
    let id = format!("edgebeat-image-{}", std::process::id());
    let log = std::fs::File::create(dir.path().join("gateway.log")).unwrap();
    let process = spawn_async(
        tokio::process::Command::new("runc")
            .arg(format!("--root={}", state.display()))
            .args(["run", "--bundle", bundle.to_str().unwrap(), &id])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true),
    )
    .unwrap();
    let container = Container {
        root: state,
        id,
        process,
    };
    let health = std::net::SocketAddr::from(([127, 0, 0, 1], metrics_port));
    let log_text = || std::fs::read_to_string(dir.path().join("gateway.log")).unwrap_or_default();
    // Polling a port the container opens: nothing to subscribe to.
    let healthy = edgebeat_tests::wait::until(
        "/healthz 200 from the container",
        Duration::from_secs(60),
        || async {
            match http_get(health, "/healthz").await {
                Ok((200, _)) => Ok(()),
                other => Err(other),
            }
        },
        edgebeat_tests::wait::every(Duration::from_millis(200)),
    )
    .await;
    if let Err(e) = healthy {
        panic!("{e}; the container's log:\n{}", log_text());
    }

    let node = "image-runc-1";
    let grpc = std::net::SocketAddr::from(([127, 0, 0, 1], grpc_port));
    let agent = start_agent(
        deployed_agent_config(&site, node, grpc),
        Arc::new(edgebeat_hw::SystemClock),
    )
    .unwrap();
    let nodes: Api<Node> = Api::all(control_plane.admin_client().await.unwrap());
    eventually(
        "the agent's Node, written by the container",
        Duration::from_secs(60),
        || {
            let nodes = nodes.clone();
            async move { nodes.get_opt(node).await.ok().flatten().is_some() }
        },
    )
    .await;
    agent.stop().await.unwrap();
    nodes.delete(node, &Default::default()).await.unwrap();
    drop(container);
}

/// The host and port of an `https://host:port` URL.
fn url_host_port(url: &str) -> (String, u16) {
    let rest = url.trim_start_matches("https://").trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':').unwrap();
    (host.to_owned(), port.parse().unwrap())
}
