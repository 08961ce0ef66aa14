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

use http::{HeaderName, HeaderValue};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{GetParams, Patch, PatchParams, PostParams};
use kube::core::Request;
use kube::{Resource, ResourceExt as _};
use serde::de::DeserializeOwned;

use crate::patch::{EVENT_NAMESPACE, LEASE_NAMESPACE};

/// `Impersonate-User` (kube-apiserver impersonation headers).
const IMPERSONATE_USER: HeaderName = HeaderName::from_static("impersonate-user");
/// `Impersonate-Group`.
const IMPERSONATE_GROUP: HeaderName = HeaderName::from_static("impersonate-group");

/// The apiserver as the gateway writes to it: a kube-rs client and whether to impersonate
/// each node.
#[derive(Clone)]
pub struct Apiserver {
    client: kube::Client,
    impersonate: bool,
}

impl Apiserver {
    /// Calls through `client`; with `impersonate`, as each node (see the module docs).
    pub fn new(client: kube::Client, impersonate: bool) -> Self {
        Self {
            client,
            impersonate,
        }
    }

    /// Whether requests impersonate the node they are for.
    pub fn impersonates(&self) -> bool {
        self.impersonate
    }

    /// Sends `request` for `node` and decodes the answer.
    ///
    /// Errors: kube's ([`kube::Error::Api`] with the apiserver's Status for 4xx/5xx).
    async fn call<T: DeserializeOwned>(
        &self,
        node: &str,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Result<T, kube::Error> {
        let mut request = request.map_err(kube::Error::BuildRequest)?;
        if self.impersonate {
            let user = HeaderValue::from_str(&format!("system:node:{node}")).map_err(|_| {
                kube::Error::BuildRequest(kube::core::request::Error::Validation(format!(
                    "node name {node:?} cannot be a header value"
                )))
            })?;
            let headers = request.headers_mut();
            headers.insert(IMPERSONATE_USER, user);
            headers.insert(IMPERSONATE_GROUP, HeaderValue::from_static("system:nodes"));
        }
        self.client.request(request).await
    }

    fn nodes() -> Request {
        Request::new(Node::url_path(&(), None))
    }

    fn leases() -> Request {
        Request::new(Lease::url_path(&(), Some(LEASE_NAMESPACE)))
    }

    /// `GET /api/v1/nodes/{name}`, as node `name`.
    ///
    /// Errors: kube's, including 404 as [`kube::Error::Api`].
    pub async fn get_node(&self, name: &str) -> Result<Node, kube::Error> {
        self.call(name, Self::nodes().get(name, &GetParams::default()))
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
    pub async fn get_lease_opt(&self, name: &str) -> Result<Option<Lease>, kube::Error> {
        not_found_as_none(
            self.call(name, Self::leases().get(name, &GetParams::default()))
                .await,
        )
    }

    /// `PUT` of Lease `kube-node-lease/{name}` (optimistic concurrency on its
    /// resourceVersion), as node `name`.
    ///
    /// Errors: kube's (409 on a stale resourceVersion).
    pub async fn replace_lease(&self, name: &str, lease: &Lease) -> Result<Lease, kube::Error> {
        let body = serde_json::to_vec(lease).map_err(kube::Error::SerdeError)?;
        self.call(
            name,
            Self::leases().replace(name, &PostParams::default(), body),
        )
        .await
    }

    /// `POST` of a Lease in `kube-node-lease`, as the node it is named after.
    ///
    /// Errors: kube's (409 when it exists).
    pub async fn create_lease(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        let body = serde_json::to_vec(lease).map_err(kube::Error::SerdeError)?;
        self.call(
            &lease.name_any(),
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
