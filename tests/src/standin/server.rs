//! HTTP/1.1 serving: accept loop, the request pipeline (record, latency, faults), routing
//! and the REST handlers, including streaming watches.

use parking_lot::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioExecutor;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};

use super::discovery;
use super::kinds::{Kind, Sub, meta};
use super::query::{Query, Selectors};
use super::smp;
use super::status::ApiError;
use super::store::{Store, WatchRecord};
use super::table::{self, IncludeObject};
use super::user::UserInfo;
use super::validation::{FieldError, check_micro_times, q as quote};
use super::{FaultAction, RecordedRequest};

/// The kube-apiserver's default request body limit (3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// State shared by the server tasks and every handle.
pub(crate) struct Shared {
    store: Mutex<Store>,
    /// Requests being served (for the overload mode).
    inflight: std::sync::atomic::AtomicUsize,
    /// TCP connections accepted.
    pub(crate) connections: std::sync::atomic::AtomicUsize,
    /// TCP connections open now.
    pub(crate) open: std::sync::atomic::AtomicUsize,
    /// Bumped after every state change (objects, requests, faults): wakes `wait_until`.
    pub(crate) changed: watch::Sender<u64>,
    pub(crate) shutdown: watch::Sender<bool>,
    pub(crate) addr: SocketAddr,
}

impl Shared {
    pub(crate) fn new(addr: SocketAddr) -> Self {
        Shared {
            store: Mutex::new(Store::new()),
            inflight: std::sync::atomic::AtomicUsize::new(0),
            connections: std::sync::atomic::AtomicUsize::new(0),
            open: std::sync::atomic::AtomicUsize::new(0),
            changed: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
            addr,
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock()
    }

    /// Runs `f` on the store, then wakes waiters.
    pub(crate) fn mutate<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        let r = f(&mut self.lock());
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
        r
    }
}

/// kube-apiserver's default `--http2-max-streams-per-connection`.
pub const MAX_STREAMS: u32 = 100;

/// The service error that makes hyper close the connection without a response.
#[derive(Debug)]
pub(crate) struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stand-in: connection dropped by an injected fault")
    }
}

impl std::error::Error for DropConnection {}

async fn wait_shutdown(rx: &mut watch::Receiver<bool>) {
    // An error means every sender is gone: treat that as shutdown too.
    let _ = rx.wait_for(|down| *down).await;
}

/// Accepts connections until shutdown; each connection shuts down gracefully with it.
pub(crate) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let accepted = tokio::select! {
            _ = wait_shutdown(&mut shutdown) => break,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!("stand-in accept failed: {e}");
                // Out of descriptors and the like: do not spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        shared
            .connections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        shared
            .open
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let shared = shared.clone();
        let mut conn_shutdown = shared.shutdown.subscribe();
        tokio::spawn(async move {
            let served = shared.clone();
            let svc = hyper::service::service_fn(move |req| handle(served.clone(), req));
            // HTTP/1.1 and HTTP/2 (prior knowledge) on one port, as kube-apiserver serves
            // both (over TLS, by ALPN); at most 100 streams per HTTP/2 connection, its
            // default `--http2-max-streams-per-connection`.
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder.http2().max_concurrent_streams(MAX_STREAMS);
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = wait_shutdown(&mut conn_shutdown) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.as_mut().await;
                }
            }
            shared
                .open
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        });
    }
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, DropConnection> {
    let (parts, body) = req.into_parts();
    let mut record = RecordedRequest {
        method: parts.method.clone(),
        path: parts.uri.path().to_string(),
        query: parts
            .uri
            .query()
            .filter(|q| !q.is_empty())
            .map(str::to_string),
        content_type: header_str(&parts.headers, "content-type"),
        body: Bytes::new(),
        impersonate_user: header_str(&parts.headers, "impersonate-user"),
        impersonate_groups: parts
            .headers
            .get_all("impersonate-group")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect(),
        status: 0,
        warnings: Vec::new(),
        version: parts.version,
    };
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            let resp = error_response(&ApiError::too_large());
            record.status = resp.status().as_u16();
            shared.mutate(|s| s.record(record));
            return Ok(resp);
        }
        // The client went away mid-body: nothing to answer.
        Err(_) => return Err(DropConnection),
    };
    record.body = body.clone();

    let (latency, max_inflight) = {
        let store = shared.lock();
        (store.latency, store.max_inflight)
    };
    let inflight = Inflight::enter(&shared);
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    // Overload (API Priority and Fairness rejecting what it cannot queue): 429 with
    // Retry-After, touching no state.
    let overloaded = max_inflight.is_some_and(|max| inflight.count > max);
    let fault = if overloaded {
        Some(FaultAction::Status(429))
    } else {
        shared.mutate(|s| s.take_fault(&parts.method, parts.uri.path()))
    };
    let resp = match fault {
        Some(FaultAction::Drop) => {
            tracing::debug!(method = %parts.method, path = parts.uri.path(), "stand-in: dropping connection");
            shared.mutate(|s| s.record(record));
            return Err(DropConnection);
        }
        Some(FaultAction::Status(code)) => {
            let target = match route(parts.uri.path()) {
                Route::Resource(r) => r.name.map(|n| (r.kind, n)),
                _ => None,
            };
            error_response(&ApiError::injected(
                code,
                target.as_ref().map(|(k, n)| (*k, n.as_str())),
            ))
        }
        None => {
            let user = UserInfo::from_headers(&parts.headers);
            dispatch(
                &shared,
                &parts.method,
                &parts.uri,
                &parts.headers,
                &body,
                &user,
            )
        }
    };
    record.status = resp.status().as_u16();
    record.warnings = resp
        .headers()
        .get_all(header::WARNING)
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    tracing::debug!(method = %record.method, path = %record.path, status = record.status, "stand-in");
    shared.mutate(|s| s.record(record));
    Ok(resp)
}

/// One request in flight, counted in [`Shared::inflight`] until dropped.
struct Inflight<'a> {
    shared: &'a Shared,
    /// Requests in flight including this one, when it entered.
    count: usize,
}

impl<'a> Inflight<'a> {
    fn enter(shared: &'a Shared) -> Self {
        let count = shared
            .inflight
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        Self { shared, count }
    }
}

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        self.shared
            .inflight
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

fn full(bytes: Bytes) -> Body {
    UnsyncBoxBody::new(Full::new(bytes))
}

fn json_response(code: u16, value: &Value, warnings: &[String]) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(full(Bytes::from(body)));
    *resp.status_mut() =
        http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    for w in warnings {
        let text = format!("299 - {}", quote(&format!("unknown field {}", quote(w))));
        if let Ok(v) = HeaderValue::from_str(&text) {
            h.append(header::WARNING, v);
        }
    }
    resp
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut resp = json_response(e.code, &e.to_json(), &[]);
    if let Some(ra) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&ra.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

/// A parsed request path.
#[derive(Debug)]
enum Route {
    Version,
    ApiVersions,
    CoreResources,
    ApiGroups,
    /// `/apis/<group>` of a served group.
    Group(&'static str),
    /// `/apis/<group>/v1` of a served group.
    GroupResources(&'static str),
    Resource(ResourcePath),
    /// `/apis/authorization.k8s.io/v1/subjectaccessreviews` ([`subject_access_review`]).
    SubjectAccessReviews,
    NotFound,
}

#[derive(Debug)]
struct ResourcePath {
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
    sub: Sub,
}

fn route(path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let served = |g: &str| discovery::GROUPS.into_iter().find(|s| *s == g);
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["api"] => Route::ApiVersions,
        ["api", "v1"] => Route::CoreResources,
        ["apis"] => Route::ApiGroups,
        ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"] => {
            Route::SubjectAccessReviews
        }
        ["apis", group] => served(group).map_or(Route::NotFound, Route::Group),
        ["apis", group, "v1"] => served(group).map_or(Route::NotFound, Route::GroupResources),
        ["api", "v1", rest @ ..] => resource_route("", rest),
        ["apis", group, "v1", rest @ ..] => resource_route(group, rest),
        _ => Route::NotFound,
    }
}

fn resource_route(group: &str, rest: &[&str]) -> Route {
    let kind = |r: &str| Kind::from_group_resource(group, r);
    let r = |kind: Kind, ns: Option<&str>, name: Option<&str>, sub: Sub| {
        Route::Resource(ResourcePath {
            kind,
            namespace: ns.map(str::to_string),
            name: name.map(str::to_string),
            sub,
        })
    };
    let subresource = |k: Kind, s: &str| k.subresources().iter().copied().find(|x| x.name() == s);
    match rest {
        [res] => kind(res).map_or(Route::NotFound, |k| r(k, None, None, Sub::Main)),
        ["namespaces", ns, res] => match kind(res) {
            Some(k) if k.namespaced() => r(k, Some(ns), None, Sub::Main),
            _ => Route::NotFound,
        },
        ["namespaces", ns, res, name] => match kind(res) {
            Some(k) if k.namespaced() => r(k, Some(ns), Some(name), Sub::Main),
            _ => Route::NotFound,
        },
        [res, name] => match kind(res) {
            Some(k) if !k.namespaced() => r(k, None, Some(name), Sub::Main),
            _ => Route::NotFound,
        },
        [res, name, sub] => match kind(res) {
            Some(k) if !k.namespaced() => {
                subresource(k, sub).map_or(Route::NotFound, |s| r(k, None, Some(name), s))
            }
            _ => Route::NotFound,
        },
        _ => Route::NotFound,
    }
}

/// How a GET answer is rendered, from the Accept header.
#[derive(Clone, Copy, Debug)]
enum Render {
    Object,
    Table(&'static str),
    PartialMetadata,
}

fn negotiate(headers: &HeaderMap) -> Result<Render, ApiError> {
    let accept = header_str(headers, "accept").unwrap_or_default();
    if accept.trim().is_empty() {
        return Ok(Render::Object);
    }
    for clause in accept.split(',') {
        let mut parts = clause.split(';').map(str::trim);
        let mime = parts.next().unwrap_or("").to_ascii_lowercase();
        if !matches!(mime.as_str(), "application/json" | "*/*" | "application/*") {
            continue;
        }
        let params: Vec<(String, String)> = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| {
                (
                    k.trim().to_ascii_lowercase(),
                    v.trim().trim_matches('"').to_string(),
                )
            })
            .collect();
        let param = |k: &str| {
            params
                .iter()
                .find(|(pk, _)| pk == k)
                .map(|(_, v)| v.as_str())
        };
        match (param("as"), param("g"), param("v")) {
            (None, _, _) => return Ok(Render::Object),
            (Some("Table"), Some("meta.k8s.io"), Some("v1")) => {
                return Ok(Render::Table("meta.k8s.io/v1"));
            }
            (Some("Table"), Some("meta.k8s.io"), Some("v1beta1")) => {
                return Ok(Render::Table("meta.k8s.io/v1beta1"));
            }
            (
                Some("PartialObjectMetadata" | "PartialObjectMetadataList"),
                Some("meta.k8s.io"),
                Some("v1"),
            ) => {
                return Ok(Render::PartialMetadata);
            }
            _ => continue,
        }
    }
    Err(ApiError::not_acceptable(
        "only the following media types are accepted: application/json",
    ))
}

/// Serves one request. `user` is who the request is made as (what a CSR records as its
/// requester); nothing is authorized or admitted by it.
fn dispatch(
    shared: &Arc<Shared>,
    method: &Method,
    uri: &http::Uri,
    headers: &HeaderMap,
    body: &Bytes,
    user: &UserInfo,
) -> Response<Body> {
    let r = route(uri.path());
    let get_only = |v: Value| {
        if method == Method::GET {
            json_response(200, &v, &[])
        } else {
            error_response(&ApiError::method_not_allowed())
        }
    };
    match r {
        Route::Version => get_only(discovery::version()),
        Route::ApiVersions => get_only(discovery::api_versions(shared.addr)),
        Route::CoreResources => get_only(discovery::core_resources()),
        Route::ApiGroups => get_only(discovery::api_groups()),
        Route::Group(group) => get_only(discovery::group(group)),
        Route::GroupResources(group) => get_only(discovery::group_resources(group)),
        Route::NotFound => error_response(&ApiError::path_not_found()),
        Route::SubjectAccessReviews if method == Method::POST => {
            subject_access_review(headers, body).unwrap_or_else(|e| error_response(&e))
        }
        Route::SubjectAccessReviews => error_response(&ApiError::method_not_allowed()),
        Route::Resource(rp) => {
            let q = Query::parse(uri.query());
            resource(shared, method, &rp, &q, headers, body, user)
                .unwrap_or_else(|e| error_response(&e))
        }
    }
}

/// `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`, what a kubelet (or the
/// gateway's resource metrics server) asks with `--authorization-mode=Webhook`: the review
/// echoed back with `status: {allowed: true}`, 201 Created. The stand-in is **not an
/// authorizer**: it allows every review (any user, verb, resource or path). It does check
/// the spec as the real server does before deciding (`pkg/apis/authorization/validation:
/// ValidateSubjectAccessReview`, 422 `SubjectAccessReview.authorization.k8s.io "" is
/// invalid`): exactly one of `resourceAttributes` and `nonResourceAttributes`, a user or a
/// group, and an empty `metadata`. JSON bodies only; the group is not listed in discovery.
fn subject_access_review(headers: &HeaderMap, body: &[u8]) -> Result<Response<Body>, ApiError> {
    if mime(headers) != "application/json" {
        return Err(ApiError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: application/json",
        ));
    }
    let mut review: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })?;
    let Some(object) = review.as_object_mut() else {
        return Err(ApiError::bad_request(
            "couldn't get version/kind; json parse error: the body is not a JSON object",
        ));
    };
    let spec = object.get("spec").cloned().unwrap_or(Value::Null);
    let present = |key: &str| spec.get(key).is_some_and(|v| !v.is_null());
    let text = |key: &str| spec.get(key).and_then(Value::as_str).unwrap_or_default();
    let mut errs = Vec::new();
    match (
        present("resourceAttributes"),
        present("nonResourceAttributes"),
    ) {
        (true, true) => errs.push(FieldError::invalid(
            "spec.nonResourceAttributes",
            spec["nonResourceAttributes"].to_string(),
            "cannot be specified in combination with resourceAttributes",
        )),
        (false, false) => errs.push(FieldError::invalid(
            "spec.resourceAttributes",
            "null",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
        _ => {}
    }
    let no_groups = spec
        .get("groups")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if text("user").is_empty() && no_groups {
        errs.push(FieldError::invalid(
            "spec.user",
            quote(text("user")),
            "at least one of user or group must be specified",
        ));
    }
    if object
        .get("metadata")
        .and_then(Value::as_object)
        .is_some_and(|m| m.values().any(|v| !v.is_null()))
    {
        errs.push(FieldError::invalid("metadata", "{}", "must be empty"));
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            "SubjectAccessReview.authorization.k8s.io",
            "authorization.k8s.io",
            "SubjectAccessReview",
            "",
            &errs,
        ));
    }
    object.insert("apiVersion".into(), "authorization.k8s.io/v1".into());
    object.insert("kind".into(), "SubjectAccessReview".into());
    object.insert("metadata".into(), json!({}));
    object.insert(
        "status".into(),
        json!({"allowed": true, "reason": "the stand-in apiserver allows every review"}),
    );
    Ok(json_response(201, &review, &[]))
}

/// `fieldValidation`: Warn is the server default.
#[derive(Clone, Copy, PartialEq, Eq)]
enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

fn field_validation(q: &Query) -> FieldValidation {
    match q.get("fieldValidation") {
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        _ => FieldValidation::Warn,
    }
}

fn mime(headers: &HeaderMap) -> String {
    header_str(headers, "content-type")
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn strict_error(unknown: &[String]) -> String {
    format!(
        "strict decoding error: {}",
        unknown
            .iter()
            .map(|f| format!("unknown field {}", quote(f)))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Decodes a POST/PUT body (JSON only; any other media type, protobuf included, is 415
/// UnsupportedMediaType): a body that does not decode is 400 BadRequest, as the real
/// server's decoder answers (`<Kind> in version "v1" cannot be handled as a <Kind>: …`).
fn decode_body(
    kind: Kind,
    headers: &HeaderMap,
    body: &[u8],
    fv: FieldValidation,
) -> Result<(Value, Vec<String>), ApiError> {
    let cannot = |e: String| {
        ApiError::bad_request(format!(
            "{k} in version \"v1\" cannot be handled as a {k}: {e}",
            k = kind.kind()
        ))
    };
    let raw: Value = match mime(headers).as_str() {
        "application/json" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?,
        _ => {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: application/json",
            ));
        }
    };
    if !raw.is_object() {
        return Err(ApiError::bad_request(
            "couldn't get version/kind; json parse error: the body is not a JSON object",
        ));
    }
    check_micro_times(kind, &raw).map_err(cannot)?;
    let (obj, unknown) = kind.normalize(&raw).map_err(cannot)?;
    if fv == FieldValidation::Strict && !unknown.is_empty() {
        return Err(ApiError::bad_request(strict_error(&unknown)));
    }
    Ok((
        obj,
        if fv == FieldValidation::Warn {
            unknown
        } else {
            Vec::new()
        },
    ))
}

fn dry_run(q: &Query) -> bool {
    q.get("dryRun") == Some("All")
}

fn strip_type_meta(mut v: Value) -> Value {
    if let Some(m) = v.as_object_mut() {
        m.remove("kind");
        m.remove("apiVersion");
    }
    v
}

fn resource(
    shared: &Arc<Shared>,
    method: &Method,
    rp: &ResourcePath,
    q: &Query,
    headers: &HeaderMap,
    body: &Bytes,
    user: &UserInfo,
) -> Result<Response<Body>, ApiError> {
    let kind = rp.kind;
    let ns = rp.namespace.as_deref();
    let sub = rp.sub;
    match (&rp.name, method) {
        (None, &Method::GET) => {
            let render = negotiate(headers)?;
            if q.flag("watch") {
                start_watch(shared, kind, ns, q, render)
            } else {
                list(shared, kind, ns, q, render)
            }
        }
        (None, &Method::POST) if kind.namespaced() == ns.is_some() => {
            let fv = field_validation(q);
            let (obj, warnings) = decode_body(kind, headers, body, fv)?;
            let created = shared.mutate(|s| s.create(kind, ns, obj, dry_run(q), user))?;
            Ok(json_response(201, &created, &warnings))
        }
        (Some(name), &Method::GET) => {
            let render = negotiate(headers)?;
            let store = shared.lock();
            let obj = store
                .get(kind, ns, name)
                .cloned()
                .ok_or_else(|| ApiError::not_found(kind, name))?;
            drop(store);
            render_one(kind, &obj, render, q)
        }
        (Some(name), &Method::PUT) if kind.writable() => {
            let fv = field_validation(q);
            let (obj, warnings) = decode_body(kind, headers, body, fv)?;
            let (code, stored) =
                shared.mutate(|s| s.update(kind, ns, name, obj, sub, dry_run(q), false, user))?;
            Ok(json_response(code, &stored, &warnings))
        }
        (Some(name), &Method::PATCH) if kind.writable() => {
            patch(shared, kind, ns, name, sub, q, headers, body, user)
        }
        (Some(name), &Method::DELETE) if sub == Sub::Main && kind.writable() => {
            let opts: Value = if body.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
            };
            let pre_uid = opts.pointer("/preconditions/uid").and_then(Value::as_str);
            let pre_rv = opts
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str);
            let dry = dry_run(q)
                || opts
                    .get("dryRun")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|v| v == "All"));
            let status = shared.mutate(|s| s.delete(kind, ns, name, pre_uid, pre_rv, dry))?;
            Ok(json_response(200, &status, &[]))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

fn render_one(
    kind: Kind,
    obj: &Value,
    render: Render,
    q: &Query,
) -> Result<Response<Body>, ApiError> {
    Ok(match render {
        Render::Object => json_response(200, obj, &[]),
        Render::PartialMetadata => json_response(200, &table::partial_metadata(obj), &[]),
        Render::Table(api_version) => {
            let include =
                IncludeObject::parse(q.get("includeObject")).map_err(ApiError::bad_request)?;
            let rv = meta::resource_version(obj).to_string();
            json_response(
                200,
                &table::table(kind, std::slice::from_ref(obj), &rv, include, api_version),
                &[],
            )
        }
    })
}

fn list(
    shared: &Arc<Shared>,
    kind: Kind,
    ns: Option<&str>,
    q: &Query,
    render: Render,
) -> Result<Response<Body>, ApiError> {
    let sel = Selectors::parse(kind, q).map_err(ApiError::bad_request)?;
    let (items, rv) = {
        let store = shared.lock();
        (store.list(kind, ns, &sel), store.rv.to_string())
    };
    let body = match render {
        Render::Object => json!({
            "kind": format!("{}List", kind.kind()),
            "apiVersion": kind.api_version(),
            "metadata": {"resourceVersion": rv},
            "items": items.into_iter().map(strip_type_meta).collect::<Vec<_>>(),
        }),
        Render::PartialMetadata => json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": rv},
            "items": items.iter().map(table::partial_metadata).collect::<Vec<_>>(),
        }),
        Render::Table(api_version) => {
            let include =
                IncludeObject::parse(q.get("includeObject")).map_err(ApiError::bad_request)?;
            table::table(kind, &items, &rv, include, api_version)
        }
    };
    Ok(json_response(200, &body, &[]))
}

#[allow(clippy::too_many_arguments)]
fn patch(
    shared: &Arc<Shared>,
    kind: Kind,
    ns: Option<&str>,
    name: &str,
    sub: Sub,
    q: &Query,
    headers: &HeaderMap,
    body: &Bytes,
    user: &UserInfo,
) -> Result<Response<Body>, ApiError> {
    #[derive(Clone, Copy)]
    enum PatchType {
        Strategic,
        Merge,
        Json,
    }
    let pt = match mime(headers).as_str() {
        "application/strategic-merge-patch+json" => PatchType::Strategic,
        "application/merge-patch+json" => PatchType::Merge,
        "application/json-patch+json" => PatchType::Json,
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
            return Err(ApiError::unsupported_media_type(
                "the edgebeat stand-in does not implement server-side apply; accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json",
            ));
        }
        _ => {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json",
            ));
        }
    };
    let patch_json: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let patch_text = String::from_utf8_lossy(body).into_owned();
    let invalid_patch = |msg: String| {
        ApiError::invalid(
            "",
            "",
            "",
            "",
            &[FieldError::invalid("patch", quote(&patch_text), msg)],
        )
    };
    let fv = field_validation(q);
    let dry = dry_run(q);
    shared.mutate(|s| {
        let current = s
            .get(kind, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(kind, name))?;
        let patched = match pt {
            PatchType::Strategic => smp::strategic_merge(kind.merge_lists(), &current, &patch_json)
                .map_err(|e| match e {
                    smp::SmpError::BadRequest(m) => ApiError::bad_request(m),
                    smp::SmpError::Unprocessable(m) => {
                        let mut e = ApiError::unclassified(m);
                        e.code = 422;
                        e.reason = "Invalid";
                        e
                    }
                    smp::SmpError::Internal(m) => ApiError::unclassified(m),
                })?,
            PatchType::Merge => {
                if !patch_json.is_object() {
                    return Err(ApiError::bad_request("Invalid JSON Patch"));
                }
                let mut doc = current.clone();
                json_patch::merge(&mut doc, &patch_json);
                doc
            }
            PatchType::Json => {
                let ops: json_patch::Patch = serde_json::from_value(patch_json.clone())
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
                let mut doc = current.clone();
                json_patch::patch(&mut doc, &ops).map_err(|e| {
                    let mut err = ApiError::unclassified(e.to_string());
                    err.code = 422;
                    err.reason = "Invalid";
                    err
                })?;
                doc
            }
        };
        check_micro_times(kind, &patched).map_err(invalid_patch)?;
        let (obj, unknown) = kind.normalize(&patched).map_err(invalid_patch)?;
        if fv == FieldValidation::Strict && !unknown.is_empty() {
            return Err(invalid_patch(strict_error(&unknown)));
        }
        let (_, stored) = s.update(kind, ns, name, obj, sub, dry, true, user)?;
        let warnings = if fv == FieldValidation::Warn {
            unknown
        } else {
            Vec::new()
        };
        Ok(json_response(200, &stored, &warnings))
    })
}

/// What a watch sends and how.
struct WatchFilter {
    kind: Kind,
    namespace: Option<String>,
    selectors: Selectors,
    render: Render,
    include: IncludeObject,
}

impl WatchFilter {
    fn encode(&self, event: &str, obj: &Value) -> Bytes {
        let object = match self.render {
            Render::Object => obj.clone(),
            Render::PartialMetadata => table::partial_metadata(obj),
            Render::Table(api_version) => table::table(
                self.kind,
                std::slice::from_ref(obj),
                meta::resource_version(obj),
                self.include,
                api_version,
            ),
        };
        watch_line(event, &object)
    }

    /// The event this watcher sees for `rec`, if any (selector transitions turn MODIFIED
    /// into ADDED or DELETED, as the watch cache does).
    fn apply(&self, rec: &WatchRecord) -> Option<Bytes> {
        if rec.kind != self.kind
            || self
                .namespace
                .as_ref()
                .is_some_and(|ns| *ns != rec.namespace)
        {
            return None;
        }
        let now = self.selectors.matches(self.kind, &rec.object);
        let event = match rec.event {
            "MODIFIED" => {
                let before = rec
                    .prev
                    .as_ref()
                    .is_some_and(|p| self.selectors.matches(self.kind, p));
                match (before, now) {
                    (true, true) => "MODIFIED",
                    (false, true) => "ADDED",
                    (true, false) => "DELETED",
                    (false, false) => return None,
                }
            }
            other if now => other,
            _ => return None,
        };
        Some(self.encode(event, &rec.object))
    }
}

struct WatchState {
    pending: VecDeque<Bytes>,
    rx: broadcast::Receiver<Arc<WatchRecord>>,
    shutdown: watch::Receiver<bool>,
    deadline: Option<tokio::time::Instant>,
    filter: WatchFilter,
    done: bool,
}

impl WatchState {
    async fn next(&mut self) -> Option<Bytes> {
        if let Some(b) = self.pending.pop_front() {
            return Some(b);
        }
        if self.done {
            return None;
        }
        loop {
            let deadline = self.deadline;
            let timeout = async move {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending::<()>().await,
                }
            };
            let item = tokio::select! {
                // Events committed before a shutdown are still delivered.
                biased;
                r = self.rx.recv() => r,
                _ = wait_shutdown(&mut self.shutdown) => return None,
                _ = timeout => return None,
            };
            match item {
                Ok(rec) => {
                    if let Some(b) = self.filter.apply(&rec) {
                        return Some(b);
                    }
                }
                // Fell too far behind, or the store is gone: end the watch; clients re-list.
                Err(_) => return None,
            }
        }
    }
}

fn start_watch(
    shared: &Arc<Shared>,
    kind: Kind,
    ns: Option<&str>,
    q: &Query,
    render: Render,
) -> Result<Response<Body>, ApiError> {
    let selectors = Selectors::parse(kind, q).map_err(ApiError::bad_request)?;
    let include = IncludeObject::parse(q.get("includeObject")).map_err(ApiError::bad_request)?;
    let rv_param = q.get("resourceVersion").unwrap_or("");
    let send_initial = q.flag("sendInitialEvents");
    let deadline = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let filter = WatchFilter {
        kind,
        namespace: ns.map(str::to_string),
        selectors,
        render,
        include,
    };
    let mut pending = VecDeque::new();
    let mut done = false;
    let rx = {
        let store = shared.lock();
        // Subscribing under the lock: nothing committed after the snapshot is missed.
        let rx = store.subscribe();
        if send_initial || rv_param.is_empty() || rv_param == "0" {
            for obj in store.list(kind, ns, &filter.selectors) {
                pending.push_back(filter.encode("ADDED", &obj));
            }
            if send_initial {
                let bookmark = json!({
                    "kind": kind.kind(),
                    "apiVersion": kind.api_version(),
                    "metadata": {
                        "resourceVersion": store.rv.to_string(),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                });
                pending.push_back(watch_line("BOOKMARK", &bookmark));
            }
        } else {
            let since: u64 = rv_param.parse().map_err(|_| {
                ApiError::bad_request(format!("invalid resource version: {}", quote(rv_param)))
            })?;
            if since < store.compacted_rv {
                let mut gone = ApiError::unclassified(format!(
                    "too old resource version: {since} ({})",
                    store.compacted_rv + 1
                ));
                gone.code = 410;
                gone.reason = "Expired";
                pending.push_back(watch_line("ERROR", &gone.to_json()));
                done = true;
            } else {
                pending.extend(store.history_after(since).filter_map(|r| filter.apply(r)));
            }
        }
        rx
    };
    let state = WatchState {
        pending,
        rx,
        shutdown: shared.shutdown.subscribe(),
        deadline,
        filter,
        done,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        let next = st.next().await?;
        Some((Ok::<_, Infallible>(Frame::data(next)), st))
    });
    let mut resp = Response::new(UnsyncBoxBody::new(StreamBody::new(stream)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}

/// One line of a watch stream: `{"type":…,"object":…}` and a newline, `type` first as
/// kube-apiserver writes it (`metav1.WatchEvent`, whose fields are `Type` then `Object`:
/// `staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/watch.go`). A client that reads the
/// event as a tagged enum (kube-rs' `WatchEvent`) parses the object directly when the tag
/// comes first, and must buffer the whole object otherwise; `json!` would sort the keys,
/// `object` first, and make every watch event cost the gateway more than kube-apiserver's.
fn watch_line(event: &str, object: &Value) -> Bytes {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        #[serde(rename = "type")]
        type_: &'a str,
        object: &'a Value,
    }
    let mut line = serde_json::to_vec(&Line {
        type_: event,
        object,
    })
    .unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    use kube::api::{Api, PostParams};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn subject_access_reviews_are_allowed_after_validation() {
        let standin = crate::standin::StandIn::start().await.unwrap();
        let client =
            kube::Client::try_from(kube::Config::new(standin.url().parse().unwrap())).unwrap();
        let reviews: Api<SubjectAccessReview> = Api::all(client);
        let asked = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some("system:serviceaccount:kube-system:metrics-server".into()),
                groups: Some(vec!["system:authenticated".into()]),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some("get".into()),
                    resource: Some("nodes".into()),
                    subresource: Some("metrics".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &asked)
            .await
            .unwrap();
        assert_eq!(answer.spec, asked.spec);
        assert!(answer.status.unwrap().allowed);

        // Neither attributes nor a user: 422, as the real server's validation.
        let invalid = SubjectAccessReview::default();
        match reviews.create(&PostParams::default(), &invalid).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{status:?}");
                assert!(
                    status
                        .message
                        .contains("exactly one of nonResourceAttributes or resourceAttributes"),
                    "{status:?}"
                );
            }
            other => panic!("expected 422, got {other:?}"),
        }
        let counts = standin.request_counts();
        assert_eq!(
            counts.get("POST subjectaccessreviews 201"),
            Some(&1),
            "{counts:?}"
        );
        assert_eq!(
            counts.get("POST subjectaccessreviews 422"),
            Some(&1),
            "{counts:?}"
        );
        standin.shutdown();
    }
}
