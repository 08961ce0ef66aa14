#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::*;

/// Shutdown awaits every ingress: when one fails, the others are stopped and each is awaited
/// to its end (an MQTT ingress still sending its DISCONNECT) before the error is returned,
/// named by its ingress. Main used to return at the first ingress that ended, and on an
/// error skipped the drain altogether.
#[tokio::test(start_paused = true)]
async fn the_first_ingress_to_fail_stops_the_others_and_every_one_drains() {
    let stop = tokio_util::sync::CancellationToken::new();
    let drained = Arc::new(AtomicBool::new(false));
    let mut ingresses = tokio::task::JoinSet::new();
    ingresses.spawn(async { ("gRPC", Err(IngressError::from("listener closed"))) });
    let (slow_stop, slow_drained) = (stop.clone(), drained.clone());
    ingresses.spawn(async move {
        slow_stop.cancelled().await;
        // A DISCONNECT that takes its time to go out.
        tokio::time::sleep(Duration::from_secs(2)).await;
        slow_drained.store(true, Ordering::Relaxed);
        ("MQTT", Ok(()))
    });
    let err = drain(ingresses, &stop).await.unwrap_err();
    assert!(matches!(
        err,
        ServeError::Ingress {
            ingress: "gRPC",
            ..
        }
    ));
    assert_eq!(
        edgebeat_transports::observe::error_report(&err),
        "gRPC ingress: listener closed"
    );
    assert!(stop.is_cancelled(), "the others were told to stop");
    assert!(
        drained.load(Ordering::Relaxed),
        "the MQTT ingress drained before the return"
    );
}
