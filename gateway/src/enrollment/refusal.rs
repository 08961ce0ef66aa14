//! A refused certificate request: its metric label and why.

/// A request refused: the metric label and why, for the log and the answer.
#[derive(Debug)]
pub(super) struct Refused {
    pub(super) reason: &'static str,
    pub(super) detail: String,
}

/// A [`Refused`] with `reason` (the metric label) and `detail`.
pub(super) fn refuse(reason: &'static str, detail: impl Into<String>) -> Refused {
    Refused {
        reason,
        detail: detail.into(),
    }
}
