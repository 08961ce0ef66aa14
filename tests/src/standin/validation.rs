//! The validation subset: object metadata (`apimachinery/pkg/api/validation/objectmeta.go`),
//! Node (`pkg/apis/core/validation: ValidateNode`, taints and duplicate addresses), Lease
//! (`pkg/apis/coordination/validation`), core Event (`legacyValidateEvent`), Secret
//! (`ValidateSecret`, `ValidateSecretUpdate`), CertificateSigningRequest
//! (`pkg/apis/certificates/validation/validation.go`), and Go's `RFC3339Micro` time parsing
//! for MicroTime fields.

use serde_json::Value;

use super::kinds::{Kind, Sub, at, meta, str_at};
use super::pem;

/// `field.ErrorType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FieldErrorType {
    Required,
    Invalid,
    Forbidden,
    NotSupported,
    Duplicate,
    TooLong,
}

/// `field.Error`, with the value already rendered as Go renders it.
#[derive(Clone, Debug)]
pub(crate) struct FieldError {
    pub(crate) ty: FieldErrorType,
    pub(crate) field: String,
    pub(crate) value: String,
    pub(crate) detail: String,
}

impl FieldError {
    pub(crate) fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            ty: FieldErrorType::Required,
            field: field.into(),
            value: String::new(),
            detail: detail.into(),
        }
    }

    pub(crate) fn invalid(
        field: impl Into<String>,
        value: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            ty: FieldErrorType::Invalid,
            field: field.into(),
            value: value.into(),
            detail: detail.into(),
        }
    }

    pub(crate) fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            ty: FieldErrorType::Forbidden,
            field: field.into(),
            value: String::new(),
            detail: detail.into(),
        }
    }

    /// `field.TooLong(field, _, max)`: the value is never shown.
    pub(crate) fn too_long(field: impl Into<String>, max: usize) -> Self {
        let unit = if max == 1 { "byte" } else { "bytes" };
        FieldError {
            ty: FieldErrorType::TooLong,
            field: field.into(),
            value: String::new(),
            detail: format!("may not be more than {max} {unit}"),
        }
    }

    /// `field.Duplicate(field, value)`, `value` already rendered.
    pub(crate) fn duplicate(field: impl Into<String>, value: impl Into<String>) -> Self {
        FieldError {
            ty: FieldErrorType::Duplicate,
            field: field.into(),
            value: value.into(),
            detail: String::new(),
        }
    }

    /// `field.NotSupported(field, value, valid)`: `value` already rendered, `valid` quoted
    /// in the order given.
    pub(crate) fn not_supported(
        field: impl Into<String>,
        value: impl Into<String>,
        valid: &[&str],
    ) -> Self {
        FieldError {
            ty: FieldErrorType::NotSupported,
            field: field.into(),
            value: value.into(),
            detail: valid.iter().map(|v| q(v)).collect::<Vec<_>>().join(", "),
        }
    }

    pub(crate) fn reason(&self) -> &'static str {
        match self.ty {
            FieldErrorType::Required => "FieldValueRequired",
            FieldErrorType::Invalid => "FieldValueInvalid",
            FieldErrorType::Forbidden => "FieldValueForbidden",
            FieldErrorType::NotSupported => "FieldValueNotSupported",
            FieldErrorType::Duplicate => "FieldValueDuplicate",
            FieldErrorType::TooLong => "FieldValueTooLong",
        }
    }

    /// `ErrorBody()`: the message without the field path.
    pub(crate) fn body(&self) -> String {
        let with_detail = |head: String| {
            if self.detail.is_empty() {
                head
            } else {
                format!("{head}: {}", self.detail)
            }
        };
        match self.ty {
            FieldErrorType::Required => with_detail("Required value".into()),
            FieldErrorType::Invalid => with_detail(format!("Invalid value: {}", self.value)),
            FieldErrorType::Forbidden => with_detail("Forbidden".into()),
            FieldErrorType::NotSupported => format!(
                "Unsupported value: {}: supported values: {}",
                self.value, self.detail
            ),
            FieldErrorType::Duplicate => with_detail(format!("Duplicate value: {}", self.value)),
            FieldErrorType::TooLong => with_detail("Too long".into()),
        }
    }

    pub(crate) fn message(&self) -> String {
        format!("{}: {}", self.field, self.body())
    }
}

/// Go's `%q` for the strings we render (JSON quoting is the same for printable text).
pub(crate) fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const QUALIFIED_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// `IsDNS1123Subdomain`.
pub(crate) fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b.first().is_some_and(|c| c.is_ascii_alphanumeric())
            && b.last().is_some_and(|c| c.is_ascii_alphanumeric())
    };
    if !s.split('.').all(label_ok) {
        errs.push(DNS1123_SUBDOMAIN_MSG.to_string());
    }
    errs
}

fn name_part_ok(s: &str) -> bool {
    let b = s.as_bytes();
    b.iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b.first().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.last().is_some_and(|c| c.is_ascii_alphanumeric())
}

/// `IsQualifiedName`.
pub(crate) fn qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_string());
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    }
    if !name.is_empty() && !name_part_ok(name) {
        errs.push(QUALIFIED_NAME_MSG.to_string());
    }
    errs
}

/// `IsValidLabelValue`.
pub(crate) fn label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !s.is_empty() && !name_part_ok(s) {
        errs.push(LABEL_VALUE_MSG.to_string());
    }
    errs
}

/// `ValidateObjectMeta` (create) for the metadata the stand-in keeps. Names are DNS
/// subdomains, except a CertificateSigningRequest's (`ValidateCertificateRequestName`: "We
/// don't care what you call your certificate requests").
pub(crate) fn object_meta(obj: &Value, kind: Kind, errs: &mut Vec<FieldError>) {
    let name = meta::name(obj);
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else if kind != Kind::CertificateSigningRequest {
        for m in dns1123_subdomain(name) {
            errs.push(FieldError::invalid("metadata.name", q(name), m));
        }
    }
    let ns = meta::namespace(obj);
    if kind.namespaced() {
        if ns.is_empty() {
            errs.push(FieldError::required("metadata.namespace", ""));
        }
    } else if !ns.is_empty() {
        errs.push(FieldError::forbidden(
            "metadata.namespace",
            "not allowed on this type",
        ));
    }
    if let Some(labels) = meta::labels(obj) {
        for (k, v) in labels {
            for m in qualified_name(k) {
                errs.push(FieldError::invalid("metadata.labels", q(k), m));
            }
            let v = v.as_str().unwrap_or("");
            for m in label_value(v) {
                errs.push(FieldError::invalid("metadata.labels", q(v), m));
            }
        }
    }
    if let Some(ann) = meta::get(obj, "annotations").and_then(Value::as_object) {
        let mut total = 0;
        for (k, v) in ann {
            total += k.len() + v.as_str().map_or(0, str::len);
            for m in qualified_name(&k.to_lowercase()) {
                errs.push(FieldError::invalid("metadata.annotations", q(k), m));
            }
        }
        if total > 256 * 1024 {
            errs.push(FieldError {
                ty: FieldErrorType::Invalid,
                field: "metadata.annotations".into(),
                value: String::new(),
                detail: "may not be more than 262144 bytes".into(),
            });
        }
    }
    if let Some(refs) = meta::get(obj, "ownerReferences").and_then(Value::as_array) {
        let mut controllers = 0;
        for r in refs {
            let f = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
            let api_version = f("apiVersion");
            if api_version.rsplit('/').next().unwrap_or("").is_empty() {
                errs.push(FieldError::invalid(
                    "metadata.ownerReferences.apiVersion",
                    q(api_version),
                    "version must not be empty",
                ));
            }
            for (k, what) in [("kind", "kind"), ("name", "name"), ("uid", "uid")] {
                if f(k).is_empty() {
                    errs.push(FieldError::invalid(
                        format!("metadata.ownerReferences.{k}"),
                        q(""),
                        format!("{what} must not be empty"),
                    ));
                }
            }
            if r.get("controller").and_then(Value::as_bool) == Some(true) {
                controllers += 1;
            }
        }
        if controllers > 1 {
            errs.push(FieldError::invalid(
                "metadata.ownerReferences",
                "[]v1.OwnerReference{...}",
                "Only one reference can have Controller set to true",
            ));
        }
    }
    if let Some(fins) = meta::get(obj, "finalizers").and_then(Value::as_array) {
        for f in fins {
            let f = f.as_str().unwrap_or("");
            for m in qualified_name(f) {
                errs.push(FieldError::invalid("metadata.finalizers", q(f), m));
            }
        }
    }
}

/// `ValidateObjectMetaUpdate`: name, namespace, uid and creationTimestamp are immutable.
pub(crate) fn object_meta_update(new: &Value, old: &Value, errs: &mut Vec<FieldError>) {
    for key in ["name", "namespace", "uid"] {
        let (n, o) = (meta::str_field(new, key), meta::str_field(old, key));
        if n != o {
            errs.push(FieldError::invalid(
                format!("metadata.{key}"),
                q(n),
                "field is immutable",
            ));
        }
    }
}

/// Kind-specific validation; `old` is the stored object on update, `sub` the strategy the
/// update goes through. Errors come in the order of the real validators.
pub(crate) fn validate(kind: Kind, obj: &Value, old: Option<&Value>, sub: Sub) -> Vec<FieldError> {
    let mut errs = Vec::new();
    match kind {
        // ValidateSecretUpdate: metadata update, type, immutability, then ValidateSecret.
        Kind::Secret => {
            if let Some(old) = old {
                object_meta_update(obj, old, &mut errs);
                secret_update(obj, old, &mut errs);
            }
            object_meta(obj, kind, &mut errs);
            secret(obj, &mut errs);
        }
        // validateCertificateSigningRequestUpdate: the object, the update rules, then the
        // metadata update.
        Kind::CertificateSigningRequest => {
            object_meta(obj, kind, &mut errs);
            certificate_signing_request(obj, old, sub, &mut errs);
            if let Some(old) = old {
                object_meta_update(obj, old, &mut errs);
            }
        }
        // The others start with ValidateObjectMeta(Update), then check the type's fields.
        _ => {
            object_meta(obj, kind, &mut errs);
            if let Some(old) = old {
                object_meta_update(obj, old, &mut errs);
            }
            match kind {
                Kind::Node => node(obj, old, &mut errs),
                Kind::Lease => lease(obj, &mut errs),
                Kind::Event => event(obj, &mut errs),
                _ => {}
            }
        }
    }
    errs
}

/// `IsDNS1123Label`.
fn dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    let b = s.as_bytes();
    let ok = !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-';
    if !ok {
        if !s.is_empty() && dns1123_subdomain(s).is_empty() {
            errs.push("must not contain dots".to_string());
        } else {
            errs.push("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".to_string());
        }
    }
    errs
}

/// `IsConfigMapKey`, the rule for Secret data keys.
fn config_map_key(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if s.is_empty()
        || !s
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        errs.push("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')".to_string());
    }
    if s == "." {
        errs.push("must not be '.'".to_string());
    } else if s == ".." {
        errs.push("must not be '..'".to_string());
    } else if s.starts_with("..") {
        errs.push("must not start with '..'".to_string());
    }
    errs
}

/// `core.MaxSecretSize`.
const MAX_SECRET_SIZE: usize = 1024 * 1024;

/// `ValidateSecret` after `ValidateObjectMeta`: data keys and size, and the keys each
/// well-known type requires. The JSON error texts of the docker config types are serde's,
/// not Go's.
fn secret(obj: &Value, errs: &mut Vec<FieldError>) {
    let Ok(secret) = serde_json::from_value::<k8s_openapi::api::core::v1::Secret>(obj.clone())
    else {
        return;
    };
    let data = secret.data.unwrap_or_default();
    let mut total = 0;
    for (key, value) in &data {
        for m in config_map_key(key) {
            errs.push(FieldError::invalid(format!("data[{key}]"), q(key), m));
        }
        total += value.0.len();
    }
    if total > MAX_SECRET_SIZE {
        errs.push(FieldError::too_long("data", MAX_SECRET_SIZE));
    }
    let json_map = |key: &str| {
        let path = format!("data[{key}]");
        match data.get(key) {
            None => Some(FieldError::required(path, "")),
            Some(v) => serde_json::from_slice::<serde_json::Map<String, Value>>(&v.0)
                .err()
                .map(|e| FieldError::invalid(path, q("<secret contents redacted>"), e.to_string())),
        }
    };
    match secret.type_.as_deref().unwrap_or("") {
        "kubernetes.io/service-account-token" => {
            let name = secret
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubernetes.io/service-account.name"))
                .map_or("", String::as_str);
            if name.is_empty() {
                errs.push(FieldError::required(
                    "metadata.annotations[kubernetes.io/service-account.name]",
                    "",
                ));
            }
        }
        "kubernetes.io/dockercfg" => errs.extend(json_map(".dockercfg")),
        "kubernetes.io/dockerconfigjson" => errs.extend(json_map(".dockerconfigjson")),
        // Either may be empty, but one must be there.
        "kubernetes.io/basic-auth"
            if !data.contains_key("username") && !data.contains_key("password") =>
        {
            errs.push(FieldError::required("data[username]", ""));
            errs.push(FieldError::required("data[password]", ""));
        }
        "kubernetes.io/ssh-auth" if data.get("ssh-privatekey").is_none_or(|v| v.0.is_empty()) => {
            errs.push(FieldError::required("data[ssh-privatekey]", ""));
        }
        "kubernetes.io/tls" => {
            for key in ["tls.crt", "tls.key"] {
                if !data.contains_key(key) {
                    errs.push(FieldError::required(format!("data[{key}]"), ""));
                }
            }
        }
        _ => {}
    }
}

/// The Secret half of `ValidateSecretUpdate`: `type` is immutable, and so are `data` and
/// `immutable` once `immutable` is true.
fn secret_update(new: &Value, old: &Value, errs: &mut Vec<FieldError>) {
    let (new_type, old_type) = (str_at(new, &["type"]), str_at(old, &["type"]));
    if new_type != old_type {
        errs.push(FieldError::invalid(
            "type",
            q(new_type),
            "field is immutable",
        ));
    }
    if at(old, &["immutable"]).and_then(Value::as_bool) == Some(true) {
        const MSG: &str = "field is immutable when `immutable` is set";
        if at(new, &["immutable"]).and_then(Value::as_bool) != Some(true) {
            errs.push(FieldError::forbidden("immutable", MSG));
        }
        if at(new, &["data"]) != at(old, &["data"]) {
            errs.push(FieldError::forbidden("data", MSG));
        }
    }
}

/// `allValidUsages` of the certificates validation, sorted as `sets.String.List()`.
const VALID_USAGES: [&str; 23] = [
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// `certificates.LegacyUnknownSignerName`.
const LEGACY_UNKNOWN_SIGNER: &str = "kubernetes.io/legacy-unknown";

type Csr = k8s_openapi::api::certificates::v1::CertificateSigningRequest;
type CsrCondition = k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition;

fn csr_conditions(csr: &Csr) -> &[CsrCondition] {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[])
}

fn csr_certificate(csr: &Csr) -> &[u8] {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .map_or(&[], |c| c.0.as_slice())
}

fn conditions_of<'a>(csr: &'a Csr, ty: &str) -> Vec<&'a CsrCondition> {
    csr_conditions(csr)
        .iter()
        .filter(|c| c.type_ == ty)
        .collect()
}

/// `certificateValidationOptions`, from `getValidationOptions` and the subresource.
#[derive(Default)]
struct CsrOptions {
    allow_setting_approval_conditions: bool,
    allow_setting_certificate: bool,
    allow_both_approved_and_denied: bool,
    allow_legacy_signer_name: bool,
    allow_duplicate_condition_types: bool,
    allow_empty_condition_type: bool,
    allow_arbitrary_certificate: bool,
    allow_unknown_usages: bool,
    allow_duplicate_usages: bool,
}

impl CsrOptions {
    /// What the stored object already breaks is tolerated (compatibility with existing
    /// data); `/status` may set the certificate, `/approval` the approval conditions.
    fn new(new: &Csr, old: Option<&Csr>, sub: Sub) -> Self {
        let Some(old) = old else {
            return CsrOptions::default();
        };
        let conditions = csr_conditions(old);
        let has = |ty: &str| conditions.iter().any(|c| c.type_ == ty);
        let mut types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
        let n = types.len();
        types.sort_unstable();
        types.dedup();
        let usages = old.spec.usages.as_deref().unwrap_or(&[]);
        let mut distinct_usages = usages.to_vec();
        distinct_usages.sort_unstable();
        distinct_usages.dedup();
        CsrOptions {
            allow_setting_approval_conditions: sub == Sub::Approval,
            allow_setting_certificate: sub == Sub::Status,
            allow_both_approved_and_denied: has("Approved") && has("Denied"),
            allow_legacy_signer_name: old.spec.signer_name == LEGACY_UNKNOWN_SIGNER,
            allow_duplicate_condition_types: types.len() != n,
            allow_empty_condition_type: has(""),
            allow_arbitrary_certificate: csr_certificate(new) == csr_certificate(old)
                || pem::validate_certificate(csr_certificate(old)).is_err(),
            allow_unknown_usages: usages.iter().any(|u| !VALID_USAGES.contains(&u.as_str())),
            allow_duplicate_usages: distinct_usages.len() != usages.len(),
        }
    }
}

/// Go's `%#v` of a byte slice: how `spec.request` is shown in its Invalid error.
fn go_bytes(b: &[u8]) -> String {
    let items: Vec<String> = b.iter().map(|x| format!("{x:#x}")).collect();
    format!("[]byte{{{}}}", items.join(", "))
}

/// `ValidateSignerName` (`pkg/apis/core/validation/names.go`).
fn signer_name(name: &str, errs: &mut Vec<FieldError>) {
    const PATH: &str = "spec.signerName";
    if name.is_empty() {
        errs.push(FieldError::required(PATH, ""));
        return;
    }
    let segments: Vec<&str> = name.split('/').collect();
    let [domain, path] = segments.as_slice() else {
        errs.push(FieldError::invalid(
            PATH,
            q(name),
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
        return;
    };
    if domain.len() > 253 {
        errs.push(FieldError::too_long(PATH, 253));
    }
    let labels: Vec<&str> = domain.split('.').collect();
    for label in &labels {
        let label_errs = dns1123_label(label);
        if !label_errs.is_empty() {
            for m in label_errs {
                errs.push(FieldError::invalid(
                    PATH,
                    q(domain),
                    format!("validating label {}: {m}", q(label)),
                ));
            }
            break;
        }
    }
    if labels.len() < 2 {
        errs.push(FieldError::invalid(
            PATH,
            q(domain),
            "should be a domain with at least two segments separated by dots",
        ));
    }
    for label in path.split('.') {
        let label_errs = dns1123_subdomain(label);
        if !label_errs.is_empty() {
            for m in label_errs {
                errs.push(FieldError::invalid(
                    PATH,
                    q(path),
                    format!("validating label {}: {m}", q(label)),
                ));
            }
            break;
        }
    }
    let max = 253 + (253 + 63 + 1) + 1;
    if name.len() > max {
        errs.push(FieldError::too_long(PATH, max));
    }
}

/// `validateCertificateSigningRequest` after `ValidateObjectMeta`, then (on update)
/// `validateCertificateSigningRequestUpdate`'s rules, with the options of `sub`'s
/// strategy (`ValidateCertificateSigningRequest{,Status,Approval}Update`).
fn certificate_signing_request(
    obj: &Value,
    old: Option<&Value>,
    sub: Sub,
    errs: &mut Vec<FieldError>,
) {
    let Ok(new) = serde_json::from_value::<Csr>(obj.clone()) else {
        return;
    };
    let old = old.and_then(|o| serde_json::from_value::<Csr>(o.clone()).ok());
    let opts = CsrOptions::new(&new, old.as_ref(), sub);
    let spec = &new.spec;
    if let Err(e) = pem::parse_and_verify_csr(&spec.request.0) {
        errs.push(FieldError::invalid(
            "spec.request",
            go_bytes(&spec.request.0),
            e,
        ));
    }
    let usages = spec.usages.as_deref().unwrap_or(&[]);
    if usages.is_empty() {
        errs.push(FieldError::required("spec.usages", ""));
    }
    if !opts.allow_unknown_usages {
        for (i, u) in usages.iter().enumerate() {
            if !VALID_USAGES.contains(&u.as_str()) {
                errs.push(FieldError::not_supported(
                    format!("spec.usages[{i}]"),
                    q(u),
                    &VALID_USAGES,
                ));
            }
        }
    }
    if !opts.allow_duplicate_usages {
        for (i, u) in usages.iter().enumerate() {
            if usages[..i].contains(u) {
                errs.push(FieldError::duplicate(format!("spec.usages[{i}]"), q(u)));
            }
        }
    }
    if !opts.allow_legacy_signer_name && spec.signer_name == LEGACY_UNKNOWN_SIGNER {
        errs.push(FieldError::invalid(
            "spec.signerName",
            q(&spec.signer_name),
            "the legacy signerName is not allowed via this API version",
        ));
    } else {
        signer_name(&spec.signer_name, errs);
    }
    if let Some(secs) = spec.expiration_seconds.filter(|s| *s < 600) {
        errs.push(FieldError::invalid(
            "spec.expirationSeconds",
            secs.to_string(),
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    csr_status_conditions(&new, &opts, errs);
    if !opts.allow_arbitrary_certificate
        && let Err(e) = pem::validate_certificate(csr_certificate(&new))
    {
        errs.push(FieldError::invalid(
            "status.certificate",
            q("<certificate data>"),
            e,
        ));
    }
    let Some(old) = old else {
        return;
    };
    for ty in ["Approved", "Denied", "Failed"] {
        if conditions_of(&new, ty).len() < conditions_of(&old, ty).len() {
            errs.push(FieldError::forbidden(
                "status.conditions",
                format!("updates may not remove a condition of type {}", q(ty)),
            ));
        }
    }
    if !opts.allow_setting_approval_conditions {
        for ty in ["Approved", "Denied"] {
            let (o, n) = (conditions_of(&old, ty), conditions_of(&new, ty));
            if n.len() > o.len() {
                errs.push(FieldError::forbidden(
                    "status.conditions",
                    format!("updates may not add a condition of type {}", q(ty)),
                ));
            } else if n.len() == o.len() && n != o {
                // The real message continues with a cmp.Diff the stand-in does not render.
                errs.push(FieldError::forbidden(
                    "status.conditions",
                    format!("updates may not modify a condition of type {}", q(ty)),
                ));
            }
        }
    }
    if csr_certificate(&new) != csr_certificate(&old) {
        if !opts.allow_setting_certificate {
            errs.push(FieldError::forbidden(
                "status.certificate",
                "updates may not set certificate content",
            ));
        } else if !csr_certificate(&old).is_empty() {
            errs.push(FieldError::forbidden(
                "status.certificate",
                "updates may not modify existing certificate content",
            ));
        }
    }
}

/// `validateConditions`.
fn csr_status_conditions(csr: &Csr, opts: &CsrOptions, errs: &mut Vec<FieldError>) {
    let (mut approved, mut denied) = (false, false);
    let mut seen: Vec<&str> = Vec::new();
    for (i, c) in csr_conditions(csr).iter().enumerate() {
        let path = format!("status.conditions[{i}]");
        if !opts.allow_empty_condition_type && c.type_.is_empty() {
            errs.push(FieldError::required(format!("{path}.type"), ""));
        }
        let true_only = matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed");
        let allowed: &[&str] = if true_only {
            &["True"]
        } else {
            &["False", "True", "Unknown"]
        };
        if c.status.is_empty() {
            errs.push(FieldError::required(format!("{path}.status"), ""));
        } else if !allowed.contains(&c.status.as_str()) {
            errs.push(FieldError::not_supported(
                format!("{path}.status"),
                q(&c.status),
                allowed,
            ));
        }
        if !opts.allow_both_approved_and_denied {
            let exclusive = match c.type_.as_str() {
                "Approved" => {
                    approved = true;
                    denied
                }
                "Denied" => {
                    denied = true;
                    approved
                }
                _ => false,
            };
            if exclusive {
                errs.push(FieldError::invalid(
                    format!("{path}.type"),
                    q(&c.type_),
                    "Approved and Denied conditions are mutually exclusive",
                ));
            }
        }
        if !opts.allow_duplicate_condition_types {
            if seen.contains(&c.type_.as_str()) {
                errs.push(FieldError::duplicate(format!("{path}.type"), q(&c.type_)));
            }
            seen.push(&c.type_);
        }
    }
}

fn node(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    if let Some(taints) = at(obj, &["spec", "taints"]).and_then(Value::as_array) {
        let mut seen: Vec<(String, String)> = Vec::new();
        for (i, t) in taints.iter().enumerate() {
            let path = format!("spec.taints[{i}]");
            let key = str_at(t, &["key"]);
            let value = str_at(t, &["value"]);
            let effect = str_at(t, &["effect"]);
            for m in qualified_name(key) {
                errs.push(FieldError::invalid(format!("{path}.key"), q(key), m));
            }
            for m in label_value(value) {
                errs.push(FieldError::invalid(format!("{path}.value"), q(value), m));
            }
            if effect.is_empty() {
                errs.push(FieldError::required(format!("{path}.effect"), ""));
            } else if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                errs.push(FieldError {
                    ty: FieldErrorType::NotSupported,
                    field: format!("{path}.effect"),
                    value: q(effect),
                    detail: "\"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\"".into(),
                });
            }
            let pair = (key.to_string(), effect.to_string());
            if seen.contains(&pair) {
                errs.push(FieldError {
                    ty: FieldErrorType::Duplicate,
                    field: path,
                    value: t.to_string(),
                    detail: "taints must be unique by key and effect pair".into(),
                });
            } else {
                seen.push(pair);
            }
        }
    }
    if old.is_some()
        && let Some(addrs) = at(obj, &["status", "addresses"]).and_then(Value::as_array)
    {
        for (i, a) in addrs.iter().enumerate() {
            if addrs[..i].contains(a) {
                errs.push(FieldError {
                    ty: FieldErrorType::Duplicate,
                    field: format!("status.addresses[{i}]"),
                    value: a.to_string(),
                    detail: String::new(),
                });
            }
        }
    }
}

fn lease(obj: &Value, errs: &mut Vec<FieldError>) {
    if let Some(d) = at(obj, &["spec", "leaseDurationSeconds"]).and_then(Value::as_i64)
        && d <= 0
    {
        errs.push(FieldError::invalid(
            "spec.leaseDurationSeconds",
            d.to_string(),
            "must be greater than 0",
        ));
    }
    if let Some(t) = at(obj, &["spec", "leaseTransitions"]).and_then(Value::as_i64)
        && t < 0
    {
        errs.push(FieldError::invalid(
            "spec.leaseTransitions",
            t.to_string(),
            "must be greater than or equal to 0",
        ));
    }
}

/// `legacyValidateEvent` for requests to the core v1 API.
fn event(obj: &Value, errs: &mut Vec<FieldError>) {
    let ns = meta::namespace(obj);
    let involved_ns = str_at(obj, &["involvedObject", "namespace"]);
    let event_time = at(obj, &["eventTime"]).is_some_and(|v| !v.is_null());
    let mismatch = || {
        FieldError::invalid(
            "involvedObject.namespace",
            q(involved_ns),
            "does not match event.namespace",
        )
    };
    if !event_time {
        if involved_ns.is_empty() {
            if !ns.is_empty() && ns != "default" {
                errs.push(mismatch());
            }
        } else if ns != involved_ns {
            errs.push(mismatch());
        }
    } else {
        if involved_ns.is_empty() && ns != "default" && ns != "kube-system" {
            errs.push(mismatch());
        }
        let controller = str_at(obj, &["reportingComponent"]);
        if controller.is_empty() {
            errs.push(FieldError::required("reportingComponent", ""));
        }
        for m in qualified_name(controller) {
            if !controller.is_empty() {
                errs.push(FieldError::invalid("reportingComponent", q(controller), m));
            }
        }
        for (field, limit) in [("reportingInstance", 128), ("action", 128), ("reason", 128)] {
            let v = str_at(obj, &[field]);
            if v.is_empty() {
                errs.push(FieldError::required(field, ""));
            }
            if v.len() > limit {
                errs.push(FieldError::invalid(
                    field,
                    q(""),
                    format!("can have at most {limit} characters"),
                ));
            }
        }
        if str_at(obj, &["message"]).len() > 1024 {
            errs.push(FieldError::invalid(
                "message",
                q(""),
                "can have at most 1024 characters",
            ));
        }
    }
    for m in dns1123_subdomain(ns) {
        errs.push(FieldError::invalid("namespace", q(ns), m));
    }
}

/// Go's `RFC3339Micro` layout, the one `metav1.MicroTime.UnmarshalJSON` parses with.
pub(crate) const RFC3339_MICRO: &str = "2006-01-02T15:04:05.000000Z07:00";

/// Checks the MicroTime fields of `obj` (the raw request JSON). Returns the error text of
/// the first bad one, as Go's decoder reports it.
pub(crate) fn check_micro_times(kind: Kind, obj: &Value) -> Result<(), String> {
    for path in kind.micro_time_fields() {
        match at(obj, path) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => parse_micro_time(s)?,
            Some(other) => {
                return Err(format!(
                    "json: cannot unmarshal {} into Go value of type string",
                    json_type_name(other)
                ));
            }
        }
    }
    Ok(())
}

fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn days_in(month: u32, year: i64) -> u32 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Emulates `time.Parse(RFC3339Micro, s)`: exactly 6 fractional digits, then `Z` or an
/// offset. The stand-in additionally requires the `Z` form (the project's contract; the
/// real parser would also take `+hh:mm`).
pub(crate) fn parse_micro_time(s: &str) -> Result<(), String> {
    let cannot = |value_elem: &str, layout_elem: &str| {
        format!(
            "parsing time {} as {}: cannot parse {} as {}",
            q(s),
            q(RFC3339_MICRO),
            q(value_elem),
            q(layout_elem)
        )
    };
    let out_of_range = |what: &str| format!("parsing time {}: {what} out of range", q(s));
    let mut rest = s;
    // fixed-width numbers: (layout element, digits, literal that follows)
    let mut nums = [0i64; 6];
    let elems: [(&str, usize, &str); 6] = [
        ("2006", 4, "-"),
        ("01", 2, "-"),
        ("02", 2, "T"),
        ("15", 2, ":"),
        ("04", 2, ":"),
        ("05", 2, ""),
    ];
    for (i, (layout, width, lit)) in elems.iter().enumerate() {
        let hold = rest;
        let digits = rest
            .as_bytes()
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        // Go's stdHour accepts one digit; the others need the full width.
        let take = if *layout == "15" && digits == 1 {
            1
        } else {
            *width
        };
        if digits < take {
            return Err(cannot(hold, layout));
        }
        let (num, after) = rest.split_at(take);
        nums[i] = num.parse().map_err(|_| cannot(hold, layout))?;
        rest = after;
        if !lit.is_empty() {
            match rest.strip_prefix(lit) {
                Some(r) => rest = r,
                None => return Err(cannot(rest, lit)),
            }
        }
    }
    let [year, month, day, hour, minute, second] = nums;
    if !(1..=12).contains(&month) {
        return Err(out_of_range("month"));
    }
    if hour >= 24 {
        return Err(out_of_range("hour"));
    }
    if minute >= 60 {
        return Err(out_of_range("minute"));
    }
    if second >= 60 {
        return Err(out_of_range("second"));
    }
    // ".000000": exactly a period and six digits
    let frac_ok = rest.len() >= 7
        && matches!(rest.as_bytes().first(), Some(b'.' | b','))
        && rest.as_bytes()[1..7].iter().all(u8::is_ascii_digit);
    if !frac_ok {
        return Err(cannot(rest, ".000000"));
    }
    rest = &rest[7..];
    // "Z07:00"
    if let Some(r) = rest.strip_prefix('Z') {
        rest = r;
    } else {
        let b = rest.as_bytes();
        let offset_ok = b.len() >= 6
            && matches!(b[0], b'+' | b'-')
            && b[1..3].iter().all(u8::is_ascii_digit)
            && b[3] == b':'
            && b[4..6].iter().all(u8::is_ascii_digit);
        if !offset_ok {
            return Err(cannot(rest, "Z07:00"));
        }
        return Err(format!(
            "parsing time {}: the edgebeat stand-in requires MicroTime in UTC with a 'Z' suffix \
             (the real server would accept the offset {})",
            q(s),
            q(&rest[..6])
        ));
    }
    if !rest.is_empty() {
        return Err(format!("parsing time {}: extra text: {}", q(s), q(rest)));
    }
    if day < 1 || day > i64::from(days_in(month as u32, year)) {
        return Err(format!("parsing time {}: day out of range", q(s)));
    }
    Ok(())
}
