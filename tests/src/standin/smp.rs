//! Strategic merge patch: the subset the Node, Lease and Event types need.
//!
//! This is a port of the *apply* half of
//! `staging/src/k8s.io/apimachinery/pkg/util/strategicpatch/patch.go` (`mergeMap`,
//! `mergeSlice`, `mergePatchIntoOriginal`, `normalizeElementOrder`…), with one
//! difference: the real code reads `patchStrategy`/`patchMergeKey` from the Go struct tags
//! of the whole type, while this port reads them from a small table of JSON paths (see
//! [`node_merge_lists`]). Every list not in the table is replaced whole, every map merges
//! recursively. For Node that table is exact (`k8s.io/api/core/v1/types.go`):
//!
//! | path | strategy |
//! |---|---|
//! | `metadata.ownerReferences` | merge, key `uid` |
//! | `metadata.finalizers` | merge (set of scalars) |
//! | `spec.podCIDRs` | merge (set of scalars) |
//! | `status.conditions` | merge, key `type` |
//! | `status.addresses` | merge, key `type` (kubelet sends `{"$patch":"replace"}`) |
//!
//! Note `spec.taints` is *not* a merge list (`+listType=atomic`, no patch strategy): a
//! strategic merge patch replaces the taints whole, as on a real server.
//!
//! Directives supported: `$patch: replace|delete` on maps and list elements,
//! `$setElementOrder/<list>`, `$deleteFromPrimitiveList/<list>`, `$retainKeys`; `null`
//! deletes a map key. Errors map to HTTP statuses as
//! `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go:
//! interpretStrategicMergePatchError` does: malformed directives are 400, a list of lists is
//! 422, and the rest (for example a list element without its merge key) is a 500 with an
//! empty reason, which is what the real server answers for them.
//!
//! Not the general algorithm: no struct-tag lookup (a `$setElementOrder` for an unknown
//! field is accepted here where the real server fails), `sort.SliceStable` is modelled by
//! its insertion sort (exact for lists of up to 20 elements), and `null` values inside a
//! subtree added where the original had nothing are dropped (RFC 7386 behaviour).

use serde_json::{Map, Value};

/// How a list merges in a strategic merge patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListStrategy {
    /// No patch strategy: the patch's list replaces the original (the default).
    Replace,
    /// `patchStrategy:"merge"` with a `patchMergeKey`: elements are maps matched by the key.
    MergeKey(&'static str),
    /// `patchStrategy:"merge"` on a list of scalars: a set union.
    MergeScalars,
}

/// Why a strategic merge patch could not be applied, with the HTTP status the real
/// server answers for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SmpError {
    /// 400 BadRequest: the patch is not a JSON object, or a directive is malformed.
    BadRequest(String),
    /// 422 Invalid: e.g. "lists of lists are not supported".
    Unprocessable(String),
    /// 500 with an empty reason: errors the real server does not classify (missing merge
    /// key, unknown `$patch` value, element types differing within a list).
    Internal(String),
}

impl std::fmt::Display for SmpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SmpError::BadRequest(m) | SmpError::Unprocessable(m) | SmpError::Internal(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for SmpError {}

/// The merge-list table for Node (see the module docs).
pub fn node_merge_lists() -> &'static [(&'static [&'static str], ListStrategy)] {
    super::kinds::Kind::Node.merge_lists()
}

/// Applies a strategic merge `patch` to a Node JSON object, as
/// `strategicpatch.StrategicMergeMapPatch(original, patch, v1.Node{})` does.
pub fn strategic_merge_node(original: &Value, patch: &Value) -> Result<Value, SmpError> {
    strategic_merge(node_merge_lists(), original, patch)
}

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_PREFIX: &str = "$deleteFromPrimitiveList";
const ORDER_PREFIX: &str = "$setElementOrder";

/// Applies `patch` to `original` with the given merge-list table.
pub(crate) fn strategic_merge(
    table: &[(&[&str], ListStrategy)],
    original: &Value,
    patch: &Value,
) -> Result<Value, SmpError> {
    let Value::Object(patch) = patch else {
        return Err(SmpError::BadRequest(
            "json: cannot unmarshal non-object into Go value of type map[string]interface {}"
                .into(),
        ));
    };
    let original = match original {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    let merger = Merger { table };
    let mut path = Vec::new();
    merger
        .merge_map(original, patch.clone(), &mut path)
        .map(Value::Object)
}

struct Merger<'t> {
    table: &'t [(&'t [&'t str], ListStrategy)],
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ElemKind {
    Null,
    Bool,
    Int,
    Float,
    String,
    Array,
    Object,
}

fn elem_kind(v: &Value) -> ElemKind {
    match v {
        Value::Null => ElemKind::Null,
        Value::Bool(_) => ElemKind::Bool,
        Value::Number(n) if n.is_f64() => ElemKind::Float,
        Value::Number(_) => ElemKind::Int,
        Value::String(_) => ElemKind::String,
        Value::Array(_) => ElemKind::Array,
        Value::Object(_) => ElemKind::Object,
    }
}

fn bad_arg(v: &Value) -> SmpError {
    SmpError::Internal(format!(
        "expected a map[string]interface {{}}, but received {v} instead"
    ))
}

fn no_merge_key(m: &Value, key: &str) -> SmpError {
    SmpError::Internal(format!(
        "map: {m} does not contain declared merge key: {key}"
    ))
}

impl Merger<'_> {
    fn strategy(&self, path: &[String], key: &str) -> ListStrategy {
        self.table
            .iter()
            .find(|(p, _)| {
                p.len() == path.len() + 1
                    && p.iter().zip(path).all(|(a, b)| *a == b.as_str())
                    && p.last() == Some(&key)
            })
            .map(|(_, s)| *s)
            .unwrap_or(ListStrategy::Replace)
    }

    fn merge_map(
        &self,
        mut original: Map<String, Value>,
        mut patch: Map<String, Value>,
        path: &mut Vec<String>,
    ) -> Result<Map<String, Value>, SmpError> {
        if let Some(directive) = patch.get(DIRECTIVE) {
            return match directive.as_str() {
                Some("replace") => {
                    patch.remove(DIRECTIVE);
                    Ok(patch)
                }
                Some("delete") => Ok(Map::new()),
                _ => Err(SmpError::Internal(format!(
                    "unknown patch type: {directive} in map: {}",
                    Value::Object(patch.clone())
                ))),
            };
        }
        apply_retain_keys(&mut original, &mut patch)?;
        self.merge_patch_into_original(&mut original, &mut patch, path)?;

        for (k, patch_v) in patch {
            let (key, is_delete_list) = if k.starts_with(DELETE_PREFIX) {
                (
                    extract_key(&k, DELETE_PREFIX).map_err(|_| {
                        SmpError::BadRequest("invalid patch format of primitive list".into())
                    })?,
                    true,
                )
            } else {
                (k, false)
            };
            if patch_v.is_null() {
                original.remove(&key);
                continue;
            }
            let Some(orig_v) = original.remove(&key) else {
                original.insert(key, discard_nulls(patch_v));
                continue;
            };
            let merged = match (orig_v, patch_v) {
                (Value::Object(o), Value::Object(p)) => {
                    path.push(key.clone());
                    let r = self.merge_map(o, p, path);
                    path.pop();
                    Value::Object(r?)
                }
                (Value::Array(o), Value::Array(p)) => {
                    let strategy = self.strategy(path, &key);
                    path.push(key.clone());
                    let r = self.merge_slice_handler(o, p, strategy, is_delete_list, path);
                    path.pop();
                    Value::Array(r?)
                }
                (_, p) => p,
            };
            original.insert(key, merged);
        }
        Ok(original)
    }

    fn merge_slice_handler(
        &self,
        original: Vec<Value>,
        patch: Vec<Value>,
        strategy: ListStrategy,
        is_delete_list: bool,
        path: &mut Vec<String>,
    ) -> Result<Vec<Value>, SmpError> {
        match strategy {
            ListStrategy::Replace => Ok(patch),
            ListStrategy::MergeKey(key) => {
                self.merge_slice(original, patch, Some(key), is_delete_list, path)
            }
            ListStrategy::MergeScalars => {
                self.merge_slice(original, patch, None, is_delete_list, path)
            }
        }
    }

    fn merge_slice(
        &self,
        original: Vec<Value>,
        patch: Vec<Value>,
        merge_key: Option<&str>,
        is_delete_list: bool,
        path: &mut Vec<String>,
    ) -> Result<Vec<Value>, SmpError> {
        if original.is_empty() && patch.is_empty() {
            return Ok(original);
        }
        let kind = slice_element_type(&[&original, &patch])?;
        let (server_order, patch, merged) = if kind != ElemKind::Object {
            if is_delete_list {
                return Ok(delete_from_slice(original, &patch));
            }
            let mut both = original.clone();
            both.extend(patch.iter().cloned());
            (original, patch, dedup_scalars(both))
        } else {
            let Some(key) = merge_key else {
                return Err(SmpError::Internal(
                    "cannot merge lists without merge key for type map".into(),
                ));
            };
            let (original, patch) = merge_slice_with_special_elements(original, patch, key)?;
            let merged =
                self.merge_slice_without_special_elements(original.clone(), &patch, key, path)?;
            (original, patch, merged)
        };
        let key = merge_key.unwrap_or("");
        let (patch_items, server_only) = if key.is_empty() {
            partition_primitives(merged, &patch)
        } else {
            partition_maps(merged, &patch, key)?
        };
        normalize_element_order(patch_items, server_only, &patch, &server_order, key, kind)
    }

    fn merge_slice_without_special_elements(
        &self,
        mut original: Vec<Value>,
        patch: &[Value],
        key: &str,
        path: &mut Vec<String>,
    ) -> Result<Vec<Value>, SmpError> {
        for v in patch {
            let Some(typed) = v.as_object() else {
                return Err(bad_arg(v));
            };
            let Some(merge_value) = typed.get(key) else {
                return Err(no_merge_key(v, key));
            };
            match find_map_by_key(&original, key, merge_value)? {
                Some(idx) => {
                    let current = std::mem::take(&mut original[idx]);
                    let current = match current {
                        Value::Object(m) => m,
                        other => return Err(bad_arg(&other)),
                    };
                    original[idx] = Value::Object(self.merge_map(current, typed.clone(), path)?);
                }
                None => original.push(v.clone()),
            }
        }
        Ok(original)
    }

    /// `$setElementOrder/<list>` handling (`mergePatchIntoOriginal`).
    fn merge_patch_into_original(
        &self,
        original: &mut Map<String, Value>,
        patch: &mut Map<String, Value>,
        path: &mut Vec<String>,
    ) -> Result<(), SmpError> {
        let order_keys: Vec<String> = patch
            .keys()
            .filter(|k| k.starts_with(ORDER_PREFIX))
            .cloned()
            .collect();
        for order_key in order_keys {
            let Some(set_order) = patch.remove(&order_key) else {
                continue;
            };
            let Value::Array(set_order) = set_order else {
                return Err(bad_arg(&set_order));
            };
            let list_key = extract_key(&order_key, ORDER_PREFIX).map_err(|_| {
                SmpError::BadRequest("invalid patch format of setElementOrder list".into())
            })?;
            let original_list = match original.get(&list_key) {
                None => None,
                Some(Value::Array(a)) => Some(a.clone()),
                Some(other) => return Err(bad_arg(other)),
            };
            let patch_list = match patch.get(&list_key) {
                None => None,
                Some(Value::Array(a)) => Some(a.clone()),
                Some(other) => return Err(bad_arg(other)),
            };
            let strategy = self.strategy(path, &list_key);
            let key = match strategy {
                ListStrategy::MergeKey(k) => k,
                _ => "",
            };
            validate_patch_with_set_order_list(
                patch_list.as_deref().unwrap_or(&[]),
                &set_order,
                key,
            )?;
            let merged = match (&original_list, &patch_list) {
                (Some(o), None) => o.clone(),
                (None, Some(p)) => p.clone(),
                (Some(o), Some(p)) => {
                    path.push(list_key.clone());
                    let r = self.merge_slice_handler(o.clone(), p.clone(), strategy, false, path);
                    path.pop();
                    r?
                }
                (None, None) => continue,
            };
            let (patch_items, server_only) = if key.is_empty() {
                partition_primitives(merged, &set_order)
            } else {
                partition_maps(merged, &set_order, key)?
            };
            let orig = original_list.unwrap_or_default();
            let kind = slice_element_type(&[&orig, patch_list.as_deref().unwrap_or(&[])])?;
            let both =
                normalize_element_order(patch_items, server_only, &set_order, &orig, key, kind)?;
            original.insert(list_key.clone(), Value::Array(both));
            patch.remove(&list_key);
        }
        Ok(())
    }
}

fn extract_key(s: &str, prefix: &str) -> Result<String, ()> {
    match s.split_once('/') {
        Some((p, rest)) if p == prefix => Ok(rest.to_string()),
        _ => Err(()),
    }
}

fn discard_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, discard_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

fn apply_retain_keys(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
) -> Result<(), SmpError> {
    let Some(retain) = patch.remove(RETAIN_KEYS) else {
        return Ok(());
    };
    let bad = || SmpError::BadRequest("invalid patch format of retainKeys".into());
    let Value::Array(retain) = retain else {
        return Err(bad());
    };
    let keep = |k: &str| retain.iter().any(|r| r.as_str() == Some(k));
    for (k, v) in patch.iter() {
        if v.is_null() || k.starts_with(DELETE_PREFIX) || k.starts_with(ORDER_PREFIX) {
            continue;
        }
        if !keep(k) {
            return Err(bad());
        }
    }
    original.retain(|k, _| keep(k));
    Ok(())
}

fn slice_element_type(slices: &[&[Value]]) -> Result<ElemKind, SmpError> {
    let mut prev: Option<ElemKind> = None;
    for s in slices {
        for v in s.iter() {
            let current = elem_kind(v);
            match prev {
                None => {
                    if current == ElemKind::Array {
                        return Err(SmpError::Unprocessable(
                            "lists of lists are not supported".into(),
                        ));
                    }
                    prev = Some(current);
                }
                Some(p) if p != current => {
                    return Err(SmpError::Internal(format!(
                        "list element types are not identical: {}",
                        Value::Array(slices.iter().flat_map(|s| s.iter().cloned()).collect())
                    )));
                }
                Some(_) => {}
            }
        }
    }
    prev.ok_or_else(|| SmpError::Internal("no elements in any of the given slices".into()))
}

/// `deduplicateScalars`: Go's in-place variant (moves the last element into the hole).
fn dedup_scalars(mut s: Vec<Value>) -> Vec<Value> {
    let mut length = s.len();
    let mut i = 0;
    while i + 1 < length {
        let mut j = i + 1;
        while j < length {
            if s[i] == s[j] {
                s.swap(j, length - 1);
                length -= 1;
                s.truncate(length);
                continue;
            }
            j += 1;
        }
        i += 1;
    }
    s
}

fn delete_from_slice(current: Vec<Value>, to_delete: &[Value]) -> Vec<Value> {
    current
        .into_iter()
        .filter(|v| !to_delete.contains(v))
        .collect()
}

fn merge_slice_with_special_elements(
    mut original: Vec<Value>,
    patch: Vec<Value>,
    key: &str,
) -> Result<(Vec<Value>, Vec<Value>), SmpError> {
    let mut without = Vec::new();
    let mut replace = false;
    for v in patch {
        let directive = v.get(DIRECTIVE).cloned();
        match directive {
            None => without.push(v),
            Some(d) => match d.as_str() {
                Some("delete") => match v.get(key) {
                    Some(mv) => {
                        let mv = mv.clone();
                        while let Some(idx) = find_map_by_key(&original, key, &mv)? {
                            original.remove(idx);
                        }
                    }
                    None => return Err(no_merge_key(&v, key)),
                },
                Some("replace") => replace = true,
                Some("merge") => {
                    return Err(SmpError::Internal(
                        "merging lists cannot yet be specified in the patch".into(),
                    ));
                }
                _ => {
                    return Err(SmpError::Internal(format!(
                        "unknown patch type: {d} in map: {v}"
                    )));
                }
            },
        }
    }
    if replace {
        return Ok((without, Vec::new()));
    }
    Ok((original, without))
}

fn find_map_by_key(list: &[Value], key: &str, value: &Value) -> Result<Option<usize>, SmpError> {
    for (i, v) in list.iter().enumerate() {
        let Some(m) = v.as_object() else {
            return Err(SmpError::Internal(format!(
                "value for key {i} is not a map."
            )));
        };
        if m.get(key) == Some(value) {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

fn partition_primitives(merged: Vec<Value>, by: &[Value]) -> (Vec<Value>, Vec<Value>) {
    merged.into_iter().partition(|v| by.contains(v))
}

fn partition_maps(
    merged: Vec<Value>,
    by: &[Value],
    key: &str,
) -> Result<(Vec<Value>, Vec<Value>), SmpError> {
    let mut patch = Vec::new();
    let mut server_only = Vec::new();
    for v in merged {
        if !v.is_object() {
            return Err(bad_arg(&v));
        }
        let Some(mv) = v.get(key).cloned() else {
            return Err(no_merge_key(&v, key));
        };
        if find_map_by_key(by, key, &mv)?.is_some() {
            patch.push(v);
        } else {
            server_only.push(v);
        }
    }
    Ok((patch, server_only))
}

fn validate_merge_key_in_lists(key: &str, lists: &[&[Value]]) -> Result<(), SmpError> {
    for list in lists {
        for item in list.iter() {
            let Some(m) = item.as_object() else {
                return Err(bad_arg(item));
            };
            if !m.contains_key(key) {
                return Err(no_merge_key(item, key));
            }
        }
    }
    Ok(())
}

fn extract_to_delete_items(list: Vec<Value>) -> Result<(Vec<Value>, Vec<Value>), SmpError> {
    let mut keep = Vec::new();
    let mut delete = Vec::new();
    for v in list {
        if !v.is_object() {
            return Err(bad_arg(&v));
        }
        if v.get(DIRECTIVE).and_then(Value::as_str) == Some("delete") {
            delete.push(v);
        } else {
            keep.push(v);
        }
    }
    Ok((keep, delete))
}

fn index_of(list: &[Value], item: &Value, key: &str, kind: ElemKind) -> Option<usize> {
    let val = |v: &'_ Value| -> Option<Value> {
        if kind == ElemKind::Object {
            v.as_object().and_then(|m| m.get(key)).cloned()
        } else {
            Some(v.clone())
        }
    };
    let wanted = val(item);
    list.iter().position(|v| val(v) == wanted)
}

/// `normalizeSliceOrder`; `sort.SliceStable` with its non-strict `less` is modelled by
/// Go's insertion sort (what SliceStable runs for up to 20 elements).
fn normalize_slice_order(
    to_sort: Vec<Value>,
    order: &[Value],
    key: &str,
    kind: ElemKind,
) -> Result<Vec<Value>, SmpError> {
    let (mut to_sort, to_delete) = if kind == ElemKind::Object {
        validate_merge_key_in_lists(key, &[&to_sort, order])?;
        extract_to_delete_items(to_sort)?
    } else {
        (to_sort, Vec::new())
    };
    let less =
        |a: &Value, b: &Value| match (index_of(order, a, key, kind), index_of(order, b, key, kind))
        {
            (Some(i), Some(j)) => i < j,
            _ => true,
        };
    for i in 1..to_sort.len() {
        let mut j = i;
        while j > 0 && less(&to_sort[j], &to_sort[j - 1]) {
            to_sort.swap(j, j - 1);
            j -= 1;
        }
    }
    to_sort.extend(to_delete);
    Ok(to_sort)
}

fn normalize_element_order(
    patch: Vec<Value>,
    server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key: &str,
    kind: ElemKind,
) -> Result<Vec<Value>, SmpError> {
    let patch = normalize_slice_order(patch, patch_order, key, kind)?;
    let server_only = normalize_slice_order(server_only, server_order, key, kind)?;
    Ok(merge_sorted_slice(
        server_only,
        patch,
        server_order,
        key,
        kind,
    ))
}

/// `mergeSortedSlice`: interleaves server-only items (`left`) into the patch items
/// (`right`), keeping both relative orders.
fn merge_sorted_slice(
    left: Vec<Value>,
    right: Vec<Value>,
    server_order: &[Value],
    key: &str,
    kind: ElemKind,
) -> Vec<Value> {
    let size = left.len() + right.len();
    let mut out = Vec::with_capacity(size);
    let mut left = left.into_iter().peekable();
    let mut right = right.into_iter().peekable();
    for _ in 0..size {
        let take_left = match (left.peek(), right.peek()) {
            (Some(_), None) => true,
            (None, _) => false,
            (Some(l), Some(r)) => matches!(
                (index_of(server_order, l, key, kind), index_of(server_order, r, key, kind)),
                (Some(li), Some(ri)) if li < ri
            ),
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

fn merge_key_value_equal(left: &Value, right: &Value, key: &str) -> Result<bool, SmpError> {
    if key.is_empty() {
        return Ok(left == right);
    }
    let (Some(l), Some(r)) = (left.as_object(), right.as_object()) else {
        return Err(bad_arg(if left.is_object() { right } else { left }));
    };
    let Some(lv) = l.get(key) else {
        return Err(no_merge_key(left, key));
    };
    let Some(rv) = r.get(key) else {
        return Err(no_merge_key(right, key));
    };
    Ok(lv == rv)
}

fn validate_patch_with_set_order_list(
    patch_list: &[Value],
    set_order: &[Value],
    key: &str,
) -> Result<(), SmpError> {
    if set_order.is_empty() || patch_list.is_empty() {
        return Ok(());
    }
    let non_delete = if key.is_empty() {
        patch_list.to_vec()
    } else {
        extract_to_delete_items(patch_list.to_vec())?.0
    };
    let (mut pi, mut si) = (0, 0);
    while pi < non_delete.len() && si < set_order.len() {
        if non_delete[pi].get(DIRECTIVE).is_some() {
            pi += 1;
            continue;
        }
        if merge_key_value_equal(&non_delete[pi], &set_order[si], key)? {
            pi += 1;
        }
        si += 1;
    }
    if pi < non_delete.len() && si >= set_order.len() {
        return Err(SmpError::Internal(format!(
            "The order in patch list:\n{}\n doesn't match {ORDER_PREFIX} list:\n{}\n",
            Value::Array(patch_list.to_vec()),
            Value::Array(set_order.to_vec())
        )));
    }
    Ok(())
}
