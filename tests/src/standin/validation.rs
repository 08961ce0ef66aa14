//! The validation subset: object metadata (`apimachinery/pkg/api/validation/objectmeta.go`),
//! Node (`pkg/apis/core/validation: ValidateNode`, taints and duplicate addresses), Lease
//! (`pkg/apis/coordination/validation`), core Event (`legacyValidateEvent`), and Go's
//! `RFC3339Micro` time parsing for MicroTime fields.

use serde_json::Value;

use super::kinds::{Kind, at, meta, str_at};

/// `field.ErrorType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FieldErrorType {
    Required,
    Invalid,
    Forbidden,
    NotSupported,
    Duplicate,
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

    pub(crate) fn reason(&self) -> &'static str {
        match self.ty {
            FieldErrorType::Required => "FieldValueRequired",
            FieldErrorType::Invalid => "FieldValueInvalid",
            FieldErrorType::Forbidden => "FieldValueForbidden",
            FieldErrorType::NotSupported => "FieldValueNotSupported",
            FieldErrorType::Duplicate => "FieldValueDuplicate",
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

/// `ValidateObjectMeta` (create) for the metadata the stand-in keeps.
pub(crate) fn object_meta(obj: &Value, kind: Kind, errs: &mut Vec<FieldError>) {
    let name = meta::name(obj);
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
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

/// Kind-specific validation; `old` is the stored object on update.
pub(crate) fn validate(kind: Kind, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    // The real validators start with ValidateObjectMeta, then check the type's fields.
    object_meta(obj, kind, &mut errs);
    if let Some(old) = old {
        object_meta_update(obj, old, &mut errs);
    }
    match kind {
        Kind::Node => node(obj, old, &mut errs),
        Kind::Lease => lease(obj, &mut errs),
        Kind::Event => event(obj, &mut errs),
        Kind::Namespace => {}
    }
    errs
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
