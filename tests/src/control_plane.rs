//! The real Kubernetes control plane for end-to-end tests: etcd, kube-apiserver and
//! kube-controller-manager of one pinned release, built from their Go modules, their
//! certificates, kubeconfigs and command lines written by `scripts/control-plane.sh prepare`
//! (`scripts/control-plane/start.sh` says how each runs: TLS, x509 client certificates,
//! `Node,RBAC`, `NodeRestriction`, an audit log, the node lifecycle and CSR controllers,
//! leader election).
//!
//! - [`ControlPlane::shared`]: one per test binary, started on first use; each test uses its
//!   own node names. [`ControlPlane::start`]: one of a test's own, for tests that stop
//!   components or need test-only settings (shorter grace periods).
//! - The components are children of the test process, started through
//!   [`crate::process::spawn`]: they die with it (SIGKILL, the parent-death signal) however
//!   it ends, the shared one's included (a `static`, never dropped). A [`ControlPlane::start`]ed
//!   value stops them when dropped (SIGTERM, then SIGKILL after 10 s).
//! - A component that exits on its own is started again, as kubelet restarts a control
//!   plane's static pod (after 1 s, doubling up to 10 s while it keeps exiting within 10 s of
//!   its start; kubelet's back-off is 10 s to 5 min, too slow for a test): a
//!   kube-controller-manager that loses its leader lease exits, as upstream's does. The
//!   restart is noted in its log; [`ControlPlane::exits`] counts them.
//! - State, certificates and logs live under `target/control-plane/<binary>-<pid>-<n>/`, kept
//!   after the run for a failing test to be read; a later run removes those of processes
//!   that are gone.
//! - Whether the components are built: [`built`] (`scripts/control-plane.sh build` builds
//!   them; `scripts/test.sh` does).

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context as _, bail};
use edgebeat_agent::config::{AgentConfig, ClientTls, TlsIdentity};
use serde::Deserialize;
use tokio::time::Instant;

use crate::harness::{AgentHandle, fixture, grpc_transport, start_agent, test_agent_config};
use crate::pki::Ca;
use crate::process::GatewayProcess;

/// The repository's root (the tests crate is one of its members).
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_owned)
        .unwrap_or_default()
}

fn script() -> PathBuf {
    repository().join("scripts/control-plane.sh")
}

/// The directory of the built components (`scripts/control-plane.sh bin`), `None` when they
/// are not built.
pub fn built() -> Option<PathBuf> {
    let out = crate::process::output(Command::new(script()).arg("bin")).ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The components, in the order they start (and the reverse of the order they stop).
const COMPONENTS: [&str; 3] = ["etcd", "kube-apiserver", "kube-controller-manager"];

/// A running control plane (see the module docs).
#[derive(Debug)]
pub struct ControlPlane {
    /// Its state, certificates (`pki/`), kubeconfigs and logs (`<component>.log`).
    pub dir: PathBuf,
    /// kube-apiserver's URL, `https://127.0.0.1:<port>`.
    pub url: String,
    /// The cluster CA (PEM file): kube-apiserver's serving certificate and every client
    /// certificate chain to it; kube-controller-manager signs CSRs with it.
    pub ca: PathBuf,
    /// The audit log: one JSON event per answered request ([`AuditEvent`]).
    pub audit_log: PathBuf,
    /// The directory of the built components (kubectl among them).
    pub bin: PathBuf,
    /// A kubeconfig of a cluster admin (`system:masters`), for the tests' own setup.
    pub admin_kubeconfig: PathBuf,
    components: Arc<Components>,
}

static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
static STARTED: AtomicUsize = AtomicUsize::new(0);

impl ControlPlane {
    /// The test binary's control plane, started on first use with upstream settings. Never
    /// dropped: its components end with the test process (see the module docs).
    ///
    /// Errors: not built, or it did not start (the error holds its log's tail).
    pub fn shared() -> anyhow::Result<&'static ControlPlane> {
        SHARED
            .get_or_init(|| Self::start_dir(&[]).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    /// A control plane of the caller's, with `settings` (environment variables of
    /// `scripts/control-plane/start.sh`, e.g. `EDGEBEAT_NODE_MONITOR_GRACE_PERIOD`); stopped
    /// when dropped.
    ///
    /// Errors: as [`Self::shared`].
    pub fn start(settings: &[(&str, &str)]) -> anyhow::Result<Self> {
        Self::start_dir(settings)
    }

    fn start_dir(settings: &[(&str, &str)]) -> anyhow::Result<Self> {
        let bin =
            built().context("the control plane is not built: scripts/control-plane.sh build")?;
        let runs = run_root()?;
        remove_finished_runs(&runs);
        let exe = std::env::current_exe()?;
        let binary = exe
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("test")
            .to_owned();
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let dir = runs.join(format!("{binary}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let out = crate::process::output(
            Command::new(script())
                .arg("prepare")
                .arg(&dir)
                .envs(settings.iter().copied()),
        )
        .context("running scripts/control-plane.sh prepare")?;
        if !out.status.success() {
            bail!(
                "scripts/control-plane.sh prepare {} failed:\n{}{}",
                dir.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let env = std::fs::read_to_string(dir.join("env"))?;
        let var = |name: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .map(str::to_owned)
                .with_context(|| format!("{name} not in {}/env", dir.display()))
        };
        let (url, ca, audit_log, admin_kubeconfig) = (
            var("EDGEBEAT_APISERVER_URL")?,
            var("EDGEBEAT_CLUSTER_CA")?.into(),
            var("EDGEBEAT_AUDIT_LOG")?.into(),
            var("KUBECONFIG")?.into(),
        );
        // Dropped on an error below: what was started is stopped.
        let control_plane = Self {
            url,
            ca,
            audit_log,
            admin_kubeconfig,
            bin,
            components: Components::supervised(&dir),
            dir,
        };
        for component in COMPONENTS {
            control_plane.components.start(component)?;
            control_plane.wait_ready(component)?;
        }
        Ok(control_plane)
    }

    /// Stops `component` (`kube-apiserver`, `kube-controller-manager` or `etcd`): SIGTERM,
    /// SIGKILL after 10 s. It stays stopped (not restarted) until
    /// [`Self::restart_component`].
    ///
    /// Errors: no such component, or it could not be signalled or waited for.
    pub fn stop_component(&self, component: &str) -> anyhow::Result<()> {
        self.components.stop(component)
    }

    /// Starts `component` again as it ran (stopping it first if it runs) and waits until it
    /// is ready.
    ///
    /// Errors: it did not start, or did not become ready within 120 s.
    pub fn restart_component(&self, component: &str) -> anyhow::Result<()> {
        self.components.stop(component)?;
        self.components.start(component)?;
        self.wait_ready(component)
    }

    /// Sends `signal` (a name `kill -s` takes: `STOP`, `CONT`) to the running `component`:
    /// `STOP` freezes it, so that its peers' connections stay open and nothing answers them
    /// (etcd frozen: kube-apiserver's writes fail while its watches stay up).
    ///
    /// Errors: no such component, it is not running, or it could not be signalled.
    pub fn signal_component(&self, component: &str, signal: &str) -> anyhow::Result<()> {
        let pid = self
            .components
            .lock()
            .get(component)
            .and_then(|c| c.child.as_ref().map(std::process::Child::id))
            .with_context(|| format!("{component} is not running"))?;
        crate::process::signal(pid, signal).with_context(|| format!("signalling {component}"))
    }

    /// How many times `component` exited on its own (and was started again), e.g. a
    /// kube-controller-manager that lost its leader lease.
    pub fn exits(&self, component: &str) -> usize {
        self.components.exits(component)
    }

    /// Waits until kube-apiserver answers `/readyz`, or kube-controller-manager acts (its
    /// root CA publisher has put kube-root-ca.crt into kube-node-lease); etcd is ready
    /// when kube-apiserver is.
    fn wait_ready(&self, component: &str) -> anyhow::Result<()> {
        let check: &[&str] = match component {
            "kube-apiserver" => &["get", "--raw", "/readyz"],
            "kube-controller-manager" => &[
                "-n",
                "kube-node-lease",
                "get",
                "configmap",
                "kube-root-ca.crt",
            ],
            _ => return Ok(()),
        };
        let exits = self.exits(component);
        // Done: ready (true), or the component exited first (false).
        let ready = crate::wait::blocking(
            &format!("{component} ready"),
            Duration::from_secs(120),
            Duration::from_millis(200),
            || {
                let ready = crate::process::output(
                    Command::new(self.bin.join("kubectl"))
                        .arg("--kubeconfig")
                        .arg(&self.admin_kubeconfig)
                        .arg("--request-timeout=5s")
                        .args(check)
                        .stdin(Stdio::null()),
                )
                .is_ok_and(|out| out.status.success());
                (ready || self.exits(component) != exits).then_some(ready)
            },
        );
        if ready == Ok(true) {
            return Ok(());
        }
        let log = self.dir.join(format!("{component}.log"));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        bail!(
            "{component} is not ready; see {}:\n{}",
            log.display(),
            lines[lines.len().saturating_sub(30)..].join("\n")
        );
    }

    /// The real kubectl of the release, as the cluster admin: its standard output.
    ///
    /// Errors: kubectl failed (the error holds its standard error).
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        self.kubectl_as(&self.admin_kubeconfig, args)
    }

    /// The real kubectl with `kubeconfig`: its standard output.
    ///
    /// Errors: kubectl failed (the error holds its standard error).
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
        run_kubectl(&self.bin.join("kubectl"), kubeconfig, args)
    }

    /// A kube-rs client of the cluster admin.
    ///
    /// Errors: the kubeconfig cannot be read or used.
    pub async fn admin_client(&self) -> anyhow::Result<kube::Client> {
        self.client(&self.admin_kubeconfig).await
    }

    /// A kube-rs client with `kubeconfig`.
    ///
    /// Errors: the kubeconfig cannot be read or used.
    pub async fn client(&self, kubeconfig: &Path) -> anyhow::Result<kube::Client> {
        kube_client(kubeconfig).await
    }

    /// A kubeconfig (written into the control plane's directory) authenticating as the
    /// service account `namespace/name` with a token from the TokenRequest API (`kubectl
    /// create token`, 2 h), as a pod of that service account would: the identity of a
    /// deployed component, never `system:masters`.
    ///
    /// Errors: the service account does not exist, or writing the file failed.
    pub fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<PathBuf> {
        let token = self.kubectl(&["-n", namespace, "create", "token", name, "--duration=2h"])?;
        let file = self.dir.join(format!("{namespace}-{name}.kubeconfig"));
        std::fs::write(
            &file,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: {}, certificate-authority: {}}}\nusers:\n- name: {name}\n  user: {{token: {}}}\ncontexts:\n- name: {name}\n  context: {{cluster: test, user: {name}, namespace: {namespace}}}\ncurrent-context: {name}\n",
                self.url,
                self.ca.display(),
                token.trim()
            ),
        )?;
        Ok(file)
    }

    /// Every audit event so far.
    ///
    /// Errors: the log cannot be read; a line that is not an event is skipped (the last
    /// one may be half written).
    pub fn audit(&self) -> anyhow::Result<Vec<AuditEvent>> {
        let text = std::fs::read_to_string(&self.audit_log)?;
        Ok(text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for component in COMPONENTS.iter().rev() {
            let _ = self.components.stop(component);
        }
        self.components.ended.store(true, Ordering::Relaxed);
    }
}

/// What the gateway's deployment helpers ([`deployed_gateway_args`],
/// [`rendered_gateway_args`]...) need of a cluster: kubectl as its admin, and a kubeconfig of
/// a ServiceAccount. The suite's [`ControlPlane`] is one; [`KubeconfigCluster`] is any other
/// (kind, k3s) reached by the admin's kubeconfig.
pub trait ClusterAdmin {
    /// kubectl as the cluster admin, in the repository (so `-k deploy/...` works): its
    /// standard output.
    ///
    /// Errors: kubectl failed (the error holds its standard error).
    fn kubectl(&self, args: &[&str]) -> anyhow::Result<String>;

    /// A kubeconfig authenticating as the ServiceAccount `namespace/name` with a token from
    /// the TokenRequest API, as a pod of that ServiceAccount would.
    ///
    /// Errors: the ServiceAccount does not exist, or writing the file failed.
    fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> anyhow::Result<PathBuf>;

    /// The admin's kubeconfig (for kube-rs clients: [`kube_client`]).
    fn admin_kubeconfig(&self) -> &Path;
}

impl ClusterAdmin for ControlPlane {
    fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        ControlPlane::kubectl(self, args)
    }

    fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> anyhow::Result<PathBuf> {
        ControlPlane::service_account_kubeconfig(self, namespace, name)
    }

    fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }
}

/// A kube-rs client with `kubeconfig` (its current context).
///
/// Errors: the kubeconfig cannot be read or used.
pub async fn kube_client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    edgebeat_transports::tls::install_ring_provider();
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// A cluster of someone's own (kind, k3s...) reached by an admin's kubeconfig: the
/// [`ClusterAdmin`] the demo uses with `--kubeconfig`. ServiceAccount kubeconfigs are
/// written into a temporary directory of its own, removed when it is dropped.
pub struct KubeconfigCluster {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

impl KubeconfigCluster {
    /// The cluster of `kubeconfig`'s current context, driven with the kubectl at `kubectl`.
    ///
    /// Errors: the temporary directory cannot be made.
    pub fn new(kubectl: &Path, kubeconfig: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            kubectl: kubectl.to_owned(),
            kubeconfig: std::path::absolute(kubeconfig)?,
            dir: tempfile::tempdir()?,
        })
    }
}

impl ClusterAdmin for KubeconfigCluster {
    fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        run_kubectl(&self.kubectl, &self.kubeconfig, args)
    }

    /// The token's kubeconfig names the admin's cluster entry as it is (server and CA,
    /// flattened into data), so it reaches the cluster the same way.
    fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> anyhow::Result<PathBuf> {
        let token = self.kubectl(&["-n", namespace, "create", "token", name, "--duration=2h"])?;
        let view: serde_json::Value = serde_json::from_str(&self.kubectl(&[
            "config",
            "view",
            "--minify",
            "--flatten",
            "-o",
            "json",
        ])?)?;
        let cluster = view["clusters"][0]["cluster"].clone();
        if cluster.is_null() {
            bail!(
                "{}: no cluster in its current context",
                self.kubeconfig.display()
            );
        }
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": cluster}],
            "users": [{"name": name, "user": {"token": token.trim()}}],
            "contexts": [{"name": name, "context": {"cluster": "cluster", "user": name, "namespace": namespace}}],
            "current-context": name,
        });
        let file = self
            .dir
            .path()
            .join(format!("{namespace}-{name}.kubeconfig"));
        std::fs::write(&file, serde_json::to_vec_pretty(&config)?)?;
        Ok(file)
    }

    fn admin_kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }
}

/// `kubectl --kubeconfig <kubeconfig> <args>` in the repository: its standard output.
fn run_kubectl(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = crate::process::output(
        Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--request-timeout=20s")
            .args(args)
            .current_dir(repository())
            .stdin(Stdio::null()),
    )
    .with_context(|| format!("running {}", kubectl.display()))?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The components' processes, watched by a thread of their own that starts again one that
/// exits on its own (see the module docs).
#[derive(Debug)]
struct Components {
    dir: PathBuf,
    state: Mutex<BTreeMap<&'static str, Component>>,
    /// Set when the [`ControlPlane`] is dropped: the watching thread ends.
    ended: AtomicBool,
}

#[derive(Debug, Default)]
struct Component {
    child: Option<std::process::Child>,
    /// Started and not stopped by a test: restarted when it exits.
    wanted: bool,
    started: Option<Instant>,
    exits: usize,
    backoff: Duration,
    restart_at: Option<Instant>,
}

/// The first restart's delay, and the longest.
const RESTART_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(10));

impl Components {
    fn supervised(dir: &Path) -> Arc<Self> {
        let components = Arc::new(Self {
            dir: dir.to_owned(),
            state: Mutex::new(
                COMPONENTS
                    .iter()
                    .map(|c| (*c, Component::default()))
                    .collect(),
            ),
            ended: AtomicBool::new(false),
        });
        let watched = components.clone();
        // Not joined: it ends within 100 ms of `ended`, or with the process. It forks
        // nothing itself (crate::process::spawn does), so its end kills nothing.
        let _ = std::thread::Builder::new()
            .name("control-plane".to_owned())
            .spawn(move || {
                while !watched.ended.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                    watched.watch();
                }
            });
        components
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, BTreeMap<&'static str, Component>> {
        self.state.lock()
    }

    /// One look at every component: reaps one that exited, starts again one that is due.
    fn watch(&self) {
        let mut state = self.lock();
        let now = Instant::now();
        for (name, component) in state.iter_mut() {
            if let Some(child) = component.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                component.child = None;
                if component.wanted {
                    component.exits += 1;
                    let ran_long = component
                        .started
                        .is_some_and(|at| now - at >= RESTART_BACKOFF.1);
                    component.backoff = if ran_long {
                        RESTART_BACKOFF.0
                    } else {
                        (component.backoff * 2).clamp(RESTART_BACKOFF.0, RESTART_BACKOFF.1)
                    };
                    component.restart_at = Some(now + component.backoff);
                    self.note(
                        name,
                        &format!(
                            "exited ({status}); started again in {:?}, as kubelet restarts a static pod",
                            component.backoff
                        ),
                    );
                }
            }
            if component.child.is_none()
                && component.wanted
                && component.restart_at.is_some_and(|at| now >= at)
            {
                match self.spawn(name) {
                    Ok(child) => {
                        component.child = Some(child);
                        component.started = Some(now);
                        component.restart_at = None;
                    }
                    Err(e) => {
                        self.note(name, &format!("could not start again: {e:#}"));
                        component.restart_at = Some(now + component.backoff);
                    }
                }
            }
        }
    }

    /// A line of the test fixture's in `component`'s log.
    fn note(&self, component: &str, line: &str) {
        use std::io::Write as _;
        if let Ok(mut log) = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.join(format!("{component}.log")))
        {
            let _ = writeln!(
                log,
                "edgebeat-tests {}: {component} {line}",
                jiff::Timestamp::now()
            );
        }
    }

    /// Starts `component` from its command line (`run-<component>.sh`, which execs it, so
    /// the child is the component), its output appended to `<component>.log`, its PID in
    /// `<component>.pid` (for `scripts/control-plane.sh stop` by hand).
    fn spawn(&self, component: &str) -> anyhow::Result<std::process::Child> {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.join(format!("{component}.log")))?;
        let child = crate::process::spawn(
            Command::new(self.dir.join(format!("run-{component}.sh")))
                .current_dir(&self.dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
        )
        .with_context(|| format!("starting {component}"))?;
        std::fs::write(
            self.dir.join(format!("{component}.pid")),
            format!(
                "{}
",
                child.id()
            ),
        )?;
        Ok(child)
    }

    /// Starts `component`, which is not running, and keeps it running.
    fn start(&self, component: &str) -> anyhow::Result<()> {
        let mut state = self.lock();
        let entry = state
            .get_mut(component)
            .with_context(|| format!("no component {component}"))?;
        if entry.child.is_none() {
            entry.child = Some(self.spawn(component)?);
        }
        entry.wanted = true;
        entry.started = Some(Instant::now());
        entry.restart_at = None;
        entry.backoff = Duration::ZERO;
        Ok(())
    }

    /// Stops `component` (SIGTERM, SIGKILL after 10 s) and keeps it stopped.
    fn stop(&self, component: &str) -> anyhow::Result<()> {
        let child = {
            let mut state = self.lock();
            let entry = state
                .get_mut(component)
                .with_context(|| format!("no component {component}"))?;
            entry.wanted = false;
            entry.restart_at = None;
            entry.child.take()
        };
        let _ = std::fs::remove_file(self.dir.join(format!("{component}.pid")));
        let Some(child) = child else {
            return Ok(());
        };
        Ok(crate::process::terminate(child)?)
    }

    fn exits(&self, component: &str) -> usize {
        self.lock().get(component).map_or(0, |c| c.exits)
    }
}

fn run_root() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test binary> or target/<profile>/<binary>: target/control-plane.
    let target = exe
        .ancestors()
        .find(|dir| dir.file_name().is_some_and(|n| n == "target"))
        .context("a binary outside a target directory")?;
    let root = target.join("control-plane");
    std::fs::create_dir_all(&root)?;
    Ok(root)
}

/// Removes the directories of earlier runs whose test binary has ended.
fn remove_finished_runs(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// One event of kube-apiserver's audit log (`audit.k8s.io/v1` `Event`, at Metadata level):
/// who asked what, and the answer's code.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`...
    pub verb: String,
    /// The request's path and query.
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    /// Who was authenticated.
    pub user: AuditUser,
    /// Who the request was made as, with impersonation.
    #[serde(default)]
    pub impersonated_user: Option<AuditUser>,
    /// What it was on.
    #[serde(default)]
    pub object_ref: Option<AuditObject>,
    /// The answer.
    #[serde(default)]
    pub response_status: Option<AuditStatus>,
    /// When the answer was complete (RFC 3339, microseconds).
    pub stage_timestamp: String,
    /// `ResponseComplete` or `ResponseStarted` (a watch).
    pub stage: String,
    /// The client's `User-Agent` (kubectl's start with `kubectl/`).
    #[serde(default)]
    pub user_agent: String,
}

/// A user of an [`AuditEvent`].
#[derive(Debug, Clone, Deserialize)]
pub struct AuditUser {
    /// e.g. `system:serviceaccount:edgebeat-system:edgebeat-gateway`.
    pub username: String,
}

/// The object of an [`AuditEvent`].
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AuditObject {
    /// e.g. `leases`.
    #[serde(default)]
    pub resource: Option<String>,
    /// e.g. `status`.
    #[serde(default)]
    pub subresource: Option<String>,
    /// The namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The object's name.
    #[serde(default)]
    pub name: Option<String>,
}

/// The answer of an [`AuditEvent`].
#[derive(Debug, Clone, Deserialize)]
pub struct AuditStatus {
    /// The HTTP status code.
    #[serde(default)]
    pub code: u16,
}

impl AuditEvent {
    /// The answer's status code (0 when the event has none).
    pub fn code(&self) -> u16 {
        self.response_status.as_ref().map_or(0, |s| s.code)
    }

    /// `resource` or `resource/subresource`, `""` for a non-resource request.
    pub fn resource(&self) -> String {
        match &self.object_ref {
            Some(AuditObject {
                resource: Some(r),
                subresource: Some(s),
                ..
            }) => format!("{r}/{s}"),
            Some(AuditObject {
                resource: Some(r), ..
            }) => r.clone(),
            _ => String::new(),
        }
    }

    /// The object's name, `""` when none.
    pub fn name(&self) -> &str {
        self.object_ref
            .as_ref()
            .and_then(|o| o.name.as_deref())
            .unwrap_or("")
    }

    /// When the answer was complete.
    ///
    /// Errors: the timestamp is not RFC 3339.
    pub fn at(&self) -> anyhow::Result<jiff::Timestamp> {
        Ok(self.stage_timestamp.parse()?)
    }
}

/// The gateway as `deploy/` runs it, on this machine: `kustomizations` (e.g.
/// `deploy/gateway`) applied to the control plane by the real kubectl, then the container
/// arguments of the Deployment the apiserver holds, with what only a pod has replaced:
/// `0.0.0.0:<port>` listeners by `127.0.0.1:0`, files under each volume's `mountPath` by the
/// same names under the local directory `mounts` gives for that volume, `$(POD_NAME)` by
/// `pod_name`; and `--kubeconfig` with a token of the Deployment's service account (what the
/// pod's in-cluster configuration would carry).
///
/// Errors: kubectl failed, the Deployment or its gateway container is missing, or an
/// argument names a volume `mounts` does not give.
pub fn deployed_gateway_args(
    control_plane: &(impl ClusterAdmin + ?Sized),
    kustomizations: &[&str],
    mounts: &[(&str, &Path)],
    pod_name: &str,
) -> anyhow::Result<Vec<String>> {
    for kustomization in kustomizations {
        control_plane.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-k",
            kustomization,
        ])?;
    }
    installed_gateway_args(control_plane, mounts, pod_name)
}

/// The gateway's ServiceAccount as the audit log names it.
pub const GATEWAY_USER: &str = "system:serviceaccount:edgebeat-system:edgebeat-gateway";

/// The gateway's requests (as [`GATEWAY_USER`]) in the audit log, answered at or after
/// `from`: the binary's, not kubectl's made with the gateway's kubeconfig (a test probing
/// what the gateway's identity may not do, whose refusals are the point).
///
/// # Panics
/// When the audit log cannot be read.
pub fn gateway_requests(control_plane: &ControlPlane, from: jiff::Timestamp) -> Vec<AuditEvent> {
    #[allow(clippy::unwrap_used)]
    control_plane
        .audit()
        .unwrap()
        .into_iter()
        .filter(|e| {
            e.user.username == GATEWAY_USER
                && !e.user_agent.starts_with("kubectl/")
                && e.at().is_ok_and(|at| at >= from)
        })
        .collect()
}

/// Asserts that the apiserver refused none of `requests`: no 4xx but a 404 or 409 (which
/// the gateway reads as answers), so no 403 from RBAC and no 422 from validation or
/// admission. A 5xx is not a refusal of the request but an apiserver in trouble (a 504 on
/// an Event when etcd lagged under the suite's load, once in a full run), which the gateway
/// backs off from and retries; the outage tests cover that.
///
/// # Panics
/// When one was, listing them.
pub fn assert_none_refused(requests: &[AuditEvent]) {
    let refused: Vec<_> = requests
        .iter()
        .filter(|e| matches!(e.code(), 400..=403 | 405..=408 | 410..=499))
        .map(|e| (e.code(), e.verb.as_str(), e.request_uri.as_str()))
        .collect();
    assert!(
        refused.is_empty(),
        "requests the apiserver refused: {refused:?}"
    );
}

/// The command line of the gateway container of the Deployment `edgebeat-system/edgebeat-gateway`
/// as installed (by kustomize or Helm), for the real binary here: as
/// [`deployed_gateway_args`] without applying anything.
///
/// Errors: as [`deployed_gateway_args`].
pub fn installed_gateway_args(
    control_plane: &(impl ClusterAdmin + ?Sized),
    mounts: &[(&str, &Path)],
    pod_name: &str,
) -> anyhow::Result<Vec<String>> {
    let json = control_plane.kubectl(&[
        "-n",
        "edgebeat-system",
        "get",
        "deployment",
        "edgebeat-gateway",
        "-o",
        "json",
    ])?;
    gateway_args_of(
        control_plane,
        serde_json::from_str(&json)?,
        mounts,
        pod_name,
    )
}

/// As [`installed_gateway_args`], for the Deployment `kubectl kustomize <kustomization>`
/// renders (the release's kubectl), without installing it: for an overlay whose Deployment
/// must not replace the one other tests share on the control plane.
///
/// Errors: as [`deployed_gateway_args`], and the kustomization renders no Deployment.
pub fn rendered_gateway_args(
    control_plane: &(impl ClusterAdmin + ?Sized),
    kustomization: &str,
    mounts: &[(&str, &Path)],
    pod_name: &str,
) -> anyhow::Result<Vec<String>> {
    let rendered = control_plane.kubectl(&["kustomize", kustomization])?;
    let deployment = serde_saphyr::from_multiple::<serde_json::Value>(&rendered)?
        .into_iter()
        .find(|v| v["kind"] == "Deployment")
        .with_context(|| format!("{kustomization} renders no Deployment"))?;
    gateway_args_of(
        control_plane,
        serde_json::from_value(deployment)?,
        mounts,
        pod_name,
    )
}

/// The gateway container's command line of `deployment`, for the real binary here (see
/// [`deployed_gateway_args`]).
fn gateway_args_of(
    control_plane: &(impl ClusterAdmin + ?Sized),
    deployment: k8s_openapi::api::apps::v1::Deployment,
    mounts: &[(&str, &Path)],
    pod_name: &str,
) -> anyhow::Result<Vec<String>> {
    let pod = deployment
        .spec
        .and_then(|s| s.template.spec)
        .context("the Deployment has no pod spec")?;
    let container = pod
        .containers
        .into_iter()
        .find(|c| c.name == "gateway")
        .context("no container named gateway")?;
    let volume_mounts = container.volume_mounts.unwrap_or_default();
    let mut args = Vec::new();
    for arg in container.args.unwrap_or_default() {
        let mut arg = arg.replace("$(POD_NAME)", pod_name);
        if let Some((flag, value)) = arg.split_once('=')
            && value.starts_with("0.0.0.0:")
        {
            arg = format!("{flag}=127.0.0.1:0");
        }
        for mount in &volume_mounts {
            let prefix = format!("{}/", mount.mount_path.trim_end_matches('/'));
            if arg.contains(&prefix) {
                let local = mounts
                    .iter()
                    .find(|(name, _)| *name == mount.name)
                    .with_context(|| {
                        format!("{arg}: no local directory for volume {}", mount.name)
                    })?
                    .1;
                arg = arg.replace(&prefix, &format!("{}/", local.display()));
            }
        }
        args.push(arg);
    }
    let service_account = pod
        .service_account_name
        .context("the pod names no service account")?;
    let kubeconfig =
        control_plane.service_account_kubeconfig("edgebeat-system", &service_account)?;
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    Ok(args)
}

/// A gateway of `deploy/gateway` serving gRPC with mTLS: its serving certificate and the
/// site CA from `site`, written where the Deployment mounts them.
pub struct DeployedGateway {
    /// The running binary.
    pub process: GatewayProcess,
    /// Its gRPC listener (mTLS).
    pub grpc: std::net::SocketAddr,
    /// Its `/healthz`, `/readyz` and `/metrics`.
    pub health: std::net::SocketAddr,
    /// The site CA its serving certificate and the nodes' certificates come from.
    pub site: Arc<Ca>,
    _dir: tempfile::TempDir,
}

#[allow(clippy::unwrap_used)]
impl DeployedGateway {
    /// Starts it with `extra` arguments after deploy/'s.
    ///
    /// # Panics
    /// When kubectl, the files or the binary fail (a test's setup).
    pub async fn start(control_plane: &ControlPlane, extra: &[&str]) -> Self {
        Self::start_with_site(
            control_plane,
            extra,
            Arc::new(Ca::new("edgebeat-test-site")),
        )
        .await
    }

    /// As [`Self::start`], with the site CA of another replica (so that its agents'
    /// certificates are taken here too).
    ///
    /// # Panics
    /// As [`Self::start`].
    pub async fn start_with_site(
        control_plane: &ControlPlane,
        extra: &[&str],
        site: Arc<Ca>,
    ) -> Self {
        Self::start_as(control_plane, extra, site, "edgebeat-gateway-test").await
    }

    /// As [`Self::start_with_site`], as the pod `pod_name` (`$(POD_NAME)`, so the MQTT
    /// client ID: replicas sharing a broker need their own).
    ///
    /// # Panics
    /// As [`Self::start`].
    pub async fn start_as(
        control_plane: &ControlPlane,
        extra: &[&str],
        site: Arc<Ca>,
        pod_name: &str,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let server = site.server();
        let tls = dir.path().join("tls");
        let site_ca = dir.path().join("site-ca");
        std::fs::create_dir_all(&tls).unwrap();
        std::fs::create_dir_all(&site_ca).unwrap();
        std::fs::write(tls.join("tls.crt"), &server.cert_pem).unwrap();
        std::fs::write(tls.join("tls.key"), &server.key_pem).unwrap();
        std::fs::write(site_ca.join("ca.crt"), &site.cert_pem).unwrap();
        let mut args = deployed_gateway_args(
            control_plane,
            &["deploy/gateway"],
            &[("tls", &tls), ("site-ca", &site_ca)],
            pod_name,
        )
        .unwrap();
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let mut process = GatewayProcess::start(&args, &dir.path().join("gateway.log")).unwrap();
        let health = process
            .address("serving /healthz, /readyz and /metrics")
            .await
            .unwrap();
        let grpc = process.address("gRPC listening").await.unwrap();
        Self {
            process,
            grpc,
            health,
            site,
            _dir: dir,
        }
    }

    /// An agent configuration for `node` at kubelet's defaults (status every 10 s, reported
    /// every 5 min unchanged, Lease of 40 s renewed every 10 s), over gRPC with mTLS.
    pub fn agent_config(&self, node: &str) -> AgentConfig {
        self.agent_config_via(node, self.grpc)
    }

    /// As [`Self::agent_config`], reaching the gateway at `endpoint` (something in front of
    /// it, as a Service is).
    pub fn agent_config_via(&self, node: &str, endpoint: std::net::SocketAddr) -> AgentConfig {
        deployed_agent_config(&self.site, node, endpoint)
    }

    /// An in-process agent with [`Self::agent_config`].
    ///
    /// # Panics
    /// When the agent cannot start.
    pub fn agent(&self, node: &str) -> AgentHandle {
        start_agent(self.agent_config(node), Arc::new(edgebeat_hw::SystemClock)).unwrap()
    }
}

/// An agent configuration for `node` at kubelet's defaults (status every 10 s, reported
/// every 5 min unchanged, Lease of 40 s renewed every 10 s), over gRPC with mTLS to a
/// gateway as `deploy/gateway` runs it at `endpoint`, with a node certificate of `site`.
///
/// # Panics
/// When the certificate does not load (a test's setup).
#[allow(clippy::unwrap_used)]
pub fn deployed_agent_config(site: &Ca, node: &str, endpoint: std::net::SocketAddr) -> AgentConfig {
    let leaf = site.node(node);
    let mut transport = grpc_transport(&format!("https://{endpoint}"));
    transport
        .set_tls(ClientTls {
            ca_pem: site.cert_pem.clone().into_bytes(),
            client_identity: Some(TlsIdentity {
                cert_pem: leaf.cert_pem.into_bytes(),
                key_pem: leaf.key_pem.into_bytes(),
            }),
        })
        .unwrap();
    let defaults = AgentConfig::default();
    AgentConfig {
        node_status_update_frequency: defaults.node_status_update_frequency,
        node_status_report_frequency: defaults.node_status_report_frequency,
        node_lease_duration_seconds: defaults.node_lease_duration_seconds,
        ..test_agent_config(node, &fixture("rpi4-cgroup1"), transport)
    }
}

/// The command line of `deploy/gateway-enrollment`'s gateway, its RBAC applied (`deploy/gateway`
/// and `deploy/gateway/enrollment`) but its Deployment only rendered: the shared control
/// plane's Deployment stays `deploy/gateway`'s, which other tests read meanwhile.
#[allow(clippy::unwrap_used)]
fn enrolling_args(control_plane: &ControlPlane, pod_name: &str) -> Vec<String> {
    apply(
        control_plane,
        &["deploy/gateway", "deploy/gateway/enrollment"],
    );
    rendered_gateway_args(control_plane, "deploy/gateway-enrollment", &[], pod_name).unwrap()
}

/// `kubectl apply --server-side -k` of each of `kustomizations`, in order.
#[allow(clippy::unwrap_used)]
fn apply(control_plane: &ControlPlane, kustomizations: &[&str]) {
    for kustomization in kustomizations {
        control_plane
            .kubectl(&[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-k",
                kustomization,
            ])
            .unwrap();
    }
}

/// `args` with `extra` (`--flag=value`) in place of the same flags, or after them.
fn with_flags(mut args: Vec<String>, extra: &[&str]) -> Vec<String> {
    let flag = |a: &str| a.split('=').next().unwrap_or(a).to_owned();
    let replaced: Vec<String> = extra.iter().map(|a| flag(a)).collect();
    args.retain(|a| !replaced.contains(&flag(a)));
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

/// A gateway with enrollment as deployed (`deploy/gateway-enrollment`, or the Helm chart
/// with `enrollment.enabled`: `--enrollment`, the gRPC serving certificate from the site
/// CA), and bootstrap tokens made by `edgebeat-gateway token create` as the gateway's
/// ServiceAccount.
pub struct EnrollingGateway {
    /// The running binary.
    pub process: GatewayProcess,
    grpc: std::net::SocketAddr,
    enroll: std::net::SocketAddr,
    kubeconfig: std::path::PathBuf,
    dir: tempfile::TempDir,
    /// Files its flags name (the broker's TLS), kept while it runs.
    files: Option<tempfile::TempDir>,
}

#[allow(clippy::unwrap_used)]
impl EnrollingGateway {
    /// The gateway of `deploy/gateway-enrollment` with `--csr-approval=<approval>`.
    ///
    /// # Panics
    /// When kubectl, the files or the binary fail (a test's setup).
    pub async fn start(control_plane: &ControlPlane, approval: &str) -> Self {
        Self::start_with(control_plane, approval, &[]).await
    }

    /// As [`EnrollingGateway::start`], with `extra` arguments (`--flag=value`) in place of
    /// the Deployment's of the same flags, or after them.
    ///
    /// # Panics
    /// As [`EnrollingGateway::start`].
    pub async fn start_with(control_plane: &ControlPlane, approval: &str, extra: &[&str]) -> Self {
        let args: Vec<String> = enrolling_args(control_plane, "edgebeat-gateway-enrolling")
            .into_iter()
            .map(|a| {
                if a.starts_with("--csr-approval=") {
                    format!("--csr-approval={approval}")
                } else {
                    a
                }
            })
            .collect();
        Self::with_args(with_flags(args, extra)).await
    }

    /// The gateway of `deploy/gateway-enrollment` also taking heartbeats and certificate
    /// requests through `broker` over TLS, with the flags `deploy/gateway-mqtt` adds (the
    /// broker's CA and the gateway's client certificate for it, from `broker_ca`).
    ///
    /// # Panics
    /// As [`EnrollingGateway::start`].
    pub async fn start_with_mqtt(
        control_plane: &ControlPlane,
        broker: &crate::broker::Broker,
        broker_ca: &Ca,
    ) -> Self {
        let files = tempfile::tempdir().unwrap();
        let client = broker_ca.client("edgebeat-gateway", None);
        for (name, pem) in [
            ("ca.crt", &broker_ca.cert_pem),
            ("tls.crt", &client.cert_pem),
            ("tls.key", &client.key_pem),
        ] {
            std::fs::write(files.path().join(name), pem).unwrap();
        }
        let file = |name: &str| files.path().join(name).display().to_string();
        let mut args = enrolling_args(control_plane, "edgebeat-gateway-enrolling-mqtt");
        args.extend([
            format!(
                "--mqtt-endpoint=mqtts://{}:{}",
                broker.host(),
                broker.port()
            ),
            format!("--mqtt-ca-file={}", file("ca.crt")),
            format!("--mqtt-cert-file={}", file("tls.crt")),
            format!("--mqtt-key-file={}", file("tls.key")),
        ]);
        let mut gateway = Self::with_args(args).await;
        gateway.files = Some(files);
        gateway
    }

    /// The gateway of the enrollment overlay `kustomization` (e.g.
    /// `deploy/gateway-enrollment-kubelet-signer`) with its flags as rendered, once the
    /// RBAC of `deploy/gateway`, `deploy/gateway/enrollment` and `rbac` is applied;
    /// `mounts` are local directories for its volumes (by volume name); `extra` as
    /// [`EnrollingGateway::start_with`]'s.
    ///
    /// # Panics
    /// As [`EnrollingGateway::start`].
    pub async fn start_overlay(
        control_plane: &ControlPlane,
        kustomization: &str,
        rbac: &[&str],
        mounts: &[(&str, &Path)],
        pod_name: &str,
        extra: &[&str],
    ) -> Self {
        apply(
            control_plane,
            &["deploy/gateway", "deploy/gateway/enrollment"],
        );
        apply(control_plane, rbac);
        let args = rendered_gateway_args(control_plane, kustomization, mounts, pod_name).unwrap();
        Self::with_args(with_flags(args, extra)).await
    }

    /// The gateway with `args` (an installed Deployment's, see [`installed_gateway_args`]).
    ///
    /// # Panics
    /// When the binary does not start or announce its listeners.
    pub async fn with_args(args: Vec<String>) -> Self {
        Self::try_with_args(args).await.unwrap()
    }

    /// As [`Self::with_args`], for callers that are not tests (the demo).
    ///
    /// Errors: `args` has no `--kubeconfig=`, or the binary does not start or announce its
    /// listeners (the error holds its log).
    pub async fn try_with_args(args: Vec<String>) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let kubeconfig = args
            .iter()
            .find_map(|a| a.strip_prefix("--kubeconfig="))
            .context("the gateway's arguments have no --kubeconfig=")?
            .into();
        let mut process = GatewayProcess::start(&args, &dir.path().join("gateway.log"))?;
        let enroll = process.address("gRPC enrollment listening").await?;
        let grpc = process.address("gRPC listening").await?;
        Ok(Self {
            process,
            grpc,
            enroll,
            kubeconfig,
            dir,
            files: None,
        })
    }

    /// `edgebeat-gateway token create --nodes <nodes> --uses <uses>` as the gateway's
    /// ServiceAccount: the token it prints.
    ///
    /// # Panics
    /// When the command fails.
    pub fn token(&self, nodes: &str, uses: u32) -> String {
        self.try_token(nodes, uses).unwrap()
    }

    /// As [`Self::token`], for callers that are not tests (the demo).
    ///
    /// Errors: the command could not run or failed (the error holds its standard error).
    pub fn try_token(&self, nodes: &str, uses: u32) -> anyhow::Result<String> {
        let out = crate::process::output(
            std::process::Command::new(crate::process::workspace_binary("edgebeat-gateway")?)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["token", "create", "--nodes", nodes, "--ttl", "1h"])
                .arg(format!("--uses={uses}")),
        )?;
        if !out.status.success() {
            bail!("token create: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// `config` (its node name, host root and intervals) with nothing but `token`: gRPC to
    /// this gateway, enrolling at its enrollment listener, the token file and certificates
    /// kept under `dir` (`dir/token`, `dir/pki`).
    ///
    /// Errors: the token file cannot be written.
    pub fn enrolled_agent_config(
        &self,
        mut config: AgentConfig,
        token: &str,
        dir: &Path,
    ) -> anyhow::Result<AgentConfig> {
        std::fs::create_dir_all(dir)?;
        let token_file = dir.join("token");
        std::fs::write(&token_file, format!("{token}\n"))?;
        config.transport = Some(grpc_transport(&format!("https://{}", self.grpc)));
        config.certificates = Some(edgebeat_agent::config::ManagedCertificates {
            bootstrap_token_file: token_file,
            cert_dir: dir.join("pki"),
            rotate_certificates: true,
            enrollment_endpoint: Some(format!("http://{}", self.enroll)),
        });
        Ok(config)
    }

    /// An agent for `node` with nothing but `token` and the broker's CA (`caFile`), over
    /// MQTT: it enrolls through `broker` (`…/nodes/<node>/csr`), then signs every message
    /// with the key it got and takes only the answers the gateway signs.
    ///
    /// # Panics
    /// When the agent does not start.
    pub fn mqtt_agent(
        &self,
        node: &str,
        token: &str,
        broker: &crate::broker::Broker,
        broker_ca: &Ca,
    ) -> AgentHandle {
        let config = self.mqtt_agent_config(node, token, broker, broker_ca);
        start_agent(config, Arc::new(edgebeat_hw::SystemClock)).unwrap()
    }

    /// The configuration of [`Self::mqtt_agent`], for a caller to change (its intervals)
    /// before it starts the agent.
    ///
    /// # Panics
    /// When the token file cannot be written or the broker's CA not taken.
    pub fn mqtt_agent_config(
        &self,
        node: &str,
        token: &str,
        broker: &crate::broker::Broker,
        broker_ca: &Ca,
    ) -> AgentConfig {
        let dir = self.dir.path().join(node);
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let mut options =
            edgebeat_agent::config::MqttUplinkOptions::new(broker.host(), broker.port());
        options
            .set_tls(ClientTls {
                ca_pem: broker_ca.cert_pem.clone().into_bytes(),
                client_identity: None,
            })
            .unwrap();
        let mut config = test_agent_config(
            node,
            &fixture("rpi4-cgroup1"),
            edgebeat_agent::config::TransportConfig::Mqtt(options),
        );
        config.certificates = Some(edgebeat_agent::config::ManagedCertificates {
            bootstrap_token_file: token_file,
            cert_dir: dir.join("pki"),
            rotate_certificates: true,
            enrollment_endpoint: None,
        });
        config
    }

    /// An agent for `node` with nothing but `token`: gRPC to the gateway, enrolling at its
    /// enrollment listener, certificates kept under the test's directory.
    ///
    /// # Panics
    /// When the agent does not start.
    pub fn agent(&self, node: &str, token: &str) -> AgentHandle {
        start_agent(
            self.agent_config(node, token),
            Arc::new(edgebeat_hw::SystemClock),
        )
        .unwrap()
    }

    /// The configuration of [`Self::agent`], for a caller to change before it starts the
    /// agent.
    ///
    /// # Panics
    /// When the token file cannot be written.
    pub fn agent_config(&self, node: &str, token: &str) -> AgentConfig {
        let base = test_agent_config(
            node,
            &fixture("rpi4-cgroup1"),
            grpc_transport(&format!("https://{}", self.grpc)),
        );
        self.enrolled_agent_config(base, token, &self.dir.path().join(node))
            .unwrap()
    }
}
