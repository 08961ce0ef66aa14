//! Counting a bootstrap token's uses: each new CSR it proves, written to its Secret.

use super::{Enrollment, tokens};

impl Enrollment {
    /// Counts a CSR just created with token `id`, and adds the uses not yet recorded to
    /// the token's Secret ([`tokens::record_uses`]): one writer at a time per replica, each
    /// write carrying every use made meanwhile, so a storm of enrollments with one token
    /// costs a few Secret writes a second rather than one (and its conflicts) per
    /// enrollment. With several replicas a token can overshoot its limit by the uses the
    /// others have not yet written (the requests in flight there).
    pub(super) async fn token_used(&self, id: &str) {
        *self
            .unrecorded_uses
            .lock()
            .entry(id.to_owned())
            .or_default() += 1;
        self.flush_uses(id).await;
    }

    /// Writes token `id`'s unrecorded uses to its Secret, until none are left (see
    /// [`Enrollment::token_used`]); a failure is logged and left for the next use.
    async fn flush_uses(&self, id: &str) {
        let _recording = self.recording_uses.lock().await;
        loop {
            let pending = self.unrecorded_uses.lock().get(id).copied().unwrap_or(0);
            if pending == 0 {
                return;
            }
            match tokens::record_uses(self.client.clone(), &self.options.namespace, id, pending)
                .await
            {
                Ok(_) => {
                    let mut unrecorded = self.unrecorded_uses.lock();
                    if let Some(n) = unrecorded.get_mut(id) {
                        *n = n.saturating_sub(pending);
                        if *n == 0 {
                            unrecorded.remove(id);
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(token = id, %error, "the token's uses could not be recorded; trying again with its next use");
                    return;
                }
            }
        }
    }
}
