//! `/readyz` while a replica starts and once it serves: what the start waits for, then
//! whether every ingress serves.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

type Readiness = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// `/readyz` from the first second: while the gateway starts, "starting: " and what it
/// waits for; then [`readiness`].
pub(super) struct Startup {
    phase: tokio::sync::watch::Sender<&'static str>,
    started: std::sync::OnceLock<Readiness>,
}

impl Startup {
    pub(super) fn new(phase: &'static str) -> Self {
        Self {
            phase: tokio::sync::watch::Sender::new(phase),
            started: std::sync::OnceLock::new(),
        }
    }

    /// What the start waits for now.
    pub(super) fn phase(&self, phase: &'static str) {
        self.phase.send_replace(phase);
    }

    /// Started: from now on `/readyz` is `ready`.
    pub(super) fn started(&self, ready: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        // Set once: run() starts once.
        let _ = self.started.set(Box::new(ready));
    }

    pub(super) fn ready(&self) -> Result<(), String> {
        match self.started.get() {
            Some(ready) => ready(),
            None => Err(format!("starting: {}", *self.phase.borrow())),
        }
    }
}

/// `/readyz`: not shutting down, the Node and Lease watches listed once (`listed`: the
/// apiserver answered the gateway's credentials), (with gRPC) the gRPC server running, and
/// (with MQTT) the shared subscription granted by the broker.
pub(super) fn readiness(
    stop: tokio_util::sync::CancellationToken,
    grpc_serving: Option<Arc<AtomicBool>>,
    mqtt_subscribed: Option<tokio::sync::watch::Receiver<bool>>,
    listed: Arc<AtomicBool>,
) -> impl Fn() -> Result<(), String> + Send + Sync + 'static {
    move || {
        if stop.is_cancelled() {
            return Err("shutting down".into());
        }
        if !listed.load(Ordering::Relaxed) {
            return Err(
                "the managed Nodes and Leases are not listed yet (is the apiserver reachable? see the log)"
                    .into(),
            );
        }
        if grpc_serving
            .as_ref()
            .is_some_and(|serving| !serving.load(Ordering::Relaxed))
        {
            return Err("gRPC server not serving".into());
        }
        if let Some(subscribed) = &mqtt_subscribed
            && !*subscribed.borrow()
        {
            return Err(
                "MQTT shared subscription not granted yet (connecting to the broker or subscribing)"
                    .into(),
            );
        }
        Ok(())
    }
}
