//! Reconnect backoff, one rule for every transport client that reconnects: the agent's
//! uplinks and the gateway's MQTT ingress.

use std::time::Duration;

/// Least delay after a failed Lease renewal, and of a reconnect: 200 ms. kubelet's node
/// lease controller (`staging/src/k8s.io/component-helpers/apimachinery/lease/controller.go`)
/// retries a failed renewal after 200 ms, doubling.
pub const RETRY_MIN: Duration = Duration::from_millis(200);
/// Longest such delay: 7 s, kubelet's `maxBackoff` for Lease renewals and for registration.
pub const RETRY_MAX: Duration = Duration::from_secs(7);
/// Least delay before `Register` is sent again after a refusal: 100 ms, doubling to
/// [`RETRY_MAX`] (kubelet `pkg/kubelet/kubelet_node_status.go: registerWithAPIServer`).
pub const REGISTER_RETRY_MIN: Duration = Duration::from_millis(100);

/// Reconnect delays: exponential from `min` doubling to `max`, each with random jitter up to
/// its own length (backon's `ExponentialBuilder`), never giving up. rumqttc and tonic
/// reconnect without delay by themselves; this is what keeps a fleet from reconnecting in
/// lockstep after a gateway or broker restart.
pub fn reconnect_backoff(min: Duration, max: Duration) -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(min)
        .with_max_delay(max)
        .without_max_times()
        .build()
}
