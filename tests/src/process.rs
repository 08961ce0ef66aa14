//! Child processes of the tests.
//!
//! - [`spawn`], [`spawn_async`], [`output`], [`status`], [`output_async`]: every process the
//!   tests start goes through these (`tests/clippy.toml` disallows `Command::spawn`,
//!   `output` and `status` elsewhere in this crate), so that it ends when the test process
//!   ends, however that ends (a panic, `exit`, SIGKILL, a timeout of the CI): the kernel
//!   sends it SIGKILL (Linux's parent-death signal, `PR_SET_PDEATHSIG`, set between `fork`
//!   and `exec` and kept across `exec`). Nothing has to run at the test process's end, so
//!   a shared fixture in a `static`, whose `Drop` never runs, is covered too.
//!
//!   The parent-death signal fires when the *thread* that forked the child ends, not the
//!   process: a shared fixture first used by one test's thread (or a tokio worker or
//!   blocking-pool thread) would lose its processes when that thread ends. So [`spawn`] and
//!   [`spawn_async`] fork on one thread of this module's that lives as long as the process.
//!   [`output`] and [`status`] fork on the caller's thread, which waits for the child.
//!
//!   It covers a child and what the child `exec`s (`ip netns exec`, a `#!/bin/sh` script
//!   ending in `exec`), not what a child forks and leaves behind: a script that starts
//!   daemons in the background is not run through here for long-lived processes (the
//!   control plane's components are started one by one, see `crate::control_plane`).
//! - [`GatewayProcess`]: the real `edgebeat-gateway` binary as a child process, for
//!   end-to-end tests that must run the wiring of its `main` (not a copy of it): started
//!   with the flags a test gives, its JSON log (`--log-format json`) read line by line, the
//!   addresses it bound (port 0) taken from that log, killed when dropped.

use parking_lot::Mutex;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::AsyncBufReadExt as _;

/// Starts `command` as a child that is killed (SIGKILL) when this process ends; forked on
/// a thread that lives as long as the process (see the module docs).
///
/// Errors: as [`std::process::Command::spawn`].
#[allow(clippy::disallowed_methods)]
pub fn spawn(command: &mut std::process::Command) -> io::Result<std::process::Child> {
    die_with_this_process(command);
    let mut owned = std::mem::replace(command, std::process::Command::new(""));
    let (owned, child) = on_spawner_thread(move || {
        let child = owned.spawn();
        (owned, child)
    })?;
    *command = owned;
    child
}

/// As [`spawn`], for tokio: the child is registered with the caller's runtime (its `wait`,
/// its pipes, `kill_on_drop`) as `tokio::process::Command::spawn` would.
///
/// Errors: as `tokio::process::Command::spawn`; no tokio runtime.
#[allow(clippy::disallowed_methods)]
pub fn spawn_async(command: &mut tokio::process::Command) -> io::Result<tokio::process::Child> {
    let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
    die_with_this_process(command.as_std_mut());
    let mut owned = std::mem::replace(command, tokio::process::Command::new(""));
    let (owned, child) = on_spawner_thread(move || {
        let _runtime = runtime.enter();
        let child = owned.spawn();
        (owned, child)
    })?;
    *command = owned;
    child
}

/// Runs `command` to completion and collects its output, as
/// [`std::process::Command::output`]; killed if this process ends first.
///
/// Errors: as [`std::process::Command::output`].
#[allow(clippy::disallowed_methods)]
pub fn output(command: &mut std::process::Command) -> io::Result<std::process::Output> {
    die_with_this_process(command);
    command.output()
}

/// Runs `command` to completion, as [`std::process::Command::status`]; killed if this
/// process ends first.
///
/// Errors: as [`std::process::Command::status`].
#[allow(clippy::disallowed_methods)]
pub fn status(command: &mut std::process::Command) -> io::Result<std::process::ExitStatus> {
    die_with_this_process(command);
    command.status()
}

/// As [`output`], for tokio (`tokio::process::Command::output`).
///
/// Errors: as `tokio::process::Command::output`.
#[allow(clippy::disallowed_methods)]
pub async fn output_async(
    command: &mut tokio::process::Command,
) -> io::Result<std::process::Output> {
    die_with_this_process(command.as_std_mut());
    command.output().await
}

/// Sends `signal` (`TERM`, `KILL`...) to `pid` with kill(1).
///
/// Errors: kill could not run or failed (no such process).
pub fn signal(pid: u32, signal: &str) -> io::Result<()> {
    let exit = status(
        std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .stderr(Stdio::null()),
    )?;
    if exit.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("kill -{signal} {pid}: {exit}")))
    }
}

/// Stops `child` as a service manager would: SIGTERM, up to 10 s to exit (polled every
/// 100 ms: a blocking caller, a `Drop` among them), then SIGKILL. A child already gone
/// is waited for and fine.
///
/// # Errors
/// Waiting for it or killing it failed.
pub fn terminate(mut child: std::process::Child) -> io::Result<()> {
    let _ = signal(child.id(), "TERM");
    for _ in 0..100 {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill()?;
    child.wait()?;
    Ok(())
}

/// Makes `command`'s child receive SIGKILL when the thread that forks it ends, which for
/// [`spawn`] is when this process ends.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_this_process(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt as _;
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: it makes two system calls (prctl, getppid) and
    // allocates nothing (an `io::Error` from an OS error code holds no allocation).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            ) == -1
            {
                return Err(io::Error::last_os_error());
            }
            // The parent ended between fork and prctl: no signal will come, so do not exec.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Not Linux: no parent-death signal; children end when their fixtures are dropped.
#[cfg(not(target_os = "linux"))]
fn die_with_this_process(_command: &mut std::process::Command) {}

type Job = Box<dyn FnOnce() + Send>;

/// Runs `job` on the spawner thread: started on first use, never ended, so that the
/// parent-death signal of what it forks fires only when the process ends.
fn on_spawner_thread<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    static JOBS: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    let gone = || io::Error::other("the tests' spawner thread is gone");
    let jobs = JOBS.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<Job>();
        // Never joined: it waits for jobs until the process ends (a thread that cannot
        // start drops `receiver`, and every `send` below fails).
        let _ = std::thread::Builder::new()
            .name("edgebeat-spawner".to_owned())
            .spawn(move || {
                for job in receiver {
                    job();
                }
            });
        sender
    });
    let (done, result) = mpsc::sync_channel(1);
    jobs.send(Box::new(move || {
        // A panicking job must not end the thread (and with it every child forked so far).
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        let _ = done.send(outcome);
    }))
    .map_err(|_| gone())?;
    match result.recv().map_err(|_| gone())? {
        Ok(value) => Ok(value),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// A workspace binary built beside the running executable (`target/<profile>/<name>`, also
/// for test executables in `target/<profile>/deps`).
///
/// Errors: not built (`cargo build` it first, with the same profile).
pub fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("executable without a directory")?;
    if dir.ends_with("deps") {
        dir = dir.parent().context("deps without a parent")?;
    }
    let binary = dir.join(name);
    if !binary.is_file() {
        bail!(
            "{} not found: build it first (cargo build --bin {name}, with the same profile)",
            binary.display()
        );
    }
    Ok(binary)
}

/// One line of a JSON log (`tracing_subscriber`'s flattened JSON: `level`, `message`,
/// `target` and the event's fields at the top level).
pub type LogLine = serde_json::Map<String, serde_json::Value>;

/// A running `edgebeat-gateway` (see the module docs).
pub struct GatewayProcess {
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<LogLine>>>,
    added: Arc<tokio::sync::Notify>,
    /// Where its stdout and stderr are copied as they come (kept for a failing test).
    pub log: PathBuf,
}

impl GatewayProcess {
    /// Starts `edgebeat-gateway` with `args` (after `--log-format json`), its log copied to
    /// `log` and parsed.
    ///
    /// Errors: the binary is not built or cannot start.
    pub fn start<I, S>(args: I, log: &Path) -> anyhow::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let binary = workspace_binary("edgebeat-gateway")?;
        let mut child = spawn_async(
            tokio::process::Command::new(&binary)
                .arg("--log-format")
                .arg("json")
                .args(args)
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true),
        )
        .with_context(|| format!("starting {}", binary.display()))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let added = Arc::new(tokio::sync::Notify::new());
        let file =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let file = Arc::new(Mutex::new(file));
        let stdout = child.stdout.take().context("no stdout")?;
        let stderr = child.stderr.take().context("no stderr")?;
        for stream in [
            Box::new(stdout) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
            Box::new(stderr),
        ] {
            let (lines, added, file) = (lines.clone(), added.clone(), file.clone());
            tokio::spawn(async move {
                let mut reader = tokio::io::BufReader::new(stream).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    {
                        use std::io::Write as _;
                        let mut file = file.lock();
                        let _ = writeln!(file, "{line}");
                    }
                    if let Ok(serde_json::Value::Object(parsed)) = serde_json::from_str(&line) {
                        lines.lock().push(parsed);
                        added.notify_waiters();
                    }
                }
            });
        }
        Ok(Self {
            child,
            lines,
            added,
            log: log.to_owned(),
        })
    }

    /// The process ID (`None` once it has been waited for).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Every log line so far.
    pub fn lines(&self) -> Vec<LogLine> {
        self.lines.lock().clone()
    }

    /// The first log line for which `found` holds, waiting up to `deadline` for it.
    ///
    /// Errors: none came within `deadline`, or the process ended; the error holds the log.
    pub async fn wait_for(
        &mut self,
        deadline: Duration,
        found: impl Fn(&LogLine) -> bool,
    ) -> anyhow::Result<LogLine> {
        let Self {
            child,
            lines,
            added,
            ..
        } = self;
        let added: &tokio::sync::Notify = added;
        let waited = crate::wait::until(
            "a matching log line",
            deadline,
            || {
                let line = lines.lock().iter().find(|l| found(l)).cloned();
                std::future::ready(match line {
                    Some(line) => Some(Ok(line)),
                    None => match child.try_wait() {
                        Ok(None) => None,
                        Ok(Some(status)) => Some(Err(anyhow::anyhow!(
                            "edgebeat-gateway exited ({status}) first"
                        ))),
                        Err(e) => Some(Err(e.into())),
                    },
                })
            },
            // Made before each check (the notification reaches a `Notified` from its
            // making on), so a line logged during the check is not missed.
            move || added.notified(),
        )
        .await;
        match waited {
            Ok(Ok(line)) => Ok(line),
            Ok(Err(e)) => bail!("{e:#}; log:\n{}", self.log_text()),
            Err(_) => bail!(
                "no such log line within {deadline:?}; log:\n{}",
                self.log_text()
            ),
        }
    }

    /// The address of the log line whose message is `message` (its `addr` field), e.g.
    /// `"serving /healthz, /readyz and /metrics"` or `"gRPC listening"`.
    ///
    /// Errors: as [`Self::wait_for`], or the line has no parsable `addr`.
    pub async fn address(&mut self, message: &str) -> anyhow::Result<SocketAddr> {
        let line = self
            .wait_for(Duration::from_secs(20), |l| {
                l.get("message").and_then(|m| m.as_str()) == Some(message)
            })
            .await?;
        line.get("addr")
            .and_then(|a| a.as_str())
            .context("no addr field")?
            .parse()
            .context("addr")
    }

    /// The log as written so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the exit status (up to 10 s, then kills).
    ///
    /// Errors: the process could not be signalled or waited for.
    pub async fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        if let Some(pid) = self.child.id() {
            // Gone already: its status is what `wait` returns.
            let _ = signal(pid, "TERM");
        }
        match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                self.child.kill().await?;
                Ok(self.child.wait().await?)
            }
        }
    }

    /// Kills it (SIGKILL: no goodbye, as a node or a container runtime kills it) and waits
    /// for it.
    ///
    /// Errors: the process could not be killed or waited for.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}
