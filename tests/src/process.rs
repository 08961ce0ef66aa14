//! The real `edgebeat-gateway` binary as a child process, for end-to-end tests that must run
//! the wiring of its `main` (not a copy of it): started with the flags a test gives, its JSON
//! log (`--log-format json`) read line by line, the addresses it bound (port 0) taken from
//! that log, killed when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::AsyncBufReadExt as _;

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
        let mut child = tokio::process::Command::new(&binary)
            .arg("--log-format")
            .arg("json")
            .args(args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
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
                        let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
                        let _ = writeln!(file, "{line}");
                    }
                    if let Ok(serde_json::Value::Object(parsed)) = serde_json::from_str(&line) {
                        lines
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(parsed);
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
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The first log line for which `found` holds, waiting up to `deadline` for it.
    ///
    /// Errors: none came within `deadline`, or the process ended; the error holds the log.
    pub async fn wait_for(
        &mut self,
        deadline: Duration,
        found: impl Fn(&LogLine) -> bool,
    ) -> anyhow::Result<LogLine> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let added = self.added.notified();
            tokio::pin!(added);
            added.as_mut().enable();
            if let Some(line) = self.lines().into_iter().find(|l| found(l)) {
                return Ok(line);
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "edgebeat-gateway exited ({status}) first; log:\n{}",
                    self.log_text()
                );
            }
            if tokio::time::timeout_at(until, added).await.is_err() {
                bail!(
                    "no such log line within {deadline:?}; log:\n{}",
                    self.log_text()
                );
            }
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
            std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()?;
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
