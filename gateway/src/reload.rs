//! The gateway's own TLS files, reloaded while it serves: a serving certificate that
//! cert-manager renews into a mounted Secret, a CA bundle that carries the old and the new
//! CA during a CA change. Kubernetes updates a mounted Secret by swapping a symlink, so the
//! files are read again every [`RELOAD_PERIOD`] and compared by content, rather than
//! watched with inotify (which a symlink swap defeats).

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::watch;

/// How often the files are read again: 10 s (kubelet refreshes a mounted Secret within its
/// sync period, a minute by default, so this adds little to the delay).
pub const RELOAD_PERIOD: Duration = Duration::from_secs(10);

/// Largest file read, bytes (1 MiB, as the gateway's other PEM files).
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Watches `paths`: every `period` their contents are read; when any changed, `build` makes
/// a new value of them (in `paths`' order), which the returned receiver then holds. A read
/// that fails (a file being replaced) or a value `build` refuses (a key that does not match
/// its certificate yet) is logged and the previous value kept; the next change is tried
/// again. The task ends when every receiver is dropped. `build`'s error is only logged
/// (its `Display`).
pub fn watch_files<T, E, F>(
    paths: Vec<PathBuf>,
    period: Duration,
    initial: T,
    build: F,
) -> watch::Receiver<T>
where
    T: Send + Sync + 'static,
    E: std::fmt::Display,
    F: Fn(Vec<Vec<u8>>) -> Result<T, E> + Send + 'static,
{
    let (tx, rx) = watch::channel(initial);
    let read = move |paths: &[PathBuf]| -> Result<Vec<Vec<u8>>, String> {
        paths
            .iter()
            .map(|p| edgebeat_hw::read_bounded(p, MAX_FILE_BYTES).map_err(|e| e.to_string()))
            .collect()
    };
    let mut last = read(&paths).ok();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tx.closed() => return,
                () = tokio::time::sleep(period) => {}
            }
            let contents = match read(&paths) {
                Ok(contents) => contents,
                Err(error) => {
                    tracing::warn!(%error, "reloading TLS files: unreadable; the previous ones stay in use");
                    continue;
                }
            };
            if last.as_ref() == Some(&contents) {
                continue;
            }
            match build(contents.clone()) {
                Ok(value) => {
                    tracing::info!(files = ?paths, "TLS files changed: reloaded");
                    tx.send_replace(value);
                    last = Some(contents);
                }
                Err(error) => {
                    tracing::warn!(%error, files = ?paths, "TLS files changed but are unusable; the previous ones stay in use");
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_changed_file_is_reloaded_and_a_bad_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tls.crt");
        std::fs::write(&file, "one").unwrap();
        let mut rx = watch_files(vec![file.clone()], RELOAD_PERIOD, "one".to_owned(), |c| {
            let text = String::from_utf8(c[0].clone()).map_err(|e| e.to_string())?;
            if text == "bad" {
                Err("refused".to_owned())
            } else {
                Ok(text)
            }
        });
        std::fs::write(&file, "bad").unwrap();
        tokio::time::sleep(RELOAD_PERIOD * 3).await;
        assert!(!rx.has_changed().unwrap(), "a refused value is not sent");
        std::fs::write(&file, "two").unwrap();
        tokio::time::timeout(RELOAD_PERIOD * 2, rx.changed())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(*rx.borrow_and_update(), "two");
        std::fs::remove_file(&file).unwrap();
        tokio::time::sleep(RELOAD_PERIOD * 3).await;
        assert!(
            !rx.has_changed().unwrap(),
            "a missing file keeps the last value"
        );
    }
}
