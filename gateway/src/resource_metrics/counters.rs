//! The resource metrics server's counters (`edgebeat_gateway_resource_metrics_*`), apart
//! from the server and the reviews that both count in them.

use edgebeat_transports::observe::register_family;
use http::StatusCode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::budget::Budget;

/// A label of one value (`code`, `call`, `budget`).
type Label = [(&'static str, &'static str); 1];

/// The resource metrics server's counters, for `/metrics` (see
/// [`ResourceMetricsCounters::register`]): requests by HTTP status, reviews asked of the
/// apiserver by call, and reviews refused by budget ([`Budget`]).
#[derive(Debug)]
pub struct ResourceMetricsCounters {
    by_code: Family<Label, Counter>,
    reviews: Family<Label, Counter>,
    refused: Family<Label, Counter>,
}

impl Default for ResourceMetricsCounters {
    /// Every call's and every budget's series exist from the start, at 0.
    fn default() -> Self {
        let counters = Self {
            by_code: Family::default(),
            reviews: Family::default(),
            refused: Family::default(),
        };
        for call in REVIEW_CALLS {
            let _series = counters.reviews.get_or_create(&[("call", call)]);
        }
        for budget in Budget::ALL {
            let _series = counters
                .refused
                .get_or_create(&[("budget", budget.as_str())]);
        }
        counters
    }
}

/// The `call` label values of `edgebeat_gateway_resource_metrics_reviews_total`.
const REVIEW_CALLS: [&str; 2] = ["token_review", "access_review"];

impl ResourceMetricsCounters {
    /// Counts one request answered `status`.
    pub fn count(&self, status: StatusCode) {
        self.by_code.get_or_create(&[("code", code(status))]).inc();
    }

    /// Requests counted with `code` (`"200"`, `"400"`, `"401"`, `"403"`, `"404"`, `"405"`,
    /// `"429"`, `"500"`, or `"other"`).
    pub fn get(&self, code: &'static str) -> u64 {
        self.by_code.get_or_create(&[("code", code)]).get()
    }

    /// Counts one review asked of the apiserver: `call` is `"token_review"` (a
    /// TokenReview) or `"access_review"` (a SubjectAccessReview).
    pub fn count_review(&self, call: &'static str) {
        self.reviews.get_or_create(&[("call", call)]).inc();
    }

    /// Reviews of `call` (as [`ResourceMetricsCounters::count_review`]) asked so far.
    pub fn reviews(&self, call: &'static str) -> u64 {
        self.reviews.get_or_create(&[("call", call)]).get()
    }

    /// Counts one review not asked because `budget` allowed none.
    pub fn count_refused(&self, budget: Budget) {
        self.refused
            .get_or_create(&[("budget", budget.as_str())])
            .inc();
    }

    /// Reviews `budget` refused so far.
    pub fn refused(&self, budget: Budget) -> u64 {
        self.refused
            .get_or_create(&[("budget", budget.as_str())])
            .get()
    }

    /// Registers `edgebeat_gateway_resource_metrics_requests_total{code}`,
    /// `edgebeat_gateway_resource_metrics_reviews_total{call}` and
    /// `edgebeat_gateway_resource_metrics_reviews_refused_total{budget}` in `registry`.
    #[rustfmt::skip]
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        register_family(registry, "edgebeat_gateway_resource_metrics_requests", "Requests for kubelet's /metrics/resource of the nodes this replica holds, by HTTP status code (401 unauthenticated, 403 not authorized, 404 node not held or no such path, 429 over a review budget, 500 the apiserver's TokenReview or SubjectAccessReview failed)", None, self.by_code.clone());
        register_family(registry, "edgebeat_gateway_resource_metrics_reviews", "TokenReviews (call=token_review) and SubjectAccessReviews (call=access_review) the resource metrics server asked of the apiserver: answers not cached, within the review budgets", None, self.reviews.clone());
        register_family(registry, "edgebeat_gateway_resource_metrics_reviews_refused", "Reviews the resource metrics server did not ask of the apiserver because a review budget allowed none (budget=address: the source address's, global: the replica's for connections not yet served a 200, served: the replica's for connections served a 200); each request answered 429", None, self.refused.clone());
    }
}

/// The `code` label of `status`.
fn code(status: StatusCode) -> &'static str {
    match status.as_u16() {
        200 => "200",
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        405 => "405",
        429 => "429",
        500 => "500",
        _ => "other",
    }
}
