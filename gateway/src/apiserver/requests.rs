//! `edgebeat_gateway_apiserver_request_duration_seconds{verb, resource, subresource, code}`:
//! every request the gateway's kube-rs clients send, timed from the call until the answer's
//! head arrives (for a WATCH, until the stream opens), by a tower layer under kube-rs'
//! client ([`RequestMetrics::layer`]; [`super::kube_client`] and [`super::watch_client`]
//! install it).
//!
//! Labels as kube-apiserver's own `apiserver_request_duration_seconds` names them
//! (`staging/src/k8s.io/apiserver/pkg/endpoints/metrics/metrics.go`, `CleanVerb`): `verb` is
//! `GET`, `LIST` (a GET of a collection), `WATCH` (`watch=true`), `POST`, `PUT`, `PATCH` or
//! `DELETE`; `resource` and `subresource` come from the path (`/api/v1/nodes/n/status` is
//! `nodes`, `status`); `code` is the HTTP status, or `error` when no answer came (connect
//! failure, timeout). Buckets are client-go's `rest_client_request_duration_seconds`
//! (`staging/src/k8s.io/component-base/metrics/prometheus/restclient/metrics.go`). The
//! label sets are bounded: the gateway calls six resources with three subresources.

use edgebeat_transports::observe::register_family;
use std::task::{Context, Poll};
use tokio::time::Instant;

use futures_util::future::BoxFuture;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// The resources the gateway calls, the only `resource` labels besides `other` and empty
/// (so a label is a `&'static str`: no allocation per request).
pub const RESOURCES: [&str; 6] = [
    "nodes",
    "leases",
    "events",
    "certificatesigningrequests",
    "secrets",
    "namespaces",
];

/// The subresources the gateway calls (`subresource` label, besides `other` and empty).
pub const SUBRESOURCES: [&str; 2] = ["status", "approval"];

/// `segment` as one of `known`, `""` when absent, else `"other"`.
fn label(segment: Option<&str>, known: &[&'static str]) -> &'static str {
    match segment {
        None | Some("") => "",
        Some(s) => known.iter().find(|k| **k == s).copied().unwrap_or("other"),
    }
}

/// client-go's `rest_client_request_duration_seconds` buckets, seconds.
pub const BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// The HTTP status of an answer, or none (`error`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Code(pub Option<u16>);

impl EncodeLabelValue for Code {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        match self.0 {
            Some(code) => write!(encoder, "{code}"),
            None => encoder.write_str("error"),
        }
    }
}

/// Labels of one request (see the module docs).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `GET`, `LIST`, `WATCH`, `POST`, `PUT`, `PATCH`, `DELETE` (or the method as sent).
    pub verb: &'static str,
    /// The resource, one of [`RESOURCES`], `other`, or empty for a path that names none.
    pub resource: &'static str,
    /// The subresource, one of [`SUBRESOURCES`], `other`, or empty.
    pub subresource: &'static str,
    /// The answer's status code, or `error`.
    pub code: Code,
}

/// Makes histograms with [`BUCKETS`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Buckets;

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(BUCKETS)
    }
}

/// The request histograms, shared by both clients and registered once.
#[derive(Clone, Debug)]
pub struct RequestMetrics {
    durations: Family<RequestLabels, Histogram, Buckets>,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        Self {
            durations: Family::new_with_constructor(Buckets),
        }
    }
}

impl RequestMetrics {
    /// Registers `edgebeat_gateway_apiserver_request_duration_seconds` in `registry`.
    #[rustfmt::skip]
    pub fn register(&self, registry: &mut Registry) {
        register_family(registry, "edgebeat_gateway_apiserver_request_duration", "The gateway's requests to kube-apiserver, from the call until the answer's head (a WATCH: until it opens), by verb, resource, subresource and HTTP status (error: no answer)", Some(Unit::Seconds), self.durations.clone());
    }

    /// Records one request of `labels` that took `seconds`.
    pub fn observe(&self, labels: &RequestLabels, seconds: f64) {
        self.durations.get_or_create(labels).observe(seconds);
    }

    /// The tower layer that times every request of the client it wraps.
    pub fn layer(&self) -> RequestLayer {
        RequestLayer(self.clone())
    }
}

/// `verb`, `resource` and `subresource` of a request to `path?query` with `method`, as
/// kube-apiserver labels them (see the module docs). Paths outside `/api/v1/…` and
/// `/apis/<group>/<version>/…` give an empty resource.
pub fn classify(method: &http::Method, path: &str, query: Option<&str>) -> RequestLabels {
    // After `/api/<version>` or `/apis/<group>/<version>`: at most
    // `namespaces/<ns>/<resource>/<name>/<subresource>`, kept without allocating.
    let mut segments = path.trim_start_matches('/').split('/');
    let prefix = match segments.next() {
        Some("api") => Some(1),
        Some("apis") => Some(2),
        _ => None,
    };
    let mut held = [""; 5];
    let mut n = 0;
    if let Some(prefix) = prefix {
        for (slot, segment) in held.iter_mut().zip(segments.skip(prefix)) {
            *slot = segment;
            n += 1;
        }
    }
    let rest = match held.get(..n).unwrap_or_default() {
        ["namespaces", _namespace, more @ ..] if !more.is_empty() => more,
        all => all,
    };
    let resource = label(rest.first().copied(), &RESOURCES);
    let named = rest.get(1).is_some_and(|name| !name.is_empty());
    let subresource = label(rest.get(2).copied(), &SUBRESOURCES);
    let watch = query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match *method {
        http::Method::GET if watch => "WATCH",
        http::Method::GET if !named => "LIST",
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::PATCH => "PATCH",
        http::Method::DELETE => "DELETE",
        _ => "OTHER",
    };
    RequestLabels {
        verb,
        resource,
        subresource,
        code: Code(None),
    }
}

/// Times the requests of the service it wraps into a [`RequestMetrics`].
#[derive(Clone, Debug)]
pub struct RequestLayer(RequestMetrics);

impl<S> tower::Layer<S> for RequestLayer {
    type Service = Measured<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Measured {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// A service whose requests are timed (see [`RequestLayer`]).
#[derive(Clone, Debug)]
pub struct Measured<S> {
    inner: S,
    metrics: RequestMetrics,
}

impl<S, B, R> tower::Service<http::Request<B>> for Measured<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let mut labels = classify(
            request.method(),
            request.uri().path(),
            request.uri().query(),
        );
        let started = Instant::now();
        let answer = self.inner.call(request);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let result = answer.await;
            labels.code = Code(result.as_ref().ok().map(|r| r.status().as_u16()));
            metrics.observe(&labels, started.elapsed().as_secs_f64());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn requests_are_labelled_as_kube_apiserver_labels_them() {
        const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
        const APPROVAL: &str =
            "/apis/certificates.k8s.io/v1/certificatesigningrequests/node-csr-1/approval";
        let watch = Some("labelSelector=edgebeat.io%2Fmanaged%3Dtrue&watch=true&resourceVersion=5");
        let lease = format!("{LEASE}/edge-01");
        #[rustfmt::skip]
        let cases = [
            (Method::PATCH, "/api/v1/nodes/edge-01/status", None, ("PATCH", "nodes", "status")),
            (Method::PUT, lease.as_str(), None, ("PUT", "leases", "")),
            (Method::GET, LEASE, watch, ("WATCH", "leases", "")),
            (Method::GET, "/api/v1/nodes", Some("labelSelector=x"), ("LIST", "nodes", "")),
            (Method::GET, "/api/v1/nodes/edge-01", None, ("GET", "nodes", "")),
            (Method::POST, "/api/v1/namespaces/default/events", None, ("POST", "events", "")),
            (Method::PUT, APPROVAL, None, ("PUT", "certificatesigningrequests", "approval")),
            (Method::GET, "/version", None, ("LIST", "", "")),
            (Method::DELETE, "/api/v1/namespaces/x/pods/p/eviction", None, ("DELETE", "other", "other")),
        ];
        for (method, path, query, (verb, resource, subresource)) in cases {
            let l = classify(&method, path, query);
            assert_eq!(
                (l.verb, l.resource, l.subresource),
                (verb, resource, subresource),
                "{method} {path}?{query:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_wrapped_service_counts_answers_and_failures() {
        use tower::{Layer as _, Service as _, ServiceExt as _};
        let metrics = RequestMetrics::default();
        let mut ok = metrics
            .layer()
            .layer(tower::service_fn(|_: http::Request<()>| async {
                Ok::<_, std::io::Error>(http::Response::builder().status(409).body(()).unwrap())
            }));
        let request = || {
            http::Request::put("/api/v1/nodes/n/status")
                .body(())
                .unwrap()
        };
        let answer = ok.ready().await.unwrap().call(request()).await.unwrap();
        assert_eq!(answer.status(), 409);
        let mut failing = metrics
            .layer()
            .layer(tower::service_fn(|_: http::Request<()>| async {
                Err::<http::Response<()>, _>(std::io::Error::other("refused"))
            }));
        let failed = failing.ready().await.unwrap().call(request()).await;
        assert_eq!(
            failed.map_err(|e| e.to_string()).err().as_deref(),
            Some("refused"),
            "the service's own error, passed through"
        );
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains(
                "edgebeat_gateway_apiserver_request_duration_seconds_count{verb=\"PUT\",resource=\"nodes\",subresource=\"status\",code=\"error\"} 1"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "edgebeat_gateway_apiserver_request_duration_seconds_count{verb=\"PUT\",resource=\"nodes\",subresource=\"status\",code=\"409\"} 1"
            ),
            "{out}"
        );
    }
}
