//! The resource metrics server: kubelet's text, its routes, and its authentication and
//! authorization (with a fake apiserver that counts its reviews), without sockets; and one
//! request over a real TLS socket with a client certificate.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use http::header::{ALLOW, CONTENT_TYPE};
use http::request::Parts;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewStatus, UserInfo};
use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewStatus};
use parking_lot::Mutex;

use super::auth::{
    Auth, CertificateUserError, User, access_review, bearer_token, certificate_user,
};
use super::cache::ReviewCache;
use super::exposition::cpu_seconds;
use super::server::{Handler, Peer, Refusal, route};
use super::*;
use edgebeat_transports::observe::Succeeded;
use edgebeat_transports::tls::GrpcServerTls;

const NODE: &str = "edge-01";

fn sample() -> Sample {
    Sample {
        cpu_usage_ms: 10_500,
        memory_working_set_bytes: 1000,
        timestamp_ms: 1_624_396_278_302,
    }
}

/// [`sample`] taken at the start of the test binary: fresh enough to be served.
fn served_sample() -> Sample {
    static NOW: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let now = *NOW.get_or_init(|| jiff::Timestamp::now().as_millisecond());
    Sample {
        timestamp_ms: now,
        ..sample()
    }
}

// ---------------------------------------------------------------------------------------
// Exposition

#[test]
fn a_sample_is_written_as_kubelet_writes_it() {
    let expected = "\
# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total 10.5 1624396278302
# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 1000 1624396278302
# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE resource_scrape_error gauge
resource_scrape_error 0
";
    assert_eq!(exposition(Some(&sample())), expected);
    assert_eq!(
        EXPOSITION_CONTENT_TYPE,
        "text/plain; version=0.0.4; charset=utf-8"
    );
}

#[test]
fn no_usable_sample_is_a_scrape_error() {
    let expected = "\
# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE resource_scrape_error gauge
resource_scrape_error 1
";
    assert_eq!(exposition(None), expected);
    // metrics-server drops a node with a zero series: so is it reported.
    let no_cpu = Sample {
        cpu_usage_ms: 0,
        ..sample()
    };
    let no_memory = Sample {
        memory_working_set_bytes: 0,
        ..sample()
    };
    assert_eq!(exposition(Some(&no_cpu)), expected);
    assert_eq!(exposition(Some(&no_memory)), expected);
}

#[test]
fn cpu_seconds_are_printed_exactly() {
    let cases = [
        (10_500, "10.5"),
        (3_000, "3"),
        (1, "0.001"),
        (10, "0.01"),
        (1_010, "1.01"),
        (0, "0"),
        (123_456_789, "123456.789"),
        // Beyond 2^53: a float would round it.
        (u64::MAX, "18446744073709551.615"),
    ];
    for (ms, text) in cases {
        assert_eq!(cpu_seconds(ms), text, "{ms} ms");
    }
}

// ---------------------------------------------------------------------------------------
// Routing

fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    map
}

#[test]
fn routes_name_the_node_from_the_path_or_the_proxy_header() {
    let none = headers(&[]);
    let forwarded = |uri: &str| headers(&[("x-forwarded-uri", uri)]);
    let get = Method::GET;
    assert_eq!(
        route(&get, "/nodes/edge-01/metrics/resource", &none),
        Ok("edge-01")
    );
    assert_eq!(
        route(&Method::HEAD, "/nodes/edge-01/metrics/resource", &none),
        Ok("edge-01")
    );
    let proxied = [
        (
            "/api/v1/nodes/edge-01/proxy/metrics/resource",
            Ok("edge-01"),
        ),
        // The node proxy's name:port and scheme:name:port forms.
        (
            "/api/v1/nodes/edge-01:10250/proxy/metrics/resource",
            Ok("edge-01"),
        ),
        (
            "/api/v1/nodes/https:edge-01:10250/proxy/metrics/resource",
            Ok("edge-01"),
        ),
        (
            "/api/v1/nodes/ftp:edge-01:10250/proxy/metrics/resource",
            Err(Refusal::WhichNode),
        ),
        (
            "/api/v1/nodes/edge-01/proxy/metrics/cadvisor",
            Err(Refusal::WhichNode),
        ),
        (
            "/api/v1/nodes/a/b/proxy/metrics/resource",
            Err(Refusal::WhichNode),
        ),
        (
            "/api/v1/nodes/Edge_01/proxy/metrics/resource",
            Err(Refusal::InvalidNode("Edge_01".to_owned())),
        ),
    ];
    for (uri, expected) in proxied {
        assert_eq!(
            route(&get, "/metrics/resource", &forwarded(uri)),
            expected,
            "{uri}"
        );
    }
    // 404 "which node?": the proxy's path without its header.
    assert_eq!(
        route(&get, "/metrics/resource", &none),
        Err(Refusal::WhichNode)
    );
    // 404: other paths.
    for path in [
        "/",
        "/metrics",
        "/metrics/cadvisor",
        "/nodes/edge-01/metrics/cadvisor",
        "/nodes/edge-01/metrics/resource/",
        "/nodes/a/b/metrics/resource",
    ] {
        assert_eq!(route(&get, path, &none), Err(Refusal::NotFound), "{path}");
    }
    // 405: other methods, on either route (before the node is looked at).
    assert_eq!(
        route(&Method::POST, "/nodes/Edge_01/metrics/resource", &none),
        Err(Refusal::MethodNotAllowed)
    );
    assert_eq!(
        route(&Method::DELETE, "/metrics/resource", &none),
        Err(Refusal::MethodNotAllowed)
    );
    // 400: not a Node name.
    for node in ["Edge_01", "", "-edge"] {
        assert_eq!(
            route(&get, &format!("/nodes/{node}/metrics/resource"), &none),
            Err(Refusal::InvalidNode(node.to_owned()))
        );
    }
}

#[test]
fn bearer_tokens_are_read_as_kubelet_reads_them() {
    let token = |value: &str| {
        let map = headers(&[("authorization", value)]);
        bearer_token(&map).map(str::to_owned)
    };
    assert_eq!(token("Bearer abc.def"), Some("abc.def".to_owned()));
    assert_eq!(token("bearer abc"), Some("abc".to_owned()));
    assert_eq!(token("  BEARER abc  "), Some("abc".to_owned()));
    assert_eq!(token("Bearer abc extra"), Some("abc".to_owned()));
    assert_eq!(token("Basic dXNlcjpwYXNz"), None);
    assert_eq!(token("Bearer"), None);
    // Two spaces: an empty token (bearertoken.go refuses it too).
    assert_eq!(token("Bearer  abc"), None);
    assert_eq!(bearer_token(&headers(&[])), None);
}

// ---------------------------------------------------------------------------------------
// Authentication and authorization, with a fake apiserver

/// The apiserver's TokenReview and SubjectAccessReview, counting the calls.
#[derive(Default)]
struct Fake {
    /// Token → user name and groups.
    tokens: Mutex<HashMap<String, (String, Vec<String>)>>,
    /// (user, node) pairs allowed to get the node's metrics.
    allowed: Mutex<HashSet<(String, String)>>,
    /// Fail every call, as an apiserver that cannot be reached.
    fail: AtomicBool,
    /// How long each call takes.
    delay: Mutex<Duration>,
    token_reviews: AtomicUsize,
    /// Reviews of one node.
    access_reviews: AtomicUsize,
    /// Reviews of every node (no name).
    every_node_reviews: AtomicUsize,
    last_access_review: Mutex<Option<SubjectAccessReview>>,
}

impl Fake {
    fn with_token(self, token: &str, user: &str) -> Self {
        self.tokens.lock().insert(
            token.to_owned(),
            (user.to_owned(), vec!["team-a".to_owned()]),
        );
        self
    }

    fn allow(&self, user: &str, node: &str) {
        self.allowed
            .lock()
            .insert((user.to_owned(), node.to_owned()));
    }

    fn calls(&self) -> (usize, usize) {
        (
            self.token_reviews.load(Ordering::SeqCst),
            self.access_reviews.load(Ordering::SeqCst),
        )
    }

    async fn answer_after_delay(&self) -> Result<(), ReviewError> {
        let delay = *self.delay.lock();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(ReviewError::Apiserver("connection refused".to_owned()));
        }
        Ok(())
    }
}

impl Reviews for Fake {
    async fn token_review(&self, review: TokenReview) -> Result<TokenReview, ReviewError> {
        self.token_reviews.fetch_add(1, Ordering::SeqCst);
        self.answer_after_delay().await?;
        let token = review.spec.token.clone();
        let user = self.tokens.lock().get(&token).cloned();
        let status = TokenReviewStatus {
            authenticated: Some(user.is_some()),
            user: user.map(|(name, groups)| UserInfo {
                username: Some(name),
                uid: Some("uid-1".to_owned()),
                groups: Some(groups),
                extra: None,
            }),
            error: None,
            audiences: None,
        };
        Ok(TokenReview {
            status: Some(status),
            ..review
        })
    }

    async fn access_review(
        &self,
        review: SubjectAccessReview,
    ) -> Result<SubjectAccessReview, ReviewError> {
        let every_node = review
            .spec
            .resource_attributes
            .as_ref()
            .is_some_and(|a| a.name.is_none());
        if every_node {
            self.every_node_reviews.fetch_add(1, Ordering::SeqCst);
        } else {
            self.access_reviews.fetch_add(1, Ordering::SeqCst);
        }
        self.answer_after_delay().await?;
        let user = review.spec.user.clone().unwrap_or_default();
        let node = review
            .spec
            .resource_attributes
            .as_ref()
            .and_then(|a| a.name.clone())
            .unwrap_or_default();
        let allowed = self.allowed.lock().contains(&(user, node));
        if !every_node {
            *self.last_access_review.lock() = Some(review.clone());
        }
        Ok(SubjectAccessReview {
            status: Some(SubjectAccessReviewStatus {
                allowed,
                reason: (!allowed).then(|| "no RBAC policy matched".to_owned()),
                ..SubjectAccessReviewStatus::default()
            }),
            ..review
        })
    }
}

struct Bench {
    fake: Arc<Fake>,
    samples: Arc<Samples>,
    counters: Arc<ResourceMetricsCounters>,
    handler: Handler<Arc<Fake>>,
}

impl Bench {
    fn new(fake: Fake) -> Self {
        let fake = Arc::new(fake);
        let samples = Arc::new(Samples::default());
        samples.record(NODE, served_sample());
        let counters = Arc::new(ResourceMetricsCounters::default());
        let auth = Auth::new(fake.clone(), counters.clone());
        let handler = Handler::new(samples.clone(), auth, counters.clone());
        Self {
            fake,
            samples,
            counters,
            handler,
        }
    }

    /// The status, body and headers of `method uri` with `headers`, from a client with no
    /// certificate.
    async fn call(
        &self,
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, String, http::HeaderMap) {
        self.call_as(method, uri, headers, None).await
    }

    async fn call_as(
        &self,
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
        certificate_user: Option<User>,
    ) -> (StatusCode, String, http::HeaderMap) {
        let peer = Peer {
            remote: "192.0.2.7:41000".parse().unwrap(),
            certificate_user,
            succeeded: Succeeded::default(),
        };
        self.call_on(&peer, method, uri, headers).await
    }

    /// As [`Bench::call`], on the connection `peer`.
    async fn call_on(
        &self,
        peer: &Peer,
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, String, http::HeaderMap) {
        let response = self
            .handler
            .handle(&parts(method, uri, headers), peer)
            .await;
        let (head, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        (
            head.status,
            String::from_utf8(body.to_vec()).unwrap(),
            head.headers,
        )
    }
}

fn parts(method: Method, uri: &str, headers: &[(&str, &str)]) -> Parts {
    let mut builder = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(()).unwrap().into_parts().0
}

const PATH: &str = "/nodes/edge-01/metrics/resource";
const ALICE: (&str, &str) = ("authorization", "Bearer alice-token");
const FORBIDDEN_ALICE: &str =
    "Forbidden (user=alice, verb=get, resource=nodes, subresource=metrics)\n";

#[tokio::test(start_paused = true)]
async fn no_credentials_is_401_unauthorized_without_a_review() {
    let bench = Bench::new(Fake::default().with_token("alice-token", "alice"));
    let (status, body, _) = bench.call(Method::GET, PATH, &[]).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::UNAUTHORIZED, "Unauthorized\n")
    );
    let (status, _, _) = bench
        .call(
            Method::GET,
            PATH,
            &[("authorization", "Basic dXNlcjpwYXNz")],
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(bench.fake.calls(), (0, 0));
    // An unknown token: 401 after its TokenReview, and no SubjectAccessReview.
    let (status, _, _) = bench
        .call(Method::GET, PATH, &[("authorization", "Bearer forged")])
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(bench.fake.calls(), (1, 0));
    assert_eq!(bench.counters.get("401"), 3);
}

#[tokio::test(start_paused = true)]
async fn routing_refusals_come_before_authentication() {
    let bench = Bench::new(Fake::default());
    let (status, _, headers) = bench.call(Method::POST, PATH, &[]).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers[ALLOW], "GET, HEAD");
    let (status, body, _) = bench.call(Method::GET, "/metrics/resource", &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.starts_with("which node?"), "{body}");
    let (status, _, _) = bench.call(Method::GET, "/healthz", &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body, _) = bench
        .call(Method::GET, "/nodes/Edge_01/metrics/resource", &[])
        .await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::BAD_REQUEST, "invalid node name \"Edge_01\"\n")
    );
    assert_eq!(bench.fake.calls(), (0, 0));
    assert_eq!(
        (
            bench.counters.get("405"),
            bench.counters.get("404"),
            bench.counters.get("400")
        ),
        (1, 2, 1)
    );
}

#[tokio::test(start_paused = true)]
async fn a_denied_token_is_403_forbidden_with_kubelets_text() {
    let bench = Bench::new(Fake::default().with_token("alice-token", "alice"));
    let (status, body, _) = bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::FORBIDDEN, FORBIDDEN_ALICE)
    );
    assert_eq!(bench.fake.calls(), (1, 1));
    assert_eq!(bench.counters.get("403"), 1);
}

#[tokio::test(start_paused = true)]
async fn an_allowed_token_is_served_and_its_answers_reused_for_their_ttls() {
    let bench = Bench::new(Fake::default().with_token("alice-token", "alice"));
    bench.fake.allow("alice", NODE);
    let (status, body, headers) = bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, exposition(Some(&served_sample())));
    assert_eq!(headers[CONTENT_TYPE], EXPOSITION_CONTENT_TYPE);
    assert_eq!(bench.fake.calls(), (1, 1));
    // Within both TTLs: no new review.
    tokio::time::advance(Duration::from_secs(60)).await;
    let (status, _, _) = bench.call(Method::HEAD, PATH, &[ALICE]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(bench.fake.calls(), (1, 1));
    // Past the token's 2 minutes, within the decision's 5: a new TokenReview only.
    tokio::time::advance(TOKEN_TTL).await;
    bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(bench.fake.calls(), (2, 1));
    // Past the decision's 5 minutes: a new SubjectAccessReview.
    tokio::time::advance(ALLOWED_TTL).await;
    bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(bench.fake.calls(), (3, 2));
    assert_eq!(bench.counters.get("200"), 4);
}

#[tokio::test(start_paused = true)]
async fn refusals_are_reused_for_30_s() {
    let bench = Bench::new(Fake::default().with_token("alice-token", "alice"));
    let (status, _, _) = bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Allowed at the apiserver now, but the refusal is cached for DENIED_TTL.
    bench.fake.allow("alice", NODE);
    tokio::time::advance(DENIED_TTL - Duration::from_secs(1)).await;
    let (status, _, _) = bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(bench.fake.calls(), (1, 1));
    tokio::time::advance(Duration::from_secs(1)).await;
    let (status, _, _) = bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(bench.fake.calls(), (1, 2));
    // An unknown token is asked about again after TOKEN_FAILURE_TTL.
    let stranger = ("authorization", "Bearer bob-token");
    bench.call(Method::GET, PATH, &[stranger]).await;
    bench
        .fake
        .tokens
        .lock()
        .insert("bob-token".to_owned(), ("bob".to_owned(), vec![]));
    let (status, _, _) = bench.call(Method::GET, PATH, &[stranger]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    tokio::time::advance(TOKEN_FAILURE_TTL).await;
    let (status, body, _) = bench.call(Method::GET, PATH, &[stranger]).await;
    assert_eq!(
        (status, body.as_str()),
        (
            StatusCode::FORBIDDEN,
            "Forbidden (user=bob, verb=get, resource=nodes, subresource=metrics)\n"
        )
    );
    assert_eq!(bench.fake.calls(), (3, 3));
}

#[tokio::test(start_paused = true)]
async fn a_node_not_held_is_404_after_authorization() {
    let bench = Bench::new(Fake::default().with_token("alice-token", "alice"));
    // Not authorized for it: 403, whether held or not.
    let (status, _, _) = bench
        .call(Method::GET, "/nodes/edge-02/metrics/resource", &[ALICE])
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    bench.fake.allow("alice", "edge-02");
    tokio::time::advance(DENIED_TTL).await;
    let (status, body, _) = bench
        .call(Method::GET, "/nodes/edge-02/metrics/resource", &[ALICE])
        .await;
    assert_eq!(
        (status, body.as_str()),
        (
            StatusCode::NOT_FOUND,
            "node edge-02 has no sample of the last 60s at this replica\n"
        )
    );
    // A node that moved away is no longer served.
    bench.fake.allow("alice", NODE);
    bench.samples.remove(NODE);
    let (status, _, _) = bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // A node whose samples stopped (dead, or cut off) drops out once its latest is older
    // than MAX_SAMPLE_AGE, as a dead kubelet's scrape fails.
    let now = jiff::Timestamp::now().as_millisecond();
    let age = i64::try_from(MAX_SAMPLE_AGE.as_millis()).unwrap();
    bench.samples.record(
        NODE,
        Sample {
            timestamp_ms: now - age + 5_000,
            ..sample()
        },
    );
    let (status, _, _) = bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(status, StatusCode::OK, "within the age");
    bench.samples.remove(NODE);
    bench.samples.record(
        NODE,
        Sample {
            timestamp_ms: now - age - 1_000,
            ..sample()
        },
    );
    let (status, body, _) = bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(
        (status, body.as_str()),
        (
            StatusCode::NOT_FOUND,
            "node edge-01 has no sample of the last 60s at this replica\n"
        )
    );
}

#[tokio::test(start_paused = true)]
async fn the_apiserver_proxy_names_the_node_in_x_forwarded_uri() {
    let bench = Bench::new(Fake::default());
    let apiserver = User::authenticated(
        "kube-apiserver-kubelet-client".to_owned(),
        String::new(),
        vec!["system:masters".to_owned()],
        Default::default(),
    );
    bench.fake.allow("kube-apiserver-kubelet-client", NODE);
    let forwarded = (
        "x-forwarded-uri",
        "/api/v1/nodes/edge-01/proxy/metrics/resource",
    );
    let (status, body, _) = bench
        .call_as(
            Method::GET,
            "/metrics/resource",
            &[forwarded],
            Some(apiserver.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, exposition(Some(&served_sample())));
    // The client certificate authenticated it: no TokenReview; the node authorized is the
    // header's.
    assert_eq!(bench.fake.calls(), (0, 1));
    let review = bench.fake.last_access_review.lock().clone().unwrap();
    let attributes = review.spec.resource_attributes.unwrap();
    assert_eq!(attributes.name.as_deref(), Some(NODE));
    // Another node in the header: its own authorization, refused.
    let other = (
        "x-forwarded-uri",
        "/api/v1/nodes/edge-09/proxy/metrics/resource",
    );
    let (status, _, _) = bench
        .call_as(Method::GET, "/metrics/resource", &[other], Some(apiserver))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test(start_paused = true)]
async fn the_access_review_asks_kubelets_attributes() {
    let bench = Bench::new(Fake::default().with_token("alice-token", "alice"));
    bench.call(Method::HEAD, PATH, &[ALICE]).await;
    let spec = bench.fake.last_access_review.lock().clone().unwrap().spec;
    assert_eq!(spec.user.as_deref(), Some("alice"));
    assert_eq!(spec.uid.as_deref(), Some("uid-1"));
    assert_eq!(
        spec.groups,
        Some(vec!["team-a".to_owned(), "system:authenticated".to_owned()])
    );
    assert_eq!(spec.extra, None);
    let a = spec.resource_attributes.unwrap();
    assert_eq!(
        (
            a.verb.as_deref(),
            a.group.as_deref(),
            a.version.as_deref(),
            a.resource.as_deref(),
            a.subresource.as_deref(),
            a.name.as_deref(),
            a.namespace.as_deref(),
        ),
        (
            Some("get"),
            None,
            Some("v1"),
            Some("nodes"),
            Some("metrics"),
            Some(NODE),
            None
        )
    );
    assert!(spec.non_resource_attributes.is_none());
    // As sent on the wire: the core group and empty fields left out.
    let user = User::authenticated("u".to_owned(), String::new(), vec![], Default::default());
    let json = serde_json::to_value(access_review(&user, Some(NODE)).spec).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "user": "u",
            "groups": ["system:authenticated"],
            "resourceAttributes": {
                "verb": "get", "version": "v1", "resource": "nodes",
                "subresource": "metrics", "name": NODE,
            },
        })
    );
}

#[tokio::test(start_paused = true)]
async fn an_apiserver_error_is_500_never_a_pass_and_is_not_cached() {
    let bench = Bench::new(Fake::default().with_token("alice-token", "alice"));
    bench.fake.allow("alice", NODE);
    bench.fake.fail.store(true, Ordering::SeqCst);
    let (status, body, _) = bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.starts_with("Authentication error"), "{body}");
    // A certificate user needs no TokenReview: the SubjectAccessReview fails instead.
    let admin = User::authenticated(
        "alice".to_owned(),
        String::new(),
        vec![],
        Default::default(),
    );
    let (status, body, _) = bench.call_as(Method::GET, PATH, &[], Some(admin)).await;
    assert_eq!(
        (status, body.as_str()),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "Authorization error (user=alice, verb=get, resource=nodes, subresource=metrics)\n"
        )
    );
    // The every-node review failed: no per-node review after it.
    assert_eq!(bench.fake.calls(), (1, 0));
    assert_eq!(bench.fake.every_node_reviews.load(Ordering::SeqCst), 1);
    // The apiserver is back: asked again at once (errors are not cached): every node (no),
    // then the node (yes).
    bench.fake.fail.store(false, Ordering::SeqCst);
    let (status, _, _) = bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(bench.fake.calls(), (2, 1));
    assert_eq!(bench.fake.every_node_reviews.load(Ordering::SeqCst), 2);
    assert_eq!(bench.counters.get("500"), 2);
}

#[tokio::test(start_paused = true)]
async fn a_review_that_takes_too_long_is_500() {
    let bench = Bench::new(Fake::default().with_token("alice-token", "alice"));
    bench.fake.allow("alice", NODE);
    *bench.fake.delay.lock() = REVIEW_TIMEOUT + Duration::from_secs(1);
    let (status, _, _) = bench.call(Method::GET, PATH, &[ALICE]).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_with_one_token_make_one_review() {
    let bench = Bench::new(Fake::default().with_token("alice-token", "alice"));
    bench.fake.allow("alice", NODE);
    *bench.fake.delay.lock() = Duration::from_millis(200);
    let (a, b, c) = tokio::join!(
        bench.call(Method::GET, PATH, &[ALICE]),
        bench.call(Method::GET, PATH, &[ALICE]),
        bench.call(Method::GET, PATH, &[ALICE]),
    );
    assert_eq!(
        (a.0, b.0, c.0),
        (StatusCode::OK, StatusCode::OK, StatusCode::OK)
    );
    assert_eq!(bench.fake.calls(), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn caches_are_bounded_and_make_room_from_the_oldest() {
    let cache: ReviewCache<u32, u32> = ReviewCache::new(2);
    let reviews = AtomicUsize::new(0);
    let review = |value: u32, ttl: Duration| {
        reviews.fetch_add(1, Ordering::SeqCst);
        async move { Ok((value, ttl)) }
    };
    let long = Duration::from_secs(600);
    assert_eq!(cache.get_or_review(1, || review(10, long)).await, Ok(10));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(cache.get_or_review(2, || review(20, long)).await, Ok(20));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(cache.get_or_review(3, || review(30, long)).await, Ok(30));
    assert_eq!(cache.len(), 2);
    // 1, the oldest, made room: reviewed again; 3 is still cached.
    assert_eq!(cache.get_or_review(3, || review(31, long)).await, Ok(30));
    assert_eq!(reviews.load(Ordering::SeqCst), 3);
    assert_eq!(cache.get_or_review(1, || review(11, long)).await, Ok(11));
    assert_eq!(reviews.load(Ordering::SeqCst), 4);
    // Expired answers make room before live ones.
    let short: ReviewCache<u32, u32> = ReviewCache::new(2);
    short.get_or_review(1, || review(10, long)).await.unwrap();
    short
        .get_or_review(2, || review(20, Duration::from_secs(1)))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(2)).await;
    short.get_or_review(3, || review(30, long)).await.unwrap();
    assert_eq!(short.get_or_review(1, || review(12, long)).await, Ok(10));
}

// ---------------------------------------------------------------------------------------
// Review budgets

/// A new connection from `address` (no client certificate, not yet served).
fn connection_from(address: &str) -> Peer {
    Peer {
        remote: std::net::SocketAddr::new(address.parse().unwrap(), 41000),
        certificate_user: None,
        succeeded: Succeeded::default(),
    }
}

/// `GET` of [`PATH`] with `Authorization: Bearer <token>` on `peer`.
async fn get_with_token(bench: &Bench, peer: &Peer, token: &str) -> (StatusCode, http::HeaderMap) {
    let authorization = format!("Bearer {token}");
    let (status, _, headers) = bench
        .call_on(
            peer,
            Method::GET,
            PATH,
            &[("authorization", &authorization)],
        )
        .await;
    (status, headers)
}

/// Random tokens from one address: a TokenReview each (401) until the address's budget is
/// spent, then `429` with `Retry-After` and no TokenReview; the budget refills at its rate.
#[tokio::test(start_paused = true)]
async fn random_tokens_over_the_address_budget_are_429_without_a_review() {
    let bench = Bench::new(Fake::default());
    let attacker = connection_from("203.0.113.9");
    for i in 0..ADDRESS_REVIEW_BURST {
        let (status, _) = get_with_token(&bench, &attacker, &format!("random-{i}")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "token {i}");
    }
    for i in 0..5 {
        let (status, headers) = get_with_token(&bench, &attacker, &format!("more-{i}")).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            headers[http::header::RETRY_AFTER],
            "1",
            "200 ms, rounded up"
        );
    }
    let reviews = ADDRESS_REVIEW_BURST as usize;
    assert_eq!(
        bench.fake.calls(),
        (reviews, 0),
        "no review over the budget"
    );
    assert_eq!(bench.counters.get("429"), 5);
    assert_eq!(bench.counters.refused(Budget::Address), 5);
    assert_eq!(
        bench.counters.reviews("token_review"),
        u64::from(ADDRESS_REVIEW_BURST)
    );
    // A second later, the address may cost 5 more.
    tokio::time::advance(Duration::from_secs(1)).await;
    let mut statuses = Vec::new();
    for i in 0..6 {
        statuses.push(
            get_with_token(&bench, &attacker, &format!("later-{i}"))
                .await
                .0,
        );
    }
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::UNAUTHORIZED)
            .count(),
        5
    );
    assert_eq!(statuses[5], StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(bench.fake.calls(), (reviews + 5, 0));
}

/// Cached answers take no budget: with the address's budget spent, a token whose answer is
/// cached (authenticated, or not) is answered as before, without a review.
#[tokio::test(start_paused = true)]
async fn cached_answers_are_answered_when_the_budget_is_spent() {
    let bench = Bench::new(Fake::default().with_token("alice-token", "alice"));
    bench.fake.allow("alice", NODE);
    let client = connection_from("203.0.113.9");
    assert_eq!(
        get_with_token(&bench, &client, "alice-token").await.0,
        StatusCode::OK
    );
    assert_eq!(
        get_with_token(&bench, &client, "forged").await.0,
        StatusCode::UNAUTHORIZED
    );
    // Spend the rest of the address's budget (3 taken: alice's TokenReview and
    // SubjectAccessReviews of every node, then of the node; 1 the forged token's).
    let mut i = 0;
    while get_with_token(&bench, &client, &format!("random-{i}"))
        .await
        .0
        == StatusCode::UNAUTHORIZED
    {
        i += 1;
    }
    assert_eq!(i, ADDRESS_REVIEW_BURST - 4);
    let calls = bench.fake.calls();
    let fresh = Peer {
        succeeded: Succeeded::default(),
        ..client.clone()
    };
    assert_eq!(
        get_with_token(&bench, &fresh, "alice-token").await.0,
        StatusCode::OK
    );
    assert_eq!(
        get_with_token(&bench, &fresh, "forged").await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(bench.fake.calls(), calls, "cached: no review");
}

/// A user allowed on no node asking for random node names: a SubjectAccessReview each
/// until the address's budget is spent, then `429` without one.
#[tokio::test(start_paused = true)]
async fn random_node_names_cost_access_reviews_within_the_budget() {
    let bench = Bench::new(Fake::default().with_token("bob-token", "bob"));
    let bob = connection_from("203.0.113.10");
    let mut statuses = HashMap::<StatusCode, u32>::new();
    for i in 0..40 {
        let (status, _, _) = bench
            .call_on(
                &bob,
                Method::GET,
                &format!("/nodes/edge-{i:03}/metrics/resource"),
                &[("authorization", "Bearer bob-token")],
            )
            .await;
        *statuses.entry(status).or_default() += 1;
    }
    // 20: bob's TokenReview, his every-node review, then 18 nodes'.
    assert_eq!(statuses[&StatusCode::FORBIDDEN], ADDRESS_REVIEW_BURST - 2);
    assert_eq!(
        statuses[&StatusCode::TOO_MANY_REQUESTS],
        40 - (ADDRESS_REVIEW_BURST - 2)
    );
    assert_eq!(
        bench.fake.calls(),
        (1, ADDRESS_REVIEW_BURST as usize - 2),
        "no review over the budget"
    );
    assert_eq!(
        bench.counters.reviews("access_review"),
        u64::from(ADDRESS_REVIEW_BURST) - 1
    );
}

/// A flood of random tokens from many addresses spends the replica's budget: a new
/// connection's review waits (`429`), but metrics-server's connection, served before, is
/// reviewed again when its token's answer expires, and scraped.
#[tokio::test(start_paused = true)]
async fn a_flood_from_many_addresses_spends_the_global_budget_but_not_a_served_connections() {
    let bench = Bench::new(Fake::default().with_token("scraper-token", "metrics-server"));
    bench.fake.allow("metrics-server", "");
    let scraper = connection_from("10.0.0.5");
    assert_eq!(
        get_with_token(&bench, &scraper, "scraper-token").await.0,
        StatusCode::OK
    );
    assert!(scraper.succeeded.is_marked(), "a 200 marks its connection");
    tokio::time::advance(TOKEN_TTL).await;
    let mut refused = 0;
    for i in 0..300u32 {
        let flooder = connection_from(&std::net::Ipv4Addr::from(0xC633_6400 + i).to_string());
        if get_with_token(&bench, &flooder, &format!("random-{i}"))
            .await
            .0
            == StatusCode::TOO_MANY_REQUESTS
        {
            refused += 1;
        }
    }
    assert_eq!(refused, 300 - GLOBAL_REVIEW_BURST);
    assert_eq!(bench.counters.refused(Budget::Global), u64::from(refused));
    assert_eq!(bench.fake.calls().0, 1 + GLOBAL_REVIEW_BURST as usize);
    // A new connection of the scraper's would wait; its served connection does not.
    let new = connection_from("10.0.0.6");
    assert_eq!(
        get_with_token(&bench, &new, "scraper-token").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get_with_token(&bench, &scraper, "scraper-token").await.0,
        StatusCode::OK
    );
    assert_eq!(bench.fake.calls().0, 2 + GLOBAL_REVIEW_BURST as usize);
}

#[test]
fn retry_after_is_whole_seconds_rounded_up() {
    let after = |ms| {
        super::server::retry_after_seconds(OverBudget {
            budget: Budget::Global,
            retry_after: Duration::from_millis(ms),
        })
    };
    assert_eq!(
        (after(0), after(20), after(1_000), after(1_001)),
        (1, 1, 1, 2)
    );
}

// ---------------------------------------------------------------------------------------
// Client certificates

fn certificate_der(subject: &[(rcgen::DnType, &str)]) -> Vec<u8> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    for (ty, value) in subject {
        params.distinguished_name.push(ty.clone(), *value);
    }
    let key = rcgen::KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().der().to_vec()
}

/// `der` with every occurrence of `from` replaced by `to` (same length). rcgen holds one
/// value per attribute type; a sibling type patched into the wanted one makes a subject
/// (and, self-signed, an issuer) with two. The signature breaks, which reading the
/// subject does not check.
fn patched(der: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut der = der.to_vec();
    let mut found = false;
    for at in 0..=der.len() - from.len() {
        if &der[at..at + from.len()] == from {
            der[at..at + to.len()].copy_from_slice(to);
            found = true;
        }
    }
    assert!(found, "{from:02x?} not found");
    der
}

/// DER of the OIDs 2.5.4.10 (O), 2.5.4.11 (OU), 1.3.6.1.4.1.57683.2 (uid) and .3.
const OID_O: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x0a];
const OID_OU: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x0b];
const OID_UID_TAIL: &[u8] = &[0x83, 0xc2, 0x53, 0x02];
const OID_UID_SIBLING_TAIL: &[u8] = &[0x83, 0xc2, 0x53, 0x03];

#[test]
fn a_certificate_names_its_user_as_kubelets_x509_authenticator() {
    use rcgen::DnType;
    let der = certificate_der(&[
        (DnType::OrganizationName, "system:masters"),
        (DnType::OrganizationalUnitName, "ops"),
        (DnType::CommonName, "kubernetes-admin"),
    ]);
    let der = patched(&der, OID_OU, OID_O);
    let user = certificate_user(&der).unwrap().unwrap();
    assert_eq!(user.name, "kubernetes-admin");
    assert_eq!(user.uid, "");
    assert_eq!(
        user.groups,
        ["system:masters", "ops", "system:authenticated"]
    );
    let digest = ring::digest::digest(&ring::digest::SHA256, &der);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        user.extra["authentication.kubernetes.io/credential-id"],
        [format!("X509SHA256={hex}")]
    );
    // The uid attribute (1.3.6.1.4.1.57683.2), at most once.
    let uid_type = DnType::CustomDnType(vec![1, 3, 6, 1, 4, 1, 57683, 2]);
    let sibling_type = DnType::CustomDnType(vec![1, 3, 6, 1, 4, 1, 57683, 3]);
    let with_uid = certificate_der(&[(DnType::CommonName, "svc"), (uid_type.clone(), "1234")]);
    assert_eq!(certificate_user(&with_uid).unwrap().unwrap().uid, "1234");
    let two_uids = certificate_der(&[
        (DnType::CommonName, "svc"),
        (uid_type, "1"),
        (sibling_type, "2"),
    ]);
    let two_uids = patched(&two_uids, OID_UID_SIBLING_TAIL, OID_UID_TAIL);
    assert_eq!(
        certificate_user(&two_uids),
        Err(CertificateUserError::MultipleUids(2))
    );
    // No CN: no one (a token may still authenticate the request).
    let no_cn = certificate_der(&[(DnType::OrganizationName, "system:masters")]);
    assert_eq!(certificate_user(&no_cn), Ok(None));
    assert!(
        matches!(
            certificate_user(b"not DER"),
            Err(CertificateUserError::Parse(_))
        ),
        "not DER is a parse error"
    );
}

#[test]
fn the_anonymous_user_is_not_made_authenticated() {
    let anonymous = User::authenticated(
        "system:anonymous".to_owned(),
        String::new(),
        vec!["system:unauthenticated".to_owned()],
        Default::default(),
    );
    assert_eq!(anonymous.groups, ["system:unauthenticated"]);
    let already = User::authenticated(
        "u".to_owned(),
        String::new(),
        vec!["system:authenticated".to_owned()],
        Default::default(),
    );
    assert_eq!(already.groups, ["system:authenticated"]);
}

#[test]
fn requests_are_counted_by_code_for_prometheus() {
    let counters = ResourceMetricsCounters::default();
    counters.count(StatusCode::OK);
    counters.count(StatusCode::UNAUTHORIZED);
    counters.count(StatusCode::UNAUTHORIZED);
    let mut registry = prometheus_client::registry::Registry::default();
    counters.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("edgebeat_gateway_resource_metrics_requests_total{code=\"200\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("edgebeat_gateway_resource_metrics_requests_total{code=\"401\"} 2\n"),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------
// Over a TLS socket

/// A CA, a server certificate for localhost signed by it, and a client certificate
/// (CN=kubernetes-admin, O=system:masters) signed by it, all PEM: (CA, server cert, server
/// key, client cert, client key).
fn pki() -> (String, String, String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "kubernetes");
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let mut server =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate().unwrap();
    let server_pem = server.signed_by(&server_key, &issuer).unwrap().pem();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    client
        .distinguished_name
        .push(DnType::CommonName, "kubernetes-admin");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().unwrap();
    let client_pem = client.signed_by(&client_key, &issuer).unwrap().pem();
    (
        ca_pem,
        server_pem,
        server_key.serialize_pem(),
        client_pem,
        client_key.serialize_pem(),
    )
}

/// `request` over a new TLS connection to `addr` (with `identity` as client certificate),
/// and the whole answer.
async fn exchange(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    identity: Option<(&str, &str)>,
    request: &str,
) -> String {
    use edgebeat_transports::tls::{ClientTls, TlsIdentity};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let tls = ClientTls {
        ca_pem: ca_pem.as_bytes().to_vec(),
        client_identity: identity.map(|(cert, key)| TlsIdentity {
            cert_pem: cert.as_bytes().to_vec(),
            key_pem: key.as_bytes().to_vec(),
        }),
    };
    let mut config = tls.rustls_config().unwrap();
    // A client offering HTTP/1.1 only (a raw request below) gets it.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut stream = connector.connect(name, tcp).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
            // A close without close_notify ends the answer too.
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(error) => panic!("reading the answer: {error}"),
        }
    }
    String::from_utf8(answer).unwrap()
}

#[tokio::test]
async fn a_client_certificate_is_authenticated_over_tls() {
    let (ca_pem, server_pem, server_key, client_pem, client_key) = pki();
    let options = ResourceMetricsOptions {
        tls: GrpcServerTls {
            cert_pem: server_pem.into_bytes(),
            key_pem: server_key.into_bytes(),
            client_ca_pem: Some(ca_pem.clone().into_bytes()),
        },
    };
    options.check().unwrap();
    let fake = Arc::new(Fake::default());
    fake.allow("kubernetes-admin", NODE);
    let samples = Arc::new(Samples::default());
    samples.record(NODE, served_sample());
    let counters = Arc::new(ResourceMetricsCounters::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        options,
        samples,
        fake.clone(),
        counters.clone(),
        async move {
            let _ = stopped.await;
        },
    ));
    let request = "GET /nodes/edge-01/metrics/resource HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    // 200: the client certificate (CN=kubernetes-admin, O=system:masters) authenticates.
    let answer = exchange(addr, &ca_pem, Some((&client_pem, &client_key)), request).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(
        answer.contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{answer}"
    );
    assert!(
        answer.ends_with(&exposition(Some(&served_sample()))),
        "{answer}"
    );
    assert_eq!(fake.calls(), (0, 1));
    let spec = fake.last_access_review.lock().clone().unwrap().spec;
    assert_eq!(spec.user.as_deref(), Some("kubernetes-admin"));
    assert_eq!(
        spec.groups,
        Some(vec![
            "system:masters".to_owned(),
            "system:authenticated".to_owned()
        ])
    );
    assert!(
        spec.extra.unwrap()["authentication.kubernetes.io/credential-id"][0]
            .starts_with("X509SHA256=")
    );
    // 401: the client certificate is optional, but then something else must authenticate.
    let answer = exchange(addr, &ca_pem, None, request).await;
    assert!(
        answer.starts_with("HTTP/1.1 401 Unauthorized\r\n"),
        "{answer}"
    );
    assert!(answer.ends_with("\r\n\r\nUnauthorized\n"), "{answer}");
    assert_eq!((counters.get("200"), counters.get("401")), (1, 1));
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[test]
fn unusable_tls_material_is_refused_before_serving() {
    let (ca_pem, server_pem, server_key, _, _) = pki();
    let good = ResourceMetricsOptions {
        tls: GrpcServerTls {
            cert_pem: server_pem.into_bytes(),
            key_pem: server_key.into_bytes(),
            client_ca_pem: Some(ca_pem.into_bytes()),
        },
    };
    good.check().unwrap();
    assert_eq!(
        good.rustls_config().unwrap().alpn_protocols,
        [b"h2".to_vec(), b"http/1.1".to_vec()]
    );
    let cases = [
        (
            ResourceMetricsOptions {
                tls: GrpcServerTls {
                    key_pem: b"junk".to_vec(),
                    ..good.tls.clone()
                },
            },
            "key: ",
        ),
        (
            ResourceMetricsOptions {
                tls: GrpcServerTls {
                    client_ca_pem: Some(b"junk".to_vec()),
                    ..good.tls.clone()
                },
            },
            "client CA: ",
        ),
    ];
    for (options, prefix) in cases {
        let error = options.check().unwrap_err().to_string();
        assert!(error.starts_with(prefix), "{error}");
    }
    let debug = format!("{good:?}");
    assert!(
        debug.contains("<redacted>") && !debug.contains("PRIVATE"),
        "{debug}"
    );
}

/// A renewal's usage becomes the node's sample (KiB → bytes, stamped when sampled); one the
/// host could not read (a 0) is none; an older one does not replace a newer.
#[test]
fn a_renewals_usage_is_the_nodes_sample_unless_unreadable_or_older() {
    let samples = Samples::default();
    let at = |ms: u64| std::time::UNIX_EPOCH + Duration::from_millis(ms);
    let usage = |cpu_usage_ms, memory_working_set_kib| edgebeat_proto::ResourceUsage {
        cpu_usage_ms,
        memory_working_set_kib,
    };
    assert_eq!(
        samples.record_usage(NODE, &usage(0, 10), at(1_000), None),
        Ok(None)
    );
    assert_eq!(
        samples.record_usage(NODE, &usage(10, 0), at(1_000), None),
        Ok(None)
    );
    assert_eq!(samples.get(NODE), None, "a 0 is no sample");
    samples
        .record_usage(NODE, &usage(1_500, 4), at(2_000), None)
        .unwrap();
    let newest = Sample {
        cpu_usage_ms: 1_500,
        memory_working_set_bytes: 4_096,
        timestamp_ms: 2_000,
    };
    assert_eq!(samples.get(NODE), Some(newest));
    assert_eq!(
        samples.record_usage(NODE, &usage(1_400, 4), at(1_900), None),
        Ok(None)
    );
    assert_eq!(
        samples.get(NODE),
        Some(newest),
        "a late retry replaces nothing"
    );
}

fn shared(node: &str, cpu_usage_ms: u64, sampled_ms: i64) -> edgebeat_proto::SharedUsage {
    edgebeat_proto::SharedUsage {
        usage: Some(edgebeat_proto::ResourceUsage {
            cpu_usage_ms,
            memory_working_set_kib: 4,
        }),
        sampled_ms,
        node_name: node.to_owned(),
    }
}

/// Another replica's sample is recorded as an own one would be (and what a renewal records
/// is what this replica shares); one that is not a sample, older than the one held, or of a
/// node past the limit is not; samples older than a cutoff are forgotten.
#[test]
fn shared_samples_are_recorded_within_the_limit_and_forgotten_when_old() {
    let samples = Samples::new(2);
    let now = std::time::UNIX_EPOCH + Duration::from_secs(10);
    let own = samples.record_usage(
        "own",
        &shared("own", 7, 0).usage.unwrap(),
        std::time::UNIX_EPOCH + Duration::from_millis(3_000),
        None,
    );
    assert_eq!(own, Ok(Some(shared("own", 7, 3_000))), "shared as recorded");
    assert_eq!(
        samples.record_shared(&shared(NODE, 1_500, 2_000), None, now),
        Ok(true)
    );
    assert_eq!(
        samples.get(NODE),
        Some(Sample {
            cpu_usage_ms: 1_500,
            memory_working_set_bytes: 4_096,
            timestamp_ms: 2_000,
        })
    );
    let not_samples = [
        edgebeat_proto::SharedUsage {
            usage: None,
            sampled_ms: 5_000,
            node_name: NODE.to_owned(),
        },
        shared(NODE, 0, 5_000),
        shared(NODE, 1_600, 0),
        shared(NODE, 1_400, 1_900),
    ];
    for bad in not_samples {
        assert_eq!(samples.record_shared(&bad, None, now), Ok(false), "{bad:?}");
    }
    assert_eq!(samples.get(NODE).map(|s| s.timestamp_ms), Some(2_000));
    assert_eq!(
        samples.record_shared(&shared("third", 1, 2_500), None, now),
        Ok(false),
        "past the limit of 2 nodes"
    );
    assert_eq!(
        samples.record_usage(
            "third",
            &shared("third", 1, 0).usage.unwrap(),
            std::time::UNIX_EPOCH + Duration::from_millis(2_500),
            None,
        ),
        Ok(Some(shared("third", 1, 2_500))),
        "the limit is on shared samples only"
    );
    samples.forget_before(std::time::UNIX_EPOCH + Duration::from_millis(2_500));
    assert_eq!(samples.get(NODE), None, "older than the cutoff");
    assert!(samples.get("own").is_some() && samples.get("third").is_some());
}

/// A sample above its node's capacity is refused, shared or from a renewal, and the one
/// held stays: a working set above the node's memory, or CPU time used faster than its
/// CPUs (and 25 %) since the sample held, over 10 s at least. A counter that went back (a
/// reboot) and a rate over less than 10 s are not judged; a shared sample dated beyond the
/// clock window is refused as from the future.
#[test]
fn a_sample_beyond_its_nodes_capacity_is_refused() {
    let samples = Samples::default();
    // Two CPUs and 8 KiB (the samples' 4 KiB fits).
    let capacity = Capacity {
        cpu_millis: 2_000,
        memory_bytes: 8 * 1024,
    };
    let at = |ms: u64| std::time::UNIX_EPOCH + Duration::from_millis(ms);
    let now = at(100_000);
    let usage = |cpu_usage_ms, memory_working_set_kib| edgebeat_proto::ResourceUsage {
        cpu_usage_ms,
        memory_working_set_kib,
    };
    assert_eq!(
        samples.record_usage(NODE, &usage(10_000, 9), at(1_000), Some(capacity)),
        Err(SampleRefused::MemoryAboveCapacity {
            working_set_bytes: 9 * 1024,
            capacity_bytes: 8 * 1024
        })
    );
    assert_eq!(samples.get(NODE), None);
    samples
        .record_usage(NODE, &usage(10_000, 4), at(1_000), Some(capacity))
        .unwrap();
    // 25,001 ms of CPU in 10 s is 2,500.1 millicores: 2 CPUs and 25 % is 2,500.
    assert_eq!(
        samples.record_shared(&shared(NODE, 35_010, 11_000), Some(capacity), now),
        Err(SampleRefused::CpuAboveCapacity {
            rate_millis: 2_501,
            capacity_millis: 2_000
        })
    );
    assert_eq!(
        samples.get(NODE).map(|s| s.timestamp_ms),
        Some(1_000),
        "held"
    );
    assert_eq!(
        samples.record_shared(&shared(NODE, 35_000, 11_000), Some(capacity), now),
        Ok(true),
        "2,500 millicores is within"
    );
    assert_eq!(
        samples.record_shared(&shared(NODE, 1_000_000, 12_000), Some(capacity), now),
        Ok(true),
        "over 1 s the rate is not judged"
    );
    assert_eq!(
        samples.record_shared(&shared(NODE, 5, 30_000), Some(capacity), now),
        Ok(true),
        "a counter reset (a reboot) is not judged"
    );
    assert_eq!(
        samples.record_shared(&shared(NODE, 6, 130_001), Some(capacity), now),
        Err(SampleRefused::FromTheFuture(SampleFromTheFuture {
            ahead_ms: 30_001
        }))
    );
    assert_eq!(samples.get(NODE).map(|s| s.cpu_usage_ms), Some(5));
}

/// Capacity is read from a NodeStatus's quantities as Kubernetes writes them; without
/// either figure, or with one that does not parse, there is none.
#[test]
fn capacity_is_read_from_the_nodes_quantities() {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let map = |cpu: &str, memory: &str| {
        [("cpu", cpu), ("memory", memory), ("pods", "110")]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(
        Capacity::of(&map("4", "8029908Ki")),
        Some(Capacity {
            cpu_millis: 4_000,
            memory_bytes: 8_029_908 * 1024
        })
    );
    assert_eq!(
        Capacity::of(&map("3900m", "2Gi")),
        Some(Capacity {
            cpu_millis: 3_900,
            memory_bytes: 2 << 30
        })
    );
    assert_eq!(Capacity::of(&map("4", "")), None);
    assert_eq!(Capacity::of(&map("four", "1Gi")), None);
}

/// A user allowed on every node (metrics-server's ClusterRole) is reviewed once for a
/// whole fleet (the review without a name), never per node; a user allowed on one node only
/// is reviewed per node after the every-node review says no, and refused elsewhere.
#[tokio::test(start_paused = true)]
async fn a_user_allowed_on_every_node_is_reviewed_once_not_per_node() {
    let bench = Bench::new(
        Fake::default()
            .with_token("alice-token", "alice")
            .with_token("bob-token", "bob"),
    );
    bench.fake.allow("alice", "");
    for i in 0..50 {
        let node = format!("edge-{i:02}");
        bench.samples.record(&node, served_sample());
        let (status, _, _) = bench
            .call(
                Method::GET,
                &format!("/nodes/{node}/metrics/resource"),
                &[ALICE],
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{node}");
    }
    assert_eq!(bench.fake.every_node_reviews.load(Ordering::SeqCst), 1);
    assert_eq!(bench.fake.calls(), (1, 0), "no review per node");

    bench.fake.allow("bob", "edge-01");
    let bob = ("authorization", "Bearer bob-token");
    let (status, _, _) = bench
        .call(Method::GET, "/nodes/edge-01/metrics/resource", &[bob])
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = bench
        .call(Method::GET, "/nodes/edge-02/metrics/resource", &[bob])
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        bench.fake.every_node_reviews.load(Ordering::SeqCst),
        2,
        "bob's every-node answer (no) is cached"
    );
    assert_eq!(bench.fake.calls(), (2, 2), "then one review per node");
}

/// A sample dated beyond the clock window ahead is refused, whatever its date; one from the
/// past, or within the window, is for the freshness rule to judge.
#[test]
fn a_sample_from_the_future_is_refused() {
    let now = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let now_ms = 1_800_000_000_000;
    assert_eq!(check_sample_time(now_ms, now), Ok(()));
    assert_eq!(check_sample_time(now_ms + 30_000, now), Ok(()));
    assert_eq!(check_sample_time(0, now), Ok(()));
    assert_eq!(check_sample_time(i64::MIN, now), Ok(()));
    assert_eq!(
        check_sample_time(now_ms + 30_001, now),
        Err(SampleFromTheFuture { ahead_ms: 30_001 })
    );
    assert_eq!(
        check_sample_time(i64::MAX - 1, now),
        Err(SampleFromTheFuture {
            ahead_ms: i128::from(i64::MAX - 1) - i128::from(now_ms)
        })
    );
}
