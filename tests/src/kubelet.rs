//! A real kubelet for this host beside the edgebeat agent (`tests/tests/kubelet.rs`):
//! kubelet of the control plane's release and containerd v2 behind it, built unchanged from
//! their Go modules by `scripts/kubelet.sh` (`runc` is the system's), registering this host
//! as a Node of a [`ControlPlane`].
//!
//! - Both are children of the test process started through [`crate::process::spawn`] (they
//!   die with it however it ends); [`Kubelet`] stops them when dropped or [`Kubelet::stop`]ped.
//! - Everything of theirs lives under `<control plane dir>/kubelet/` (under `target/`):
//!   containerd's root, state, sockets, CNI configuration, CDI and NRI directories, kubelet's
//!   `podLogsDir`, its certificates and logs. Where a Unix socket's path must be short
//!   (`sun_path` holds 107 bytes; containerd takes a shim socket directory of at most 42),
//!   under a temporary directory in `/tmp` instead: kubelet's `--root-dir` (its
//!   `pod-resources` and plugin sockets) and containerd's shim sockets.
//! - What they change on the machine is put back when the [`Kubelet`] is stopped or dropped
//!   (a panicking test included), and [`HostState`] is how a test proves it:
//!   - kubelet's kernel tunables (`setupKernelTunables`: `vm.overcommit_memory`,
//!     `vm.panic_on_oom`, `kernel.panic`, `kernel.panic_on_oops`, `kernel.keys.root_max*`),
//!     which it writes for the whole machine unless `protectKernelDefaults`: restored to the
//!     values read before it started;
//!   - its `kubepods` cgroups (cgroup driver `cgroupfs`, `cgroupsPerQOS`): removed from every
//!     hierarchy, deepest first;
//!   - the bind mount of its root directory onto itself it makes rshared (`MakeRShared`), and
//!     anything else mounted under the directory: unmounted, deepest first;
//!   - `/var/lib/kubelet/device-plugins/kubelet.sock` and `/var/log/containers`, which
//!     kubelet makes at those constant paths whatever its configuration: removed when they
//!     were not there before;
//!   - iptables: kubelet creates `KUBE-IPTABLES-HINT`, `KUBE-FIREWALL` and its jump rules
//!     when it finds `iptables` on its `PATH`; it runs with a `PATH` without `/usr/sbin` (so
//!     without iptables, which it then skips, saying so in its log), and the rules are
//!     compared before and after.
//! - cgroup v1 only by opting in: kubelet 1.36 refuses cgroup v1 unless `failCgroupV1: false`,
//!   which its configuration here sets (harmless on cgroup v2).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::time::Instant;

use crate::control_plane::{ControlPlane, repository};

/// The built binaries (`scripts/kubelet.sh bin`).
#[derive(Debug, Clone)]
pub struct Binaries {
    /// kubelet of the control plane's release.
    pub kubelet: PathBuf,
    /// containerd v2.
    pub containerd: PathBuf,
    /// containerd's runc shim (`containerd-shim-runc-v2`), found by containerd on its `PATH`.
    pub shim: PathBuf,
}

/// The binaries built by `scripts/kubelet.sh build`, `None` when one is not built.
pub fn built() -> Option<Binaries> {
    let out = crate::process::output(
        Command::new(repository().join("scripts/kubelet.sh"))
            .arg("bin")
            .stdin(Stdio::null()),
    )
    .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().map(PathBuf::from);
    Some(Binaries {
        kubelet: lines.next()?,
        containerd: lines.next()?,
        shim: lines.next()?,
    })
}

/// The kernel tunables kubelet sets for the whole machine (`setupKernelTunables` of
/// `pkg/kubelet/cm/container_manager_linux.go`), under `/proc/sys`.
pub const KUBELET_SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// Paths kubelet or containerd would use by default, none of which they may create here
/// (their configuration moves each under the test's directory).
const DEFAULT_PATHS: [&str; 18] = [
    "/var/lib/kubelet",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/device-plugins/kubelet.sock",
    "/var/log/pods",
    "/var/log/containers",
    "/etc/kubernetes",
    "/var/lib/containerd",
    "/run/containerd",
    "/opt/containerd",
    "/etc/containerd",
    "/etc/cdi",
    "/var/run/cdi",
    "/var/run/nri",
    "/opt/nri",
    "/etc/cni",
    "/opt/cni",
    "/var/lib/cni",
    "/var/run/netns",
];

/// What kubelet and containerd could change on this machine, read at one moment: equal
/// before a [`Kubelet`] starts and after it is stopped when it left nothing behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostState {
    /// [`KUBELET_SYSCTLS`] → value.
    pub sysctls: BTreeMap<String, String>,
    /// Every cgroup directory named `kubepods*` at the top of a hierarchy under
    /// `/sys/fs/cgroup` (each v1 hierarchy and the unified one), and all below them.
    pub kubepods_cgroups: BTreeSet<String>,
    /// The top-level cgroups of every hierarchy (a cgroup created beside `kubepods`).
    pub top_cgroups: BTreeSet<String>,
    /// Mount points under the test's directory, or under [`DEFAULT_PATHS`].
    pub mounts: BTreeSet<String>,
    /// Which of [`DEFAULT_PATHS`] exist.
    pub default_paths: BTreeSet<String>,
    /// `iptables-save` and `ip6tables-save` without their comment lines (dates).
    pub iptables: String,
}

impl HostState {
    /// Reads it now; `dirs` are the test's directories (mounts under them are recorded).
    ///
    /// Errors: `/proc/sys`, `/sys/fs/cgroup` or `/proc/self/mountinfo` cannot be read.
    pub fn read(dirs: &[&Path]) -> anyhow::Result<Self> {
        let mut sysctls = BTreeMap::new();
        for name in KUBELET_SYSCTLS {
            let path = Path::new("/proc/sys").join(name);
            let value = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            sysctls.insert(name.replace('/', "."), value.trim().to_owned());
        }
        let (kubepods_cgroups, top_cgroups) = cgroups()?;
        let mut mounts = BTreeSet::new();
        let roots: Vec<PathBuf> = dirs
            .iter()
            .map(|d| d.to_path_buf())
            .chain(DEFAULT_PATHS.iter().map(PathBuf::from))
            .collect();
        for point in mount_points()? {
            if roots.iter().any(|r| Path::new(&point).starts_with(r)) {
                mounts.insert(point);
            }
        }
        let default_paths = DEFAULT_PATHS
            .iter()
            .filter(|p| std::fs::symlink_metadata(p).is_ok())
            .map(|p| (*p).to_owned())
            .collect();
        let mut iptables = String::new();
        for save in ["iptables-save", "ip6tables-save"] {
            // A machine without iptables has nothing kubelet could have changed.
            if let Ok(out) = crate::process::output(
                Command::new(save)
                    .stdin(Stdio::null())
                    .stderr(Stdio::null()),
            ) {
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    if !line.starts_with('#') {
                        iptables.push_str(line);
                        iptables.push('\n');
                    }
                }
            }
        }
        Ok(Self {
            sysctls,
            kubepods_cgroups,
            top_cgroups,
            mounts,
            default_paths,
            iptables,
        })
    }
}

/// The cgroup hierarchies' directories: each directory under `/sys/fs/cgroup` that is a
/// mounted hierarchy (`cpu`, `memory`..., `unified`), or `/sys/fs/cgroup` itself on a
/// cgroup v2 host.
fn hierarchies() -> anyhow::Result<Vec<PathBuf>> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        return Ok(vec![root.to_owned()]);
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root).context("reading /sys/fs/cgroup")? {
        let path = entry?.path();
        // A hierarchy's root has cgroup.procs; a symlink (cpu,cpuacct) is the same one.
        if path.join("cgroup.procs").exists() && !path.is_symlink() {
            found.push(path);
        }
    }
    Ok(found)
}

/// (`kubepods*` cgroups and all below them, top-level cgroups), as `<hierarchy>/<path>`.
fn cgroups() -> anyhow::Result<(BTreeSet<String>, BTreeSet<String>)> {
    let mut kubepods = BTreeSet::new();
    let mut top = BTreeSet::new();
    for hierarchy in hierarchies()? {
        let name = hierarchy
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        for entry in std::fs::read_dir(&hierarchy)? {
            let entry = entry?;
            if !entry.file_type()?.is_dir() {
                continue;
            }
            let child = entry.file_name().to_string_lossy().into_owned();
            top.insert(format!("{name}/{child}"));
            if child.starts_with("kubepods") {
                let mut stack = vec![entry.path()];
                while let Some(dir) = stack.pop() {
                    if let Ok(rel) = dir.strip_prefix(&hierarchy) {
                        kubepods.insert(format!("{name}/{}", rel.display()));
                    }
                    for sub in std::fs::read_dir(&dir)?.flatten() {
                        if sub.file_type().is_ok_and(|t| t.is_dir()) {
                            stack.push(sub.path());
                        }
                    }
                }
            }
        }
    }
    Ok((kubepods, top))
}

/// Every mount point of this mount namespace (`/proc/self/mountinfo`, field 5, with its
/// octal escapes undone for spaces).
fn mount_points() -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| p.replace("\\040", " "))
        .collect())
}

/// A port free on 127.0.0.1 now: bound (port 0) and released. kubelet's `port` must not be
/// 0, so it is chosen this way (another process may take it meanwhile; then kubelet fails to
/// start and says so in its log).
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// This host's name as kubelet takes it for its Node's name (`os.Hostname`, lowercased).
///
/// Errors: `/proc/sys/kernel/hostname` cannot be read.
pub fn host_node_name() -> anyhow::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/hostname")?
        .trim()
        .to_lowercase())
}

/// A running kubelet and containerd (see the module docs).
#[derive(Debug)]
pub struct Kubelet {
    /// Its Node's name: this host's name, lowercased (`--hostname-override` says so).
    pub node_name: String,
    /// Everything of theirs: configuration, state, sockets, logs (`kubelet.log`,
    /// `containerd.log`).
    pub dir: PathBuf,
    /// kubelet's `--root-dir`: its filesystem is the Node's nodefs.
    pub root_dir: PathBuf,
    /// kubelet's server port (`daemonEndpoints.kubeletEndpoint.Port`), on 127.0.0.1.
    pub port: u16,
    before: HostState,
    /// Where Unix sockets need a short path (see the module docs): kubelet's root
    /// directory and containerd's shim sockets; removed when dropped.
    short: tempfile::TempDir,
    kubelet: Option<std::process::Child>,
    containerd: Option<std::process::Child>,
    stopped: bool,
}

impl Kubelet {
    /// Starts containerd and kubelet for this host against `control_plane`, as the Node
    /// [`host_node_name`], and waits until the Node is `Ready` (120 s). `extra_config` is
    /// appended to its `KubeletConfiguration` (YAML, top-level fields, e.g. `evictionHard`).
    ///
    /// # Errors
    /// Not built (`scripts/kubelet.sh build`), not root, `kubepods` cgroups already there
    /// (a kubelet runs, or one left them), the files or certificates cannot be made, or a
    /// process does not start or the Node does not become Ready in time (the error holds
    /// the logs' tails). What was started is stopped and put back.
    pub fn start(control_plane: &ControlPlane, extra_config: &str) -> anyhow::Result<Self> {
        let binaries = built().context("kubelet is not built: scripts/kubelet.sh build")?;
        let uid = std::fs::read_to_string("/proc/self/status")?
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next().map(str::to_owned))
            .unwrap_or_default();
        if uid != "0" {
            bail!("kubelet needs root (its cgroups, kernel tunables and mounts)");
        }
        let node_name = host_node_name()?;
        let dir = control_plane.dir.join("kubelet");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let short = tempfile::Builder::new()
            .prefix("edgebeat-kubelet-")
            .tempdir()?;
        let before = HostState::read(&[&dir, short.path()])?;
        if !before.kubepods_cgroups.is_empty() {
            bail!(
                "kubepods cgroups exist already (another kubelet, or one that left them): {:?}",
                before.kubepods_cgroups
            );
        }
        let mut kubelet = Self {
            node_name,
            root_dir: short.path().join("root"),
            port: free_port()?,
            dir,
            before,
            short,
            kubelet: None,
            containerd: None,
            stopped: false,
        };
        // Dropped on an error below: what was started is stopped and put back.
        let socket = kubelet.write_containerd_config()?;
        kubelet.containerd = Some(
            kubelet.spawn(
                "containerd",
                Command::new(&binaries.containerd)
                    .arg("--config")
                    .arg(kubelet.dir.join("containerd.toml"))
                    .env("PATH", kubelet.containerd_path(&binaries)),
            )?,
        );
        kubelet.wait_for("containerd's socket", Duration::from_secs(30), |_| {
            Ok(socket.exists())
        })?;
        kubelet.write_kubelet_config(control_plane, &socket, extra_config)?;
        kubelet.kubelet = Some(
            kubelet.spawn(
                "kubelet",
                Command::new(&binaries.kubelet)
                    .arg("--config")
                    .arg(kubelet.dir.join("kubelet.yaml"))
                    .arg("--kubeconfig")
                    .arg(kubelet.dir.join("kubelet.kubeconfig"))
                    .arg("--root-dir")
                    .arg(&kubelet.root_dir)
                    // Not under --root-dir by default: /var/lib/kubelet/pki.
                    .arg("--cert-dir")
                    .arg(kubelet.dir.join("pki"))
                    .arg("--hostname-override")
                    .arg(&kubelet.node_name)
                    .arg("--v=2")
                    // No iptables on its PATH (see the module docs).
                    .env("PATH", "/usr/local/bin:/usr/bin:/bin"),
            )?,
        );
        let ready = |k: &Self| -> anyhow::Result<bool> {
            let Ok(json) = control_plane.kubectl(&["get", "node", &k.node_name, "-o", "json"])
            else {
                return Ok(false);
            };
            let node: serde_json::Value = serde_json::from_str(&json)?;
            Ok(node["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True"))
        };
        kubelet.wait_for("its Node to be Ready", Duration::from_secs(120), ready)?;
        Ok(kubelet)
    }

    /// What [`HostState::read`] read before containerd and kubelet started.
    pub fn before(&self) -> &HostState {
        &self.before
    }

    /// containerd's `PATH`: its shim's directory first (containerd finds
    /// `containerd-shim-runc-v2` there), then the system's (runc).
    fn containerd_path(&self, binaries: &Binaries) -> String {
        let shim_dir = binaries
            .shim
            .parent()
            .map_or_else(String::new, |d| format!("{}:", d.display()));
        format!("{shim_dir}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    }

    /// Writes containerd's configuration (and the CNI configuration its CRI reads); returns
    /// its socket's path.
    fn write_containerd_config(&self) -> anyhow::Result<PathBuf> {
        let d = &self.dir;
        let socket = d.join("c.sock");
        // A Unix socket's path holds at most 107 bytes (sun_path), the .ttrpc one's too.
        if socket.as_os_str().len() + ".ttrpc".len() > 107 {
            bail!(
                "{}: too long a path for containerd's socket (a shorter target directory)",
                socket.display()
            );
        }
        let cni = d.join("cni");
        std::fs::create_dir_all(cni.join("net.d"))?;
        std::fs::create_dir_all(cni.join("bin"))?;
        // The loopback network only: enough for the runtime's NetworkReady (no pod runs).
        std::fs::write(
            cni.join("net.d/10-loopback.conflist"),
            "{\"cniVersion\": \"1.0.0\", \"name\": \"edgebeat-loopback\", \"plugins\": [{\"type\": \"loopback\"}]}\n",
        )?;
        let runc = ["/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .context("no runc (Debian's runc package)")?;
        let p = |name: &str| d.join(name).display().to_string();
        let config = format!(
            r#"# containerd for tests/tests/kubelet.rs: every path under the test's directory.
version = 3
root = '{root}'
state = '{state}'
imports = []
disabled_plugins = [
  'io.containerd.snapshotter.v1.devmapper', 'io.containerd.snapshotter.v1.zfs',
  'io.containerd.snapshotter.v1.blockfile', 'io.containerd.snapshotter.v1.btrfs',
  'io.containerd.tracing.processor.v1.otlp', 'io.containerd.internal.v1.tracing',
]

[grpc]
  address = '{socket}'

[ttrpc]
  address = '{socket}.ttrpc'

[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    cdi_spec_dirs = ['{cdi}']
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = '{runc}'
        SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{cni_bin}']
      conf_dir = '{cni_conf}'
  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
  [plugins.'io.containerd.internal.v1.opt']
    path = '{opt}'
  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = '{verifier}'
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
    socket_path = '{nri}'
  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = '{shims}'
"#,
            root = p("containerd/root"),
            state = p("containerd/state"),
            socket = socket.display(),
            cdi = p("cdi"),
            cni_bin = cni.join("bin").display(),
            cni_conf = cni.join("net.d").display(),
            opt = p("containerd/opt"),
            verifier = p("containerd/image-verifier"),
            nri = p("nri.sock"),
            shims = self.short.path().join("s").display(),
        );
        std::fs::write(d.join("containerd.toml"), config)?;
        Ok(socket)
    }

    /// Writes kubelet's client certificate (`system:node:<name>` in `system:nodes`, signed
    /// by the cluster CA, as a node's bootstrap would get it), its kubeconfig and its
    /// `KubeletConfiguration`.
    fn write_kubelet_config(
        &self,
        control_plane: &ControlPlane,
        socket: &Path,
        extra_config: &str,
    ) -> anyhow::Result<()> {
        let d = &self.dir;
        let pki = d.join("pki");
        std::fs::create_dir_all(&pki)?;
        let ca_key = control_plane.ca.with_extension("key");
        let (key, csr, crt, ext) = (
            pki.join("kubelet-client.key"),
            pki.join("kubelet-client.csr"),
            pki.join("kubelet-client.crt"),
            pki.join("kubelet-client.ext"),
        );
        std::fs::write(
            &ext,
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
        )?;
        openssl(&[
            "req".as_ref(),
            "-newkey".as_ref(),
            "rsa:2048".as_ref(),
            "-nodes".as_ref(),
            "-subj".as_ref(),
            format!("/O=system:nodes/CN=system:node:{}", self.node_name).as_ref(),
            "-keyout".as_ref(),
            key.as_os_str(),
            "-out".as_ref(),
            csr.as_os_str(),
        ])?;
        openssl(&[
            "x509".as_ref(),
            "-req".as_ref(),
            "-in".as_ref(),
            csr.as_os_str(),
            "-CA".as_ref(),
            control_plane.ca.as_os_str(),
            "-CAkey".as_ref(),
            ca_key.as_os_str(),
            "-set_serial".as_ref(),
            format!("0x{:x}", fastrand::u64(1..)).as_ref(),
            "-days".as_ref(),
            "2".as_ref(),
            "-extfile".as_ref(),
            ext.as_os_str(),
            "-out".as_ref(),
            crt.as_os_str(),
        ])?;
        std::fs::write(
            d.join("kubelet.kubeconfig"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: '{}', certificate-authority: '{}'}}\nusers:\n- name: node\n  user: {{client-certificate: '{}', client-key: '{}'}}\ncontexts:\n- name: node\n  context: {{cluster: test, user: node}}\ncurrent-context: node\n",
                control_plane.url,
                control_plane.ca.display(),
                crt.display(),
                key.display()
            ),
        )?;
        // Upstream defaults but for what a test on a shared machine needs: cgroup v1
        // allowed, the cgroupfs driver (no systemd), loopback-only servers on free ports,
        // every path under the test's directory, x509 authentication of the apiserver's
        // kubelet client (the cluster CA) instead of webhooks.
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: 'unix://{socket}'
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
podLogsDir: '{logs}'
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: '{ca}'}}
authorization:
  mode: AlwaysAllow
{extra_config}"#,
            socket = socket.display(),
            port = self.port,
            healthz = free_port()?,
            logs = d.join("pod-logs").display(),
            ca = control_plane.ca.display(),
        );
        std::fs::write(d.join("kubelet.yaml"), config)?;
        Ok(())
    }

    /// Starts `name` from `command`, its output appended to `<dir>/<name>.log`.
    fn spawn(&self, name: &str, command: &mut Command) -> anyhow::Result<std::process::Child> {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.join(format!("{name}.log")))?;
        crate::process::spawn(
            command
                .current_dir(&self.dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
        )
        .with_context(|| format!("starting {name}"))
    }

    /// Waits until `done` holds, asking every 500 ms, for at most `deadline`.
    ///
    /// Errors: `deadline` passed, `done` failed, or containerd or kubelet exited first; the
    /// error holds their logs' tails.
    fn wait_for(
        &mut self,
        what: &str,
        deadline: Duration,
        done: impl Fn(&Self) -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        // Done: `done` held (Ok(None)), a process exited (Ok(Some(why))), or an error.
        let waited = crate::wait::blocking(what, deadline, Duration::from_millis(500), || {
            let seen = (|| -> anyhow::Result<Option<Option<String>>> {
                if done(self)? {
                    return Ok(Some(None));
                }
                let mut exited = None;
                for (name, child) in [
                    ("containerd", &mut self.containerd),
                    ("kubelet", &mut self.kubelet),
                ] {
                    if let Some(c) = child.as_mut()
                        && let Some(status) = c.try_wait()?
                    {
                        exited = Some(format!("{name} exited ({status})"));
                    }
                }
                Ok(exited.map(Some))
            })();
            seen.transpose()
        });
        let why = match waited {
            Ok(Ok(None)) => return Ok(()),
            Ok(Ok(Some(exited))) => exited,
            Ok(Err(e)) => return Err(e),
            Err(e) => format!("not within {:?}", e.deadline),
        };
        bail!("waiting for {what}: {why}\n{}", self.logs_tail());
    }

    /// The last 30 lines of each log.
    pub fn logs_tail(&self) -> String {
        let mut out = String::new();
        for name in ["containerd", "kubelet"] {
            let log = self.dir.join(format!("{name}.log"));
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {} (tail)\n{}\n",
                log.display(),
                lines[lines.len().saturating_sub(30)..].join("\n")
            ));
        }
        out
    }

    /// SIGKILLs kubelet (containerd stays up), as a node that dies without a word;
    /// [`Self::stop`] still puts everything back.
    ///
    /// # Errors
    /// It could not be signalled or waited for.
    pub fn kill_kubelet(&mut self) -> anyhow::Result<()> {
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.kill()?;
            kubelet.wait()?;
        }
        Ok(())
    }

    /// Stops kubelet, then containerd (SIGTERM, SIGKILL after 10 s), and puts back what they
    /// changed (see the module docs); returns the [`HostState`] read afterwards, to compare
    /// with [`Self::before`].
    ///
    /// # Errors
    /// A process could not be stopped, or something could not be put back (every step is
    /// tried; the error lists what failed).
    pub fn stop(&mut self) -> anyhow::Result<HostState> {
        let mut failures = Vec::new();
        for child in [self.kubelet.take(), self.containerd.take()]
            .into_iter()
            .flatten()
        {
            if let Err(e) = crate::process::terminate(child) {
                failures.push(format!("stopping: {e:#}"));
            }
        }
        self.stopped = true;
        if let Err(e) = self.unmount_all() {
            failures.push(format!("unmounting: {e:#}"));
        }
        if let Err(e) = remove_kubepods_cgroups() {
            failures.push(format!("removing cgroups: {e:#}"));
        }
        for (name, value) in &self.before.sysctls {
            let path = Path::new("/proc/sys").join(name.replace('.', "/"));
            let now = std::fs::read_to_string(&path).unwrap_or_default();
            if now.trim() != value
                && let Err(e) = std::fs::write(&path, format!("{value}\n"))
            {
                failures.push(format!("restoring {name}={value}: {e}"));
            }
        }
        // What kubelet makes whatever its configuration says, at constant paths: its device
        // plugin socket (/var/lib/kubelet/device-plugins/kubelet.sock,
        // pluginapi.KubeletSocket) and /var/log/containers (ContainerLogsDir). Removed, the
        // deepest first, when they were not there before; a directory only when empty (so
        // anything else in it shows as a failure).
        for path in DEFAULT_PATHS.iter().rev() {
            let path = Path::new(path);
            if self
                .before
                .default_paths
                .contains(&path.display().to_string())
                || std::fs::symlink_metadata(path).is_err()
            {
                continue;
            }
            let removed = if path.is_dir() {
                std::fs::remove_dir(path)
            } else {
                std::fs::remove_file(path)
            };
            if let Err(e) = removed {
                failures.push(format!(
                    "{} was created and cannot be removed: {e}",
                    path.display()
                ));
            }
        }
        if !failures.is_empty() {
            bail!("{}", failures.join("; "));
        }
        HostState::read(&[&self.dir, self.short.path()])
    }

    /// Unmounts every mount point under the directory (kubelet's rshared root directory,
    /// containerd's), deepest first; lazily when a plain unmount fails.
    fn unmount_all(&self) -> anyhow::Result<()> {
        let mut points: Vec<String> = mount_points()?
            .into_iter()
            .filter(|p| {
                Path::new(p).starts_with(&self.dir) || Path::new(p).starts_with(self.short.path())
            })
            .collect();
        // Deepest first; a point mounted twice (a bind mount on itself) comes twice.
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for point in points {
            let plain = crate::process::status(
                Command::new("umount")
                    .arg(&point)
                    .stdin(Stdio::null())
                    .stderr(Stdio::null()),
            )?;
            if !plain.success() {
                let lazy = crate::process::status(
                    Command::new("umount")
                        .arg("-l")
                        .arg(&point)
                        .stdin(Stdio::null()),
                )?;
                if !lazy.success() {
                    bail!("umount -l {point}: {lazy}");
                }
            }
        }
        Ok(())
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if !self.stopped
            && let Err(e) = self.stop()
        {
            eprintln!(
                "kubelet fixture: not everything was put back: {e:#} (in {})",
                self.dir.display()
            );
        }
    }
}

/// Removes every `kubepods*` cgroup of every hierarchy, deepest first (they hold no process
/// once kubelet is gone and no pod ran); retried for 5 s while the kernel still counts a
/// task leaving.
fn remove_kubepods_cgroups() -> anyhow::Result<()> {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let mut dirs = Vec::new();
        for hierarchy in hierarchies()? {
            for entry in std::fs::read_dir(&hierarchy)?.flatten() {
                if entry.file_name().to_string_lossy().starts_with("kubepods")
                    && entry.file_type().is_ok_and(|t| t.is_dir())
                {
                    let mut stack = vec![entry.path()];
                    while let Some(dir) = stack.pop() {
                        for sub in std::fs::read_dir(&dir)?.flatten() {
                            if sub.file_type().is_ok_and(|t| t.is_dir()) {
                                stack.push(sub.path());
                            }
                        }
                        dirs.push(dir);
                    }
                }
            }
        }
        if dirs.is_empty() {
            return Ok(());
        }
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        let mut last = None;
        for dir in &dirs {
            // cgroupfs: rmdir, never remove_dir_all (its files cannot be unlinked).
            if let Err(e) = std::fs::remove_dir(dir) {
                last = Some(format!("{}: {e}", dir.display()));
            }
        }
        if last.is_some() && Instant::now() >= end {
            bail!("cgroups left: {}", last.unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs openssl with `args`.
fn openssl(args: &[&std::ffi::OsStr]) -> anyhow::Result<()> {
    let out = crate::process::output(Command::new("openssl").args(args).stdin(Stdio::null()))
        .context("running openssl")?;
    if !out.status.success() {
        bail!("openssl failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}
