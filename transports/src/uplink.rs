//! The agent's side of every transport: a cheap [`Uplink`] handle for the agent's loops and
//! the [`UplinkDriver`] half that a transport's connection task consumes.

use std::sync::Arc;
use std::time::Duration;

use edgebeat_proto::{Ack, AgentMessage};
use tokio::sync::{Notify, mpsc, oneshot, watch};

/// Why a message did not get an [`Ack`].
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum UplinkError {
    /// The transport is not connected right now (connecting, backing off). The message was
    /// not sent and is not queued: the caller retries with a fresh message.
    #[error("not connected to the gateway")]
    NotConnected,
    /// The connection broke after the message was handed over; it may or may not have
    /// reached the gateway.
    #[error("connection lost before the gateway answered")]
    Disconnected,
    /// No answer within the caller's timeout.
    #[error("no answer from the gateway within {0:?}")]
    Timeout(Duration),
    /// The transport task has stopped (shutdown).
    #[error("uplink stopped")]
    Closed,
}

/// One message handed to the transport, with the slot for its answer.
#[derive(Debug)]
pub struct Request {
    /// The message to send; its header's `seq` is the key the answer comes back under.
    pub message: AgentMessage,
    /// Where the transport puts the [`Ack`] or the reason there is none.
    pub reply: oneshot::Sender<Result<Ack, UplinkError>>,
}

/// Builds the `Register` message the transport sends first on every new connection
/// (kubelet registers before its first status update). Called once per connect, so the
/// header's `seq` and the status are current.
pub type RegisterFn = Arc<dyn Fn() -> AgentMessage + Send + Sync>;

/// Agent-side handle: cheap to clone, shared by the status and lease loops.
#[derive(Clone)]
pub struct Uplink {
    tx: mpsc::Sender<Request>,
    registered: watch::Receiver<bool>,
    status_requested: Arc<Notify>,
}

/// The transport's half of an uplink: requests to send and signals to raise.
pub struct UplinkDriver {
    /// Requests from the agent's loops, in order.
    pub requests: mpsc::Receiver<Request>,
    /// Set to `true` when the gateway acknowledged `Register` on the current connection,
    /// `false` whenever the connection is lost.
    pub registered: watch::Sender<bool>,
    /// Notified when the gateway asks for a full status report (`Ack.resend_status`).
    pub status_requested: Arc<Notify>,
}

/// Creates a connected pair of [`Uplink`] and [`UplinkDriver`]. `depth` bounds the
/// messages in flight to the transport task (a handful: one status and one lease loop).
pub fn channel(depth: usize) -> (Uplink, UplinkDriver) {
    let (tx, requests) = mpsc::channel(depth.max(1));
    let (registered_tx, registered) = watch::channel(false);
    let status_requested = Arc::new(Notify::new());
    (
        Uplink {
            tx,
            registered,
            status_requested: status_requested.clone(),
        },
        UplinkDriver {
            requests,
            registered: registered_tx,
            status_requested,
        },
    )
}

impl Uplink {
    /// Sends `message` and waits up to `timeout` for the gateway's [`Ack`].
    ///
    /// Errors: [`UplinkError::NotConnected`] at once when there is no connection (the message
    /// is dropped, never queued), [`UplinkError::Disconnected`] when the connection broke
    /// first, [`UplinkError::Timeout`], or [`UplinkError::Closed`] after shutdown.
    pub async fn send(&self, message: AgentMessage, timeout: Duration) -> Result<Ack, UplinkError> {
        let (reply, answer) = oneshot::channel();
        let request = Request { message, reply };
        let exchange = async {
            self.tx
                .send(request)
                .await
                .map_err(|_| UplinkError::Closed)?;
            answer.await.map_err(|_| UplinkError::Closed)?
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(UplinkError::Timeout(timeout)),
        }
    }

    /// Whether the gateway has acknowledged `Register` on the current connection; the
    /// receiver changes on every (re)registration and disconnect.
    pub fn registered(&self) -> watch::Receiver<bool> {
        self.registered.clone()
    }

    /// Resolves when the gateway asks for a full status report (after its restart, or when
    /// the Node was recreated). One pending request is remembered if nobody is waiting.
    pub async fn status_requested(&self) {
        self.status_requested.notified().await;
    }
}

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

/// Answers every request that arrives while there is no connection with
/// [`UplinkError::NotConnected`], until `delay` has passed or `cancel` fires. Returns
/// `false` when the agent side is gone or `cancel` fired (the driver should stop).
pub async fn refuse_while_waiting(
    requests: &mut mpsc::Receiver<Request>,
    delay: Duration,
    cancel: &tokio_util::sync::CancellationToken,
) -> bool {
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return true,
            () = cancel.cancelled() => return false,
            request = requests.recv() => match request {
                Some(r) => { let _ = r.reply.send(Err(UplinkError::NotConnected)); }
                None => return false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgebeat_proto::{AckCode, Header, LeaseRenewal, agent_message::Kind};

    fn renewal(seq: u64) -> AgentMessage {
        AgentMessage {
            kind: Some(Kind::Lease(LeaseRenewal {
                header: Some(Header {
                    seq,
                    ..Default::default()
                }),
                lease_duration_seconds: 40,
            })),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn send_gets_the_drivers_answer() {
        let (uplink, mut driver) = channel(4);
        let answerer = tokio::spawn(async move {
            let r = driver.requests.recv().await.unwrap();
            let seq = r.message.header().unwrap().seq;
            r.reply
                .send(Ok(Ack {
                    seq,
                    code: AckCode::Ok.into(),
                    ..Default::default()
                }))
                .unwrap();
        });
        let ack = uplink
            .send(renewal(7), Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(ack.seq, 7);
        answerer.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn send_times_out_without_answer() {
        let (uplink, _driver) = channel(4);
        let err = uplink
            .send(renewal(1), Duration::from_secs(3))
            .await
            .unwrap_err();
        assert_eq!(err, UplinkError::Timeout(Duration::from_secs(3)));
    }

    #[tokio::test(start_paused = true)]
    async fn requests_are_refused_not_queued_while_disconnected() {
        let (uplink, mut driver) = channel(4);
        let cancel = tokio_util::sync::CancellationToken::new();
        let waiter = tokio::spawn(async move {
            refuse_while_waiting(&mut driver.requests, Duration::from_secs(5), &cancel).await
        });
        let err = uplink
            .send(renewal(1), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err, UplinkError::NotConnected);
        assert!(waiter.await.unwrap(), "waited out the delay");
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let delays: Vec<_> = reconnect_backoff(Duration::from_millis(200), Duration::from_secs(7))
            .take(12)
            .collect();
        assert_eq!(delays.len(), 12, "never gives up");
        assert!(delays[0] >= Duration::from_millis(200) && delays[0] <= Duration::from_millis(400));
        // Capped at max (plus at most the jitter of one max delay).
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(14)));
        assert!(delays[11] >= Duration::from_secs(7));
    }
}
