//! Who may read a node's resource metrics: kubelet's authentication and authorization of
//! its HTTPS API, delegated to the apiserver as kubelet does it with `--client-ca-file`,
//! `--authentication-token-webhook` and `--authorization-mode=Webhook` (kubeadm's
//! defaults; `cmd/kubelet/app/auth.go`).
//!
//! **Authentication** (`k8s.io/apiserver` `pkg/authentication/authenticatorfactory/
//! delegating.go`: x509 first, then bearer tokens; anonymous requests are refused, the
//! default of a kubelet configured by file):
//!
//! 1. A client certificate that chains to the client CA (rustls checked the chain, validity
//!    and client-auth usage in the handshake) names the user: subject CN, groups = subject
//!    O values, uid = the subject's `1.3.6.1.4.1.57683.2` attribute when present, extra
//!    `authentication.kubernetes.io/credential-id: X509SHA256=<hex>`
//!    (`pkg/authentication/request/x509/x509.go: CommonNameUserConversion`). A certificate
//!    without CN authenticates no one; the request may still carry a token.
//! 2. Else `Authorization: Bearer <token>` (`pkg/authentication/request/bearertoken`) is
//!    checked by a `TokenReview` (`plugin/pkg/authenticator/token/webhook`): the user is
//!    `status.user` (username, uid, groups, extra) when `status.authenticated`.
//! 3. Else the request is unauthenticated (`401`).
//!
//! Every authenticated user also gets the group `system:authenticated`
//! (`pkg/authentication/group/authenticated_group_adder.go`).
//!
//! **Authorization**: a `SubjectAccessReview` for the user and `get` on the `metrics`
//! subresource of the node (`pkg/kubelet/server/auth.go: GetRequestAttributes`;
//! `plugin/pkg/authorizer/webhook`): allowed serves, anything else is `403`. One replica
//! answers for thousands of nodes where kubelet answers for one, so it asks first whether
//! the user may get the `metrics` of every node (the same review without a name): RBAC
//! matches a review without a name only by a rule without `resourceNames`, which allows
//! every name (`pkg/apis/rbac/v1/evaluation_helpers.go: ResourceNameMatches`), so "allowed"
//! there means allowed on each node. metrics-server's and Prometheus's ClusterRoles are
//! such rules: their scrapes of a whole fleet cost one review per user per [`ALLOWED_TTL`],
//! not one per node. A user allowed on some nodes only is then reviewed per node.
//!
//! **Caches**, as kubelet's defaults (`pkg/kubelet/apis/config/v1beta1/defaults.go`):
//! TokenReview answers by the token's SHA-256, [`TOKEN_TTL`] when authenticated and
//! [`TOKEN_FAILURE_TTL`] when not; SubjectAccessReview answers by user and node (or every
//! node),
//! [`ALLOWED_TTL`] when allowed and [`DENIED_TTL`] when not. Each cache holds at most
//! [`CACHE_ENTRIES`] answers (expired ones, then the oldest, make room). Identical reviews in
//! flight at once are made once and shared, as kubelet's token cache does
//! (`pkg/authentication/token/cache`, singleflight): metrics-server scrapes every node of a
//! replica at once with one token. An apiserver error is never cached and never lets a
//! request through: it answers `500`.
//!
//! **Budgets** ([`super::budget`]; kubelet has none, answering for one node where a replica
//! answers for thousands): every review asked of the apiserver, TokenReview or
//! SubjectAccessReview, first takes one from the budget of the request's source address,
//! then from the replica's (a budget of its own for connections already served a `200`, so
//! that a flood does not stop metrics-server's scrapes when its token's answer expires). A
//! request whose review no budget allows is answered `429 Too Many Requests` with
//! `Retry-After`, without asking the apiserver. Cached answers and reviews joined in flight
//! take nothing: random tokens, which no cache can save, are what the budgets stop.

use std::collections::BTreeMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use edgebeat_transports::enroll::hex;
use edgebeat_transports::log_limit::{LogLimiter, LogLine};

use super::budget::{ReviewBudget, Source};
use super::cache::{ReviewCache, ReviewError};
use super::counters::ResourceMetricsCounters;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

/// How long an authenticated TokenReview answer is reused: kubelet's
/// `authentication.webhook.cacheTTL` default (2 minutes).
pub const TOKEN_TTL: Duration = Duration::from_secs(120);

/// How long a TokenReview answer "not authenticated" is reused: 30 s. (kubelet reuses it
/// for its `cacheTTL` too, 2 minutes; a shorter wait lets a token the apiserver learns late,
/// e.g. a service account token just created, work sooner.)
pub const TOKEN_FAILURE_TTL: Duration = Duration::from_secs(30);

/// How long an allowed SubjectAccessReview answer is reused: kubelet's
/// `authorization.webhook.cacheAuthorizedTTL` default (5 minutes).
pub const ALLOWED_TTL: Duration = Duration::from_secs(300);

/// How long a refused SubjectAccessReview answer is reused: kubelet's
/// `authorization.webhook.cacheUnauthorizedTTL` default (30 s).
pub const DENIED_TTL: Duration = Duration::from_secs(30);

/// Most answers each cache (tokens, access decisions) holds.
pub const CACHE_ENTRIES: usize = 1_000;

/// Longest a TokenReview or SubjectAccessReview may take: kubelet's token webhook timeout
/// (`TokenAccessReviewTimeout`, 10 s). The gateway's kube-rs client bounds no call by
/// itself.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The group every authenticated user is in.
const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// The group of unauthenticated users (an authenticator that names it is not overridden).
const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// The anonymous user, who gets no `system:authenticated`.
const ANONYMOUS_USER: &str = "system:anonymous";
/// The user extra naming the credential (`k8s.io/apiserver` `user.CredentialIDKey`).
const CREDENTIAL_ID_KEY: &str = "authentication.kubernetes.io/credential-id";
/// The subject attribute holding a certificate user's uid
/// (`k8s.io/apiserver` `asn1util.X509UID`).
const UID_OID: &str = "1.3.6.1.4.1.57683.2";

/// The verb, resource and subresource of every authorization check here.
pub(super) const VERB: &str = "get";
pub(super) const RESOURCE: &str = "nodes";
pub(super) const SUBRESOURCE: &str = "metrics";

/// The two apiserver calls kubelet's delegated authentication and authorization make, each
/// a `create` of a review object that comes back with its `status`. Implemented for
/// [`kube::Client`] (the gateway's service account then needs `create` on
/// `tokenreviews.authentication.k8s.io` and `subjectaccessreviews.authorization.k8s.io`:
/// the ClusterRole `system:auth-delegator`), and for `Arc` of any implementation.
pub trait Reviews: Send + Sync {
    /// Creates `review` (a `TokenReview` with `spec.token` set) and returns the apiserver's
    /// answer.
    ///
    /// # Errors
    ///
    /// [`ReviewError::Apiserver`] when the call fails.
    fn token_review(
        &self,
        review: TokenReview,
    ) -> impl Future<Output = Result<TokenReview, ReviewError>> + Send;

    /// Creates `review` (a `SubjectAccessReview` with its `spec` set) and returns the
    /// apiserver's answer.
    ///
    /// # Errors
    ///
    /// [`ReviewError::Apiserver`] when the call fails.
    fn access_review(
        &self,
        review: SubjectAccessReview,
    ) -> impl Future<Output = Result<SubjectAccessReview, ReviewError>> + Send;
}

impl Reviews for kube::Client {
    async fn token_review(&self, review: TokenReview) -> Result<TokenReview, ReviewError> {
        Api::<TokenReview>::all(self.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|error| ReviewError::Apiserver(error.to_string()))
    }

    async fn access_review(
        &self,
        review: SubjectAccessReview,
    ) -> Result<SubjectAccessReview, ReviewError> {
        Api::<SubjectAccessReview>::all(self.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|error| ReviewError::Apiserver(error.to_string()))
    }
}

impl<T: Reviews + ?Sized> Reviews for Arc<T> {
    fn token_review(
        &self,
        review: TokenReview,
    ) -> impl Future<Output = Result<TokenReview, ReviewError>> + Send {
        (**self).token_review(review)
    }

    fn access_review(
        &self,
        review: SubjectAccessReview,
    ) -> impl Future<Output = Result<SubjectAccessReview, ReviewError>> + Send {
        (**self).access_review(review)
    }
}

/// An authenticated user, as `k8s.io/apiserver` `user.Info`: what a SubjectAccessReview is
/// asked about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct User {
    pub(super) name: String,
    /// Empty when the authenticator gives none.
    pub(super) uid: String,
    /// Always holds `system:authenticated` (or `system:unauthenticated`).
    pub(super) groups: Vec<String>,
    pub(super) extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// The user an authenticator named, with `system:authenticated` added unless it is
    /// anonymous or already in it or `system:unauthenticated`
    /// (`pkg/authentication/group/authenticated_group_adder.go`).
    pub(super) fn authenticated(
        name: String,
        uid: String,
        mut groups: Vec<String>,
        extra: BTreeMap<String, Vec<String>>,
    ) -> Self {
        let marked = groups
            .iter()
            .any(|g| g == AUTHENTICATED_GROUP || g == UNAUTHENTICATED_GROUP);
        if name != ANONYMOUS_USER && !marked {
            groups.push(AUTHENTICATED_GROUP.to_owned());
        }
        Self {
            name,
            uid,
            groups,
            extra,
        }
    }
}

/// Why a verified client certificate authenticates no one, as
/// `k8s.io/apiserver` `pkg/authentication/request/x509/x509.go` refuses it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum CertificateUserError {
    /// The certificate does not parse as X.509 (x509-parser's message).
    #[error("the client certificate does not parse: {0}")]
    Parse(String),
    /// Its uid attribute (`1.3.6.1.4.1.57683.2`) is not a string.
    #[error("unable to parse UID into a string")]
    UidNotString,
    /// Its uid attribute is empty.
    #[error("UID cannot be an empty string")]
    EmptyUid,
    /// It has this many uid attributes, where at most one is allowed.
    #[error("expected 1 UID, but found {0}")]
    MultipleUids(usize),
}

/// The user a verified client certificate (the leaf, DER) authenticates
/// (`k8s.io/apiserver` `pkg/authentication/request/x509/x509.go:
/// CommonNameUserConversion`): the subject's CN (the last, as Go's `pkix.Name` keeps it) as
/// name, its O values as groups, its `1.3.6.1.4.1.57683.2` attribute as uid, and
/// `authentication.kubernetes.io/credential-id: X509SHA256=<hex SHA-256 of the DER>` as
/// extra. `Ok(None)` when the subject has no CN (no one is authenticated by it). Chain,
/// validity and key usage were checked by rustls in the handshake.
///
/// # Errors
///
/// [`CertificateUserError`]: why the certificate authenticates no one.
pub(super) fn certificate_user(leaf_der: &[u8]) -> Result<Option<User>, CertificateUserError> {
    use x509_parser::prelude::{FromDer as _, X509Certificate};

    let (_, cert) = X509Certificate::from_der(leaf_der)
        .map_err(|e| CertificateUserError::Parse(e.to_string()))?;
    let subject = cert.subject();
    // Go keeps only string values (and the last CN).
    let Some(name) = subject
        .iter_common_name()
        .filter_map(|attr| attr.as_str().ok())
        .last()
        .filter(|name| !name.is_empty())
    else {
        return Ok(None);
    };
    let groups = subject
        .iter_organization()
        .filter_map(|attr| attr.as_str().ok())
        .map(str::to_owned)
        .collect();
    let uids = subject
        .iter_attributes()
        .filter(|attr| attr.attr_type().to_id_string() == UID_OID)
        .map(|attr| {
            attr.as_str()
                .map_err(|_| CertificateUserError::UidNotString)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let uid = match uids.as_slice() {
        [] => String::new(),
        [""] => return Err(CertificateUserError::EmptyUid),
        [uid] => (*uid).to_owned(),
        more => return Err(CertificateUserError::MultipleUids(more.len())),
    };
    let digest = ring::digest::digest(&ring::digest::SHA256, leaf_der);
    let extra = BTreeMap::from([(
        CREDENTIAL_ID_KEY.to_owned(),
        vec![format!("X509SHA256={}", hex(digest.as_ref()))],
    )]);
    Ok(Some(User::authenticated(
        name.to_owned(),
        uid,
        groups,
        extra,
    )))
}

/// The token of an `Authorization: Bearer <token>` header, as
/// `pkg/authentication/request/bearertoken/bearertoken.go` reads it: the header trimmed, its
/// scheme `Bearer` in any case, the token the second space-separated part; `None` for any
/// other header, or an empty token.
pub(super) fn bearer_token(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .trim();
    let mut parts = value.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// What a SubjectAccessReview answer is cached by: everything it asked but the constant
/// verb and resource.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct AccessKey {
    user: User,
    /// `None`: every node.
    node: Option<String>,
}

/// Kubelet's delegated authentication (of bearer tokens) and authorization, with their
/// caches and the review budgets (see the module docs).
pub(super) struct Auth<R> {
    reviews: R,
    /// By the token's SHA-256: the user, or `None` for "not authenticated".
    tokens: ReviewCache<[u8; 32], Option<User>>,
    /// Whether the user may get the node's metrics.
    decisions: ReviewCache<AccessKey, bool>,
    /// What each review asked of the apiserver takes from.
    budget: ReviewBudget,
    /// Reviews asked, and refused by a budget.
    counters: Arc<ResourceMetricsCounters>,
    /// Which apiserver errors and budget refusals are also logged.
    log: LogLimiter,
}

impl<R: Reviews> Auth<R> {
    /// Authentication and authorization through `reviews`, with empty caches of
    /// [`CACHE_ENTRIES`] answers each and full budgets of the documented sizes
    /// ([`super::budget`]), counting in `counters`.
    pub(super) fn new(reviews: R, counters: Arc<ResourceMetricsCounters>) -> Self {
        Self::with(reviews, CACHE_ENTRIES, ReviewBudget::default(), counters)
    }

    /// As [`Auth::new`], caching at most `capacity` answers of each kind, within `budget`.
    pub(super) fn with(
        reviews: R,
        capacity: usize,
        budget: ReviewBudget,
        counters: Arc<ResourceMetricsCounters>,
    ) -> Self {
        Self {
            reviews,
            tokens: ReviewCache::new(capacity),
            decisions: ReviewCache::new(capacity),
            budget,
            counters,
            log: LogLimiter::default(),
        }
    }

    /// Takes one review of `call` (`"token_review"` or `"access_review"`) for a request
    /// from `source` from the budgets, and counts it.
    ///
    /// # Errors
    ///
    /// [`ReviewError::OverBudget`] when a budget has none left (counted, and logged at most
    /// once per 10 s per budget).
    fn take_budget(&self, call: &'static str, source: Source) -> Result<(), ReviewError> {
        match self.budget.take(source) {
            Ok(()) => {
                self.counters.count_review(call);
                Ok(())
            }
            Err(over) => {
                self.counters.count_refused(over.budget);
                let log = self
                    .log
                    .check("over_budget", over.budget.as_str(), Instant::now());
                if let LogLine::Write { suppressed, .. } = log {
                    tracing::warn!(
                        budget = over.budget.as_str(),
                        remote = %source.address,
                        call,
                        suppressed,
                        "resource metrics: over the review budget; answering 429 without asking the apiserver"
                    );
                }
                Err(ReviewError::OverBudget(over))
            }
        }
    }

    /// The user `token` authenticates (`None`: it authenticates no one), from the cache or
    /// a TokenReview, which takes from `source`'s budgets.
    ///
    /// # Errors
    ///
    /// [`ReviewError::OverBudget`] when the token's answer is not cached and the budgets
    /// allow no TokenReview now; the [`ReviewError`] of a TokenReview that failed or took
    /// longer than [`REVIEW_TIMEOUT`] (logged here, at most once per 10 s).
    pub(super) async fn authenticate_token(
        &self,
        token: &str,
        source: Source,
    ) -> Result<Option<User>, ReviewError> {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        let result = self
            .tokens
            .get_or_review(key, || async {
                self.take_budget("token_review", source)?;
                let review = TokenReview {
                    spec: TokenReviewSpec {
                        token: token.to_owned(),
                        audiences: None,
                    },
                    ..TokenReview::default()
                };
                let answer = bounded(self.reviews.token_review(review)).await?;
                let user = token_user(answer);
                let ttl = if user.is_some() {
                    TOKEN_TTL
                } else {
                    TOKEN_FAILURE_TTL
                };
                Ok((user, ttl))
            })
            .await;
        if let Err(error) = &result {
            self.warn("token_review", error);
        }
        result
    }

    /// Whether `user` may `get` the `metrics` subresource of `node`: of every node (one
    /// review per user, see the module docs), else of `node`, each from the cache or a
    /// SubjectAccessReview, which takes from `source`'s budgets: `true` only when an answer
    /// is allowed (and not denied).
    ///
    /// # Errors
    ///
    /// [`ReviewError::OverBudget`] when an answer is not cached and the budgets allow no
    /// SubjectAccessReview now; the [`ReviewError`] of a SubjectAccessReview that failed,
    /// took longer than [`REVIEW_TIMEOUT`] or answered both allowed and denied (logged
    /// here, at most once per 10 s).
    pub(super) async fn authorize(
        &self,
        user: &User,
        node: &str,
        source: Source,
    ) -> Result<bool, ReviewError> {
        if self.decide(user, None, source).await? {
            return Ok(true);
        }
        self.decide(user, Some(node), source).await
    }

    /// The answer of [`access_review`] for `user` on `node` (`None`: every node), from the
    /// cache or the apiserver (within `source`'s budgets).
    async fn decide(
        &self,
        user: &User,
        node: Option<&str>,
        source: Source,
    ) -> Result<bool, ReviewError> {
        let key = AccessKey {
            user: user.clone(),
            node: node.map(str::to_owned),
        };
        let result = self
            .decisions
            .get_or_review(key, || async {
                self.take_budget("access_review", source)?;
                let answer = bounded(self.reviews.access_review(access_review(user, node))).await?;
                let status = answer.status.unwrap_or_default();
                if status.allowed && status.denied == Some(true) {
                    return Err(ReviewError::Invalid(
                        "the SubjectAccessReview answered both allowed and denied",
                    ));
                }
                if !status.allowed {
                    tracing::debug!(
                        user = %user.name,
                        node = node.unwrap_or("(every node)"),
                        reason = status.reason.as_deref().unwrap_or(""),
                        "resource metrics: SubjectAccessReview not allowed"
                    );
                }
                let ttl = if status.allowed {
                    ALLOWED_TTL
                } else {
                    DENIED_TTL
                };
                Ok((status.allowed, ttl))
            })
            .await;
        if let Err(error) = &result {
            self.warn("access_review", error);
        }
        result
    }

    /// Logs an apiserver error of `call`, at most one line per 10 s per call (a budget's
    /// refusal was logged where it was made).
    fn warn(&self, call: &'static str, error: &ReviewError) {
        if matches!(error, ReviewError::OverBudget(_)) {
            return;
        }
        if let LogLine::Write { suppressed, .. } = self.log.check(call, "apiserver", Instant::now())
        {
            tracing::warn!(
                %error,
                call,
                suppressed,
                "resource metrics: a review at the apiserver failed; answering 500"
            );
        }
    }
}

/// `review`, failing with [`ReviewError::TimedOut`] after [`REVIEW_TIMEOUT`].
async fn bounded<T>(
    review: impl Future<Output = Result<T, ReviewError>>,
) -> Result<T, ReviewError> {
    tokio::time::timeout(REVIEW_TIMEOUT, review)
        .await
        .map_err(|_| ReviewError::TimedOut(REVIEW_TIMEOUT))?
}

/// The user a TokenReview answer authenticates (`plugin/pkg/authenticator/token/webhook`):
/// `status.user` when `status.authenticated`, with `system:authenticated` added; `None`
/// otherwise, and for an answer that names no username.
fn token_user(answer: TokenReview) -> Option<User> {
    let status = answer.status?;
    if status.authenticated != Some(true) {
        if let Some(error) = status.error.filter(|e| !e.is_empty()) {
            tracing::debug!(%error, "resource metrics: token not authenticated");
        }
        return None;
    }
    let UserInfo {
        username,
        uid,
        groups,
        extra,
    } = status.user?;
    let name = username.filter(|name| !name.is_empty())?;
    Some(User::authenticated(
        name,
        uid.unwrap_or_default(),
        groups.unwrap_or_default(),
        extra.unwrap_or_default(),
    ))
}

/// The SubjectAccessReview kubelet's webhook authorizer sends for `user` reading `node`'s
/// resource metrics (`pkg/kubelet/server/auth.go`, `plugin/pkg/authorizer/webhook`):
/// verb `get`, resource `nodes`, subresource `metrics`, name `node` (none for every node),
/// version `v1`, the core group (`""`, left out as Go's `omitempty` does, like the empty
/// namespace, uid, groups and extra).
pub(super) fn access_review(user: &User, node: Option<&str>) -> SubjectAccessReview {
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: non_empty(&user.uid),
            groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(VERB.to_owned()),
                group: None,
                version: Some("v1".to_owned()),
                resource: Some(RESOURCE.to_owned()),
                subresource: Some(SUBRESOURCE.to_owned()),
                name: node.map(str::to_owned),
                ..ResourceAttributes::default()
            }),
            non_resource_attributes: None,
        },
        ..SubjectAccessReview::default()
    }
}
