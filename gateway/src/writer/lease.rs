//! Lease renewals: kubelet's lease controller (`staging/src/k8s.io/component-helpers/
//! apimachinery/lease/controller.go`): PUT with the last known resourceVersion, GET only
//! after a 409, create when missing; and the Lease state the agent echoes.

use super::{NodeWrites, Writer, retry};
use crate::apiserver::answers;
use crate::bodies;
use crate::view::{LeaseRecord, PartialLease};
use edgebeat_proto::Answer;
use edgebeat_proto::registration::NodeName;
use edgebeat_transports::ingress::RejectReason;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use std::time::Duration;
use tokio::time::Instant;

/// The gateway's Lease state, echoed by the agent (`LeaseRenewal.lease_state`): the
/// resourceVersion and renewTime of the last successful write. Encoding: renewTime as
/// 8 bytes big-endian microseconds since the epoch, then the resourceVersion as UTF-8
/// (at most 64 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseState {
    /// `metadata.resourceVersion` returned by the last write.
    pub resource_version: String,
    /// `spec.renewTime` of the last write.
    pub renew_time: Timestamp,
}

impl LeaseState {
    /// The wire form (see the type docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.resource_version.len());
        out.extend_from_slice(&self.renew_time.as_microsecond().to_be_bytes());
        out.extend_from_slice(self.resource_version.as_bytes());
        out
    }

    /// Parses the wire form; `None` for empty or malformed input (the agent's echo is not
    /// trusted: a bad one only costs a GET).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let (time, rv) = bytes.split_first_chunk::<8>()?;
        if rv.is_empty() || rv.len() > 64 {
            return None;
        }
        let resource_version = std::str::from_utf8(rv).ok()?.to_owned();
        let renew_time = Timestamp::from_microsecond(i64::from_be_bytes(*time)).ok()?;
        Some(Self {
            resource_version,
            renew_time,
        })
    }
}

/// What a renewal PUTs against without reading the Lease first: the newer of the view's
/// record and the agent's echo of the last write, when the Lease is plain (a body can be
/// rebuilt from them). `None`: read it (nothing is known, or it holds more than kubelet
/// sets).
fn plain_base(
    held: Option<LeaseRecord>,
    echoed: Option<LeaseState>,
    uid: Option<&str>,
) -> Option<PlainBase<'_>> {
    let held_time = held.as_ref().and_then(|h| h.renew_time);
    match (held, echoed, uid) {
        (held, Some(state), Some(uid))
            if held.as_ref().is_none_or(|h| h.plain)
                && held.as_ref().map(|h| &*h.resource_version)
                    != Some(state.resource_version.as_str())
                && held_time.is_none_or(|t| t < state.renew_time) =>
        {
            Some(PlainBase {
                uid,
                resource_version: Box::from(state.resource_version),
                holder: held.and_then(|h| h.holder_identity),
            })
        }
        (Some(h), _, Some(uid)) if h.plain => Some(PlainBase {
            uid,
            resource_version: h.resource_version,
            holder: h.holder_identity,
        }),
        _ => None,
    }
}

/// What [`plain_base`] found to PUT against.
struct PlainBase<'a> {
    /// The Node's UID (the Lease's ownerReference).
    uid: &'a str,
    /// The resourceVersion of the last write known.
    resource_version: Box<str>,
    /// The holderIdentity found, kept as kubelet keeps it
    /// ([`LeaseRecord::holder_identity`]); the node name when none is known.
    holder: Option<Box<str>>,
}

impl Writer {
    /// renewTime from the gateway clock with microsecond precision, strictly after the last
    /// one written for this Lease: the node lifecycle controller counts a renewal only when
    /// its renewTime is later than the last one it saw (`tryUpdateNodeHealth`), and
    /// `MicroTime` carries exactly six fractional digits (`apimachinery/pkg/apis/meta/v1/
    /// micro_time.go`).
    pub(super) fn renew_time(&self, w: &mut NodeWrites) -> Timestamp {
        let now = self.now();
        let micros = Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now);
        let t = match w.last_renew {
            Some(last) if micros <= last => last
                .checked_add(jiff::SignedDuration::from_micros(1))
                .unwrap_or(micros),
            _ => micros,
        };
        w.last_renew = Some(t);
        t
    }

    /// Raises the last renewTime known for this Lease to `t` (written by another replica or
    /// before a restart), so the next one is later still.
    pub(super) fn saw_renew_time(w: &mut NodeWrites, t: Option<Timestamp>) {
        if let Some(t) = t
            && w.last_renew.is_none_or(|last| last < t)
        {
            w.last_renew = Some(t);
        }
    }

    /// kubelet's lease controller: PUT the Lease with a fresh renewTime and the
    /// resourceVersion of the last write (no GET on the happy path); on 409 or with nothing
    /// known, GET (or create when missing) and retry; up to 5 attempts, each started before
    /// `deadline`.
    ///
    /// The last write is known from the view (this replica's writes and the Lease watch) or
    /// from the agent's echoed `lease_state` (see [`LeaseState`]), whichever is newer. A
    /// Lease the view knows to hold more than kubelet sets (annotations, other labels) is
    /// read whole first, so the PUT drops nothing; the echo alone, with the view knowing
    /// nothing of the Lease, is trusted to be of a plain one (the gateway wrote it).
    pub(crate) async fn renew(
        &self,
        w: &mut NodeWrites,
        name: &NodeName,
        duration: i32,
        lease_state: &[u8],
        deadline: Instant,
    ) -> Answer {
        if duration <= 0 {
            return self.reject(
                RejectReason::Invalid,
                format!("leaseDurationSeconds must be > 0, got {duration}"),
            );
        }
        let uid = match self.ensure_known(w, name).await {
            Ok(held) => held.uid,
            Err(answer) => return answer,
        };
        let now = self.now();
        // The echo is agent input: one from the future (beyond clock skew) is ignored.
        let mut echoed = LeaseState::decode(lease_state).filter(|s| {
            s.renew_time
                <= now
                    .checked_add(jiff::SignedDuration::from_secs(5))
                    .unwrap_or(now)
        });
        Self::saw_renew_time(w, echoed.as_ref().map(|s| s.renew_time));
        let mut held = self.view.lease(name);
        Self::saw_renew_time(w, held.as_ref().and_then(|h| h.renew_time));
        let mut last_error = String::new();
        for _ in 0..5 {
            let Some(budget) = deadline
                .checked_duration_since(Instant::now())
                .filter(|b| !b.is_zero())
            else {
                last_error = "too late to write this renewal; waiting for a fresh one".into();
                break;
            };
            let (body, renew) = match plain_base(held.take(), echoed.take(), uid.as_deref()) {
                Some(base) => {
                    let renew = self.renew_time(w);
                    let holder = base.holder.as_deref().unwrap_or(name);
                    let body = bodies::plain_lease_json(
                        name,
                        holder,
                        base.uid,
                        duration,
                        &base.resource_version,
                        renew,
                    );
                    (body, renew)
                }
                None => match self.read_lease(w, name, budget).await {
                    Read::Lease(base) => {
                        let renew = self.renew_time(w);
                        let lease =
                            bodies::renewed_lease(*base, name, uid.as_deref(), duration, renew);
                        match serde_json::to_vec(&lease) {
                            Ok(body) => (body, renew),
                            Err(e) => {
                                last_error = format!("encoding lease: {e}");
                                break;
                            }
                        }
                    }
                    Read::Missing => return self.create_lease(w, name, duration).await,
                    Read::Failed(e) => {
                        last_error = format!("reading lease: {e}");
                        continue;
                    }
                    Read::Late => {
                        last_error = "reading lease: deadline passed".into();
                        break;
                    }
                },
            };
            match tokio::time::timeout(budget, self.api.replace_lease(name, body)).await {
                Ok(Ok(written)) => return self.renewed(w, name, &written, renew),
                Ok(Err(e)) => {
                    last_error = format!("updating lease: {e}");
                    // Conflict or gone: fall back to GET (kubelet backoffEnsureLease).
                    if answers::is_conflict(&e) || answers::is_not_found(&e) {
                        continue;
                    }
                    break;
                }
                Err(_) => {
                    last_error = "updating lease: deadline passed".into();
                    break;
                }
            }
        }
        self.counters.lease_failures.inc();
        let now = self.now();
        let lease_age = self
            .view
            .lease(name)
            .and_then(|h| h.renew_time)
            .map(|t| now.duration_since(t));
        self.api.renewal_failed(name, lease_age, &last_error);
        retry(last_error)
    }

    /// GET of the Lease before a PUT (kubelet's lease controller after a 409, or with
    /// nothing known): what it holds goes into the view.
    async fn read_lease(&self, w: &mut NodeWrites, name: &NodeName, budget: Duration) -> Read {
        match tokio::time::timeout(budget, self.api.get_lease_opt(name)).await {
            Ok(Ok(Some(lease))) => {
                self.view.observe_lease(&PartialLease::from(&lease));
                let renew_time = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref());
                Self::saw_renew_time(w, renew_time.map(|t| t.0));
                Read::Lease(Box::new(lease))
            }
            Ok(Ok(None)) => Read::Missing,
            Ok(Err(e)) => Read::Failed(e),
            Err(_) => Read::Late,
        }
    }

    pub(super) fn renewed(
        &self,
        w: &mut NodeWrites,
        name: &NodeName,
        written: &PartialLease,
        renew: Timestamp,
    ) -> Answer {
        let state = LeaseState {
            resource_version: written
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default(),
            renew_time: renew,
        };
        self.view.observe_lease(written);
        self.counters.lease_renewals.inc();
        w.series
            .lease_age
            .get_or_insert_with(|| self.node_metrics.lease_age(name))
            .renewed(renew);
        Answer::Renewed {
            lease_state: state.encode(),
            resend_status: false,
        }
    }

    /// Creates the Lease with an ownerReference to the Node, whose UID is read fresh (kubelet
    /// `SetNodeOwnerFunc`): a cached UID could belong to a deleted Node, and the garbage
    /// collector would delete the new Lease at once.
    pub(super) async fn create_lease(
        &self,
        w: &mut NodeWrites,
        name: &NodeName,
        duration: i32,
    ) -> Answer {
        let uid = match self.api.get_node(name).await {
            Ok(node) => {
                self.view.observe_node(&node);
                match node.metadata.uid {
                    Some(uid) => uid,
                    None => return retry("node has no uid yet"),
                }
            }
            Err(e) if answers::is_not_found(&e) => return self.forget(w, name),
            // kubelet skips creation this round when the owner Node cannot be read.
            Err(e) => {
                return retry(format!("reading node for the lease owner: {e}"));
            }
        };
        let renew = self.renew_time(w);
        match self
            .api
            .create_lease(&bodies::new_lease(name, &uid, duration, renew))
            .await
        {
            Ok(created) => self.renewed(w, name, &created, renew),
            Err(e) => {
                self.counters.lease_failures.inc();
                retry(format!("creating lease: {e}"))
            }
        }
    }
}

/// What [`Writer::read_lease`] found.
enum Read {
    /// The Lease, whole.
    Lease(Box<Lease>),
    /// No such Lease: it is to be created.
    Missing,
    /// The GET failed.
    Failed(kube::Error),
    /// The renewal's deadline passed first.
    Late,
}
