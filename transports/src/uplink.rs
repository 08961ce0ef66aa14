//! The agent's side of every transport: a cheap [`Uplink`] handle for the agent's loops and
//! the [`UplinkDriver`] half that a transport's connection task consumes.

use std::sync::Arc;
use std::time::Duration;

pub use edgebeat_proto::HeaderForm;
use edgebeat_proto::{Ack, AckError, AgentMessage, Answer};
use tokio::sync::{mpsc, oneshot, watch};

/// Why a message did not get an [`Answer`].
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
    /// The gateway's [`Ack`] for the message held a contradiction ([`AckError`]); it was
    /// dropped and logged. The agent retries the message, as after a lost connection.
    #[error(transparent)]
    BadAck(#[from] AckError),
}

/// One message handed to the transport, with the slot for its answer.
#[derive(Debug)]
pub struct Request {
    /// The message to send; its header's `seq` is the key the answer comes back under.
    pub message: AgentMessage,
    /// Where the transport puts the [`Answer`] or the reason there is none.
    pub reply: oneshot::Sender<Result<Answer, UplinkError>>,
}

/// Builds the `Register` message the transport sends first on every new connection
/// (kubelet registers before its first status update). Called once per connect, so the
/// header's `seq` and the status are current.
pub type RegisterFn = Arc<dyn Fn() -> AgentMessage + Send + Sync>;

/// Where this agent process stands with its Node, across every connection of one uplink
/// (kubelet's `registrationCompleted`, `pkg/kubelet/kubelet_node_status.go`:
/// `registerWithAPIServer` runs once per process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRegistration {
    /// The gateway has not accepted a `Register` from this process yet.
    Pending,
    /// The gateway accepted a `Register` of this process. A later `Register` (on a new
    /// connection) sets `Register.registration_completed`, so the gateway never creates
    /// the Node again for it.
    Completed,
    /// The gateway answered `Ack.node_not_found`: the Node was deleted after this process
    /// registered it. Final for the process: the owner of the uplink stops sending, and
    /// only a restart registers the Node again (as kubelet).
    NodeNotFound,
}

/// Agent-side handle: cheap to clone, shared by the status and lease loops.
#[derive(Clone)]
pub struct Uplink {
    tx: mpsc::Sender<Request>,
    registered: watch::Receiver<bool>,
    registration: watch::Receiver<NodeRegistration>,
    status_requests: watch::Receiver<u64>,
    connections: watch::Receiver<u64>,
    certificate_due: watch::Receiver<u64>,
}

/// The transport's half of an uplink: requests to send and signals to raise.
pub struct UplinkDriver {
    /// Requests from the agent's loops, in order.
    pub requests: mpsc::Receiver<Request>,
    /// Set to `true` when the gateway acknowledged `Register` on the current connection,
    /// `false` whenever the connection is lost.
    pub registered: watch::Sender<bool>,
    /// [`NodeRegistration`] of this process, raised by [`Session::on_ack`]; it only moves
    /// forward (`Pending` → `Completed` → `NodeNotFound`).
    pub registration: watch::Sender<NodeRegistration>,
    /// Counts the gateway's requests for a full status report (`Ack.resend_status`); the
    /// agent compares it with the count its last report answered, so a request is served
    /// once, by whichever report comes next.
    pub status_requests: watch::Sender<u64>,
    /// Counts connections made (a gRPC stream opened, an MQTT CONNACK), so that a loop
    /// backing off after failed sends can try again as soon as one is up (see
    /// [`Uplink::connections`]); raise it with [`UplinkDriver::connected`].
    pub connections: watch::Sender<u64>,
    /// Counts the gateway's word that the node's certificate is due for rotation
    /// (`Ack.certificate_due`, see [`Uplink::certificate_due`]).
    pub certificate_due: watch::Sender<u64>,
}

impl UplinkDriver {
    /// Records that a connection is up (see [`UplinkDriver::connections`]).
    pub fn connected(&self) {
        self.connections.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Ends the uplink for good, once no transport will run on this driver again (the
    /// agent is shutting down): requests already queued are answered
    /// [`UplinkError::Closed`], and [`Uplink::send`] answers it at once from now on.
    ///
    /// Without it, a request sent after the transport stopped (the retry of one its last
    /// connection failed) waits in a queue nobody reads until its caller's timeout: a
    /// Lease renewal's is the renew interval, 10 s by default, which held every connected
    /// agent's exit on SIGTERM that long. A transport stopped to be restarted (certificate
    /// rotation) leaves the driver open.
    pub fn close(&mut self) {
        self.requests.close();
        while let Ok(request) = self.requests.try_recv() {
            let _ = request.reply.send(Err(UplinkError::Closed));
        }
    }
}

/// Creates a connected pair of [`Uplink`] and [`UplinkDriver`]. `depth` bounds the
/// messages in flight to the transport task (a handful: one status and one lease loop).
pub fn channel(depth: usize) -> (Uplink, UplinkDriver) {
    let (tx, requests) = mpsc::channel(depth.max(1));
    let (registered_tx, registered) = watch::channel(false);
    let (registration_tx, registration) = watch::channel(NodeRegistration::Pending);
    let (status_requests_tx, status_requests) = watch::channel(0);
    let (connections_tx, connections) = watch::channel(0);
    let (certificate_due_tx, certificate_due) = watch::channel(0);
    (
        Uplink {
            tx,
            registered,
            registration,
            status_requests,
            connections,
            certificate_due,
        },
        UplinkDriver {
            requests,
            registered: registered_tx,
            registration: registration_tx,
            status_requests: status_requests_tx,
            connections: connections_tx,
            certificate_due: certificate_due_tx,
        },
    )
}

impl Uplink {
    /// Sends `message` and waits up to `timeout` for the gateway's [`Answer`].
    ///
    /// Errors: [`UplinkError::NotConnected`] at once when there is no connection (the message
    /// is dropped, never queued), [`UplinkError::Disconnected`] when the connection broke
    /// first, [`UplinkError::Timeout`], [`UplinkError::BadAck`] for a contradictory answer,
    /// or [`UplinkError::Closed`] after shutdown.
    pub async fn send(
        &self,
        message: AgentMessage,
        timeout: Duration,
    ) -> Result<Answer, UplinkError> {
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

    /// Where this process stands with its Node (see [`NodeRegistration`]); the receiver
    /// changes when a first `Register` is accepted and when the Node is found deleted.
    pub fn registration(&self) -> watch::Receiver<NodeRegistration> {
        self.registration.clone()
    }

    /// How many times the gateway has asked for a full status report on this uplink (it
    /// does when the apiserver's copy of the node differs from what it last wrote, e.g. the
    /// node lifecycle controller set it Unknown during an outage). The receiver changes on
    /// every request.
    pub fn status_requests(&self) -> watch::Receiver<u64> {
        self.status_requests.clone()
    }

    /// How many connections the transport has made; the receiver changes when one comes
    /// up (a gRPC stream opened, an MQTT CONNACK). A loop backing off after failed sends
    /// waits on it too, so that after an outage the first renewal goes out as soon as the
    /// link is back rather than when the backoff (up to 7 s) ends.
    pub fn connections(&self) -> watch::Receiver<u64> {
        self.connections.clone()
    }

    /// How many times the gateway said, accepting a Register, that the node's certificate
    /// is due for rotation by its clock (`Ack.certificate_due`: for boards without a
    /// real-time clock, which cannot tell a certificate's age after a reboot). The
    /// receiver changes on every such answer.
    pub fn certificate_due(&self) -> watch::Receiver<u64> {
        self.certificate_due.clone()
    }
}

pub use crate::backoff::reconnect_backoff;
use crate::backoff::{REGISTER_RETRY_MIN, RETRY_MAX};

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
mod tests;

/// What a driver must do after [`Session::on_ack`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterAck {
    /// Nothing.
    Nothing,
    /// Send `Register` again after this delay (registration was refused for now).
    RegisterAfter(Duration),
    /// Publish the node's certificate chain again ([`Answer::SendCertificate`], signed MQTT):
    /// a gateway replica holds no current copy.
    PublishCertificate,
}

/// `Ack.node_not_found` answers, each to another request and none written in between, that
/// an agent whose answers are not authenticated (plain MQTT, plaintext gRPC) needs before it
/// takes its Node as deleted: on such a path anyone could send one.
pub const NODE_NOT_FOUND_CONFIRMATIONS: u8 = 3;

/// Messages that carry the boot ID after a gateway replica asked for it
/// ([`Answer::SendBootId`]).
/// Replicas behind an MQTT shared subscription take a node's messages in turn (Mosquitto
/// hands them out round robin), so one message might always reach a replica that knows the
/// boot; four reach each of up to four replicas. Each costs 13 bytes more than a tagged one.
pub const BOOT_ID_MESSAGES: u8 = 4;

/// Per-connection protocol state shared by every uplink driver, with no I/O: which
/// requests await an [`Ack`], whether `Register` was accepted, and the registration backoff
/// (kubelet's: 100 ms doubling to 7 s). Drivers feed it sends and acks and act on what it
/// returns.
pub struct Session {
    /// Requests awaiting an answer, by seq, and whether each is quiet (answered only with
    /// news, so silence is not a loss).
    pending: std::collections::HashMap<u64, (oneshot::Sender<Result<Answer, UplinkError>>, bool)>,
    register_seq: Option<u64>,
    registered: bool,
    /// What the gateway allowed when it accepted `Register`.
    header_form: HeaderForm,
    /// A gateway replica answered [`Answer::SendBootId`]: this many next messages carry the boot
    /// ID ([`BOOT_ID_MESSAGES`]).
    boot_id_messages: u8,
    backoff: Box<dyn Iterator<Item = Duration> + Send>,
    /// The transport authenticates the gateway's answers (TLS to the gateway, or verified
    /// signed answers): see [`Session::with_authenticated_answers`].
    authenticated: bool,
    /// `node_not_found` answers in a row not yet obeyed (unauthenticated answers only).
    not_found: u8,
}

impl Default for Session {
    fn default() -> Self {
        Self::new()
    }
}

impl Session {
    /// A fresh session for a new connection: nothing pending, not registered.
    pub fn new() -> Self {
        Self {
            pending: std::collections::HashMap::new(),
            register_seq: None,
            registered: false,
            header_form: HeaderForm::Full,
            boot_id_messages: 0,
            backoff: Box::new(reconnect_backoff(REGISTER_RETRY_MIN, RETRY_MAX)),
            authenticated: false,
            not_found: 0,
        }
    }

    /// Says whether the transport authenticates the gateway's answers (gRPC over TLS, which
    /// verifies the gateway; MQTT with verified signed answers). Unauthenticated answers are
    /// obeyed, except that `node_not_found`, which stops the agent for good, needs
    /// [`NODE_NOT_FOUND_CONFIRMATIONS`] of them in a row: one forged message must never stop
    /// an agent.
    pub fn with_authenticated_answers(mut self, authenticated: bool) -> Self {
        self.authenticated = authenticated;
        self
    }

    /// A session on a new connection whose registration is still valid: for transports
    /// where the connection is to a broker, not to the gateway (MQTT), a reconnect says
    /// nothing about what the gateway knows, so the agent does not register again (any
    /// gateway replica reads the Node when it does not know it).
    /// `header_form`: what the gateway said when it accepted `Register` (a gateway
    /// property, not the connection's).
    pub fn resumed(header_form: HeaderForm) -> Self {
        Self {
            registered: true,
            header_form,
            ..Self::new()
        }
    }

    /// Whether the gateway accepted `Register` on this connection.
    pub fn registered(&self) -> bool {
        self.registered
    }

    /// How quiet messages' headers go on this connection ([`HeaderForm`]): whole until
    /// the gateway accepted `Register`, then as it allowed.
    pub fn header_form(&self) -> HeaderForm {
        if self.registered {
            self.header_form
        } else {
            HeaderForm::Full
        }
    }

    /// Whether the message about to be sent carries the boot ID because a gateway replica
    /// asked for it ([`Answer::SendBootId`]): true for the [`BOOT_ID_MESSAGES`] messages sent
    /// after the request.
    pub fn take_boot_id_request(&mut self) -> bool {
        let requested = self.boot_id_messages > 0;
        self.boot_id_messages = self.boot_id_messages.saturating_sub(1);
        requested
    }

    /// Records that `Register` with `seq` was sent.
    pub fn register_sent(&mut self, seq: Option<u64>) {
        self.register_seq = seq;
    }

    /// Records a request sent with `seq` whose answer goes to `reply` (`quiet`: a quiet
    /// renewal, answered only with news); forgets requests whose caller gave up (timed
    /// out). Returns how many were forgotten that expected an answer: requests that went
    /// unanswered (a quiet one that heard nothing was written).
    pub fn track(
        &mut self,
        seq: u64,
        reply: oneshot::Sender<Result<Answer, UplinkError>>,
        quiet: bool,
    ) -> usize {
        let mut unanswered = 0;
        self.pending.retain(|_, (r, quiet)| {
            let gone = r.is_closed();
            unanswered += usize::from(gone && !*quiet);
            !gone
        });
        self.pending.insert(seq, (reply, quiet));
        unanswered
    }

    /// Handles one [`Ack`]: reads it as an [`Answer`], answers the waiting request,
    /// updates the registration state (raising `driver.registered`, `driver.registration`
    /// and `driver.status_requests` as the gateway says) and says whether to send `Register`
    /// again (only after a refused one, with kubelet's backoff).
    ///
    /// Only an ack that answers a request this session sent and still awaits (by its
    /// `seq`) counts: an ack is only as trustworthy as the path it came by (an MQTT broker is
    /// a third party), so an unsolicited or replayed one changes nothing. Its
    /// [`Answer::NodeNotFound`] is obeyed only once this process registered
    /// ([`NodeRegistration::Completed`]): the Node was deleted since, and
    /// `driver.registration` becomes [`NodeRegistration::NodeNotFound`] for good. A
    /// contradictory ack ([`AckError`]) is logged and fails its request with
    /// [`UplinkError::BadAck`]; for `Register`, as a refusal.
    pub fn on_ack(&mut self, ack: Ack, driver: &UplinkDriver) -> AfterAck {
        let seq = ack.seq;
        let answer = Answer::try_from(ack);
        let contradictory = |e: &AckError| {
            tracing::warn!(seq, error = %e, "dropping the gateway's contradictory ack");
        };
        if Some(seq) == self.register_seq {
            // One answer per Register: a replayed or forged second one changes nothing.
            self.register_seq = None;
            // Obeyed only once this process registered (see `node_not_found`); otherwise an
            // ordinary refusal, retried with backoff.
            if matches!(answer, Ok(Answer::NodeNotFound { .. })) && self.node_not_found(driver) {
                return AfterAck::Nothing;
            }
            if matches!(answer, Ok(Answer::SendCertificate { .. })) {
                return AfterAck::PublishCertificate;
            }
            let reason = match answer {
                Ok(Answer::Registered {
                    headers,
                    resend_status,
                    certificate_due,
                }) => {
                    if certificate_due {
                        driver.certificate_due.send_modify(|n| *n += 1);
                    }
                    if resend_status {
                        driver.status_requests.send_modify(|n| *n += 1);
                    }
                    self.registered = true;
                    self.not_found = 0;
                    self.header_form = headers;
                    self.backoff = Box::new(reconnect_backoff(REGISTER_RETRY_MIN, RETRY_MAX));
                    driver.registered.send_replace(true);
                    driver.registration.send_if_modified(|r| {
                        let first = *r == NodeRegistration::Pending;
                        if first {
                            *r = NodeRegistration::Completed;
                        }
                        first
                    });
                    return AfterAck::Nothing;
                }
                Ok(other) => other.reason().to_owned(),
                Err(e) => {
                    contradictory(&e);
                    e.to_string()
                }
            };
            let delay = self.backoff.next().unwrap_or(RETRY_MAX);
            tracing::warn!(%reason, ?delay, "registration not accepted; retrying");
            return AfterAck::RegisterAfter(delay);
        }
        let Some((reply, _)) = self.pending.remove(&seq) else {
            tracing::debug!(seq, "ignoring an ack for no request of this session");
            return AfterAck::Nothing;
        };
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                contradictory(&e);
                let _ = reply.send(Err(e.into()));
                return AfterAck::Nothing;
            }
        };
        let mut after = AfterAck::Nothing;
        let answer = match answer {
            Answer::SendBootId { .. } => {
                self.boot_id_messages = BOOT_ID_MESSAGES;
                answer
            }
            Answer::SendCertificate { .. } => {
                after = AfterAck::PublishCertificate;
                answer
            }
            Answer::NodeNotFound { reason } => {
                if self.node_not_found(driver) {
                    Answer::NodeNotFound { reason }
                } else {
                    // Not (yet) taken as the Node's deletion: retried as any refusal.
                    Answer::Retry { reason }
                }
            }
            a => {
                if a.is_written() {
                    self.not_found = 0;
                }
                if a.asks_for_status() {
                    driver.status_requests.send_modify(|n| *n += 1);
                }
                a
            }
        };
        let _ = reply.send(Ok(answer));
        after
    }

    /// The gateway says the Node this process registered is gone (see [`Session::on_ack`]);
    /// returns whether that was obeyed: once this process registered, at once when answers
    /// are authenticated, else at the [`NODE_NOT_FOUND_CONFIRMATIONS`]th in a row.
    fn node_not_found(&mut self, driver: &UplinkDriver) -> bool {
        if !self.authenticated {
            self.not_found = self.not_found.saturating_add(1);
            if self.not_found < NODE_NOT_FOUND_CONFIRMATIONS {
                tracing::warn!(
                    answers = self.not_found,
                    needed = NODE_NOT_FOUND_CONFIRMATIONS,
                    "the gateway says the Node was deleted, over a path that does not authenticate its answers; not obeyed until confirmed"
                );
                return false;
            }
        }
        let obeyed = driver.registration.send_if_modified(|r| {
            let completed = *r == NodeRegistration::Completed;
            if completed {
                *r = NodeRegistration::NodeNotFound;
            }
            completed
        });
        if obeyed {
            self.registered = false;
            driver.registered.send_replace(false);
        } else {
            tracing::debug!("ignoring node_not_found: this process has not registered");
        }
        obeyed
    }

    /// Ends the session: `driver.registered` goes false and every pending request fails
    /// with [`UplinkError::Disconnected`].
    pub fn close(&mut self, driver: &UplinkDriver) {
        self.registered = false;
        driver.registered.send_replace(false);
        self.fail_pending();
    }

    /// Fails every pending request with [`UplinkError::Disconnected`] and leaves the
    /// registration as it is (see [`Session::resumed`]).
    pub fn fail_pending(&mut self) {
        for (_, (reply, _)) in self.pending.drain() {
            let _ = reply.send(Err(UplinkError::Disconnected));
        }
    }
}

#[cfg(test)]
mod session_tests;
