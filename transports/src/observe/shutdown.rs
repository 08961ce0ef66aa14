//! What stops either binary ([`shutdown_signal`]).

/// Resolves on SIGTERM or Ctrl-C (SIGINT): what stops either binary, whether systemd or the
/// kubelet sends SIGTERM or someone presses Ctrl-C. When SIGTERM cannot be listened for, logs
/// a warning and waits for Ctrl-C alone.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the process");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
