//! [`Handler`] for [`Gateway`]: how every ingress hands it messages, certificate
//! requests and rejections.

use std::sync::Arc;

use edgebeat_proto::{self as pb, Answer};
use edgebeat_transports::ingress::{CertificateId, Handler, Letter, Peer};
use edgebeat_transports::log_limit::LogLine;
use tokio::time::Instant;

use super::Gateway;
use crate::enrollment::gate::Source;
use crate::resource_metrics::SampleRefused;
use edgebeat_transports::ingress::RejectReason;

impl Handler for Gateway {
    /// Posts the message to its node's mailbox and waits for its answer; when nothing of
    /// the node was being handled, handles the mailbox's letters itself meanwhile (its own
    /// and those posted behind it). For direct callers (tests); the ingresses use
    /// [`Handler::deliver`]. Cancelled while it handles letters, it leaves the waiting ones
    /// to the node's next post.
    async fn handle(&self, peer: &Peer, message: pb::AgentMessage) -> Option<Answer> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        if let Some(cell) = self.post(Letter::new(peer.clone(), message, reply)) {
            self.handle_letters(&cell).await;
        }
        answer.await.ok().flatten()
    }

    /// Posts the letter to its node's mailbox; when nothing of the node was being handled,
    /// a task handles the mailbox's letters until none is left.
    fn deliver(self: Arc<Self>, letter: Letter) {
        if let Some(cell) = self.post(letter) {
            tokio::spawn(async move { self.handle_letters(&cell).await });
        }
    }

    /// Through the [`EnrollmentGate`] (per source: the client's address over gRPC, the
    /// node of the topic over MQTT), then [`Enrollment::handle`]; `None` without
    /// enrollment or over a limit (counted as `rate_limited`).
    async fn request_certificate(
        &self,
        peer: &Peer,
        topic_node: Option<&str>,
        payload: Vec<u8>,
    ) -> Option<Vec<u8>> {
        let enrollment = self.enrollment.get()?;
        let source = match (peer.remote, topic_node) {
            (Some(addr), _) => Source::Address(addr.ip()),
            (None, Some(node)) => Source::Node(node.to_owned()),
            (None, None) => Source::Unknown,
        };
        let Some(_permit) = self.enrollment_gate.admit(source, Instant::now()) else {
            enrollment.counters.count(
                "unknown",
                crate::enrollment::CsrRejectReason::RateLimited.as_str(),
            );
            tracing::debug!(remote = ?peer.remote, node = ?topic_node, "certificate request over the limits; not answered");
            return None;
        };
        enrollment
            .handle(peer.transport, topic_node, &payload)
            .await
    }

    fn recorded_certificate(&self, node: &str) -> Option<CertificateId> {
        self.writer.view.certificate(node)
    }

    /// Takes the bridge's word into the site tracker ([`SiteTracker::uplink`]) and, for a
    /// site of managed nodes, wakes the site loop, which marks or clears the site's nodes
    /// at once (a flood of made-up sites wakes nothing).
    fn site_uplink(&self, site: &str, up: bool) {
        if self.sites.lock().uplink(site, up) {
            self.sites_wake.notify_one();
        }
    }

    /// Records another replica's sample ([`Samples::record_shared`]), so that this replica
    /// serves the node's resource metrics too.
    ///
    /// [`Samples::record_shared`]: crate::resource_metrics::Samples::record_shared
    ///
    /// The batch it came in was verified as a replica's where the replicas sign. Still, a
    /// sample is refused (counted and logged within bounds) for a node that is not a managed
    /// Node in the view ([`RejectReason::Foreign`]: a made-up node or a worker edgebeat does
    /// not run), when dated beyond the clock window ahead of this replica's clock
    /// ([`RejectReason::ClockSkew`]: a sample from the future would never be replaced by
    /// the node's genuine ones), and beyond the node's capacity ([`RejectReason::Invalid`]).
    fn shared_usage(&self, usage: pb::SharedUsage) {
        let peer = Peer::unidentified(edgebeat_transports::ingress::TransportKind::Mqtt, None);
        let Some(capacity) = self.writer.view.managed_capacity(&usage.node_name) else {
            return self.rejected(
                &peer,
                RejectReason::Foreign,
                "shared usage sample of a node that is no managed Node",
            );
        };
        match self
            .resource_samples
            .record_shared(&usage, capacity, self.clock.now())
        {
            Ok(_) => {}
            Err(refused) => {
                let reason = match refused {
                    SampleRefused::FromTheFuture(_) => RejectReason::ClockSkew,
                    _ => RejectReason::Invalid,
                };
                self.rejected(
                    &peer,
                    reason,
                    &format!("shared usage sample of {}: {refused}", usage.node_name),
                );
            }
        }
    }

    fn rejected(&self, peer: &Peer, why: RejectReason, detail: &str) {
        self.counters.count_rejection(why);
        if matches!(why, RejectReason::Superseded | RejectReason::Replayed) {
            // Expected under a backlog or a replay flood: one warning each would flood the log.
            tracing::debug!(transport = peer.transport.as_str(), node = ?peer.identity, why = why.as_str(), detail, "heartbeat superseded or replayed");
            return;
        }
        // Per reason and source address (or node), one line per interval: a flood is
        // counted in full and written in a few lines.
        let source = match (&peer.remote, &peer.identity) {
            (Some(remote), _) => remote.ip().to_string(),
            (None, Some(node)) => node.to_string(),
            (None, None) => String::new(),
        };
        let now = tokio::time::Instant::now();
        if let LogLine::Write { suppressed, others } =
            self.counters
                .rejection_log
                .check(why.as_str(), &source, now)
        {
            tracing::warn!(transport = peer.transport.as_str(), remote = ?peer.remote, node = ?peer.identity, why = why.as_str(), detail, suppressed, other_sources = others, "message rejected by the transport");
        }
    }
}
