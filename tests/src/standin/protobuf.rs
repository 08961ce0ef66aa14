//! Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`), decoded into
//! the JSON the rest of the stand-in works on, for the kinds a real client writes that way:
//! kubectl's typed clientset sends CertificateSigningRequests as protobuf (`kubectl
//! certificate approve|deny` PUTs `/approval` so). Other kinds keep the 415 of a server
//! that does not take protobuf.
//!
//! The envelope is `staging/src/k8s.io/apimachinery/pkg/runtime/serializer/protobuf/
//! protobuf.go`'s: the bytes `k8s\0`, then a `runtime.Unknown` (`typeMeta` = 1, `raw` = 2)
//! whose `raw` is the object. Field numbers are those of `k8s.io/api/certificates/v1/
//! generated.proto` and `k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto`. As gogo
//! protobuf writes empty strings and zero numbers of non-pointer fields, those are treated
//! as absent where the JSON form omits them; `managedFields` are skipped (the stand-in keeps
//! none); a `metav1.Time` is whole seconds (`Time.Unmarshal` drops nanoseconds).

use serde_json::{Map, Value, json};

use super::kinds::Kind;

/// The protobuf media type.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// `protobuf.go`'s envelope prefix.
const PREFIX: [u8; 4] = [0x6b, 0x38, 0x73, 0x00];

/// Whether protobuf bodies of `kind` are decoded.
pub(crate) fn supports(kind: Kind) -> bool {
    kind == Kind::CertificateSigningRequest
}

/// One field of a protobuf message.
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf
            .split_first()
            .ok_or_else(|| "unexpected EOF".to_string())?;
        *buf = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("proto: integer overflow".to_string())
}

/// The fields of the message in `buf`, in order.
fn fields(mut buf: &[u8]) -> Result<Vec<(u64, Wire<'_>)>, String> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let (number, wire_type) = (key >> 3, key & 7);
        let wire = match wire_type {
            0 => Wire::Varint(varint(&mut buf)?),
            1 | 5 => {
                let n = if wire_type == 1 { 8 } else { 4 };
                if buf.len() < n {
                    return Err("unexpected EOF".to_string());
                }
                buf = &buf[n..];
                Wire::Fixed
            }
            2 => {
                let len = usize::try_from(varint(&mut buf)?)
                    .map_err(|_| "proto: negative length found during unmarshaling".to_string())?;
                if buf.len() < len {
                    return Err("unexpected EOF".to_string());
                }
                let (bytes, rest) = buf.split_at(len);
                buf = rest;
                Wire::Bytes(bytes)
            }
            other => return Err(format!("proto: illegal wireType {other}")),
        };
        out.push((number, wire));
    }
    Ok(out)
}

fn string(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "proto: invalid UTF-8 string".to_string())
}

/// Sets `key` to the string when it is not empty (JSON `omitempty`).
fn set_str(m: &mut Map<String, Value>, key: &str, b: &[u8]) -> Result<(), String> {
    let s = string(b)?;
    if !s.is_empty() {
        m.insert(key.to_string(), s.into());
    }
    Ok(())
}

fn push_str(m: &mut Map<String, Value>, key: &str, b: &[u8]) -> Result<(), String> {
    let s = string(b)?;
    if let Value::Array(a) = m.entry(key).or_insert_with(|| Value::Array(Vec::new())) {
        a.push(s.into());
    }
    Ok(())
}

fn bytes_json(b: &[u8]) -> Value {
    serde_json::to_value(k8s_openapi::ByteString(b.to_vec())).unwrap_or(Value::Null)
}

/// A `metav1.Time`: `None` for the zero time (an empty message).
fn time(b: &[u8]) -> Result<Option<Value>, String> {
    let mut seconds = None;
    for (n, w) in fields(b)? {
        if let (1, Wire::Varint(v)) = (n, w) {
            // int64 on the wire: two's complement.
            seconds = Some(v as i64);
        }
    }
    let Some(seconds) = seconds else {
        return Ok(None);
    };
    let ts = jiff::Timestamp::from_second(seconds).map_err(|e| e.to_string())?;
    let text = jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%SZ", ts).map_err(|e| e.to_string())?;
    Ok(Some(text.into()))
}

fn set_time(m: &mut Map<String, Value>, key: &str, b: &[u8]) -> Result<(), String> {
    if let Some(t) = time(b)? {
        m.insert(key.to_string(), t);
    }
    Ok(())
}

/// A `map<string, string>` entry.
fn map_entry(m: &mut Map<String, Value>, key: &str, b: &[u8]) -> Result<(), String> {
    let (mut k, mut v) = (String::new(), String::new());
    for (n, w) in fields(b)? {
        match (n, w) {
            (1, Wire::Bytes(x)) => k = string(x)?,
            (2, Wire::Bytes(x)) => v = string(x)?,
            _ => {}
        }
    }
    if let Value::Object(map) = m.entry(key).or_insert_with(|| Value::Object(Map::new())) {
        map.insert(k, v.into());
    }
    Ok(())
}

fn owner_reference(b: &[u8]) -> Result<Value, String> {
    let mut m = Map::new();
    for (n, w) in fields(b)? {
        match (n, w) {
            (5, Wire::Bytes(x)) => set_str(&mut m, "apiVersion", x)?,
            (1, Wire::Bytes(x)) => set_str(&mut m, "kind", x)?,
            (3, Wire::Bytes(x)) => set_str(&mut m, "name", x)?,
            (4, Wire::Bytes(x)) => set_str(&mut m, "uid", x)?,
            (6, Wire::Varint(v)) => {
                m.insert("controller".into(), (v != 0).into());
            }
            (7, Wire::Varint(v)) => {
                m.insert("blockOwnerDeletion".into(), (v != 0).into());
            }
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

/// `ObjectMeta`.
fn object_meta(b: &[u8]) -> Result<Value, String> {
    let mut m = Map::new();
    for (n, w) in fields(b)? {
        match (n, w) {
            (1, Wire::Bytes(x)) => set_str(&mut m, "name", x)?,
            (2, Wire::Bytes(x)) => set_str(&mut m, "generateName", x)?,
            (3, Wire::Bytes(x)) => set_str(&mut m, "namespace", x)?,
            (4, Wire::Bytes(x)) => set_str(&mut m, "selfLink", x)?,
            (5, Wire::Bytes(x)) => set_str(&mut m, "uid", x)?,
            (6, Wire::Bytes(x)) => set_str(&mut m, "resourceVersion", x)?,
            (7, Wire::Varint(v)) if v != 0 => {
                m.insert("generation".into(), (v as i64).into());
            }
            (8, Wire::Bytes(x)) => set_time(&mut m, "creationTimestamp", x)?,
            (9, Wire::Bytes(x)) => set_time(&mut m, "deletionTimestamp", x)?,
            (10, Wire::Varint(v)) => {
                m.insert("deletionGracePeriodSeconds".into(), (v as i64).into());
            }
            (11, Wire::Bytes(x)) => map_entry(&mut m, "labels", x)?,
            (12, Wire::Bytes(x)) => map_entry(&mut m, "annotations", x)?,
            (13, Wire::Bytes(x)) => {
                let r = owner_reference(x)?;
                if let Value::Array(a) = m
                    .entry("ownerReferences")
                    .or_insert_with(|| Value::Array(Vec::new()))
                {
                    a.push(r);
                }
            }
            (14, Wire::Bytes(x)) => push_str(&mut m, "finalizers", x)?,
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

/// `CertificateSigningRequestSpec`.
fn csr_spec(b: &[u8]) -> Result<Value, String> {
    let mut m = Map::new();
    m.insert("request".into(), bytes_json(&[]));
    m.insert("signerName".into(), "".into());
    for (n, w) in fields(b)? {
        match (n, w) {
            (1, Wire::Bytes(x)) => {
                m.insert("request".into(), bytes_json(x));
            }
            (7, Wire::Bytes(x)) => {
                m.insert("signerName".into(), string(x)?.into());
            }
            (8, Wire::Varint(v)) => {
                m.insert("expirationSeconds".into(), (v as i32).into());
            }
            (5, Wire::Bytes(x)) => push_str(&mut m, "usages", x)?,
            (2, Wire::Bytes(x)) => set_str(&mut m, "username", x)?,
            (3, Wire::Bytes(x)) => set_str(&mut m, "uid", x)?,
            (4, Wire::Bytes(x)) => push_str(&mut m, "groups", x)?,
            (6, Wire::Bytes(x)) => {
                let (mut key, mut items) = (String::new(), Vec::new());
                for (en, ew) in fields(x)? {
                    match (en, ew) {
                        (1, Wire::Bytes(k)) => key = string(k)?,
                        (2, Wire::Bytes(v)) => {
                            for (vn, vw) in fields(v)? {
                                if let (1, Wire::Bytes(item)) = (vn, vw) {
                                    items.push(Value::from(string(item)?));
                                }
                            }
                        }
                        _ => {}
                    }
                }
                if let Value::Object(extra) = m
                    .entry("extra")
                    .or_insert_with(|| Value::Object(Map::new()))
                {
                    extra.insert(key, Value::Array(items));
                }
            }
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

/// `CertificateSigningRequestStatus`.
fn csr_status(b: &[u8]) -> Result<Value, String> {
    let mut m = Map::new();
    for (n, w) in fields(b)? {
        match (n, w) {
            (1, Wire::Bytes(x)) => {
                let mut c = Map::new();
                c.insert("type".into(), "".into());
                c.insert("status".into(), "".into());
                for (cn, cw) in fields(x)? {
                    match (cn, cw) {
                        (1, Wire::Bytes(v)) => {
                            c.insert("type".into(), string(v)?.into());
                        }
                        (6, Wire::Bytes(v)) => {
                            c.insert("status".into(), string(v)?.into());
                        }
                        (2, Wire::Bytes(v)) => set_str(&mut c, "reason", v)?,
                        (3, Wire::Bytes(v)) => set_str(&mut c, "message", v)?,
                        (4, Wire::Bytes(v)) => set_time(&mut c, "lastUpdateTime", v)?,
                        (5, Wire::Bytes(v)) => set_time(&mut c, "lastTransitionTime", v)?,
                        _ => {}
                    }
                }
                if let Value::Array(a) = m
                    .entry("conditions")
                    .or_insert_with(|| Value::Array(Vec::new()))
                {
                    a.push(Value::Object(c));
                }
            }
            (2, Wire::Bytes(x)) if !x.is_empty() => {
                m.insert("certificate".into(), bytes_json(x));
            }
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

/// Decodes a protobuf body of `kind` into its JSON form (with `apiVersion` and `kind`).
/// Errors read as the protobuf serializer's.
pub(crate) fn decode(kind: Kind, body: &[u8]) -> Result<Value, String> {
    let Some(unknown) = body.strip_prefix(&PREFIX) else {
        return Err(format!(
            "provided data does not appear to be a protobuf message, expected prefix {:?}",
            PREFIX
        )
        .replace(',', ""));
    };
    let (mut type_kind, mut raw) = (String::new(), &[][..]);
    for (n, w) in fields(unknown)? {
        match (n, w) {
            (1, Wire::Bytes(tm)) => {
                for (tn, tw) in fields(tm)? {
                    if let (2, Wire::Bytes(k)) = (tn, tw) {
                        type_kind = string(k)?;
                    }
                }
            }
            (2, Wire::Bytes(r)) => raw = r,
            _ => {}
        }
    }
    if type_kind != kind.kind() {
        return Err(format!(
            "the protobuf body holds a {}, not a {}",
            if type_kind.is_empty() {
                "message without a kind"
            } else {
                &type_kind
            },
            kind.kind()
        ));
    }
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), kind.api_version().into());
    obj.insert("kind".into(), kind.kind().into());
    obj.insert("metadata".into(), json!({}));
    for (n, w) in fields(raw)? {
        match (n, w) {
            (1, Wire::Bytes(x)) => {
                obj.insert("metadata".into(), object_meta(x)?);
            }
            (2, Wire::Bytes(x)) => {
                obj.insert("spec".into(), csr_spec(x)?);
            }
            (3, Wire::Bytes(x)) => {
                obj.insert("status".into(), csr_status(x)?);
            }
            _ => {}
        }
    }
    Ok(Value::Object(obj))
}
