//! The stand-in's strategic merge patch (Node subset), without sockets. Expected results
//! follow `k8s.io/apimachinery/pkg/util/strategicpatch` step by step.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use edgebeat_tests::standin::smp::{SmpError, strategic_merge_node};
use serde_json::{Value, json};

fn types(v: &Value) -> Vec<&str> {
    v["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect()
}

fn node_with_conditions(types: &[&str]) -> Value {
    let conds: Vec<Value> = types
        .iter()
        .map(|t| json!({"type": t, "status": "False", "reason": format!("{t}Reason")}))
        .collect();
    json!({"metadata": {"name": "n"}, "spec": {"podCIDR": "10.0.0.0/24", "taints": [{"key": "a", "effect": "NoSchedule"}]},
           "status": {"conditions": conds}})
}

#[test]
fn conditions_merge_by_type_and_new_items_follow_go_ordering() {
    let orig = node_with_conditions(&["A", "B", "C"]);
    let out = strategic_merge_node(
        &orig,
        &json!({"status": {"conditions": [{"type": "D"}, {"type": "B", "status": "True"}]}}),
    )
    .unwrap();
    // mergeSortedSlice puts patch items not on the server before the server-only ones
    assert_eq!(types(&out), ["D", "A", "B", "C"]);
    assert_eq!(
        out["status"]["conditions"][2],
        json!({"type": "B", "status": "True", "reason": "BReason"})
    );

    let with_order = json!({"status": {
        "$setElementOrder/conditions": [{"type": "A"}, {"type": "B"}, {"type": "C"}, {"type": "D"}],
        "conditions": [{"type": "D"}]}});
    assert_eq!(
        types(&strategic_merge_node(&orig, &with_order).unwrap()),
        ["A", "B", "C", "D"]
    );
}

#[test]
fn list_directives_delete_and_replace() {
    let orig = node_with_conditions(&["A", "B", "C"]);
    let del = json!({"status": {"conditions": [{"type": "B", "$patch": "delete"}]}});
    assert_eq!(
        types(&strategic_merge_node(&orig, &del).unwrap()),
        ["A", "C"]
    );

    let replace =
        json!({"status": {"conditions": [{"type": "Z", "status": "True"}, {"$patch": "replace"}]}});
    let out = strategic_merge_node(&orig, &replace).unwrap();
    assert_eq!(
        out["status"]["conditions"],
        json!([{"type": "Z", "status": "True"}])
    );
}

#[test]
fn map_directives_nulls_and_new_subtrees() {
    let orig = json!({"metadata": {"name": "n", "labels": {"a": "1", "b": "2"}}, "status": {"nodeInfo": {"bootID": "x"}}});
    let out = strategic_merge_node(
        &orig,
        &json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
    )
    .unwrap();
    assert_eq!(out["metadata"]["labels"], json!({"b": "2", "c": "3"}));

    let out = strategic_merge_node(
        &orig,
        &json!({"metadata": {"labels": {"$patch": "replace", "x": "1"}}}),
    )
    .unwrap();
    assert_eq!(out["metadata"]["labels"], json!({"x": "1"}));

    let out = strategic_merge_node(
        &orig,
        &json!({"status": {"nodeInfo": {"$patch": "delete"}}}),
    )
    .unwrap();
    assert_eq!(out["status"]["nodeInfo"], json!({}));

    // nulls inside a subtree the original does not have are dropped
    let out = strategic_merge_node(
        &orig,
        &json!({"metadata": {"annotations": {"a": "1", "b": null}}}),
    )
    .unwrap();
    assert_eq!(out["metadata"]["annotations"], json!({"a": "1"}));
}

#[test]
fn taints_are_replaced_whole_but_owner_references_and_finalizers_merge() {
    let orig = json!({"metadata": {"name": "n", "finalizers": ["a", "b"],
                                   "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "u1"}]},
                      "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoExecute"}]}});
    let out = strategic_merge_node(
        &orig,
        &json!({"spec": {"taints": [{"key": "c", "effect": "NoSchedule"}]}}),
    )
    .unwrap();
    assert_eq!(
        out["spec"]["taints"],
        json!([{"key": "c", "effect": "NoSchedule"}])
    );

    let refs = json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "m", "uid": "u2"}]}});
    let out = strategic_merge_node(&orig, &refs).unwrap();
    let uids: Vec<&str> = out["metadata"]["ownerReferences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uid"].as_str().unwrap())
        .collect();
    assert_eq!(uids, ["u2", "u1"]);

    let fins =
        json!({"metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]}});
    assert_eq!(
        strategic_merge_node(&orig, &fins).unwrap()["metadata"]["finalizers"],
        json!(["c", "b"])
    );
}

#[test]
fn retain_keys_clears_the_rest() {
    let orig = node_with_conditions(&["A"]);
    let patch = json!({"spec": {"$retainKeys": ["taints"], "taints": []}});
    assert_eq!(
        strategic_merge_node(&orig, &patch).unwrap()["spec"],
        json!({"taints": []})
    );
    let bad = json!({"spec": {"$retainKeys": ["taints"], "podCIDR": "x"}});
    assert!(matches!(
        strategic_merge_node(&orig, &bad),
        Err(SmpError::BadRequest(_))
    ));
}

#[test]
fn errors_map_to_the_real_status_classes() {
    let orig = node_with_conditions(&["A"]);
    let err = strategic_merge_node(
        &orig,
        &json!({"status": {"conditions": [{"status": "True"}]}}),
    )
    .unwrap_err();
    assert!(
        matches!(&err, SmpError::Internal(m) if m.contains("does not contain declared merge key: type")),
        "{err}"
    );

    let empty = json!({"status": {"conditions": []}});
    let err = strategic_merge_node(&empty, &json!({"status": {"conditions": [[1]]}})).unwrap_err();
    assert_eq!(
        err,
        SmpError::Unprocessable("lists of lists are not supported".into())
    );

    let err =
        strategic_merge_node(&orig, &json!({"status": {"$setElementOrder": []}})).unwrap_err();
    assert_eq!(
        err,
        SmpError::BadRequest("invalid patch format of setElementOrder list".into())
    );

    assert!(matches!(
        strategic_merge_node(&orig, &json!([])),
        Err(SmpError::BadRequest(_))
    ));
    assert!(matches!(
        strategic_merge_node(&orig, &json!({"metadata": {"$patch": "frob"}})),
        Err(SmpError::Internal(_))
    ));

    let misordered = json!({"status": {"$setElementOrder/conditions": [{"type": "A"}], "conditions": [{"type": "B"}]}});
    assert!(
        matches!(strategic_merge_node(&orig, &misordered), Err(SmpError::Internal(m)) if m.contains("doesn't match"))
    );
}
