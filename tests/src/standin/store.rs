//! The object store: one global resourceVersion counter (like etcd's revision), the
//! generic registry rules of `staging/src/k8s.io/apiserver/pkg/registry/generic/registry/
//! store.go` and `rest/create.go`/`rest/update.go`, and a watch history.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use jiff::Timestamp;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::kinds::{Kind, Sub, meta};
use super::query::Selectors;
use super::status::ApiError;
use super::user::UserInfo;
use super::validation::{self, FieldError, q};
use super::{FaultAction, FaultRule, RecordedRequest};

/// How many watch events are kept for watches that resume from a resourceVersion.
const HISTORY: usize = 10_000;
/// Broadcast capacity; a watcher that falls further behind is closed (it re-lists).
const BROADCAST: usize = 4_096;

/// Namespaces that exist in every stand-in (the system ones a fresh cluster has).
pub(crate) const NAMESPACES: [&str; 4] =
    ["default", "kube-node-lease", "kube-public", "kube-system"];

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ObjKey {
    kind: Kind,
    namespace: String,
    name: String,
}

impl ObjKey {
    pub(crate) fn new(kind: Kind, namespace: Option<&str>, name: &str) -> Self {
        ObjKey {
            kind,
            namespace: if kind.namespaced() {
                namespace.unwrap_or("").to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }
}

struct Entry {
    obj: Value,
    created: u64,
}

/// One change, as watchers see it.
#[derive(Debug)]
pub(crate) struct WatchRecord {
    pub(crate) rv: u64,
    pub(crate) kind: Kind,
    pub(crate) namespace: String,
    /// ADDED, MODIFIED or DELETED.
    pub(crate) event: &'static str,
    /// The new object (the last state, with the deletion's resourceVersion, for DELETED).
    pub(crate) object: Value,
    /// The previous object for MODIFIED (selector transitions become ADDED/DELETED).
    pub(crate) prev: Option<Value>,
}

pub(crate) struct Store {
    pub(crate) rv: u64,
    seq: u64,
    objects: BTreeMap<ObjKey, Entry>,
    history: VecDeque<Arc<WatchRecord>>,
    /// Highest resourceVersion no longer in `history`.
    pub(crate) compacted_rv: u64,
    tx: broadcast::Sender<Arc<WatchRecord>>,
    pub(crate) requests: Vec<RecordedRequest>,
    /// Keep every request in `requests` (tests); off for fleet benchmarks, where only
    /// `request_counts` grows.
    pub(crate) record_requests: bool,
    /// Requests answered, by `"METHOD resource status"` (see [`resource_of`]).
    pub(crate) request_counts: BTreeMap<String, u64>,
    /// Writes (creations and changes) of each Lease, by `namespace/name`: how a fleet run
    /// tells a renewal written twice from one written once.
    pub(crate) lease_writes: BTreeMap<String, u64>,
    pub(crate) faults: Vec<FaultRule>,
    pub(crate) latency: Duration,
    /// Overload: more requests than this in flight are answered 429 with `Retry-After`.
    pub(crate) max_inflight: Option<usize>,
    hasher: RandomState,
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    if s.is_empty() {
        return Ok(0);
    }
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {}", q(s))))
}

fn now_seconds() -> Value {
    let now = Timestamp::now();
    jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%SZ", now)
        .map(Value::String)
        .unwrap_or(Value::Null)
}

/// The resource a request path names, for [`Store::request_counts`]: `leases`,
/// `nodes/status`, `nodes`, `events`, `secrets`, `certificatesigningrequests` (and its
/// `/status` and `/approval`), or `other`.
pub(crate) fn resource_of(path: &str) -> &'static str {
    if path.contains("/certificatesigningrequests") {
        if path.ends_with("/status") {
            "certificatesigningrequests/status"
        } else if path.ends_with("/approval") {
            "certificatesigningrequests/approval"
        } else {
            "certificatesigningrequests"
        }
    } else if path.ends_with("/subjectaccessreviews") {
        "subjectaccessreviews"
    } else if path.contains("/secrets") {
        "secrets"
    } else if path.contains("/leases") {
        "leases"
    } else if path.contains("/nodes/") && path.ends_with("/status") {
        "nodes/status"
    } else if path.contains("/nodes") {
        "nodes"
    } else if path.contains("/events") {
        "events"
    } else {
        "other"
    }
}

impl Store {
    /// Counts an answered request, and keeps it when recording.
    pub(crate) fn record(&mut self, request: RecordedRequest) {
        let key = format!(
            "{} {} {}",
            request.method,
            resource_of(&request.path),
            request.status
        );
        *self.request_counts.entry(key).or_default() += 1;
        if self.record_requests {
            self.requests.push(request);
        }
    }

    /// `(name, renewTime)` of every Lease in `namespace` that has one.
    pub(crate) fn renew_times(&self, namespace: &str) -> Vec<(String, Timestamp)> {
        self.list_by_creation(Kind::Lease)
            .into_iter()
            .filter(|v| v["metadata"]["namespace"] == namespace)
            .filter_map(|v| {
                let name = v["metadata"]["name"].as_str()?.to_owned();
                let renew: Timestamp = v["spec"]["renewTime"].as_str()?.parse().ok()?;
                Some((name, renew))
            })
            .collect()
    }

    pub(crate) fn new() -> Self {
        let (tx, _) = broadcast::channel(BROADCAST);
        let mut store = Store {
            rv: 0,
            seq: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted_rv: 0,
            tx,
            requests: Vec::new(),
            record_requests: true,
            request_counts: BTreeMap::new(),
            lease_writes: BTreeMap::new(),
            faults: Vec::new(),
            latency: Duration::ZERO,
            max_inflight: None,
            hasher: RandomState::new(),
        };
        for ns in NAMESPACES {
            store.add_namespace(ns);
        }
        store
    }

    /// Adds namespace `ns`, Active, as `kubectl create namespace` would (the stand-in serves
    /// no namespace writes); an existing one is left as it is.
    pub(crate) fn add_namespace(&mut self, ns: &str) {
        let key = ObjKey::new(Kind::Namespace, None, ns);
        if self.objects.contains_key(&key) {
            return;
        }
        let mut obj = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        });
        meta::set(&mut obj, "uid", self.new_uid().into());
        meta::set(&mut obj, "creationTimestamp", now_seconds());
        self.commit(Kind::Namespace, key, obj, "ADDED", None);
    }

    fn random(&mut self, salt: u64) -> u64 {
        self.seq += 1;
        let nanos = Timestamp::now().as_nanosecond();
        self.hasher.hash_one((self.seq, salt, nanos))
    }

    /// A random-looking version-4 UUID (hashes of a counter and the clock).
    pub(crate) fn new_uid(&mut self) -> String {
        let (a, b) = (self.random(1), self.random(2));
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&a.to_be_bytes());
        bytes[8..].copy_from_slice(&b.to_be_bytes());
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }

    /// `names.SimpleNameGenerator`: five characters from Kubernetes' alphabet.
    fn name_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut r = self.random(3);
        (0..5)
            .map(|_| {
                let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
                r /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<WatchRecord>> {
        self.tx.subscribe()
    }

    /// History records with a resourceVersion above `since`.
    pub(crate) fn history_after(&self, since: u64) -> impl Iterator<Item = &Arc<WatchRecord>> {
        self.history.iter().filter(move |r| r.rv > since)
    }

    /// Bumps the global resourceVersion, stores (or removes) the object and tells watchers.
    fn commit(
        &mut self,
        kind: Kind,
        key: ObjKey,
        mut obj: Value,
        event: &'static str,
        prev: Option<Value>,
    ) -> Value {
        self.rv += 1;
        let rv = self.rv;
        meta::set(&mut obj, "resourceVersion", rv.to_string().into());
        if event == "DELETED" {
            self.objects.remove(&key);
        } else {
            if kind == Kind::Lease {
                *self
                    .lease_writes
                    .entry(format!("{}/{}", key.namespace, key.name))
                    .or_default() += 1;
            }
            let created = self.objects.get(&key).map_or(rv, |e| e.created);
            self.objects.insert(
                key.clone(),
                Entry {
                    obj: obj.clone(),
                    created,
                },
            );
        }
        let record = Arc::new(WatchRecord {
            rv,
            kind,
            namespace: key.namespace,
            event,
            object: obj.clone(),
            prev,
        });
        self.history.push_back(record.clone());
        while self.history.len() > HISTORY {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
        // No receivers is fine.
        let _ = self.tx.send(record);
        obj
    }

    pub(crate) fn get(&self, kind: Kind, ns: Option<&str>, name: &str) -> Option<&Value> {
        self.objects
            .get(&ObjKey::new(kind, ns, name))
            .map(|e| &e.obj)
    }

    /// Objects of `kind` (in `ns` if given), in key order, filtered by `sel`.
    pub(crate) fn list(&self, kind: Kind, ns: Option<&str>, sel: &Selectors) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, _)| k.kind == kind && ns.is_none_or(|ns| k.namespace == ns))
            .filter(|(_, e)| sel.matches(kind, &e.obj))
            .map(|(_, e)| e.obj.clone())
            .collect()
    }

    /// Objects of `kind` in creation order.
    pub(crate) fn list_by_creation(&self, kind: Kind) -> Vec<&Value> {
        let mut v: Vec<&Entry> = self
            .objects
            .iter()
            .filter(|(k, _)| k.kind == kind)
            .map(|(_, e)| e)
            .collect();
        v.sort_by_key(|e| e.created);
        v.into_iter().map(|e| &e.obj).collect()
    }

    pub(crate) fn typed<T: DeserializeOwned>(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
    ) -> Option<T> {
        self.get(kind, ns, name)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
    }

    pub(crate) fn typed_all<T: DeserializeOwned>(&self, kind: Kind) -> Vec<T> {
        self.list_by_creation(kind)
            .into_iter()
            .filter_map(|v| serde_json::from_value(v.clone()).ok())
            .collect()
    }

    /// "Another writer": applies `f` to the stored object and commits it without any
    /// validation (a new resourceVersion and a MODIFIED event even if nothing changed).
    pub(crate) fn mutate_typed<T: DeserializeOwned + Serialize>(
        &mut self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        f: impl FnOnce(&mut T),
    ) -> bool {
        let key = ObjKey::new(kind, ns, name);
        let Some(old) = self.objects.get(&key).map(|e| e.obj.clone()) else {
            return false;
        };
        let Ok(mut typed) = serde_json::from_value::<T>(old.clone()) else {
            return false;
        };
        f(&mut typed);
        let Ok(mut new) = serde_json::to_value(&typed) else {
            return false;
        };
        // The stored identity stays; the writer cannot rename the object.
        for k in ["name", "namespace", "uid", "creationTimestamp"] {
            meta::set(
                &mut new,
                k,
                meta::get(&old, k).cloned().unwrap_or(Value::Null),
            );
        }
        self.commit(kind, key, new, "MODIFIED", Some(old));
        true
    }

    /// Fault rules: consumes one use of the first rule matching the request.
    pub(crate) fn take_fault(&mut self, method: &Method, path: &str) -> Option<FaultAction> {
        let idx = self.faults.iter().position(|r| {
            r.times > 0
                && r.method.as_ref().is_none_or(|m| m == method)
                && path.contains(&r.path_contains)
        })?;
        let rule = &mut self.faults[idx];
        rule.times -= 1;
        let action = rule.action;
        if rule.times == 0 {
            self.faults.remove(idx);
        }
        Some(action)
    }

    fn require_namespace(&self, ns: &str) -> Result<(), ApiError> {
        if self.get(Kind::Namespace, None, ns).is_some() {
            Ok(())
        } else {
            Err(ApiError::not_found(Kind::Namespace, ns))
        }
    }

    /// `rest.BeforeCreate` up to (not including) validation. `user` is the requester.
    fn prepare_create(
        &mut self,
        kind: Kind,
        url_ns: Option<&str>,
        obj: &mut Value,
        user: &UserInfo,
    ) -> Result<(), ApiError> {
        if kind.namespaced() {
            let ns = url_ns.unwrap_or("");
            let body_ns = meta::namespace(obj);
            if body_ns.is_empty() {
                meta::set(obj, "namespace", ns.into());
            } else if body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        } else {
            meta::set(obj, "namespace", Value::Null);
        }
        for k in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "selfLink",
        ] {
            meta::set(obj, k, Value::Null);
        }
        prepare_for_create(kind, obj, user);
        let uid = self.new_uid();
        meta::set(obj, "uid", uid.into());
        meta::set(obj, "creationTimestamp", now_seconds());
        let generate = meta::str_field(obj, "generateName").to_string();
        if meta::name(obj).is_empty() && !generate.is_empty() {
            let name = format!("{generate}{}", self.name_suffix());
            meta::set(obj, "name", name.into());
        }
        Ok(())
    }

    /// POST: create, as `user`. Errors: 404 for a missing namespace (the NamespaceLifecycle
    /// admission plugin), 422 Invalid, 400 for a name that cannot be a path segment (the
    /// store's key function), 500 if a resourceVersion is set (etcd3 store), 409
    /// AlreadyExists.
    pub(crate) fn create(
        &mut self,
        kind: Kind,
        url_ns: Option<&str>,
        mut obj: Value,
        dry_run: bool,
        user: &UserInfo,
    ) -> Result<Value, ApiError> {
        if !kind.writable() {
            return Err(ApiError::method_not_allowed());
        }
        let body_rv = meta::resource_version(&obj).to_string();
        // The handler checks the body's namespace against the URL's before admission
        // (`endpoints/handlers/create.go`: `EnsureObjectNamespaceMatchesRequestNamespace`,
        // 400); NamespaceLifecycle is a mutating admission plugin: it runs before
        // BeforeCreate (404). Found by `tests/tests/standin_differential.rs`.
        if kind.namespaced() {
            let body_ns = meta::namespace(&obj);
            if !body_ns.is_empty() && body_ns != url_ns.unwrap_or("") {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            self.require_namespace(url_ns.unwrap_or(""))?;
        }
        self.prepare_create(kind, url_ns, &mut obj, user)?;
        let name = meta::name(&obj).to_string();
        let errs = validation::validate(kind, &obj, None, Sub::Main);
        if !errs.is_empty() {
            return Err(ApiError::invalid_object(kind, &name, &errs));
        }
        let segment_errs = path_segment_name(&name);
        if !segment_errs.is_empty() {
            return Err(ApiError::bad_request(format!(
                "Name parameter invalid: {}: {}",
                q(&name),
                segment_errs.join(";")
            )));
        }
        if !body_rv.is_empty() {
            return Err(ApiError::unclassified(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let key = ObjKey::new(kind, Some(meta::namespace(&obj)), &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(kind, &name));
        }
        if dry_run {
            return Ok(obj);
        }
        Ok(self.commit(kind, key, obj, "ADDED", None))
    }

    /// PUT (and the update half of PATCH) through `sub`'s strategy. Returns the status code
    /// (201 when the update created the object, as `user`) and the stored object.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn update(
        &mut self,
        kind: Kind,
        url_ns: Option<&str>,
        url_name: &str,
        mut obj: Value,
        sub: Sub,
        dry_run: bool,
        from_patch: bool,
        user: &UserInfo,
    ) -> Result<(u16, Value), ApiError> {
        if !kind.writable() {
            return Err(ApiError::method_not_allowed());
        }
        if !from_patch {
            let body_name = meta::name(&obj).to_string();
            if body_name.is_empty() {
                meta::set(&mut obj, "name", url_name.into());
            } else if body_name != url_name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({url_name})"
                )));
            }
            if kind.namespaced() {
                let ns = url_ns.unwrap_or("");
                let body_ns = meta::namespace(&obj).to_string();
                if body_ns.is_empty() {
                    meta::set(&mut obj, "namespace", ns.into());
                } else if body_ns != ns {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
            }
        }
        let key = ObjKey::new(kind, url_ns, url_name);
        let Some(old) = self.objects.get(&key).map(|e| e.obj.clone()) else {
            if !kind.allow_create_on_update() || sub != Sub::Main {
                return Err(ApiError::not_found(kind, url_name));
            }
            meta::set(&mut obj, "resourceVersion", Value::Null);
            return self
                .create(kind, url_ns, obj, dry_run, user)
                .map(|o| (201, o));
        };
        let new_rv = parse_rv(meta::resource_version(&obj))?;
        let old_rv = parse_rv(meta::resource_version(&old))?;
        if new_rv == 0 {
            if !kind.allow_unconditional_update() {
                return Err(ApiError::invalid(
                    &kind.qualified_resource(),
                    kind.group(),
                    kind.plural(),
                    url_name,
                    &[FieldError::invalid(
                        "metadata.resourceVersion",
                        "0x0",
                        "must be specified for an update",
                    )],
                ));
            }
        } else if new_rv != old_rv {
            return Err(ApiError::optimistic_lock(kind, url_name));
        }
        // rest.BeforeUpdate
        meta::set(&mut obj, "resourceVersion", old_rv.to_string().into());
        for k in [
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "selfLink",
        ] {
            meta::set(
                &mut obj,
                k,
                meta::get(&old, k).cloned().unwrap_or(Value::Null),
            );
        }
        if meta::uid(&obj).is_empty() {
            meta::set(&mut obj, "uid", meta::uid(&old).into());
        }
        prepare_for_update(kind, sub, &mut obj, &old);
        let errs = validation::validate(kind, &obj, Some(&old), sub);
        if !errs.is_empty() {
            return Err(ApiError::invalid_object(kind, url_name, &errs));
        }
        // etcd3 GuaranteedUpdate: an unchanged object is not written (no new RV, no event).
        if obj == old || dry_run {
            return Ok((200, obj));
        }
        Ok((200, self.commit(kind, key, obj, "MODIFIED", Some(old))))
    }

    /// DELETE with optional preconditions. Answers the `Status` Success body of
    /// `finalizeDelete`.
    pub(crate) fn delete(
        &mut self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        precondition_uid: Option<&str>,
        precondition_rv: Option<&str>,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        if !kind.writable() {
            return Err(ApiError::method_not_allowed());
        }
        let key = ObjKey::new(kind, ns, name);
        let Some(old) = self.objects.get(&key).map(|e| e.obj.clone()) else {
            return Err(ApiError::not_found(kind, name));
        };
        let uid = meta::uid(&old).to_string();
        if let Some(p) = precondition_uid.filter(|p| *p != uid) {
            return Err(ApiError::conflict(
                kind,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {p}, UID in object meta: {uid}"
                ),
            ));
        }
        let rv = meta::resource_version(&old).to_string();
        if let Some(p) = precondition_rv.filter(|p| *p != rv) {
            return Err(ApiError::conflict(
                kind,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {p}, ResourceVersion in object meta: {rv}"
                ),
            ));
        }
        if !dry_run {
            self.commit(kind, key, old, "DELETED", None);
        }
        let mut details = serde_json::Map::new();
        details.insert("name".into(), name.into());
        if !kind.group().is_empty() {
            details.insert("group".into(), kind.group().into());
        }
        details.insert("kind".into(), kind.plural().into());
        details.insert("uid".into(), uid.into());
        Ok(json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }))
    }
}

/// `path.IsValidPathSegmentName`, which the store's key functions apply to every name.
fn path_segment_name(name: &str) -> Vec<String> {
    if name == "." || name == ".." {
        return vec![format!("may not be '{name}'")];
    }
    ["/", "%"]
        .into_iter()
        .filter(|c| name.contains(c))
        .map(|c| format!("may not contain '{c}'"))
        .collect()
}

/// `PrepareForCreate` of the strategies: leases drop `strategy`/`preferredHolder` (the
/// CoordinatedLeaderElection gate is off by default); a CertificateSigningRequest gets its
/// requester from `user` and an empty status (`csrStrategy.PrepareForCreate`,
/// `pkg/registry/certificates/certificates/strategy.go`).
fn prepare_for_create(kind: Kind, obj: &mut Value, user: &UserInfo) {
    match kind {
        Kind::Lease => {
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                spec.remove("strategy");
                spec.remove("preferredHolder");
            }
        }
        Kind::CertificateSigningRequest => {
            let Some(root) = obj.as_object_mut() else {
                return;
            };
            let spec = root
                .entry("spec")
                .or_insert_with(|| Value::Object(serde_json::Map::new()));
            if let Some(spec) = spec.as_object_mut() {
                for k in ["username", "uid", "groups", "extra"] {
                    spec.remove(k);
                }
                spec.insert("username".into(), user.name.clone().into());
                if !user.uid.is_empty() {
                    spec.insert("uid".into(), user.uid.clone().into());
                }
                if !user.groups.is_empty() {
                    spec.insert("groups".into(), json!(user.groups));
                }
                if !user.extra.is_empty() {
                    spec.insert("extra".into(), json!(user.extra));
                }
            }
            root.insert("status".into(), json!({}));
        }
        _ => {}
    }
}

/// The `status.conditions` of a CertificateSigningRequest as JSON, mutable.
fn csr_conditions_mut(obj: &mut Value) -> Option<&mut Vec<Value>> {
    obj.get_mut("status")?.get_mut("conditions")?.as_array_mut()
}

/// `preserveConditionInstances`: when `new` has as many conditions of `ty` as `old`, they
/// become `old`'s, in order.
fn preserve_condition_instances(new: &mut Value, old: &Value, ty: &str) {
    let old_conditions: Vec<&Value> = old
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|cs| cs.iter().filter(|c| c["type"] == ty).collect())
        .unwrap_or_default();
    let Some(new_conditions) = csr_conditions_mut(new) else {
        return;
    };
    let indices: Vec<usize> = new_conditions
        .iter()
        .enumerate()
        .filter(|(_, c)| c["type"] == ty)
        .map(|(i, _)| i)
        .collect();
    if indices.len() != old_conditions.len() {
        return;
    }
    for (i, c) in indices.into_iter().zip(old_conditions) {
        new_conditions[i] = c.clone();
    }
}

/// `populateConditionTimestamps`: a condition without `lastUpdateTime` gets now; one
/// without `lastTransitionTime` gets that of an old condition of the same type and status,
/// or now.
fn populate_condition_timestamps(new: &mut Value, old: &Value) {
    let now = now_seconds();
    let old_conditions = old
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let unset = |c: &Value, k: &str| c.get(k).is_none_or(|v| v.is_null() || v == "");
    let Some(conditions) = csr_conditions_mut(new) else {
        return;
    };
    for c in conditions.iter_mut() {
        if unset(c, "lastUpdateTime") {
            c["lastUpdateTime"] = now.clone();
        }
        if unset(c, "lastTransitionTime") {
            let previous = old_conditions
                .iter()
                .find(|o| {
                    o["type"] == c["type"]
                        && o["status"] == c["status"]
                        && !unset(o, "lastTransitionTime")
                })
                .map(|o| o["lastTransitionTime"].clone());
            c["lastTransitionTime"] = previous.unwrap_or_else(|| now.clone());
        }
    }
}

/// `PrepareForUpdate`: `nodeStrategy` keeps the old status, `nodeStatusStrategy` keeps the
/// old spec (metadata changes are kept either way); leases drop gated fields. For
/// CertificateSigningRequests (`pkg/registry/certificates/certificates/strategy.go`): the
/// object keeps its old spec and status (`csrStrategy`); `/status` keeps the old spec and
/// the old Approved/Denied conditions (`csrStatusStrategy`); `/approval` keeps the old spec
/// and status but for the conditions (`csrApprovalStrategy`); both fill in condition
/// timestamps.
fn prepare_for_update(kind: Kind, sub: Sub, obj: &mut Value, old: &Value) {
    let copy_from_old = |obj: &mut Value, field: &str| {
        if let Some(m) = obj.as_object_mut() {
            match old.get(field) {
                Some(v) => {
                    m.insert(field.to_string(), v.clone());
                }
                None => {
                    m.remove(field);
                }
            }
        }
    };
    match (kind, sub) {
        (Kind::Node, Sub::Main) => copy_from_old(obj, "status"),
        (Kind::Node, Sub::Status) => copy_from_old(obj, "spec"),
        (Kind::CertificateSigningRequest, Sub::Main) => {
            copy_from_old(obj, "spec");
            copy_from_old(obj, "status");
        }
        (Kind::CertificateSigningRequest, Sub::Status) => {
            copy_from_old(obj, "spec");
            preserve_condition_instances(obj, old, "Approved");
            preserve_condition_instances(obj, old, "Denied");
            populate_condition_timestamps(obj, old);
        }
        (Kind::CertificateSigningRequest, Sub::Approval) => {
            populate_condition_timestamps(obj, old);
            let conditions = obj.pointer("/status/conditions").cloned();
            copy_from_old(obj, "spec");
            copy_from_old(obj, "status");
            if let Some(root) = obj.as_object_mut() {
                let status = root
                    .entry("status")
                    .or_insert_with(|| Value::Object(serde_json::Map::new()));
                if let Some(status) = status.as_object_mut() {
                    match conditions {
                        Some(c) if !c.is_null() => {
                            status.insert("conditions".into(), c);
                        }
                        _ => {
                            status.remove("conditions");
                        }
                    }
                }
            }
        }
        (Kind::Lease, _) => {
            let old_spec = old.get("spec");
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                for f in ["strategy", "preferredHolder"] {
                    if old_spec.and_then(|s| s.get(f)).is_none() {
                        spec.remove(f);
                    }
                }
            }
        }
        _ => {}
    }
}
