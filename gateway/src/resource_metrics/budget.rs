//! How many TokenReviews and SubjectAccessReviews the resource metrics server may ask of
//! the apiserver: token buckets (governor's GCRA, on tokio's clock) for each source address
//! and for the replica as a whole. kubelet has no such budget (it answers for one node);
//! one replica answers for thousands, on an address anyone on the network reaches, and a
//! request with a random bearer token costs a TokenReview that no cache can save (random
//! tokens never repeat): unbounded, 300 addresses made 63,369 TokenReviews in 30 s of a real
//! kube-apiserver, 97 of them answered 500 or 504.
//!
//! Legitimate callers need very few reviews: metrics-server scrapes the whole fleet with
//! one service account token, reviewed once per [`TOKEN_TTL`](super::TOKEN_TTL) and
//! authorized once per [`ALLOWED_TTL`](super::ALLOWED_TTL) for every node at once;
//! Prometheus likewise; the apiserver's node proxy authenticates by client certificate (no
//! TokenReview) and is authorized for every node once per `ALLOWED_TTL`. Cached answers,
//! positive or negative, cost no budget; neither does a request that joins a review already
//! in flight.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::ops::Add;
use std::time::Duration;

use governor::clock::{Clock, Reference};
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::HashMapStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

/// Reviews per second the replica asks of the apiserver for connections not yet served a
/// `200`, whatever their address: 50/s. A sustained flood from many addresses costs the
/// apiserver at most this (plus [`SERVED_REVIEWS_PER_SECOND`]), under the 2,100/s at which
/// a real kube-apiserver answered 500 and 504 to reviews; legitimate callers need a few per
/// minute (see the module docs).
pub const GLOBAL_REVIEWS_PER_SECOND: u32 = 50;

/// Reviews the global budget holds at most, for a burst after a quiet time: 100, room for
/// every cache to be empty at once (a replica that just started) with a few dozen users
/// (each one TokenReview and one SubjectAccessReview) arriving together.
pub const GLOBAL_REVIEW_BURST: u32 = 100;

/// Reviews per second one source address may cost: 5/s. One address legitimately carries
/// one or a few callers (a metrics-server pod, a Prometheus, `kubectl` users behind a NAT),
/// each needing a TokenReview per [`TOKEN_TTL`](super::TOKEN_TTL); a flood must come from
/// at least [`GLOBAL_REVIEWS_PER_SECOND`] / 5 = 10 addresses to spend the global budget.
pub const ADDRESS_REVIEWS_PER_SECOND: u32 = 5;

/// Reviews one source address's budget holds at most: 20, room for a caller with its
/// token, an every-node SubjectAccessReview and a few per-node ones, or a few callers
/// starting together.
pub const ADDRESS_REVIEW_BURST: u32 = 20;

/// Reviews per second the replica asks for connections that were served a `200` (their
/// credentials' cached answers expire, e.g. metrics-server's token every
/// [`TOKEN_TTL`](super::TOKEN_TTL)), in a budget of their own: 10/s. So a flood that spends
/// the global budget does not stop metrics-server's scrapes when its token is reviewed
/// again; only callers the apiserver let read a node's metrics draw on it.
pub const SERVED_REVIEWS_PER_SECOND: u32 = 10;

/// Reviews the served connections' budget holds at most: 20.
pub const SERVED_REVIEW_BURST: u32 = 20;

/// Source addresses above which address budgets that are full again (indistinguishable
/// from a new one) are forgotten, so that addresses that came and went do not hold memory.
const TRACKED_ADDRESSES: usize = 4_096;

/// Which budget refused a review: the `budget` label of
/// `edgebeat_gateway_resource_metrics_reviews_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Budget {
    /// The source address's ([`ADDRESS_REVIEWS_PER_SECOND`]).
    Address,
    /// The replica's, for connections not yet served ([`GLOBAL_REVIEWS_PER_SECOND`]).
    Global,
    /// The replica's, for connections served a `200` ([`SERVED_REVIEWS_PER_SECOND`]).
    Served,
}

impl Budget {
    /// Every budget, in the order of the label values.
    pub const ALL: [Self; 3] = [Self::Address, Self::Global, Self::Served];

    /// The label value: `address`, `global` or `served`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Address => "address",
            Self::Global => "global",
            Self::Served => "served",
        }
    }
}

/// A review the budgets did not allow: which one, and how long until it would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBudget {
    /// The budget that refused.
    pub budget: Budget,
    /// Until the budget holds a review again (what `Retry-After` tells, rounded up to
    /// whole seconds).
    pub retry_after: Duration,
}

/// Where a request that may need a review comes from: its address and whether its
/// connection was served a `200` already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Source {
    pub(super) address: IpAddr,
    pub(super) served: bool,
}

/// tokio's clock for governor, so that tests with paused time drive the buckets.
#[derive(Debug, Clone, Copy, Default)]
struct TokioClock;

/// An instant of [`TokioClock`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct TokioInstant(tokio::time::Instant);

impl Add<Nanos> for TokioInstant {
    type Output = Self;

    fn add(self, other: Nanos) -> Self {
        Self(self.0 + Duration::from(other))
    }
}

impl Reference for TokioInstant {
    fn duration_since(&self, earlier: Self) -> Nanos {
        let nanos = self.0.saturating_duration_since(earlier.0).as_nanos();
        Nanos::from(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    fn saturating_sub(&self, duration: Nanos) -> Self {
        self.0
            .checked_sub(Duration::from(duration))
            .map_or(*self, Self)
    }
}

impl Clock for TokioClock {
    type Instant = TokioInstant;

    fn now(&self) -> TokioInstant {
        TokioInstant(tokio::time::Instant::now())
    }
}

type Middleware = NoOpMiddleware<TokioInstant>;
type Bucket = RateLimiter<NotKeyed, InMemoryState, TokioClock, Middleware>;
type Buckets = RateLimiter<IpAddr, HashMapStateStore<IpAddr>, TokioClock, Middleware>;

/// The budgets of one replica's resource metrics server (see the module docs): one bucket
/// per source address (an IPv6 address counts by its /64, which one host usually holds
/// whole), then one for connections not yet served and one for those served.
pub(super) struct ReviewBudget {
    addresses: Buckets,
    global: Bucket,
    served: Bucket,
}

impl Default for ReviewBudget {
    /// The documented constants.
    fn default() -> Self {
        Self::new(
            quota(ADDRESS_REVIEWS_PER_SECOND, ADDRESS_REVIEW_BURST),
            quota(GLOBAL_REVIEWS_PER_SECOND, GLOBAL_REVIEW_BURST),
            quota(SERVED_REVIEWS_PER_SECOND, SERVED_REVIEW_BURST),
        )
    }
}

/// `per_second` reviews a second, at most `burst` at once (each at least 1).
pub(super) fn quota(per_second: u32, burst: u32) -> Quota {
    Quota::per_second(NonZeroU32::new(per_second).unwrap_or(NonZeroU32::MIN))
        .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN))
}

impl ReviewBudget {
    /// Budgets of the given quotas, each full.
    pub(super) fn new(address: Quota, global: Quota, served: Quota) -> Self {
        Self {
            addresses: RateLimiter::new(address, HashMapStateStore::default(), TokioClock),
            global: RateLimiter::new(global, InMemoryState::default(), TokioClock),
            served: RateLimiter::new(served, InMemoryState::default(), TokioClock),
        }
    }

    /// Takes one review from `source`'s budgets: its address's, then the replica's (the
    /// served connections' when it was served). A review its address's budget refuses
    /// takes nothing from the replica's, so one address cannot spend it for the others.
    ///
    /// # Errors
    ///
    /// [`OverBudget`]: the budget that refused, and when it would allow one.
    pub(super) fn take(&self, source: Source) -> Result<(), OverBudget> {
        let now = TokioClock.now();
        if self.addresses.len() >= TRACKED_ADDRESSES {
            self.addresses.retain_recent();
        }
        let over = |budget| {
            move |not_until: governor::NotUntil<TokioInstant>| OverBudget {
                budget,
                retry_after: not_until.wait_time_from(now),
            }
        };
        self.addresses
            .check_key(&address_key(source.address))
            .map_err(over(Budget::Address))?;
        if source.served {
            self.served.check().map_err(over(Budget::Served))
        } else {
            self.global.check().map_err(over(Budget::Global))
        }
    }

    /// Source addresses whose budget is remembered.
    #[cfg(test)]
    pub(super) fn tracked_addresses(&self) -> usize {
        self.addresses.len()
    }
}

/// The key of `address`'s budget: an IPv4 address (an IPv4-mapped IPv6 one as IPv4) as it
/// is, an IPv6 address by its /64.
fn address_key(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((v6.to_bits() & !u128::from(u64::MAX)).into()),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn from(address: &str, served: bool) -> Source {
        Source {
            address: address.parse().unwrap(),
            served,
        }
    }

    /// Takes from `source` until refused; the reviews allowed.
    fn drain(budget: &ReviewBudget, source: Source) -> (usize, OverBudget) {
        for allowed in 0..10_000 {
            if let Err(over) = budget.take(source) {
                return (allowed, over);
            }
        }
        panic!("never refused");
    }

    #[tokio::test(start_paused = true)]
    async fn one_address_gets_its_burst_then_its_rate() {
        let budget = ReviewBudget::default();
        let one = from("192.0.2.1", false);
        let (allowed, over) = drain(&budget, one);
        assert_eq!(allowed, ADDRESS_REVIEW_BURST as usize);
        assert_eq!(over.budget, Budget::Address);
        assert_eq!(
            over.retry_after,
            Duration::from_millis(200),
            "5/s: one per 200 ms"
        );
        // One second later: 5 more, no more.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(drain(&budget, one).0, ADDRESS_REVIEWS_PER_SECOND as usize);
        // Another address has its own.
        assert_eq!(
            drain(&budget, from("192.0.2.2", false)).0,
            ADDRESS_REVIEW_BURST as usize
        );
    }

    #[tokio::test(start_paused = true)]
    async fn many_addresses_share_the_global_budget() {
        let budget = ReviewBudget::default();
        let mut allowed = 0;
        let mut refused = None;
        for i in 0..300u32 {
            let source = Source {
                address: IpAddr::from(std::net::Ipv4Addr::from(0xC000_0200 + i)),
                served: false,
            };
            match budget.take(source) {
                Ok(()) => allowed += 1,
                Err(over) => refused = Some(over),
            }
        }
        assert_eq!(allowed, GLOBAL_REVIEW_BURST);
        let over = refused.unwrap();
        assert_eq!(over.budget, Budget::Global);
        assert_eq!(
            over.retry_after,
            Duration::from_millis(20),
            "50/s: one per 20 ms"
        );
        // Over 10 s of the same flood (3,000 requests a second from 3,000 addresses, each
        // within its own budget): 50 a second.
        let mut allowed = 0;
        for tick in 0..1_000u32 {
            tokio::time::advance(Duration::from_millis(10)).await;
            for i in 0..30u32 {
                let address = std::net::Ipv4Addr::from(0xC633_6400 + (tick * 30 + i) % 3_000);
                allowed += u32::from(
                    budget
                        .take(Source {
                            address: address.into(),
                            served: false,
                        })
                        .is_ok(),
                );
            }
        }
        assert_eq!(allowed, 10 * GLOBAL_REVIEWS_PER_SECOND);
    }

    #[tokio::test(start_paused = true)]
    async fn a_served_connection_is_reviewed_while_the_global_budget_is_spent() {
        let budget = ReviewBudget::default();
        for i in 0..GLOBAL_REVIEW_BURST {
            let address = IpAddr::from(std::net::Ipv4Addr::from(0xC000_0200 + i));
            budget
                .take(Source {
                    address,
                    served: false,
                })
                .unwrap();
        }
        assert_eq!(
            budget.take(from("198.51.100.1", false)).unwrap_err().budget,
            Budget::Global
        );
        assert_eq!(budget.take(from("198.51.100.1", true)), Ok(()));
        // Its address's budget still applies.
        let (allowed, over) = drain(&budget, from("198.51.100.1", true));
        assert_eq!(allowed, ADDRESS_REVIEW_BURST as usize - 2);
        assert_eq!(over.budget, Budget::Address);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ipv6_host_counts_by_its_64() {
        let budget = ReviewBudget::default();
        let mut allowed = 0;
        for i in 0..100u16 {
            let address = format!("2001:db8:1:2::{i:x}");
            allowed += usize::from(budget.take(from(&address, false)).is_ok());
        }
        assert_eq!(allowed, ADDRESS_REVIEW_BURST as usize);
        assert_eq!(
            address_key("::ffff:192.0.2.9".parse().unwrap()),
            "192.0.2.9".parse::<IpAddr>().unwrap()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn addresses_that_came_and_went_are_forgotten() {
        let budget = ReviewBudget::new(quota(5, 20), quota(1_000_000, 1_000_000), quota(1, 1));
        for i in 0..TRACKED_ADDRESSES as u32 {
            let address = IpAddr::from(std::net::Ipv4Addr::from(0x0A00_0000 + i));
            budget
                .take(Source {
                    address,
                    served: false,
                })
                .unwrap();
        }
        assert_eq!(budget.tracked_addresses(), TRACKED_ADDRESSES);
        // Their buckets are full again after 1 s (one review at 5/s refills in 200 ms).
        tokio::time::advance(Duration::from_secs(1)).await;
        budget.take(from("192.0.2.1", false)).unwrap();
        assert_eq!(budget.tracked_addresses(), 1);
    }
}
