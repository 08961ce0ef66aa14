//! A stand-in kube-apiserver: a **test double, not a kube-apiserver**.
//!
//! It serves, over plain HTTP on 127.0.0.1 with no authentication (HTTP/1.1, and HTTP/2 with
//! prior knowledge on the same port, at most 100 streams per connection as kube-apiserver's
//! `--http2-max-streams-per-connection` default), the subset of the
//! Kubernetes API that edgebeat's gateway (and kubelet) touch, faithfully enough that
//! kube-rs sees the same answers and `kubectl --server` prints like a cluster:
//!
//! - discovery: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/coordination.k8s.io[/v1]`,
//!   `/apis/certificates.k8s.io[/v1]` (legacy documents; kubectl falls back to them from
//!   aggregated discovery);
//! - `nodes` (cluster-scoped): create, get, list, watch, update, patch, delete, and the
//!   `nodes/status` subresource (get, update, patch) with `nodeStatusStrategy` semantics:
//!   spec changes sent to `/status` are dropped, metadata changes are kept, and status
//!   changes sent to the main resource are dropped (`pkg/registry/core/node/strategy.go`);
//! - `leases.coordination.k8s.io`: create, get, list (per namespace and across all),
//!   watch, update (resourceVersion required, stale → 409, create on update), patch, delete
//!   (`pkg/registry/coordination/lease/strategy.go`); MicroTime fields must have exactly
//!   six fractional digits and a `Z` suffix;
//! - core v1 `events`: create, get, list (per namespace and across all), watch, update,
//!   patch, delete;
//! - `namespaces`: get, list, watch of the four system namespaces (`default`,
//!   `kube-node-lease`, `kube-public`, `kube-system`); writes to a namespace that does not
//!   exist get the NamespaceLifecycle 404;
//! - core v1 `secrets`: create, get, list, watch, update, patch, delete
//!   (`pkg/registry/core/secret/strategy.go`): an empty `type` is `Opaque`, `stringData`
//!   is merged into `data` and never stored, `type` is immutable, and so are `data` and
//!   `immutable` once `immutable` is true; data keys, the 1 MiB total and the keys of the
//!   well-known types are validated (`ValidateSecret`);
//! - `certificatesigningrequests.certificates.k8s.io` (cluster-scoped): create, get, list,
//!   watch, update, patch, delete, and the `/status` and `/approval` subresources (get,
//!   update, patch), with the strategies of `pkg/registry/certificates/certificates/
//!   strategy.go`: on create `spec.username`, `uid`, `groups` and `extra` are the
//!   requester's (the impersonated user, or `system:anonymous` in `system:unauthenticated`
//!   without impersonation, as `user.rs` explains) and the status is emptied; an update
//!   of the object keeps its spec and status (only metadata changes);
//!   `/status` keeps the spec and the Approved and Denied conditions; `/approval` changes
//!   nothing but the conditions; condition timestamps are filled in. Validation is
//!   `pkg/apis/certificates/validation/validation.go`: the request must be a `CERTIFICATE
//!   REQUEST` PEM block holding a PKCS#10 request whose signature verifies, signer name and
//!   usages are checked, Approved and Denied exclude each other, a condition type appears
//!   once, Approved/Denied/Failed are never removed, only `/approval` adds or changes
//!   Approved/Denied, only `/status` sets `status.certificate` (PEM `CERTIFICATE` blocks
//!   of X.509 certificates) and never changes it once set. As in the real server, a
//!   certificate can be written through `/status` before the request is approved: the
//!   signer is trusted to wait (only the `CertificateSigning` admission plugin's RBAC
//!   `sign` check stands in the way, and there is no RBAC here);
//! - `subjectaccessreviews.authorization.k8s.io`: create (`POST`) only, answered 201 with
//!   the review echoed back and `status.allowed: true` after the real server's validation
//!   of its spec. The stand-in is **not an authorizer**: it allows every review, so the
//!   gateway's resource metrics server (kubelet's webhook authorization) serves whoever
//!   authenticates. The group is not listed in discovery.
//!
//! Patches: strategic merge patch (the Node/Lease/Event subset of the algorithm, see
//! [`smp`]), JSON merge patch and JSON patch. Server-side apply is answered 415.
//! `resourceVersion` is one global counter bumped on every write, like etcd's revision; an
//! update that changes nothing is not written (no new resourceVersion, no watch event).
//! Errors are `metav1.Status` bodies with the real reasons, codes and message shapes.
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` gets server-side printed Tables
//! (`pkg/printers/internalversion/printers.go` columns). Unknown fields are dropped with a
//! `Warning` header, or rejected with `fieldValidation=Strict`; `dryRun=All` is honoured.
//!
//! Test hooks: every request is recorded ([`RecordedRequest`]); faults can be switched on
//! at runtime (latency, answering N matching requests with a status code, dropping the
//! connection); another writer can be simulated ([`StandInHandle::bump_lease`],
//! [`StandInHandle::update_node`], [`StandInHandle::update_certificate_signing_request`]);
//! [`StandInHandle::wait_until`] waits for a state without polling.
//!
//! Impersonation: `Impersonate-User` and every `Impersonate-Group` are recorded on each
//! [`RecordedRequest`], and the impersonated user is who a CertificateSigningRequest
//! records as its requester (`user.rs`). Nothing else depends on who asks: a node identity
//! (`system:node:<name>` in `system:nodes`) is served like any other user. The real Node
//! authorizer and NodeRestriction admission for the gateway's impersonated writes are
//! proved against the real control plane instead
//! (`tests/tests/control_plane.rs::impersonated_writes_pass_the_real_node_authorizer_and_node_restriction`).
//!
//! What it does **not** do otherwise: authentication, authorization (no RBAC, no Node
//! authorizer; the impersonating client's own `impersonate` permission is not checked),
//! admission other than the namespace existence check (no NodeRestriction, no
//! TaintNodesByCondition taint on create; none of the certificates admission plugins:
//! `CertificateApproval` and `CertificateSigning` only check RBAC `approve`/`sign`, and
//! `CertificateSubjectRestriction`'s refusal of `system:masters` for the
//! `kubernetes.io/kube-apiserver-client` signer is not modelled), field managers /
//! managedFields / server-side apply, YAML or protobuf bodies (415; answers are always
//! JSON, which protobuf-preferring clients accept, and a read whose `Accept` allows no
//! JSON is 406), pagination (`limit` is ignored and the whole list returned), bookmarks other than
//! the `sendInitialEvents` one, garbage collection (deleting a Node leaves its Lease), the
//! node lifecycle controller (nothing turns a node NotReady), and most of the validation
//! of the real types (metadata, taints, duplicate addresses, lease durations, event
//! namespaces and MicroTime parsing are checked; Secrets and CertificateSigningRequests are
//! validated as described above), nor the canonical form of quantities (kept as sent: the
//! real apiserver writes `16000000000` back as `16G`; the gateway never reads them back).
//! So `kubectl certificate approve|deny`, whose typed client writes protobuf, works only
//! against a real apiserver: it is proved there
//! (`tests/tests/control_plane.rs::boards_enroll_through_the_real_csr_api_auto_and_by_kubectl_certificate_approve`).
//!
//! Held to the real apiserver: `tests/tests/standin_differential.rs` makes the gateway's
//! and kubelet's calls (Node registration, strategic-merge status patches with the
//! delete directive and annotations, Lease create, renewals as bytes, the stale 409, a
//! watch event, bad MicroTime, durations and names, Events, a CSR's create, `/approval`
//! and `/status`, an immutable Secret) to both and wants the same codes, reasons and
//! fields the gateway reads.

mod discovery;
mod kinds;
mod pem;
mod query;
mod server;
pub mod smp;
mod status;
mod store;
mod table;
mod user;
mod validation;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Secret};
use tokio::net::TcpListener;

use kinds::Kind;
pub use server::MAX_STREAMS;
use server::Shared;
use store::Store;

/// The stand-in apiserver (a test double, not a kube-apiserver). See the module docs for
/// what it serves and what it does not do.
#[derive(Clone, Copy, Debug, Default)]
pub struct StandIn;

impl StandIn {
    /// Binds `127.0.0.1:0` and serves until [`StandInHandle::shutdown`].
    ///
    /// Errors: the bind fails.
    pub async fn start() -> anyhow::Result<StandInHandle> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        Self::serve(listener, std::future::pending()).await
    }

    /// Serves on `listener` until `shutdown` completes or [`StandInHandle::shutdown`] is
    /// called. Returns once the server task is running. On shutdown it stops accepting,
    /// ends open watches and lets in-flight requests finish.
    ///
    /// Errors: the listener has no local address.
    pub async fn serve(
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<StandInHandle> {
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(addr));
        let trigger = shared.clone();
        tokio::spawn(async move {
            shutdown.await;
            trigger.shutdown.send_replace(true);
        });
        tokio::spawn(server::accept_loop(listener, shared.clone()));
        Ok(StandInHandle { shared })
    }
}

/// One request the stand-in received, with what it answered.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// HTTP method.
    pub method: Method,
    /// Path without the query, e.g. `/api/v1/nodes/edge-01/status`.
    pub path: String,
    /// Raw query string, if any (still percent-encoded).
    pub query: Option<String>,
    /// The `Content-Type` header as sent, e.g. `application/strategic-merge-patch+json`.
    pub content_type: Option<String>,
    /// The request body.
    pub body: Bytes,
    /// `Impersonate-User` header.
    pub impersonate_user: Option<String>,
    /// Every `Impersonate-Group` header, in order.
    pub impersonate_groups: Vec<String>,
    /// The HTTP status answered; 0 when the connection was dropped by a fault.
    pub status: u16,
    /// `Warning` headers answered (e.g. `299 - "unknown field \"spec.foo\""`).
    pub warnings: Vec<String>,
    /// The HTTP version it came over (HTTP/1.1, or HTTP/2 with prior knowledge).
    pub version: http::Version,
}

impl RecordedRequest {
    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// What a fault does to a matching request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Answer with this status code and a `Status` body with the matching reason (500
    /// InternalError, 503 ServiceUnavailable, 429 TooManyRequests with `Retry-After: 1`,
    /// 409 Conflict shaped like the optimistic-lock error, 404 NotFound, …), without
    /// touching any state.
    Status(u16),
    /// Read the request, then close the connection without answering.
    Drop,
}

/// A switchable fault: the next `times` requests whose method matches (any, if `None`)
/// and whose path contains `path_contains` get `action` instead of being served. Rules are
/// checked in injection order; a used-up rule disappears.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    /// Method to match, or any.
    pub method: Option<Method>,
    /// Substring of the request path (not the query); "" matches every path.
    pub path_contains: String,
    /// What to do.
    pub action: FaultAction,
    /// How many requests to affect (0 = none).
    pub times: u32,
}

impl FaultRule {
    /// Answer `times` matching requests with `code`.
    pub fn status(method: Option<Method>, path_contains: &str, code: u16, times: u32) -> Self {
        FaultRule {
            method,
            path_contains: path_contains.to_string(),
            action: FaultAction::Status(code),
            times,
        }
    }

    /// Drop the connection of `times` matching requests.
    pub fn drop_connection(method: Option<Method>, path_contains: &str, times: u32) -> Self {
        FaultRule {
            method,
            path_contains: path_contains.to_string(),
            action: FaultAction::Drop,
            times,
        }
    }
}

/// Read access to the stand-in's state inside [`StandInHandle::wait_until`]. It borrows
/// the locked state: do not call the handle from the predicate.
pub struct StandInView<'a> {
    store: &'a Store,
}

impl StandInView<'_> {
    /// The Node `name`.
    pub fn node(&self, name: &str) -> Option<Node> {
        self.store.typed(Kind::Node, None, name)
    }

    /// All Nodes, in creation order.
    pub fn nodes(&self) -> Vec<Node> {
        self.store.typed_all(Kind::Node)
    }

    /// The Lease `namespace/name`.
    pub fn lease(&self, namespace: &str, name: &str) -> Option<Lease> {
        self.store.typed(Kind::Lease, Some(namespace), name)
    }

    /// All Leases, in creation order.
    pub fn leases(&self) -> Vec<Lease> {
        self.store.typed_all(Kind::Lease)
    }

    /// All core v1 Events, in creation order.
    pub fn events(&self) -> Vec<Event> {
        self.store.typed_all(Kind::Event)
    }

    /// The Secret `namespace/name`.
    pub fn secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        self.store.typed(Kind::Secret, Some(namespace), name)
    }

    /// The CertificateSigningRequest `name`.
    pub fn certificate_signing_request(&self, name: &str) -> Option<CertificateSigningRequest> {
        self.store
            .typed(Kind::CertificateSigningRequest, None, name)
    }

    /// All CertificateSigningRequests, in creation order.
    pub fn certificate_signing_requests(&self) -> Vec<CertificateSigningRequest> {
        self.store.typed_all(Kind::CertificateSigningRequest)
    }

    /// Every recorded request so far.
    pub fn requests(&self) -> &[RecordedRequest] {
        &self.store.requests
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store.rv
    }
}

/// A running stand-in. Cheap to clone; every clone controls the same server. Dropping
/// handles does not stop the server: call [`StandInHandle::shutdown`] (or let the test's
/// runtime end).
#[derive(Clone)]
pub struct StandInHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for StandInHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandInHandle")
            .field("url", &self.url())
            .finish()
    }
}

impl StandInHandle {
    /// TCP connections accepted so far: what a client's connection pool costs the
    /// apiserver.
    pub fn connections(&self) -> usize {
        self.shared
            .connections
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// TCP connections open now (clients' pooled connections included).
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// A kube-rs client for [`StandInHandle::url`]: plain HTTP, no credentials (what
    /// `kubectl` as an administrator would be).
    ///
    /// Errors: kube-rs cannot build the client.
    pub fn kube_client(&self) -> anyhow::Result<kube::Client> {
        let url = self.url().parse().map_err(anyhow::Error::from)?;
        Ok(kube::Client::try_from(kube::Config::new(url))?)
    }

    /// Every request received so far, in arrival order of their answers.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.shared.mutate(|s| s.requests.clear());
    }

    /// The Node `name` as stored.
    pub fn node(&self, name: &str) -> Option<Node> {
        self.shared.lock().typed(Kind::Node, None, name)
    }

    /// All Nodes, in creation order.
    pub fn nodes(&self) -> Vec<Node> {
        self.shared.lock().typed_all(Kind::Node)
    }

    /// The Lease `namespace/name` as stored.
    pub fn lease(&self, namespace: &str, name: &str) -> Option<Lease> {
        self.shared.lock().typed(Kind::Lease, Some(namespace), name)
    }

    /// All Leases, in creation order.
    pub fn leases(&self) -> Vec<Lease> {
        self.shared.lock().typed_all(Kind::Lease)
    }

    /// All core v1 Events, in creation order.
    pub fn events(&self) -> Vec<Event> {
        self.shared.lock().typed_all(Kind::Event)
    }

    /// The Secret `namespace/name` as stored.
    pub fn secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        self.shared
            .lock()
            .typed(Kind::Secret, Some(namespace), name)
    }

    /// All Secrets, in creation order.
    pub fn secrets(&self) -> Vec<Secret> {
        self.shared.lock().typed_all(Kind::Secret)
    }

    /// The CertificateSigningRequest `name` as stored.
    pub fn certificate_signing_request(&self, name: &str) -> Option<CertificateSigningRequest> {
        self.shared
            .lock()
            .typed(Kind::CertificateSigningRequest, None, name)
    }

    /// All CertificateSigningRequests, in creation order.
    pub fn certificate_signing_requests(&self) -> Vec<CertificateSigningRequest> {
        self.shared
            .lock()
            .typed_all(Kind::CertificateSigningRequest)
    }

    /// Another writer changes the CertificateSigningRequest, e.g. an approver or a signer
    /// outside the test (no validation, no strategy; identity fields are kept). False if it
    /// does not exist.
    pub fn update_certificate_signing_request(
        &self,
        name: &str,
        f: impl FnOnce(&mut CertificateSigningRequest),
    ) -> bool {
        self.shared
            .mutate(|s| s.mutate_typed(Kind::CertificateSigningRequest, None, name, f))
    }

    /// The `reason` of every Event that has one, in creation order (e.g. `NodeReady`).
    pub fn event_reasons(&self) -> Vec<String> {
        self.events().into_iter().filter_map(|e| e.reason).collect()
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// Simulates another writer of the Lease: stores it again under a new
    /// resourceVersion (and sends a MODIFIED watch event), so the next PUT carrying the
    /// old resourceVersion gets a natural 409 Conflict. False if the Lease does not exist.
    pub fn bump_lease(&self, namespace: &str, name: &str) -> bool {
        self.update_lease(namespace, name, |_| {})
    }

    /// Another writer changes the Lease (no validation; name, namespace, uid and
    /// creationTimestamp are kept). False if it does not exist.
    pub fn update_lease(&self, namespace: &str, name: &str, f: impl FnOnce(&mut Lease)) -> bool {
        self.shared
            .mutate(|s| s.mutate_typed(Kind::Lease, Some(namespace), name, f))
    }

    /// Another writer changes the Node, e.g. the node lifecycle controller setting the
    /// Ready condition to Unknown (no validation; identity fields are kept). False if it
    /// does not exist.
    pub fn update_node(&self, name: &str, f: impl FnOnce(&mut Node)) -> bool {
        self.shared
            .mutate(|s| s.mutate_typed(Kind::Node, None, name, f))
    }

    /// Adds a fault rule (see [`FaultRule`]).
    pub fn inject(&self, rule: FaultRule) {
        if rule.times > 0 {
            self.shared.mutate(|s| s.faults.push(rule));
        }
    }

    /// Creates namespace `name` (Active), as applying a manifest's Namespace would; the
    /// stand-in serves no namespace writes of its own. An existing one is left as it is.
    pub fn create_namespace(&self, name: &str) {
        self.shared.mutate(|s| s.add_namespace(name));
    }

    /// Delays every request by `d` before it is served (or faulted). Zero turns it off.
    pub fn set_latency(&self, d: Duration) {
        self.shared.mutate(|s| s.latency = d);
    }

    /// Keeps every request for [`StandInHandle::requests`] (the default), or only counts
    /// them ([`StandInHandle::request_counts`]): fleet benchmarks turn recording off so the
    /// stand-in's memory does not grow with every heartbeat.
    pub fn set_recording(&self, on: bool) {
        self.shared.mutate(|s| s.record_requests = on);
    }

    /// Requests answered so far, by `"METHOD resource status"`, e.g. `"PUT leases 200"`
    /// (resource: `leases`, `nodes/status`, `nodes`, `events`, `secrets`,
    /// `certificatesigningrequests[/status|/approval]`, `subjectaccessreviews` or `other`).
    pub fn request_counts(&self) -> std::collections::BTreeMap<String, u64> {
        self.shared.lock().request_counts.clone()
    }

    /// Overload mode: with more than `max` requests in flight, a request is answered
    /// 429 TooManyRequests with `Retry-After: 1`, as API Priority and Fairness answers
    /// what it cannot queue; `None` turns it off.
    pub fn set_max_inflight(&self, max: Option<usize>) {
        self.shared.mutate(|s| s.max_inflight = max);
    }

    /// `(name, renewTime)` of every Lease in `kube-node-lease`: what the node lifecycle
    /// controller reads, without copying whole objects.
    pub fn lease_renew_times(&self) -> Vec<(String, jiff::Timestamp)> {
        self.shared.lock().renew_times("kube-node-lease")
    }

    /// Writes of each Lease in `kube-node-lease` so far (its creation included), by name.
    /// Every Lease write of the gateway is one renewal's, so a node with more writes than
    /// renewals its transport took had one renewal written twice.
    pub fn lease_write_counts(&self) -> std::collections::BTreeMap<String, u64> {
        self.shared
            .lock()
            .lease_writes
            .iter()
            .filter_map(|(key, n)| Some((key.strip_prefix("kube-node-lease/")?.to_owned(), *n)))
            .collect()
    }

    /// A receiver that sees every change of the store (its value is a change counter), for
    /// callers that record what happened as it happens instead of polling.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    /// Removes every fault rule and the latency.
    pub fn clear_faults(&self) {
        self.shared.mutate(|s| {
            s.faults.clear();
            s.latency = Duration::ZERO;
        });
    }

    /// Fault rules still armed, with their remaining counts.
    pub fn faults(&self) -> Vec<FaultRule> {
        self.shared.lock().faults.clone()
    }

    /// Waits until `pred` holds, re-checking on every state change (object writes,
    /// recorded requests, fault changes), never by polling. Errors after `timeout` with
    /// `what` and a summary of the state.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&StandInView<'_>) -> bool,
    ) -> anyhow::Result<()> {
        // Plain closures (no async closure) keep the wait's future `Send`, so it can be
        // spawned. The predicate sees the store through the view: it must not lock the
        // stand-in.
        let waited = crate::wait::until(
            what,
            timeout,
            || {
                std::future::ready(pred(&StandInView {
                    store: &self.shared.lock(),
                }))
            },
            || {
                // Subscribed before the check: a change during it is seen. The sender lives
                // in `self.shared`, so it outlives this wait.
                let mut changes = self.shared.changed.subscribe();
                async move {
                    let _ = changes.changed().await;
                }
            },
        )
        .await;
        waited.map_err(|e| {
            let store = self.shared.lock();
            anyhow::anyhow!(
                "{}: not within {:?}; last seen: {}",
                e.what,
                e.deadline,
                summary(&store)
            )
        })
    }

    /// Stops the server: no new connections, open watches end, in-flight requests finish.
    pub fn shutdown(&self) {
        self.shared.shutdown.send_replace(true);
    }
}

fn summary(store: &Store) -> String {
    let names = |kind: Kind| {
        store
            .list_by_creation(kind)
            .iter()
            .map(|o| {
                let ns = kinds::meta::namespace(o);
                let name = kinds::meta::name(o);
                let rv = kinds::meta::resource_version(o);
                if ns.is_empty() {
                    format!("{name}@{rv}")
                } else {
                    format!("{ns}/{name}@{rv}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let last: Vec<String> = store
        .requests
        .iter()
        .rev()
        .take(8)
        .rev()
        .map(|r| format!("{} {} -> {}", r.method, r.path, r.status))
        .collect();
    format!(
        "resourceVersion {}; nodes [{}]; leases [{}]; certificatesigningrequests [{}]; {} events; {} requests, last: [{}]",
        store.rv,
        names(Kind::Node),
        names(Kind::Lease),
        names(Kind::CertificateSigningRequest),
        store.list_by_creation(Kind::Event).len(),
        store.requests.len(),
        last.join("; ")
    )
}
