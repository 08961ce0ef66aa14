//! The user a request is made as, for what the registry records about its requester (a
//! CertificateSigningRequest's `spec.username`, `uid`, `groups` and `extra`).
//!
//! The stand-in has no authentication, so a request without impersonation is the anonymous
//! user (`staging/src/k8s.io/apiserver/pkg/authentication/request/anonymous/anonymous.go`:
//! `system:anonymous` in `system:unauthenticated`). A request with `Impersonate-User` is that
//! user, built as `staging/src/k8s.io/apiserver/pkg/endpoints/filters/impersonation.go`
//! builds it: a `system:serviceaccount:<namespace>:<name>` user without `Impersonate-Group`
//! gets its service account groups, every `Impersonate-Group` is added in order,
//! `Impersonate-Uid` is the uid, each `Impersonate-Extra-<key>` value (key lower-cased and
//! path-unescaped) is an extra value, and `system:authenticated` is appended unless
//! `system:authenticated` or `system:unauthenticated` is already there (for
//! `system:anonymous`: `system:unauthenticated` unless already there).
//!
//! Simplified: `Impersonate-Group`, `-Uid` or `-Extra-*` without `Impersonate-User` is not
//! refused (the real filter refuses it); such a request is anonymous.

use std::collections::BTreeMap;

use http::HeaderMap;

/// `user.Anonymous`.
const ANONYMOUS: &str = "system:anonymous";
/// `user.AllAuthenticated`.
const ALL_AUTHENTICATED: &str = "system:authenticated";
/// `user.AllUnauthenticated`.
const ALL_UNAUTHENTICATED: &str = "system:unauthenticated";
/// `serviceaccount.ServiceAccountUsernamePrefix`.
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";
/// `authenticationv1.ImpersonateUserExtraHeaderPrefix`, lower-cased as hyper keeps it.
const EXTRA_PREFIX: &str = "impersonate-extra-";

/// `user.Info` of a request: who the registry strategies see as the requester.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UserInfo {
    /// `GetName()`.
    pub(crate) name: String,
    /// `GetUID()`, empty when unknown.
    pub(crate) uid: String,
    /// `GetGroups()`, in the order the impersonation filter builds them.
    pub(crate) groups: Vec<String>,
    /// `GetExtra()`.
    pub(crate) extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// The anonymous user of an unauthenticated request.
    pub(crate) fn anonymous() -> Self {
        UserInfo {
            name: ANONYMOUS.to_string(),
            uid: String::new(),
            groups: vec![ALL_UNAUTHENTICATED.to_string()],
            extra: BTreeMap::new(),
        }
    }

    /// The user of a request with these headers: the impersonated one, or anonymous.
    pub(crate) fn from_headers(headers: &HeaderMap) -> Self {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        let Some(requested) = header("impersonate-user") else {
            return Self::anonymous();
        };
        let specified_groups: Vec<String> = headers
            .get_all("impersonate-group")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        let mut groups = Vec::new();
        if let Some(ns) = service_account_namespace(&requested)
            && specified_groups.is_empty()
        {
            // serviceaccount.MakeGroupNames
            groups.push("system:serviceaccounts".to_string());
            groups.push(format!("system:serviceaccounts:{ns}"));
        }
        groups.extend(specified_groups);
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in headers {
            let Some(key) = name.as_str().strip_prefix(EXTRA_PREFIX) else {
                continue;
            };
            if let Ok(v) = value.to_str() {
                extra
                    .entry(path_unescape(key))
                    .or_default()
                    .push(v.to_string());
            }
        }
        if requested == ANONYMOUS {
            if !groups.iter().any(|g| g == ALL_UNAUTHENTICATED) {
                groups.push(ALL_UNAUTHENTICATED.to_string());
            }
        } else if !groups
            .iter()
            .any(|g| g == ALL_AUTHENTICATED || g == ALL_UNAUTHENTICATED)
        {
            groups.push(ALL_AUTHENTICATED.to_string());
        }
        UserInfo {
            name: requested,
            uid: header("impersonate-uid").unwrap_or_default(),
            groups,
            extra,
        }
    }
}

/// The namespace of a service account user name, as `serviceaccount.SplitUsername` accepts
/// it: `system:serviceaccount:<namespace>:<name>` with a DNS label namespace and a DNS
/// subdomain name.
fn service_account_namespace(user: &str) -> Option<&str> {
    let rest = user.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
    let (ns, name) = rest.split_once(':')?;
    let label = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    };
    let subdomain_ok = name.len() <= 253 && name.split('.').all(label);
    (label(ns) && subdomain_ok).then_some(ns)
}

/// `url.PathUnescape`, falling back to the raw key when it is not valid percent-encoding
/// (`unescapeExtraKey`).
fn path_unescape(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                None => return key.to_string(),
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| key.to_string())
}
