//! The agent's Debian packages (`scripts/package.sh`, cargo-deb) installed as operators
//! install them: real `dpkg` into a Debian bookworm root that `debootstrap` made
//! (`dpkg --root`: the maintainer scripts run chrooted into it, with no systemd running
//! there, as in an image build), for each architecture built. Each package installs its
//! binary, its unit (enabled, not started until `/etc/edgebeat/agent.yaml` exists), the
//! examples and its conffile, in seconds (nothing in its scripts waits); the installed
//! binary (arm64 and armhf under qemu-user) registers a Node that turns Ready through the
//! real gateway binary; an upgrade over an edited conffile keeps the edit and puts the new
//! one beside it (`.dpkg-dist`); a purge leaves nothing of it. lintian finds nothing beyond
//! the overrides the package explains.
//!
//! Needs root, `dpkg`, `lintian`, the packages (`EDGEBEAT_DEBS`, their paths separated by
//! spaces) and a bookworm root as a tar archive (`EDGEBEAT_BOOKWORM_TAR`): `scripts/test.sh`
//! makes both (`scripts/package.sh`, `scripts/debootstrap.sh`) and runs it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use edgebeat_tests::process::{GatewayProcess, output, spawn_async};
use edgebeat_tests::standin::StandIn;

/// How long `dpkg -i` may take: unpacking and the scripts, which never wait for a service.
const DPKG_WITHIN: Duration = Duration::from_secs(60);

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

/// A fresh bookworm root from `EDGEBEAT_BOOKWORM_TAR`, in a directory removed when dropped.
fn bookworm_root() -> tempfile::TempDir {
    let tar = std::env::var("EDGEBEAT_BOOKWORM_TAR").expect("EDGEBEAT_BOOKWORM_TAR");
    let dir = tempfile::Builder::new()
        .prefix("edgebeat-bookworm-")
        .tempdir()
        .unwrap();
    run("tar", &["-xf", &tar, "-C", dir.path().to_str().unwrap()]);
    dir
}

/// `dpkg --root root` with `args`, unattended (the old conffile kept when both changed, as
/// `apt-get -o Dpkg::Options::=--force-confold` does), asserting it succeeds within
/// [`DPKG_WITHIN`].
fn dpkg(root: &Path, args: &[&str]) {
    let started = tokio::time::Instant::now();
    let root = format!("--root={}", root.display());
    let mut all = vec![root.as_str(), "--force-confdef", "--force-confold"];
    all.extend_from_slice(args);
    run("dpkg", &all);
    let took = started.elapsed();
    assert!(took < DPKG_WITHIN, "dpkg {args:?} took {took:?}");
}

/// A field of the package as `dpkg-query` reads it in `root` (`${Version}`, `${Conffiles}`,
/// `${db:Status-Abbrev}`).
fn query(root: &Path, field: &str) -> String {
    let admin = root.join("var/lib/dpkg");
    let out = output(Command::new("dpkg-query").args([
        &format!("--admindir={}", admin.display()),
        "-W",
        &format!("-f={field}"),
        "edgebeat-agent",
    ]))
    .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The architecture of a package file (`dpkg-deb --field`).
fn architecture(deb: &Path) -> String {
    run(
        "dpkg-deb",
        &["--field", deb.to_str().unwrap(), "Architecture"],
    )
    .trim()
    .to_owned()
}

/// The ELF machine of `binary` (`e_machine`, bytes 18–19, little-endian).
fn elf_machine(binary: &Path) -> u16 {
    let bytes = std::fs::read(binary).unwrap();
    assert_eq!(
        &bytes[..4],
        b"\x7fELF",
        "{} is no ELF file",
        binary.display()
    );
    u16::from_le_bytes([bytes[18], bytes[19]])
}

/// The same package as a later release would ship it, made from `deb` (a stand-in for the
/// next release, which does not exist yet): version `0.1.0-2` and a changed conffile.
fn next_release(deb: &Path, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let tree = dir.join("next");
    run(
        "dpkg-deb",
        &[
            "--raw-extract",
            deb.to_str().unwrap(),
            tree.to_str().unwrap(),
        ],
    );
    let control = tree.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control).unwrap();
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .unwrap()
        .to_owned();
    std::fs::write(&control, text.replace(&version, "0.1.0-2")).unwrap();
    let default = tree.join("etc/default/edgebeat-agent");
    let mut conffile = std::fs::read_to_string(&default).unwrap();
    conffile.push_str("# A line the next release adds.\n");
    std::fs::write(&default, conffile).unwrap();
    // Its md5sums as dpkg-deb expects them after the change.
    let sums = run(
        "sh",
        &[
            "-c",
            &format!(
                "cd {} && find . -path ./DEBIAN -prune -o -type f -printf '%P\\n' | sort | xargs md5sum",
                tree.display()
            ),
        ],
    );
    std::fs::write(tree.join("DEBIAN/md5sums"), sums).unwrap();
    let next = dir.join("next.deb");
    run(
        "dpkg-deb",
        &[
            "--root-owner-group",
            "--build",
            tree.to_str().unwrap(),
            next.to_str().unwrap(),
        ],
    );
    next
}

/// The installed binary under `root` with `config`, run on this host (arm64 and armhf
/// under qemu-user, static binaries: no chroot, no binfmt), logging to `log`.
fn spawn_installed(root: &Path, arch: &str, config: &Path, log: &Path) -> tokio::process::Child {
    let binary = root.join("usr/bin/edgebeat-agent");
    let mut command = match arch {
        "arm64" => {
            let mut c = tokio::process::Command::new("qemu-aarch64-static");
            c.arg(&binary);
            c
        }
        "armhf" => {
            let mut c = tokio::process::Command::new("qemu-arm-static");
            c.arg(&binary);
            c
        }
        _ => tokio::process::Command::new(&binary),
    };
    let log = std::fs::File::create(log).unwrap();
    spawn_async(
        command
            .arg("--config")
            .arg(config)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true),
    )
    .unwrap()
}

/// Whether Node `name` holds `Ready` `True`.
fn ready(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, dpkg, lintian, the packages and a bookworm root (scripts/test.sh)"]
async fn each_package_installs_runs_upgrades_and_purges_clean() {
    let debs: Vec<PathBuf> = std::env::var("EDGEBEAT_DEBS")
        .expect("EDGEBEAT_DEBS")
        .split_whitespace()
        .map(PathBuf::from)
        .collect();
    assert!(!debs.is_empty(), "no package in EDGEBEAT_DEBS");
    let standin = StandIn::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut gateway = GatewayProcess::start(
        [
            "--server".to_owned(),
            standin.url(),
            "--grpc-listen=127.0.0.1:0".to_owned(),
            "--allow-unidentified-agents".to_owned(),
        ],
        &dir.path().join("gateway.log"),
    )
    .unwrap();
    let grpc = gateway.address("gRPC listening").await.unwrap();

    for deb in &debs {
        let arch = architecture(deb);
        println!("{}: {arch}", deb.display());
        // lintian: nothing but what the overrides explain.
        run(
            "lintian",
            &[
                "--fail-on",
                "error,warning",
                "--no-tag-display-limit",
                deb.to_str().unwrap(),
            ],
        );

        let root = bookworm_root();
        let r = root.path();
        if arch != "amd64" {
            run(
                "dpkg",
                &[
                    &format!("--root={}", r.display()),
                    "--add-architecture",
                    &arch,
                ],
            );
        }
        dpkg(r, &["--install", deb.to_str().unwrap()]);
        assert_eq!(
            query(r, "${db:Status-Abbrev}").trim(),
            "ii",
            "{arch}: installed"
        );
        let machine = match arch.as_str() {
            "arm64" => 0xb7,
            "armhf" => 0x28,
            _ => 0x3e,
        };
        assert_eq!(
            elf_machine(&r.join("usr/bin/edgebeat-agent")),
            machine,
            "{arch}"
        );
        let unit = std::fs::read_to_string(r.join("usr/lib/systemd/system/edgebeat-agent.service"))
            .unwrap();
        for line in [
            "ExecStart=/usr/bin/edgebeat-agent --config /etc/edgebeat/agent.yaml $EDGEBEAT_AGENT_OPTS",
            "ConditionPathExists=/etc/edgebeat/agent.yaml",
            "Type=notify",
        ] {
            assert!(
                unit.lines().any(|l| l == line),
                "{arch}: the unit lacks {line}"
            );
        }
        let wants = r.join("etc/systemd/system/multi-user.target.wants/edgebeat-agent.service");
        assert!(wants.is_symlink(), "{arch}: the unit is enabled");
        assert!(
            r.join("usr/share/doc/edgebeat-agent/examples/site-grpc.yaml")
                .is_file(),
            "{arch}: the examples"
        );
        assert!(
            query(r, "${Conffiles}").contains("/etc/default/edgebeat-agent"),
            "{arch}: the conffile"
        );
        assert!(
            !r.join("etc/edgebeat/agent.yaml").exists(),
            "{arch}: no configuration shipped"
        );

        // The installed binary, configured as an operator does, registers its Node.
        let node = format!("packaged-{arch}");
        let config = r.join("etc/edgebeat/agent.yaml");
        std::fs::create_dir_all(config.parent().unwrap()).unwrap();
        std::fs::write(
            &config,
            format!(
                "apiVersion: edgebeat.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {node}\nhostRoot: {}\nclockSyncCondition: false\ntransport: {{kind: grpc, endpoint: \"http://{grpc}\"}}\n",
                edgebeat_tests::harness::fixture("rpi4-cgroup1").display()
            ),
        )
        .unwrap();
        let log = dir.path().join(format!("agent-{arch}.log"));
        let mut agent = spawn_installed(r, &arch, &config, &log);
        let seen = standin
            .wait_until(Duration::from_secs(60), &format!("{node} Ready"), |v| {
                v.node(&node).is_some_and(|n| ready(&n))
            })
            .await;
        let _ = agent.kill().await;
        assert!(
            seen.is_ok(),
            "{arch}: {seen:?}\nagent log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );

        // An upgrade over an edited conffile keeps the edit, the new one beside it.
        let default = r.join("etc/default/edgebeat-agent");
        let edited = "EDGEBEAT_AGENT_OPTS=\"--log-level=debug\"\n";
        std::fs::write(&default, edited).unwrap();
        let next = next_release(deb, &dir.path().join(&arch));
        dpkg(r, &["--install", next.to_str().unwrap()]);
        assert_eq!(query(r, "${Version}"), "0.1.0-2", "{arch}: upgraded");
        assert_eq!(
            std::fs::read_to_string(&default).unwrap(),
            edited,
            "{arch}: the edit kept"
        );
        let dist = std::fs::read_to_string(r.join("etc/default/edgebeat-agent.dpkg-dist")).unwrap();
        assert!(
            dist.contains("A line the next release adds"),
            "{arch}: {dist}"
        );
        assert!(config.exists(), "{arch}: the configuration untouched");

        // The node's state (what systemd's StateDirectory holds for the dynamic user).
        let state = r.join("var/lib/private/edgebeat/pki");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join("node.key"), "a key").unwrap();
        dpkg(r, &["--purge", "edgebeat-agent"]);
        for gone in [
            "usr/bin/edgebeat-agent",
            "usr/lib/systemd/system/edgebeat-agent.service",
            "etc/systemd/system/multi-user.target.wants/edgebeat-agent.service",
            "etc/default/edgebeat-agent",
            "etc/default/edgebeat-agent.dpkg-dist",
            "etc/edgebeat",
            "var/lib/private/edgebeat",
            "usr/share/doc/edgebeat-agent",
        ] {
            assert!(
                !r.join(gone).exists() && !r.join(gone).is_symlink(),
                "{arch}: /{gone} left after purge"
            );
        }
        assert_eq!(query(r, "${db:Status-Abbrev}").trim(), "", "{arch}: purged");
    }
    gateway.terminate().await.unwrap();
}
