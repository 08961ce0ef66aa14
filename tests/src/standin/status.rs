//! `metav1.Status` failure bodies, shaped like `k8s.io/apimachinery/pkg/api/errors`.

use serde_json::{Map, Value, json};

use super::kinds::Kind;
use super::validation::FieldError;

/// An API error answered as a `Status` object.
#[derive(Clone, Debug)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    /// `StatusReason`; empty for errors the real server does not classify.
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
    /// Sent as the `Retry-After` header and `details.retryAfterSeconds`.
    pub(crate) retry_after: Option<u32>,
}

fn details(kind: Kind, name: &str) -> Value {
    let mut d = Map::new();
    if !name.is_empty() {
        d.insert("name".into(), name.into());
    }
    if !kind.group().is_empty() {
        d.insert("group".into(), kind.group().into());
    }
    d.insert("kind".into(), kind.plural().into());
    Value::Object(d)
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// `errors.NewNotFound`: `nodes "x" not found`.
    pub(crate) fn not_found(kind: Kind, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", kind.qualified_resource()),
        );
        e.details = Some(details(kind, name));
        e
    }

    /// The 404 for an unknown path.
    pub(crate) fn path_not_found() -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        e.details = Some(json!({}));
        e
    }

    /// `errors.NewAlreadyExists`.
    pub(crate) fn already_exists(kind: Kind, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", kind.qualified_resource()),
        );
        e.details = Some(details(kind, name));
        e
    }

    /// `errors.NewConflict` with `OptimisticLockErrorMsg` (or another cause).
    pub(crate) fn conflict(kind: Kind, name: &str, cause: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {cause}",
                kind.qualified_resource()
            ),
        );
        e.details = Some(details(kind, name));
        e
    }

    /// The stale-resourceVersion conflict of `registry/generic/registry/store.go: Update`.
    pub(crate) fn optimistic_lock(kind: Kind, name: &str) -> Self {
        Self::conflict(
            kind,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// `errors.NewInvalid(groupKind, name, errs)`. `kind_label` is what goes into
    /// `details.kind` (a Kind, or a resource for the store's own errors).
    pub(crate) fn invalid(
        group_kind: &str,
        group: &str,
        kind_label: &str,
        name: &str,
        errs: &[FieldError],
    ) -> Self {
        let agg = if errs.len() == 1 {
            errs.iter().map(FieldError::message).collect::<String>()
        } else {
            format!(
                "[{}]",
                errs.iter()
                    .map(FieldError::message)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{group_kind} \"{name}\" is invalid: {agg}"),
        );
        let mut d = Map::new();
        if !name.is_empty() {
            d.insert("name".into(), name.into());
        }
        if !group.is_empty() {
            d.insert("group".into(), group.into());
        }
        if !kind_label.is_empty() {
            d.insert("kind".into(), kind_label.into());
        }
        d.insert(
            "causes".into(),
            Value::Array(
                errs.iter()
                    .map(|f| json!({"reason": f.reason(), "message": f.body(), "field": f.field}))
                    .collect(),
            ),
        );
        e.details = Some(Value::Object(d));
        e
    }

    /// Validation errors of an object of `kind`.
    pub(crate) fn invalid_object(kind: Kind, name: &str, errs: &[FieldError]) -> Self {
        Self::invalid(&kind.group_kind(), kind.group(), kind.kind(), name, errs)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub(crate) fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    pub(crate) fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub(crate) fn too_large() -> Self {
        Self::new(413, "RequestEntityTooLarge", "request body too large")
    }

    /// `errors.NewInternalError`.
    pub(crate) fn internal(message: &str) -> Self {
        let mut e = Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        );
        e.details = Some(json!({"causes": [{"message": message}]}));
        e
    }

    /// What `ErrorToAPIStatus` makes of an error that is not a Status: a 500 with no reason.
    pub(crate) fn unclassified(message: impl Into<String>) -> Self {
        Self::new(500, "", message)
    }

    /// A Status answer for an injected fault with this code.
    pub(crate) fn injected(code: u16, target: Option<(Kind, &str)>) -> Self {
        let name = target.map(|(_, n)| n).unwrap_or("");
        let mut e = match code {
            400 => Self::bad_request("injected fault: bad request"),
            401 => Self::new(401, "Unauthorized", "Unauthorized"),
            403 => Self::new(403, "Forbidden", "injected fault: forbidden"),
            404 => match target {
                Some((k, n)) => Self::not_found(k, n),
                None => Self::path_not_found(),
            },
            409 => match target {
                Some((k, n)) => Self::optimistic_lock(k, n),
                None => Self::new(409, "Conflict", "injected fault: conflict"),
            },
            410 => Self::new(410, "Expired", "injected fault: gone"),
            422 => Self::new(
                422,
                "Invalid",
                format!("\"{name}\" is invalid: injected fault"),
            ),
            429 => {
                let mut e = Self::new(
                    429,
                    "TooManyRequests",
                    "Too many requests, please try again later.",
                );
                e.retry_after = Some(1);
                e
            }
            500 => Self::internal("injected fault"),
            503 => Self::new(
                503,
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ),
            504 => Self::new(
                504,
                "Timeout",
                "the server was unable to return a response in the time allotted",
            ),
            other => Self::new(other, "", format!("injected fault: status {other}")),
        };
        if let (Some(ra), true) = (e.retry_after, e.details.is_none()) {
            e.details = Some(json!({"retryAfterSeconds": ra}));
        }
        e
    }

    /// The `Status` JSON body.
    pub(crate) fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), "Status".into());
        m.insert("apiVersion".into(), "v1".into());
        m.insert("metadata".into(), json!({}));
        m.insert("status".into(), "Failure".into());
        m.insert("message".into(), self.message.clone().into());
        if !self.reason.is_empty() {
            m.insert("reason".into(), self.reason.into());
        }
        if let Some(d) = &self.details {
            m.insert("details".into(), d.clone());
        }
        m.insert("code".into(), self.code.into());
        Value::Object(m)
    }
}
