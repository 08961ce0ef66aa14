//! Whether the apiserver answers at all, said in the log within seconds of start.
//!
//! The gateway's watches retry quietly with backoff and its writes wait for heartbeats, so
//! an apiserver that cannot be reached (refused, unresolvable, silent), speaks another
//! protocol, or refuses the gateway's credentials would otherwise go unsaid while every
//! node expires. At start the gateway asks for `GET /version` (what `kubectl version` and
//! client-go's discovery ask first; readable by every client under kube-apiserver's
//! default `system:public-info-viewer` role) with a deadline of [`REACH_TIMEOUT`], and logs
//! each failure as an error naming the URL and the cause, retrying from
//! [`REACH_RETRY_MIN`] doubling to [`REACH_RETRY_MAX`] until it answers. Later outages are
//! reported by the watches ([`crate::view`]) and the writes.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Longest wait for `/version` before it counts as unreachable.
pub const REACH_TIMEOUT: Duration = Duration::from_secs(5);
/// First wait before asking again after a failure.
pub const REACH_RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest wait between two attempts (and so between two error lines).
pub const REACH_RETRY_MAX: Duration = Duration::from_secs(30);

/// Asks `client` for the apiserver's `/version` until it answers or `stop` is cancelled,
/// logging every failure at ERROR with `apiserver = url` and the cause (the error and its
/// sources, e.g. `tcp connect error: Connection refused`), and the first answer at INFO
/// with the version. Returns whether it was reached.
pub async fn report_reachability(
    client: kube::Client,
    url: http::Uri,
    stop: CancellationToken,
) -> bool {
    let mut wait = REACH_RETRY_MIN;
    let mut failures = 0u32;
    loop {
        let asked = tokio::time::timeout(REACH_TIMEOUT, client.apiserver_version());
        let cause = match stop.run_until_cancelled(asked).await {
            None => return false,
            Some(Ok(Ok(info))) => {
                tracing::info!(
                    apiserver = %url,
                    version = %info.git_version,
                    failed_attempts = failures,
                    "reached the apiserver"
                );
                return true;
            }
            Some(Ok(Err(error))) => edgebeat_transports::observe::error_report(&error),
            Some(Err(_)) => format!("no answer within {REACH_TIMEOUT:?}"),
        };
        failures += 1;
        tracing::error!(
            apiserver = %url,
            error = %cause,
            retry_in = ?wait,
            "cannot reach the apiserver"
        );
        if stop
            .run_until_cancelled(tokio::time::sleep(wait))
            .await
            .is_none()
        {
            return false;
        }
        wait = (wait * 2).min(REACH_RETRY_MAX);
    }
}
