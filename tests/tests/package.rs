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
    // A root directory is 0755 (the temporary directory is made 0700): the agent's dynamic
    // user must reach `/` (systemd's chdir, 200/CHDIR otherwise).
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
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
            "--metrics-listen=127.0.0.1:0".to_owned(),
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
        if let Err(e) = seen {
            panic!(
                "{arch}: {e:?}\nagent log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }

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

/// A root booted by its own systemd as PID 1 of a container (`systemd-nspawn --boot`),
/// sharing this host's network (the gateway on 127.0.0.1 is the board's gateway). nspawn
/// runs in cgroups of its own (`/sys/fs/cgroup/<hierarchy>/<machine>`: its `--keep-unit`
/// puts the container's beneath them) so that dropping it powers the container off and
/// leaves no cgroup, nor the `/run/systemd/nspawn` it makes, behind.
struct Booted {
    nspawn: std::process::Child,
    machine: String,
    cgroups: Vec<PathBuf>,
    init: u32,
    run_dir_existed: bool,
}

/// Where nspawn keeps its state on the host (`/run/systemd/nspawn/propagate/<machine>`,
/// its locks), which it cannot remove itself when `/run` is no tmpfs.
const NSPAWN_RUN: &str = "/run/systemd/nspawn";

impl Booted {
    /// Boots `root` with the fixture tree `host_root` at `/var/lib/edgebeat-fixture`
    /// (read-only), the console written to `log`, and waits until its systemd runs.
    async fn boot(root: &Path, host_root: &Path, log: &Path) -> Self {
        let machine = format!("edgebeat-boot-{}", std::process::id());
        let base = Path::new("/sys/fs/cgroup");
        // A hybrid host (this one): systemd's own v1 hierarchy and the unified one; a pure
        // cgroup v2 host: the one.
        let cgroups: Vec<PathBuf> = if base.join("systemd").is_dir() {
            ["systemd", "unified"]
                .iter()
                .map(|h| base.join(h))
                .filter(|h| h.is_dir())
                .map(|h| h.join(&machine))
                .collect()
        } else {
            vec![base.join(&machine)]
        };
        for cgroup in &cgroups {
            std::fs::create_dir_all(cgroup).unwrap();
        }
        let enter: String = cgroups
            .iter()
            .map(|c| format!("echo $$ > {}/cgroup.procs; ", c.display()))
            .collect();
        let console = std::fs::File::create(log).unwrap();
        let nspawn = edgebeat_tests::process::spawn(
            Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "set -e; {enter}exec systemd-nspawn --boot --register=no --keep-unit \
                     --console=read-only --machine={machine} --directory={} \
                     --bind-ro={}:/var/lib/edgebeat-fixture",
                    root.display(),
                    host_root.display()
                ))
                .stdin(std::process::Stdio::null())
                .stdout(console.try_clone().unwrap())
                .stderr(console),
        )
        .unwrap();
        let mut booted = Booted {
            nspawn,
            machine,
            cgroups,
            init: 0,
            run_dir_existed: Path::new(NSPAWN_RUN).exists(),
        };
        // The container's PID 1, as this host numbers it.
        let procs = booted.cgroups[0].join("payload/init.scope/cgroup.procs");
        // Done: its PID (Some), or systemd-nspawn ended (None).
        let init = edgebeat_tests::wait::until(
            "the container's systemd running",
            Duration::from_secs(30),
            || {
                let pid = std::fs::read_to_string(&procs)
                    .ok()
                    .and_then(|p| p.lines().next()?.parse().ok());
                std::future::ready(match (pid, booted.nspawn.try_wait()) {
                    (Some(pid), _) => Ok(Some(pid)),
                    (None, Ok(None)) => Err("no process in its init.scope yet"),
                    (None, _) => Ok(None),
                })
            },
            edgebeat_tests::wait::every(Duration::from_millis(100)),
        )
        .await;
        match init {
            Ok(Some(pid)) => booted.init = pid,
            ended => panic!(
                "the container's systemd never ran ({}); its console:\n{}",
                ended.map_or_else(|e| e.to_string(), |_| "systemd-nspawn ended".to_owned()),
                std::fs::read_to_string(log).unwrap_or_default()
            ),
        }
        booted
    }

    /// `args` run inside the container (`nsenter` into all of PID 1's namespaces).
    async fn output(&self, args: &[&str]) -> std::process::Output {
        edgebeat_tests::process::output_async(
            tokio::process::Command::new("nsenter")
                .arg(format!("--target={}", self.init))
                .arg("--all")
                .arg("--")
                .args(args),
        )
        .await
        .unwrap()
    }

    /// `args` run inside the container: stdout, trimmed; stderr and the exit status are the
    /// caller's to judge from stdout.
    async fn exec(&self, args: &[&str]) -> String {
        let out = self.output(args).await;
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// `args` run inside the container, asserting success: its stdout.
    async fn run(&self, args: &[&str]) -> String {
        let out = self.output(args).await;
        assert!(
            out.status.success(),
            "{args:?} in the container: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// One property of `unit` (`systemctl show --value`).
    async fn unit(&self, unit: &str, property: &str) -> String {
        self.exec(&["systemctl", "show", "--value", "-p", property, unit])
            .await
    }

    /// The agent's journal, for failure messages.
    async fn journal(&self) -> String {
        self.exec(&["journalctl", "--no-pager", "-u", "edgebeat-agent"])
            .await
    }

    /// Powers the container off as its operator would (`SIGRTMIN+4` to its systemd:
    /// `poweroff`) and asserts it shuts down within `within`: every unit, the agent's
    /// included, stopped in time.
    async fn power_off(&mut self, within: Duration) {
        edgebeat_tests::process::signal(self.init, "RTMIN+4").unwrap();
        let machine = self.machine.clone();
        edgebeat_tests::wait::eventually(&format!("{machine} down after poweroff"), within, || {
            std::future::ready(match self.nspawn.try_wait() {
                Ok(None) => Err("still up"),
                _ => Ok(()),
            })
        })
        .await;
    }
}

/// Removes `dir` and the cgroups beneath it, deepest first (each empty once its processes
/// are gone).
fn remove_cgroup(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// SIGKILLs every process in `dir` and the cgroups beneath it.
fn kill_cgroup(dir: &Path) {
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|p| p.parse().ok()) {
            let _ = edgebeat_tests::process::signal(pid, "KILL");
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                kill_cgroup(&entry.path());
            }
        }
    }
}

impl Drop for Booted {
    fn drop(&mut self) {
        if matches!(self.nspawn.try_wait(), Ok(None)) {
            let _ = edgebeat_tests::process::signal(self.init, "RTMIN+4");
            for _ in 0..300 {
                if !matches!(self.nspawn.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.nspawn.kill();
            let _ = self.nspawn.wait();
        }
        // Whatever the poweroff left (a container whose nspawn was killed keeps running).
        kill_cgroup(&self.cgroups[0]);
        for cgroup in &self.cgroups {
            remove_cgroup(cgroup);
        }
        let run = Path::new(NSPAWN_RUN);
        if self.run_dir_existed {
            let _ = std::fs::remove_dir_all(run.join("propagate").join(&self.machine));
        } else {
            let _ = std::fs::remove_dir_all(run);
        }
    }
}

/// The `renewTime`s the gateway wrote into Lease `node`, in the order written (its
/// creation and every update the stand-in answered 2xx).
fn renew_times(
    requests: &[edgebeat_tests::standin::RecordedRequest],
    node: &str,
) -> Vec<jiff::Timestamp> {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}");
    requests
        .iter()
        .filter(|r| {
            (r.method == http::Method::PUT && r.path == path)
                || (r.method == http::Method::POST
                    && path.starts_with(&r.path)
                    && r.json().is_some_and(|j| j["metadata"]["name"] == node))
        })
        .filter(|r| (200..300).contains(&r.status))
        .filter_map(|r| r.json()?["spec"]["renewTime"].as_str()?.parse().ok())
        .collect()
}

/// The `Ready` condition's status in each status PATCH of Node `node` among `requests`.
fn ready_reported(
    requests: &[edgebeat_tests::standin::RecordedRequest],
    node: &str,
) -> Vec<String> {
    let path = format!("/api/v1/nodes/{node}/status");
    requests
        .iter()
        .filter(|r| r.method == http::Method::PATCH && r.path == path)
        .filter_map(|r| {
            let body = r.json()?;
            let ready = body["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Ready")?["status"]
                .as_str()?
                .to_owned();
            Some(ready)
        })
        .collect()
}

/// kube-controller-manager's `--node-monitor-grace-period` default: a Lease older than
/// this turns the Node's `Ready` `Unknown`
/// (`pkg/controller/nodelifecycle/node_lifecycle_controller.go`).
const NODE_MONITOR_GRACE_PERIOD: Duration = Duration::from_secs(40);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, systemd-nspawn, the amd64 package and a bookworm root with systemd (scripts/test.sh)"]
async fn under_systemd_an_offline_board_boots_registers_later_and_upgrades_without_a_lost_lease() {
    use edgebeat_agent::systemd::{STATUS_REGISTERED, STATUS_REGISTERING};
    let deb = std::env::var("EDGEBEAT_DEBS")
        .expect("EDGEBEAT_DEBS")
        .split_whitespace()
        .map(PathBuf::from)
        .find(|d| architecture(d) == "amd64")
        .expect("an amd64 package in EDGEBEAT_DEBS");
    let dir = tempfile::tempdir().unwrap();
    let root = bookworm_root();
    let r = root.path();
    dpkg(r, &["--install", deb.to_str().unwrap()]);
    let next = next_release(&deb, &dir.path().join("next"));
    std::fs::copy(&next, r.join("root/next.deb")).unwrap();

    // The site's gateway is down: nothing listens where the agent is told to go. (The port
    // is free now; the gateway binds it later, when it "comes back".)
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let node = "booted-offline";
    std::fs::create_dir_all(r.join("etc/edgebeat")).unwrap();
    std::fs::write(
        r.join("etc/edgebeat/agent.yaml"),
        format!(
            "apiVersion: edgebeat.io/v1alpha1\nkind: AgentConfiguration\nnodeName: {node}\nhostRoot: /var/lib/edgebeat-fixture\nclockSyncCondition: false\ntransport: {{kind: grpc, endpoint: \"http://127.0.0.1:{port}\"}}\n"
        ),
    )
    .unwrap();
    let console = dir.path().join("console.log");
    let mut booted = Booted::boot(
        r,
        &edgebeat_tests::harness::fixture("rpi4-cgroup1"),
        &console,
    )
    .await;

    // 1. The boot finishes: multi-user.target reached, nothing failed, the agent active
    // and saying it is still registering.
    // (systemctl answers once systemd listens on its private socket, an instant after the
    // container's PID 1 appeared.)
    // No answer in 60 s leaves the state empty, which the assertion below reports.
    let state = edgebeat_tests::wait::until(
        "systemctl answering",
        Duration::from_secs(60),
        || async {
            let state = booted
                .exec(&["timeout", "60", "systemctl", "is-system-running", "--wait"])
                .await;
            if state.is_empty() {
                Err("no answer")
            } else {
                Ok(state)
            }
        },
        edgebeat_tests::wait::every(Duration::from_millis(100)),
    )
    .await
    .unwrap_or_default();
    assert_eq!(
        state,
        "running",
        "the boot with the gateway down; the agent's journal:\n{}",
        booted.journal().await
    );
    assert_eq!(booted.unit("edgebeat-agent", "ActiveState").await, "active");
    assert_eq!(
        booted.unit("edgebeat-agent", "StatusText").await,
        STATUS_REGISTERING
    );
    let started: u64 = booted
        .unit("edgebeat-agent", "ExecMainStartTimestampMonotonic")
        .await
        .parse()
        .unwrap();
    let active: u64 = booted
        .unit("edgebeat-agent", "ActiveEnterTimestampMonotonic")
        .await
        .parse()
        .unwrap();
    let userspace: u64 = booted
        .exec(&[
            "systemctl",
            "show",
            "--value",
            "-p",
            "UserspaceTimestampMonotonic",
        ])
        .await
        .parse()
        .unwrap();
    let finished: u64 = booted
        .exec(&[
            "systemctl",
            "show",
            "--value",
            "-p",
            "FinishTimestampMonotonic",
        ])
        .await
        .parse()
        .unwrap();
    println!(
        "gateway down: the boot finished {} ms after systemd started; the agent was READY {} ms after its start",
        (finished - userspace) / 1000,
        (active - started) / 1000
    );

    // 2. The gateway comes back: the node registers, systemd is told.
    let standin = StandIn::start().await.unwrap();
    let mut gateway = GatewayProcess::start(
        [
            "--server".to_owned(),
            standin.url(),
            format!("--grpc-listen=127.0.0.1:{port}"),
            "--allow-unidentified-agents".to_owned(),
            "--metrics-listen=127.0.0.1:0".to_owned(),
        ],
        &dir.path().join("gateway.log"),
    )
    .unwrap();
    gateway.address("gRPC listening").await.unwrap();
    let seen = standin
        .wait_until(Duration::from_secs(60), &format!("{node} Ready"), |v| {
            v.node(node).is_some_and(|n| ready(&n))
        })
        .await;
    if let Err(e) = seen {
        panic!("{e:?}\n{}", booted.journal().await);
    }
    edgebeat_tests::wait::eventually("STATUS= registered", Duration::from_secs(30), || async {
        booted.unit("edgebeat-agent", "StatusText").await == STATUS_REGISTERED
    })
    .await;

    // 3. apt's upgrade of the running agent (dpkg inside, under the running systemd: the
    // postinst restarts the unit without waiting). The Lease keeps being renewed.
    let before = booted.unit("edgebeat-agent", "MainPID").await;
    let from = standin.requests().len();
    let renewed_before = renew_times(&standin.requests(), node).len();
    let upgrade = tokio::time::Instant::now();
    booted
        .run(&[
            "dpkg",
            "--force-confdef",
            "--force-confold",
            "--install",
            "/root/next.deb",
        ])
        .await;
    let took = upgrade.elapsed();
    assert!(took < DPKG_WITHIN, "dpkg took {took:?}");
    assert_eq!(
        booted
            .exec(&["dpkg-query", "-W", "-f=${Version}", "edgebeat-agent"])
            .await,
        "0.1.0-2"
    );
    edgebeat_tests::wait::eventually("the agent restarted", Duration::from_secs(30), || async {
        let pid = booted.unit("edgebeat-agent", "MainPID").await;
        pid != before
            && pid != "0"
            && booted.unit("edgebeat-agent", "ActiveState").await == "active"
    })
    .await;
    // Two renewals by the new agent.
    let seen = standin
        .wait_until(
            Duration::from_secs(40),
            "two renewals after the upgrade",
            |v| renew_times(v.requests(), node).len() >= renewed_before + 2,
        )
        .await;
    if let Err(e) = seen {
        panic!("{e:?}\n{}", booted.journal().await);
    }
    let times = renew_times(&standin.requests(), node);
    let gap = times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).unsigned_abs())
        .max()
        .unwrap();
    println!(
        "upgrade of the running agent: dpkg took {} ms; the longest time between two renewals was {} ms",
        took.as_millis(),
        gap.as_millis()
    );
    assert!(
        gap < NODE_MONITOR_GRACE_PERIOD,
        "the Lease went {gap:?} unrenewed across the upgrade: the node would turn NotReady"
    );
    let reported = ready_reported(&standin.requests()[from..], node);
    assert!(
        reported.iter().all(|s| s == "True"),
        "Ready reported across the upgrade: {reported:?}"
    );
    assert!(
        !standin.event_reasons().iter().any(|r| r == "NodeNotReady"),
        "{:?}",
        standin.event_reasons()
    );

    // 4. A purge under systemd: the agent stopped, its unit, configuration and state gone.
    booted.run(&["dpkg", "--purge", "edgebeat-agent"]).await;
    assert_eq!(
        booted.unit("edgebeat-agent", "ActiveState").await,
        "inactive"
    );
    assert_eq!(
        booted.unit("edgebeat-agent", "LoadState").await,
        "not-found"
    );
    for gone in [
        "etc/edgebeat",
        "var/lib/private/edgebeat",
        "usr/bin/edgebeat-agent",
    ] {
        assert!(!r.join(gone).exists(), "/{gone} left after purge");
    }

    booted.power_off(Duration::from_secs(30)).await;
    drop(booted);
    gateway.terminate().await.unwrap();
}
