//! A stand-in admission webhook that allows every request after a fixed delay: what makes
//! kube-apiserver hold a request's seat without burning CPU, so that a test can saturate an
//! API Priority and Fairness priority level on a 2-core machine (a real slow webhook, a
//! policy engine under load, does the same to a cluster). It is a stand-in: it reads the
//! `AdmissionReview` only for its `uid` and always answers `allowed: true`
//! (<https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#response>).
//!
//! Served over TLS (kube-apiserver calls webhooks over HTTPS only) with a certificate of a
//! test CA for 127.0.0.1, HTTP/1.1 or HTTP/2 as the apiserver's client chooses.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::pki::Ca;

/// The largest `AdmissionReview` read (kube-apiserver's request body limit, 3 MiB).
const MAX_REVIEW: usize = 3 * 1024 * 1024;

/// A running webhook; stops serving when dropped.
#[derive(Debug)]
pub struct SlowWebhook {
    /// Where it listens (`https://<addr>/`).
    pub addr: SocketAddr,
    /// The CA certificate (PEM) its serving certificate chains to: the webhook
    /// configuration's `caBundle`.
    pub ca_pem: String,
    reviews: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl SlowWebhook {
    /// Starts it on 127.0.0.1 (a free port), answering each review `delay` after it came.
    ///
    /// # Errors
    /// The port cannot be bound or the TLS configuration not made.
    pub async fn start(delay: Duration) -> anyhow::Result<Self> {
        let ca = Ca::new("edgebeat-test-webhook");
        let leaf = ca.server();
        let tls = edgebeat_transports::tls::GrpcServerTls {
            cert_pem: leaf.cert_pem.into_bytes(),
            key_pem: leaf.key_pem.into_bytes(),
            client_ca_pem: None,
        };
        let mut config = tls
            .rustls_config(false)
            .context("the webhook's TLS configuration")?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let reviews = Arc::new(AtomicU64::new(0));
        let counted = reviews.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, counted) = (acceptor.clone(), counted.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request| {
                        review(request, delay, counted.clone())
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            ca_pem: ca.cert_pem,
            reviews,
            task,
        })
    }

    /// Reviews answered so far.
    pub fn reviews(&self) -> u64 {
        self.reviews.load(Ordering::Relaxed)
    }
}

impl Drop for SlowWebhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers one `AdmissionReview` (admission.k8s.io/v1) `delay` after it came: allowed, with
/// its `uid`. A body that is not a review gets 400.
async fn review(
    request: hyper::Request<Incoming>,
    delay: Duration,
    reviews: Arc<AtomicU64>,
) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let body = match Limited::new(request.into_body(), MAX_REVIEW)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(e) => return Ok(bad_request(&format!("reading the review: {e}"))),
    };
    let review: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(review) => review,
        Err(e) => return Ok(bad_request(&format!("not JSON: {e}"))),
    };
    let Some(uid) = review["request"]["uid"].as_str() else {
        return Ok(bad_request("no request.uid"));
    };
    // The delay is this stand-in's whole purpose: the seat it holds in the apiserver.
    tokio::time::sleep(delay).await;
    reviews.fetch_add(1, Ordering::Relaxed);
    let answer = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": true},
    });
    let mut response = hyper::Response::new(Full::new(Bytes::from(answer.to_string())));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

fn bad_request(why: &str) -> hyper::Response<Full<Bytes>> {
    let mut response = hyper::Response::new(Full::new(Bytes::from(why.to_owned())));
    *response.status_mut() = http::StatusCode::BAD_REQUEST;
    response
}
