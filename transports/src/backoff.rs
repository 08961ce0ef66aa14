//! Reconnect backoff, one rule for every transport client that reconnects: the agent's
//! uplinks and the gateway's MQTT ingress.

use std::time::Duration;

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
