//! The manager loop: the transport run with the managed identity, which is rotated when
//! due (at a random point of its lifetime, or at the gateway's word) and swapped live.

use std::time::Duration;

use edgebeat_transports::uplink::{RegisterFn, Uplink, UplinkDriver};
use tokio_util::sync::CancellationToken;

use crate::error::AgentError;

use super::Manager;
use super::identity::NodeIdentity;

/// Rotation happens at a uniformly random point in this fraction of the certificate's
/// lifetime (client-go `certificate_manager.go: nextRotationDeadline`: 70–90 %).
pub const ROTATION_WINDOW: (f64, f64) = (0.7, 0.9);

impl Manager<'_> {
    /// Waits until `identity` is due for rotation: its deadline at a random point of
    /// [`ROTATION_WINDOW`], or the gateway's word (`due` changed since it was last seen: a
    /// word that came before this call, with the first Register, counts). Wakes at most hourly to
    /// look at the wall clock again (a board's clock may jump at NTP sync). `false` when
    /// `cancel` fires first.
    pub async fn wait_due(
        &self,
        identity: &NodeIdentity,
        due: &mut tokio::sync::watch::Receiver<u64>,
        cancel: &CancellationToken,
    ) -> bool {
        let (low, high) = ROTATION_WINDOW;
        let deadline = identity.rotation_deadline(low + (high - low) * fastrand::f64());
        loop {
            let left = deadline - self.now();
            if left <= 0 {
                tracing::info!(
                    node = self.headers.node_name(),
                    not_after = identity.not_after,
                    "node certificate due for rotation"
                );
                return true;
            }
            let nap = Duration::from_secs(u64::try_from(left).unwrap_or(0).min(3600));
            tokio::select! {
                () = cancel.cancelled() => return false,
                () = tokio::time::sleep(nap) => {}
                changed = due.changed() => {
                    if changed.is_ok() {
                        tracing::info!(node = self.headers.node_name(), "the gateway says the node certificate is due; rotating");
                        return true;
                    }
                }
            }
        }
    }
}

/// Runs `transport` with a managed identity (see the module docs) until `cancel` fires:
/// obtains one first if `certDir` holds none, then runs the transport with it, rotating
/// and swapping it live when due.
///
/// Errors: [`AgentError::Certificates`] when `certDir` cannot be used; the transport's own
/// errors at start.
pub async fn run(
    manager: Manager<'_>,
    node: &str,
    register: RegisterFn,
    uplink: &Uplink,
    driver: &mut UplinkDriver,
    cancel: CancellationToken,
) -> Result<(), AgentError> {
    let mut identity = match manager.store.load() {
        Some(identity) => identity,
        None => {
            tracing::info!(node, dir = %manager.store.dir.display(), "no node certificate yet: enrolling with the bootstrap token");
            match manager.obtain(None, &cancel).await {
                Some(identity) => identity,
                None => return Ok(()),
            }
        }
    };
    let mut due = uplink.certificate_due();
    loop {
        manager.metrics.certificate_expires(identity.not_after);
        let transport = manager.configure(&identity)?;
        let instance = cancel.child_token();
        let running = transport.run(node, register.clone(), driver, instance.clone());
        tokio::pin!(running);
        let next = async {
            // The previous pair goes once the current one is accepted.
            if uplink.registered().wait_for(|r| *r).await.is_ok()
                && let Err(error) = manager.store.forget_previous()
            {
                tracing::warn!(%error, "the previous node certificate could not be deleted");
            }
            if !manager.managed.rotate_certificates {
                return std::future::pending().await;
            }
            if !manager.wait_due(&identity, &mut due, &cancel).await {
                return None;
            }
            manager.obtain(Some(&identity), &cancel).await
        };
        let next = tokio::select! {
            result = &mut running => return result,
            next = next => next,
        };
        instance.cancel();
        let stopped = running.await;
        match next {
            Some(new) if !cancel.is_cancelled() => {
                tracing::info!(
                    node,
                    not_after = new.not_after,
                    "node certificate rotated; reconnecting with it"
                );
                identity = new;
                // What the gateway said of the old certificate is not about the new one.
                due.mark_unchanged();
            }
            _ => return stopped,
        }
    }
}
