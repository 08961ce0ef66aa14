//! The gateway's calls to the kube-apiserver, each made on behalf of one node.
//!
//! Every call goes through kube-rs' own request builder ([`kube::core::Request`], what
//! [`kube::Api`] uses inside) and [`kube::Client::request`], so paths, query parameters,
//! content types and error mapping are kube-rs'. What this adds is the optional
//! **impersonation mode**: each request then carries
//!
//! ```text
//! Impersonate-User: system:node:<nodeName>
//! Impersonate-Group: system:nodes
//! ```
//!
//! so the apiserver authorizes it as the node itself: its Node authorizer and NodeRestriction
//! admission apply on top of the gateway's own checks, and the audit log names the node. The
//! apiserver adds `system:authenticated` to an impersonated user itself. The gateway's
//! service account then needs only `impersonate` on those users and that group
//! (`deploy/gateway/impersonation`), not write access to nodes and leases.
//!
//! Headers are set per request rather than per client (kube's `AuthInfo::impersonate`),
//! so one client, connection pool and rate limit serve the whole fleet.
//!
//! **Built for fleets.** A fleet must never expire because its own gateway throttles
//! itself, and a recovering apiserver must not meet a retry storm:
//!
//! - No fixed request rate: at most [`WriteLimits::max_inflight`] requests are in flight
//!   at once, so the gateway carries whatever the apiserver answers and no more. kubelet's
//!   heartbeat client has no client-side rate limit at all (`cmd/kubelet/app/server.go`:
//!   QPS −1); this bounds concurrency instead.
//! - **Lease calls first**: Node, status and Event calls may hold at most half of those
//!   slots, so a burst of registrations or status reports never holds up Lease renewals
//!   (the liveness signal; `pkg/controller/nodelifecycle` reads the Lease first).
//! - **One backoff per priority for the whole gateway**: an answer that says the apiserver
//!   is in trouble (429, 5xx, no answer in time) closes a gate; until it reopens, calls of
//!   that priority fail at once with [`BackingOff`] (the agent retries on its own schedule)
//!   and one probe request at a time goes through, after 200 ms doubling to 4 s, or after
//!   the 429's `Retry-After` (at most 4 s). The first success reopens it. Lease and other
//!   calls have a gate each, so a failing webhook on status patches never holds up Leases. An outage of any length so costs the apiserver a few
//!   probes per second, not a request per node per retry, and a renewal goes through
//!   within seconds of recovery, inside one renew interval.

use edgebeat_proto::registration::NodeName;
use parking_lot::Mutex;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{GetParams, Patch, PatchParams, PostParams};
use kube::core::Request;
use kube::{Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::bodies::{EVENT_NAMESPACE, LEASE_NAMESPACE};
use crate::view::PartialLease;
use edgebeat_transports::tls;
use gate::{Gate, Moved, Priority, Recording, Ticket};
use jiff::SignedDuration;
use outage::{OutageLine, OutageLog};

pub use gate::{BackingOff, WriteLimits, is_trouble};

/// `Impersonate-User` (kube-apiserver impersonation headers).
const IMPERSONATE_USER: HeaderName = HeaderName::from_static("impersonate-user");
/// `Impersonate-Group`.
const IMPERSONATE_GROUP: HeaderName = HeaderName::from_static("impersonate-group");

/// Longest an apiserver call may take, from sending to the decoded answer: kubelet's
/// heartbeat client timeout (`nodeStatusUpdateFrequency`, 10 s, `cmd/kubelet/app/
/// server.go: buildKubeletClientConfig`). A call past it counts as no answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The apiserver as the gateway writes to it: a kube-rs client, whether to impersonate
/// each node, the call slots and a backoff gate per priority (shared by every clone),
/// so that trouble with Node, status or Event calls (a failing webhook) never holds up
/// Lease renewals, and the reverse.
#[derive(Clone)]
pub struct Apiserver {
    client: kube::Client,
    impersonate: bool,
    all: Arc<Semaphore>,
    others: Arc<Semaphore>,
    gates: Arc<[Mutex<Gate>; 2]>,
    /// The outage being told ([`outage`]).
    outage: Arc<Mutex<OutageLog>>,
    /// The apiserver's URL, named in the outage's lines.
    url: Option<Arc<str>>,
}

/// Whether the apiserver takes this replica's Lease writes, for judging what a Lease's age
/// means ([`crate::sites`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteHealth {
    /// The Lease gate is closed (the apiserver answered 429, 5xx or nothing, and no Lease
    /// call has succeeded since) and a Lease call met trouble within [`TROUBLE_RECENT`]: a
    /// gate that no call has tried for that long (its nodes gone) says nothing either way.
    pub failing: bool,
    /// How long ago the Lease gate last reopened after trouble; `None` when it never closed.
    pub since_recovery: Option<Duration>,
}

/// How recent a Lease call's trouble must be for [`WriteHealth::failing`]: longer than the
/// gate's longest wait between probes (4 s) and a call's deadline (10 s) together.
pub const TROUBLE_RECENT: Duration = Duration::from_secs(30);

impl Apiserver {
    /// Calls through `client` with the default [`WriteLimits`]; with `impersonate`, as
    /// each node (see the module docs).
    pub fn new(client: kube::Client, impersonate: bool) -> Self {
        Self::with_limits(client, impersonate, WriteLimits::default())
    }

    /// As [`Apiserver::new`], with `limits`.
    pub fn with_limits(client: kube::Client, impersonate: bool, limits: WriteLimits) -> Self {
        let max = limits.max_inflight.max(2);
        Self {
            client,
            impersonate,
            all: Arc::new(Semaphore::new(max)),
            others: Arc::new(Semaphore::new(max / 2)),
            gates: Arc::new([Mutex::new(Gate::new()), Mutex::new(Gate::new())]),
            outage: Arc::new(Mutex::new(OutageLog::default())),
            url: None,
        }
    }

    /// Names `url` as the apiserver in the outage's lines.
    #[must_use]
    pub fn named(mut self, url: &http::Uri) -> Self {
        self.url = Some(url.to_string().into());
        self
    }

    /// Whether the apiserver takes Lease writes now, and since when (see [`WriteHealth`]).
    pub fn write_health(&self) -> WriteHealth {
        let now = Instant::now();
        let gate = self.gate(Priority::Lease).lock();
        WriteHealth {
            failing: gate.failing
                && gate
                    .last_trouble
                    .is_some_and(|t| now.saturating_duration_since(t) < TROUBLE_RECENT),
            since_recovery: gate.reopened.map(|at| now.saturating_duration_since(at)),
        }
    }

    /// Records a call's outcome (`trouble`, see [`trouble`]) in the gate of `priority`. The
    /// Lease gate's moves are the outage's start and end ([`outage`]): taken under its lock,
    /// so that no other call's outcome comes between the move and the outage's record; the
    /// line is written after. `error` says what the trouble was.
    fn observe(
        &self,
        priority: Priority,
        trouble: Option<Duration>,
        probe: bool,
        error: impl FnOnce() -> String,
    ) {
        let mut gate = self.gate(priority).lock();
        let moved = gate.observe(trouble, probe);
        if priority != Priority::Lease {
            return;
        }
        let now = Instant::now();
        let line = match moved {
            Moved::Closed => self.outage.lock().trouble(now),
            Moved::Reopened => self.outage.lock().recovered(now),
            Moved::Not => None,
        };
        drop(gate);
        let apiserver = self.url.as_deref().unwrap_or("(in-cluster)");
        match line {
            Some(OutageLine::Began) => tracing::error!(
                apiserver,
                error = %error(),
                "the apiserver does not take writes (429, 5xx or no answer); backing off, one probe request at a time; renewals are not written until it does"
            ),
            Some(OutageLine::Ended(totals)) => tracing::info!(
                apiserver,
                lasted_s = totals.lasted.as_secs(),
                renewals_not_written = totals.renewals_failed,
                nodes_affected = totals.nodes,
                oldest_lease_age_s = totals.oldest_lease.map(|a| a.as_secs()),
                "the apiserver takes writes again"
            ),
            _ => {}
        }
    }

    /// `node`'s Lease renewal was not written (`error`), its Lease last renewed `lease_age`
    /// ago when known: during an outage a summary at most every
    /// [`outage::SUMMARY_EVERY`] and a DEBUG line; otherwise a WARN of its own.
    pub fn renewal_failed(&self, node: &str, lease_age: Option<SignedDuration>, error: &str) {
        let line = self
            .outage
            .lock()
            .renewal_failed(node, lease_age, Instant::now());
        match line {
            None => tracing::warn!(node, %error, "lease renewal failed"),
            Some(summary) => {
                tracing::debug!(node, %error, "lease renewal failed");
                if let Some(OutageLine::Summary(totals)) = summary {
                    tracing::warn!(
                        apiserver = self.url.as_deref().unwrap_or("(in-cluster)"),
                        lasted_s = totals.lasted.as_secs(),
                        renewals_not_written = totals.renewals_failed,
                        nodes_affected = totals.nodes,
                        oldest_lease_age_s = totals.oldest_lease.map(|a| a.as_secs()),
                        "the apiserver still does not take writes"
                    );
                }
            }
        }
    }

    /// Whether an outage is being told: a node's failed write is then a DEBUG line.
    pub fn in_outage(&self) -> bool {
        self.outage.lock().ongoing()
    }

    /// Whether a backoff gate is closed (the apiserver answered 429, 5xx or nothing, and
    /// no call of that priority has succeeded since).
    pub fn backing_off(&self) -> bool {
        self.gates.iter().any(|g| g.lock().failing)
    }

    fn gate(&self, priority: Priority) -> &Mutex<Gate> {
        &self.gates[usize::from(priority == Priority::Other)]
    }

    fn admit(&self, priority: Priority) -> Result<Ticket<'_>, BackingOff> {
        let gate = self.gate(priority);
        let mut state = gate.lock();
        if !state.failing {
            return Ok(Ticket::Open);
        }
        let now = Instant::now();
        if now >= state.retry_at && !state.probing {
            state.probing = true;
            return Ok(Ticket::Probe(gate));
        }
        Err(BackingOff(state.retry_at.saturating_duration_since(now)))
    }

    /// Sends `request` for `node` with `priority` (waiting for a slot) and decodes the
    /// answer.
    ///
    /// Errors: kube's ([`kube::Error::Api`] with the apiserver's Status for 4xx/5xx), or
    /// [`BackingOff`] as [`kube::Error::Service`] when the gate is closed.
    async fn call<T: DeserializeOwned>(
        &self,
        node: &str,
        priority: Priority,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<T, kube::Error> {
        let request = request.map_err(kube::Error::BuildRequest)?;
        let closed = |_| kube::Error::Service("the gateway is shutting down".into());
        let _other = match priority {
            Priority::Other => Some(self.others.acquire().await.map_err(closed)?),
            Priority::Lease => None,
        };
        let _slot = self.all.acquire().await.map_err(closed)?;
        let ticket = self
            .admit(priority)
            .map_err(|backing_off| kube::Error::Service(Box::new(backing_off)))?;
        let mut outcome = Recording {
            api: self,
            priority,
            probe: matches!(ticket, Ticket::Probe(_)),
            recorded: false,
        };
        let result = self.send(node, request).await;
        outcome.record(&result);
        result
    }

    async fn send<T: DeserializeOwned>(
        &self,
        node: &str,
        mut request: http::Request<Vec<u8>>,
    ) -> Result<T, kube::Error> {
        if self.impersonate {
            let user = HeaderValue::from_str(&tls::node_user(node)).map_err(|_| {
                kube::Error::BuildRequest(kube::core::request::Error::Validation(format!(
                    "node name {node:?} cannot be a header value"
                )))
            })?;
            let headers = request.headers_mut();
            headers.insert(IMPERSONATE_USER, user);
            headers.insert(
                IMPERSONATE_GROUP,
                HeaderValue::from_static(tls::NODES_GROUP),
            );
        }
        tokio::time::timeout(REQUEST_TIMEOUT, self.client.request(request))
            .await
            .unwrap_or_else(|_| {
                Err(kube::Error::Service(
                    format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()).into(),
                ))
            })
    }

    fn nodes() -> Request {
        static PATH: LazyLock<String> = LazyLock::new(|| Node::url_path(&(), None));
        Request::new(PATH.as_str())
    }

    /// Formatted once: every renewal calls it.
    fn leases() -> Request {
        static PATH: LazyLock<String> =
            LazyLock::new(|| Lease::url_path(&(), Some(LEASE_NAMESPACE)));
        Request::new(PATH.as_str())
    }

    /// `GET /api/v1/nodes/{name}`, as node `name`.
    ///
    /// Errors: kube's, including 404 as [`kube::Error::Api`].
    pub async fn get_node(&self, name: &str) -> Result<Node, kube::Error> {
        self.call(
            name,
            Priority::Other,
            Self::nodes().get(name, &GetParams::default()),
        )
        .await
    }

    /// [`Apiserver::get_node`] with 404 as `Ok(None)` (kube's `Api::get_opt`).
    ///
    /// Errors: kube's, but not 404.
    pub async fn get_node_opt(&self, name: &str) -> Result<Option<Node>, kube::Error> {
        not_found_as_none(self.get_node(name).await)
    }

    /// `POST /api/v1/nodes`, as the node `node` names.
    ///
    /// Errors: kube's (409 when it exists).
    pub async fn create_node(&self, node: &Node) -> Result<Node, kube::Error> {
        let body = serde_json::to_vec(node).map_err(kube::Error::SerdeError)?;
        self.call(
            &node.name_any(),
            Priority::Other,
            Self::nodes().create(&PostParams::default(), body),
        )
        .await
    }

    /// `PATCH /api/v1/nodes/{name}/status` with a strategic-merge patch, as node `name`.
    ///
    /// Errors: kube's.
    pub async fn patch_node_status(
        &self,
        name: &str,
        body: serde_json::Value,
    ) -> Result<Node, kube::Error> {
        self.call(
            name,
            Priority::Other,
            Self::nodes().patch_subresource(
                "status",
                name,
                &PatchParams::default(),
                &Patch::Strategic(body),
            ),
        )
        .await
    }

    /// `GET` of Lease `kube-node-lease/{name}` with 404 as `Ok(None)`, as node `name`.
    ///
    /// Errors: kube's, but not 404.
    pub async fn get_lease_opt(&self, name: &NodeName) -> Result<Option<Lease>, kube::Error> {
        not_found_as_none(
            self.call(
                name,
                Priority::Lease,
                Self::leases().get(name, &GetParams::default()),
            )
            .await,
        )
    }

    /// `PUT` of Lease `kube-node-lease/{name}` (optimistic concurrency on its
    /// resourceVersion), as node `name`, with `body` the Lease's JSON (a plain Lease's from
    /// [`crate::bodies::plain_lease_json`], any other serialized by k8s-openapi). The answer
    /// is parsed in part: what the view keeps of it ([`PartialLease`]).
    ///
    /// Errors: kube's (409 on a stale resourceVersion).
    pub async fn replace_lease(
        &self,
        name: &NodeName,
        body: Vec<u8>,
    ) -> Result<PartialLease, kube::Error> {
        self.call(
            name,
            Priority::Lease,
            Self::leases().replace(name, &PostParams::default(), body),
        )
        .await
    }

    /// `POST` of a Lease in `kube-node-lease`, as the node it is named after; the answer
    /// parsed in part, as [`Apiserver::replace_lease`]'s.
    ///
    /// Errors: kube's (409 when it exists).
    pub async fn create_lease(&self, lease: &Lease) -> Result<PartialLease, kube::Error> {
        let body = serde_json::to_vec(lease).map_err(kube::Error::SerdeError)?;
        self.call(
            &lease.name_any(),
            Priority::Lease,
            Self::leases().create(&PostParams::default(), body),
        )
        .await
    }

    /// `POST` of an Event in the `default` namespace, as node `node` (kubelet records
    /// node events there).
    ///
    /// Errors: kube's.
    pub async fn create_event(&self, node: &str, event: &Event) -> Result<Event, kube::Error> {
        let body = serde_json::to_vec(event).map_err(kube::Error::SerdeError)?;
        self.call(
            node,
            Priority::Other,
            Request::new(Event::url_path(&(), Some(EVENT_NAMESPACE)))
                .create(&PostParams::default(), body),
        )
        .await
    }
}

fn not_found_as_none<T>(result: Result<T, kube::Error>) -> Result<Option<T>, kube::Error> {
    match result {
        Ok(object) => Ok(Some(object)),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
        Err(error) => Err(error),
    }
}

/// Builds the kube-rs client the gateway watches with ([`Gateway::watch`](crate::message_path::Gateway::watch)): `config`
/// without a read timeout, since a watch is quiet for as long as nothing changes
/// (kube-runtime's watcher applies its own idle timeout, the watch's 290 s plus a margin),
/// and no client-side rate limit. Every request is timed into `requests`
/// ([`requests::RequestMetrics`]).
///
/// Over HTTP/2 ([`client::HttpVersion::Http2`]: by ALPN over TLS, with prior knowledge over
/// `http://`); [`watch_client_with`] chooses.
///
/// Errors: kube's error when the config cannot produce a client (bad TLS material).
pub fn watch_client(
    config: kube::Config,
    requests: &requests::RequestMetrics,
) -> Result<kube::Client, kube::Error> {
    watch_client_with(config, requests, client::HttpVersion::Http2)
}

/// [`watch_client`] speaking `version` to the apiserver ([`client`]).
///
/// Errors: as [`client::http_client`].
pub fn watch_client_with(
    config: kube::Config,
    requests: &requests::RequestMetrics,
    version: client::HttpVersion,
) -> Result<kube::Client, kube::Error> {
    // No read timeout either way: the stack below has none (a watch is quiet while nothing
    // changes); HTTP/2 PINGs find a dead connection.
    let namespace = config.default_namespace.clone();
    let service = client::http_client(config, version, false)?;
    Ok(kube::client::ClientBuilder::new(service, namespace)
        .with_layer(&requests.layer())
        .build())
}

/// Builds the kube-rs client the gateway writes with, over HTTP/2
/// ([`client::HttpVersion::Http2`], with prior knowledge over `http://`) with Lease calls on
/// a connection of their own ([`client`]): no connection read or write timeout (each call
/// is bounded to 10 s as a whole instead, kubelet's heartbeat client timeout, see the
/// module docs), no retries inside the client, and, when
/// `qps` is not 0, a client-side rate limit of `qps` requests per second (tower
/// `RateLimitLayer`). The default is 0: kubelet's heartbeat client has no client-side limit
/// (`cmd/kubelet/app/server.go`), and a fixed rate shared by a whole fleet expires nodes
/// once the fleet outgrows it; the gateway bounds concurrency and backs off on 429/5xx
/// instead (the module docs). Every request is timed into `requests`
/// ([`requests::RequestMetrics`]; under the rate limit, so its wait is not counted).
///
/// Errors: kube's error when the config cannot produce a client (bad TLS material).
pub fn kube_client(
    config: kube::Config,
    qps: u64,
    requests: &requests::RequestMetrics,
) -> Result<kube::Client, kube::Error> {
    kube_client_with(config, qps, requests, client::HttpVersion::Http2)
}

/// [`kube_client`] speaking `version` to the apiserver ([`client`]): one HTTP/2 connection
/// carries every call of the replica.
///
/// The stack has no connection read or write timeout: a read timeout (hyper-timeout) also
/// fires on a pooled connection that sat idle that long, and a request handed to it at that
/// moment fails to send (kube-rs removed its own default for this reason,
/// <https://github.com/kube-rs/kube/pull/1945>); each call is bounded as a whole instead
/// ([`Apiserver`]), and HTTP/2 PINGs close a dead connection. No retries inside the client
/// either: a heartbeat retried late would be written late and hide a dead node; the agent
/// retries with a fresh message instead (kubelet's own loops).
///
/// Errors: as [`client::http_client`].
pub fn kube_client_with(
    config: kube::Config,
    qps: u64,
    requests: &requests::RequestMetrics,
    version: client::HttpVersion,
) -> Result<kube::Client, kube::Error> {
    let namespace = config.default_namespace.clone();
    let service = client::http_client(config, version, true)?;
    let builder =
        kube::client::ClientBuilder::new(service, namespace).with_layer(&requests.layer());
    Ok(if qps == 0 {
        builder.build()
    } else {
        let limit = tower::limit::RateLimitLayer::new(qps, Duration::from_secs(1));
        builder.with_layer(&limit).build()
    })
}

pub mod answers;
pub mod client;
mod gate;
pub mod outage;
pub mod reach;
pub mod requests;

#[cfg(test)]
mod tests;
