//! What an apiserver's refusal says about the call: the one place the gateway reads it
//! (whether the apiserver itself is in trouble, 429 or 5xx, is [`super::is_trouble`]).
//!
//! kube-rs answers every refusal as [`kube::Error::Api`] with the apiserver's `Status`
//! (or, for a body that is not one, a `Status` with the HTTP code and no known reason:
//! `kube-client/src/client/mod.rs: handle_api_errors`). These predicates take a
//! [`kube::Error`] and ask kube's own predicates on that `Status`
//! ([`kube::core::Status::is_not_found`], [`is_conflict`](kube::core::Status::is_conflict),
//! [`is_already_exists`](kube::core::Status::is_already_exists)) with apimachinery's rule
//! (`k8s.io/apimachinery/pkg/api/errors/errors.go`: `IsNotFound`, `IsConflict`,
//! `IsAlreadyExists`): the `reason` decides, and for `IsNotFound` and `IsConflict` the code
//! too when the answer's reason is not one Kubernetes defines (a proxy's text body). kube
//! 5.0's `reason_or_code` asks whether the *wanted* reason is known, which it always is, so
//! that code fallback is added here (`by_code`). Any other error (no answer, a transport
//! error) is none of them.
//!
//! Which one to ask is kubelet's choice for the same call:
//!
//! - a create (`POST`) that finds the object there already: [`is_already_exists`] (`409`,
//!   reason `AlreadyExists`; kubelet `registerWithAPIServer`, client-go's event recorder);
//! - an update (`PUT`) with a stale `resourceVersion`: [`is_conflict`] (`409`, reason
//!   `Conflict`; kubelet's lease controller `retryUpdateLease`);
//! - an object that is gone: [`is_not_found`] (`404`).

use kube::core::Status;

/// The apiserver's `Status` of a refusal; `None` for any error that is not an answer.
fn status(error: &kube::Error) -> Option<&Status> {
    match error {
        kube::Error::Api(status) => Some(status),
        _ => None,
    }
}

/// apimachinery's fallback for an answer without a known reason: its code.
fn by_code(status: &Status, code: u16) -> bool {
    !kube::core::response::reason::is_known(&status.reason) && status.code == code
}

/// Whether `error` is the apiserver's `404 NotFound`: kube's [`Status::is_not_found`]
/// (reason `NotFound`), or code 404 without a known reason.
pub fn is_not_found(error: &kube::Error) -> bool {
    status(error).is_some_and(|s| s.is_not_found() || by_code(s, 404))
}

/// Whether `error` is the apiserver's `409 Conflict`, an update with a stale
/// `resourceVersion`: kube's [`Status::is_conflict`] (reason `Conflict`), or code 409
/// without a known reason. A create of an existing object is [`is_already_exists`] instead.
pub fn is_conflict(error: &kube::Error) -> bool {
    status(error).is_some_and(|s| s.is_conflict() || by_code(s, 409))
}

/// Whether `error` is the apiserver's `409 AlreadyExists`, a create of an object that
/// exists: kube's [`Status::is_already_exists`], by reason only (as apimachinery's
/// `IsAlreadyExists`; a 409 `Conflict` or a 409 without a Status is not it).
pub fn is_already_exists(error: &kube::Error) -> bool {
    status(error).is_some_and(Status::is_already_exists)
}

/// The code when `error` says the apiserver refuses the content of the request itself, so
/// that sending it again will not help: 400 BadRequest, 403 Forbidden (an admission plugin
/// such as NodeRestriction, or the authorizer), 413 RequestEntityTooLarge, 415
/// UnsupportedMediaType, 422 Invalid. `None` for any other error.
pub fn refused_content(error: &kube::Error) -> Option<u16> {
    status(error)
        .map(|s| s.code)
        .filter(|code| matches!(code, 400 | 403 | 413 | 415 | 422))
}

/// Whether a watch ended with `410 Gone` (its resourceVersion too old: it must list again).
/// By code, as kube-runtime's own watcher decides it (`kube-runtime/src/watcher.rs`),
/// whichever reason (`Expired` or `Gone`) the apiserver gave.
pub fn is_gone(status: &Status) -> bool {
    status.code == 410
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Status::failure("refused", reason).with_code(code).boxed())
    }

    /// What kube-rs makes of a refusal whose body is not a `Status` (a proxy's text).
    fn unparsed(code: u16) -> kube::Error {
        answer(code, "Failed to parse error data")
    }

    #[test]
    fn not_found_is_404_by_reason_or_by_code_without_a_known_reason() {
        assert!(is_not_found(&answer(404, "NotFound")));
        assert!(is_not_found(&unparsed(404)));
        assert!(is_not_found(&answer(404, "")));
        // A known other reason decides, whatever the code.
        assert!(!is_not_found(&answer(404, "Gone")));
        for (code, reason) in [(409, "Conflict"), (410, "Expired"), (500, ""), (200, "")] {
            assert!(!is_not_found(&answer(code, reason)), "{code} {reason}");
        }
    }

    #[test]
    fn conflict_is_a_stale_update_not_an_existing_object() {
        assert!(is_conflict(&answer(409, "Conflict")));
        assert!(is_conflict(&unparsed(409)));
        assert!(!is_conflict(&answer(409, "AlreadyExists")));
        for (code, reason) in [
            (404, "NotFound"),
            (410, "Gone"),
            (422, "Invalid"),
            (503, ""),
        ] {
            assert!(!is_conflict(&answer(code, reason)), "{code} {reason}");
        }
    }

    #[test]
    fn already_exists_is_the_reason_only() {
        assert!(is_already_exists(&answer(409, "AlreadyExists")));
        assert!(!is_already_exists(&answer(409, "Conflict")));
        assert!(!is_already_exists(&unparsed(409)));
        assert!(!is_already_exists(&answer(404, "NotFound")));
    }

    #[test]
    fn gone_is_410_whatever_the_reason() {
        let watch_end =
            |code: u16, reason: &str| Status::failure("too old", reason).with_code(code);
        assert!(is_gone(&watch_end(410, "Expired")));
        assert!(is_gone(&watch_end(410, "Gone")));
        assert!(is_gone(&watch_end(410, "")));
        assert!(!is_gone(&watch_end(404, "NotFound")));
        assert!(!is_gone(&watch_end(500, "InternalError")));
    }

    #[test]
    fn refused_content_names_only_the_codes_a_resend_cannot_fix() {
        for code in [400, 403, 413, 415, 422] {
            assert_eq!(refused_content(&answer(code, "")), Some(code));
        }
        for code in [404, 409, 410, 429, 500, 503] {
            assert_eq!(refused_content(&answer(code, "")), None, "{code}");
        }
    }

    #[test]
    fn an_error_without_an_answer_is_none_of_them() {
        let no_answer = kube::Error::LinesCodecMaxLineLengthExceeded;
        assert!(!is_not_found(&no_answer));
        assert!(!is_conflict(&no_answer));
        assert!(!is_already_exists(&no_answer));
        assert_eq!(refused_content(&no_answer), None);
    }
}
