//! Query strings, label selectors and field selectors.

use serde_json::Value;

use super::kinds::{Kind, at, meta};

/// A decoded query string.
#[derive(Clone, Debug, Default)]
pub(crate) struct Query {
    pairs: Vec<(String, String)>,
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Query {
    pub(crate) fn parse(raw: Option<&str>) -> Self {
        let pairs = raw
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (percent_decode(k), percent_decode(v))
            })
            .collect();
        Query { pairs }
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `strconv.ParseBool`-true.
    pub(crate) fn flag(&self, key: &str) -> bool {
        matches!(
            self.get(key),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True")
        )
    }
}

#[derive(Clone, Debug)]
enum LabelReq {
    Exists(String),
    NotExists(String),
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

#[derive(Clone, Debug)]
struct FieldReq {
    field: String,
    value: String,
    negate: bool,
}

/// `labelSelector` and `fieldSelector` of a list or watch.
#[derive(Clone, Debug, Default)]
pub(crate) struct Selectors {
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
}

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    parts.push(cur);
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn parse_set(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

fn parse_label_req(s: &str) -> Result<LabelReq, String> {
    if let Some(k) = s.strip_prefix('!') {
        return Ok(LabelReq::NotExists(k.trim().to_string()));
    }
    if let Some((k, v)) = s.split_once("!=") {
        return Ok(LabelReq::NotEq(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = s.split_once("==") {
        return Ok(LabelReq::Eq(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = s.split_once('=') {
        return Ok(LabelReq::Eq(k.trim().into(), v.trim().into()));
    }
    if let Some((k, rest)) = s.split_once(" notin ") {
        let set = parse_set(rest).ok_or_else(|| format!("unable to parse requirement: {s}"))?;
        return Ok(LabelReq::NotIn(k.trim().into(), set));
    }
    if let Some((k, rest)) = s.split_once(" in ") {
        let set = parse_set(rest).ok_or_else(|| format!("unable to parse requirement: {s}"))?;
        return Ok(LabelReq::In(k.trim().into(), set));
    }
    if s.contains(['<', '>', '(', ')', ' ']) {
        return Err(format!(
            "unable to parse requirement: {s} (the stand-in supports =, ==, !=, in, notin, exists and !exists)"
        ));
    }
    Ok(LabelReq::Exists(s.trim().to_string()))
}

/// The field value used by field selectors, or None if the field is not selectable
/// (`GetAttrs`/`SelectableFields` of each registry strategy).
fn field_value(kind: Kind, obj: &Value, field: &str) -> Option<String> {
    let s = |path: &[&str]| {
        Some(match at(obj, path) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Bool(b)) => b.to_string(),
            Some(Value::Number(n)) => n.to_string(),
            _ => String::new(),
        })
    };
    match (kind, field) {
        (_, "metadata.name") => Some(meta::name(obj).to_string()),
        (k, "metadata.namespace") if k.namespaced() => Some(meta::namespace(obj).to_string()),
        (Kind::Node, "spec.unschedulable") => Some(
            at(obj, &["spec", "unschedulable"])
                .and_then(Value::as_bool)
                .unwrap_or(false)
                .to_string(),
        ),
        (Kind::Namespace, "status.phase") => s(&["status", "phase"]),
        (Kind::Secret, "type") => s(&["type"]),
        (Kind::CertificateSigningRequest, "spec.signerName") => s(&["spec", "signerName"]),
        (Kind::Event, f) => match f {
            "involvedObject.kind"
            | "involvedObject.namespace"
            | "involvedObject.name"
            | "involvedObject.uid"
            | "involvedObject.apiVersion"
            | "involvedObject.resourceVersion"
            | "involvedObject.fieldPath" => {
                let parts: Vec<&str> = f.split('.').collect();
                s(&parts)
            }
            "reason" | "reportingComponent" | "type" => s(&[f]),
            "source" => s(&["source", "component"]),
            _ => None,
        },
        _ => None,
    }
}

impl Selectors {
    /// Parses the selectors of `q` for `kind`; the error is a BadRequest message.
    pub(crate) fn parse(kind: Kind, q: &Query) -> Result<Self, String> {
        let mut sel = Selectors::default();
        if let Some(ls) = q.get("labelSelector") {
            for part in split_top(ls) {
                sel.labels.push(parse_label_req(&part)?);
            }
        }
        if let Some(fs) = q.get("fieldSelector") {
            for part in split_top(fs) {
                let (field, value, negate) = if let Some((f, v)) = part.split_once("!=") {
                    (f, v, true)
                } else if let Some((f, v)) = part.split_once("==") {
                    (f, v, false)
                } else if let Some((f, v)) = part.split_once('=') {
                    (f, v, false)
                } else {
                    return Err(format!(
                        "invalid selector: '{part}'; can't understand '{part}'"
                    ));
                };
                let field = field.trim().to_string();
                if field_value(kind, &Value::Null, &field).is_none() {
                    return Err(format!("field label not supported: {field}"));
                }
                sel.fields.push(FieldReq {
                    field,
                    value: value.trim().to_string(),
                    negate,
                });
            }
        }
        Ok(sel)
    }

    pub(crate) fn matches(&self, kind: Kind, obj: &Value) -> bool {
        let label = |k: &str| -> Option<&str> {
            meta::labels(obj)
                .and_then(|l| l.get(k))
                .and_then(Value::as_str)
        };
        let labels_ok = self.labels.iter().all(|r| match r {
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
            LabelReq::Eq(k, v) => label(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => label(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => label(k).is_none_or(|l| vs.iter().all(|v| v != l)),
        });
        labels_ok
            && self.fields.iter().all(|f| {
                let actual = field_value(kind, obj, &f.field).unwrap_or_default();
                (actual == f.value) != f.negate
            })
    }
}
