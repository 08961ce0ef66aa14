//! The review cache of [`super::auth`]: TokenReview and SubjectAccessReview answers kept
//! for their TTL, bounded in size, and one review in flight per key whoever asks
//! meanwhile (kubelet's webhook caches, `k8s.io/apiserver`
//! `pkg/authentication/token/cache` and `pkg/authorization/cachingauthorizer`).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::OnceCell;
use tokio::time::Instant;

/// Why a TokenReview or SubjectAccessReview has no usable answer. `Display` is the logged
/// reason; a request that meets one is answered `500`, never served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReviewError {
    /// The apiserver refused or failed the call (kube-rs' error text), or it could not be
    /// sent.
    #[error("{0}")]
    Apiserver(String),
    /// No answer within [`REVIEW_TIMEOUT`].
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// An answer that cannot be acted on, e.g. a SubjectAccessReview both allowed and
    /// denied (`plugin/pkg/authorizer/webhook`).
    #[error("{0}")]
    Invalid(&'static str),
    /// Not asked: the review budgets allow none now ([`super::Budget`]); the request is
    /// answered `429 Too Many Requests`.
    #[error("over the {} review budget; retry in {:?}", .0.budget.as_str(), .0.retry_after)]
    OverBudget(super::OverBudget),
}

/// One cached answer.
#[derive(Debug)]
struct Cached<V> {
    value: V,
    stored: Instant,
    expires: Instant,
}

/// A review in flight, shared by every request that asks it meanwhile: its answer, once
/// there (errors included, so waiters do not each try again).
type Pending<V> = Arc<OnceCell<Result<V, ReviewError>>>;

#[derive(Debug)]
struct CacheState<K, V> {
    answers: HashMap<K, Cached<V>>,
    pending: HashMap<K, Pending<V>>,
}

/// Review answers by key, each for its own time to live, at most `capacity` of them; a
/// review in flight is made once for all who ask for it meanwhile.
#[derive(Debug)]
pub(super) struct ReviewCache<K, V> {
    state: Mutex<CacheState<K, V>>,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> ReviewCache<K, V> {
    /// An empty cache holding at most `capacity` answers (at least 1).
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            state: Mutex::new(CacheState {
                answers: HashMap::new(),
                pending: HashMap::new(),
            }),
            capacity: capacity.max(1),
        }
    }

    /// `key`'s answer: the cached one while it lives, else the one `review` gives (joining
    /// the review of `key` already in flight, if any), which is cached for the time to live
    /// `review` returns with it. Errors are shared with the requests waiting, not cached.
    ///
    /// # Errors
    ///
    /// `review`'s.
    pub(super) async fn get_or_review<F, Fut>(&self, key: K, review: F) -> Result<V, ReviewError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(V, Duration), ReviewError>>,
    {
        let cell = {
            let mut state = self.state.lock();
            if let Some(cached) = state.answers.get(&key) {
                if cached.expires > Instant::now() {
                    return Ok(cached.value.clone());
                }
                state.answers.remove(&key);
            }
            state.pending.entry(key.clone()).or_default().clone()
        };
        let waiting = Waiting {
            cache: self,
            key: &key,
            cell: &cell,
        };
        let result = cell
            .get_or_init(|| async {
                let result = review().await;
                if let Ok((value, ttl)) = &result {
                    self.store(key.clone(), value.clone(), *ttl);
                }
                result.map(|(value, _)| value)
            })
            .await
            .clone();
        drop(waiting);
        result
    }

    /// Caches `value` for `key` for `ttl`, making room first when full: expired answers
    /// go, then the oldest.
    fn store(&self, key: K, value: V, ttl: Duration) {
        let now = Instant::now();
        let mut state = self.state.lock();
        if !state.answers.contains_key(&key) && state.answers.len() >= self.capacity {
            state.answers.retain(|_, cached| cached.expires > now);
            if state.answers.len() >= self.capacity
                && let Some(oldest) = state
                    .answers
                    .iter()
                    .min_by_key(|(_, cached)| cached.stored)
                    .map(|(key, _)| key.clone())
            {
                state.answers.remove(&oldest);
            }
        }
        state.answers.insert(
            key,
            Cached {
                value,
                stored: now,
                expires: now + ttl,
            },
        );
    }

    /// Answers cached (expired ones included until they make room).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.state.lock().answers.len()
    }
}

/// One request waiting on a review in flight; on drop (answered or given up), forgets the
/// review once it is answered or no one else waits for it, so the in-flight map holds only
/// reviews someone still waits on.
struct Waiting<'a, K: Hash + Eq, V> {
    cache: &'a ReviewCache<K, V>,
    key: &'a K,
    cell: &'a Pending<V>,
}

impl<K: Hash + Eq, V> Drop for Waiting<'_, K, V> {
    fn drop(&mut self) {
        let mut state = self.cache.state.lock();
        let ours = state
            .pending
            .get(self.key)
            .is_some_and(|pending| Arc::ptr_eq(pending, self.cell));
        // Others take a clone only under the lock: the map's and ours are the last two.
        if ours && (self.cell.initialized() || Arc::strong_count(self.cell) <= 2) {
            state.pending.remove(self.key);
        }
    }
}
