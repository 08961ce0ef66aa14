use super::*;

#[test]
fn keys_and_values_follow_apimachinery() {
    for good in [
        "site",
        "example.com/edge",
        "node.kubernetes.io/exclude-from-external-load-balancers",
        "a_b.c-d",
    ] {
        assert_eq!(check_key(good), Ok(()), "{good}");
    }
    for bad in ["/edge", "Example.com/edge"] {
        assert_eq!(
            check_key(bad),
            Err(RegistrationError::KeyPrefix { key: bad.into() }),
            "{bad:?}"
        );
    }
    for bad in ["", "example.com/", "-site", "site-", "a b", &"k".repeat(64)] {
        assert_eq!(
            check_key(bad),
            Err(RegistrationError::KeyName { key: bad.into() }),
            "{bad:?}"
        );
    }
    for good in ["", "true", "plant-3", "A_b.9", &"v".repeat(63)] {
        assert_eq!(check_value(good), Ok(()), "{good}");
    }
    for bad in ["-x", "x.", "two words", "é", &"v".repeat(64)] {
        assert_eq!(
            check_value(bad),
            Err(RegistrationError::Value { value: bad.into() }),
            "{bad:?}"
        );
    }
}

#[test]
fn noderestriction_label_rules() {
    let keys = [
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "node.kubernetes.io/instance-type",
        "node.kubernetes.io/edge",
        "foo.node.kubernetes.io/bar",
        "kubelet.kubernetes.io/x",
        "topology.kubernetes.io/zone",
        "example.com/site",
        "site",
        // forbidden:
        "node-role.kubernetes.io/control-plane",
        "node-restriction.kubernetes.io/trusted",
        "x.node-restriction.kubernetes.io/a",
        "kubernetes.io/role",
        "k8s.io/anything",
        "sub.k8s.io/x",
    ];
    assert_eq!(
        forbidden_labels(keys),
        [
            "k8s.io/anything",
            "kubernetes.io/role",
            "node-restriction.kubernetes.io/trusted",
            "node-role.kubernetes.io/control-plane",
            "sub.k8s.io/x",
            "x.node-restriction.kubernetes.io/a",
        ]
    );
    assert!(
        !is_kubelet_label("evilnode.kubernetes.io/x"),
        "a suffix match needs a dot"
    );
}

#[test]
fn registrations_are_bounded_and_restricted() {
    let mut r = Register::default();
    r.labels
        .insert("kubernetes.io/hostname".into(), "edge-01".into());
    validate_register(&r).unwrap();
    r.labels.insert(
        "node-role.kubernetes.io/control-plane".into(),
        String::new(),
    );
    let err = validate_register(&r).unwrap_err();
    assert_eq!(
        err,
        RegistrationError::ForbiddenLabels {
            keys: vec!["node-role.kubernetes.io/control-plane".into()]
        }
    );
    assert!(
        err.to_string()
            .contains("node-role.kubernetes.io/control-plane"),
        "{err}"
    );
    let mut r = Register::default();
    for i in 0..=MAX_LABELS {
        r.labels.insert(format!("example.com/l{i}"), "v".into());
    }
    assert_eq!(
        validate_register(&r),
        Err(RegistrationError::TooManyLabels {
            count: MAX_LABELS + 1
        })
    );
    let mut r = Register::default();
    r.labels.insert("example.com/l".into(), "v".repeat(64));
    assert_eq!(
        validate_register(&r),
        Err(RegistrationError::Label {
            key: "example.com/l".into(),
            source: Box::new(RegistrationError::Value {
                value: "v".repeat(64)
            }),
        })
    );
    let r = Register {
        taints: vec![crate::Taint {
            key: "k".into(),
            value: String::new(),
            effect: "Sometimes".into(),
        }],
        ..Default::default()
    };
    assert_eq!(
        validate_register(&r),
        Err(RegistrationError::Taint {
            key: "k".into(),
            source: Box::new(RegistrationError::TaintEffect {
                effect: "Sometimes".into()
            }),
        })
    );
}

#[test]
fn taints_name_their_fault() {
    assert_eq!(
        check_taint("example.com/edge", "true", "NoSchedule"),
        Ok(())
    );
    let e = check_taint("example.com/edge", "", "Sometimes").unwrap_err();
    assert!(
        matches!(&e, RegistrationError::Taint { key, source } if key == "example.com/edge" && matches!(**source, RegistrationError::TaintEffect { .. })),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(
        e.contains("unknown effect") && e.contains("NoExecute"),
        "{e}"
    );
    assert_eq!(
        check_taint("", "", "NoSchedule"),
        Err(RegistrationError::Taint {
            key: String::new(),
            source: Box::new(RegistrationError::KeyName { key: String::new() }),
        })
    );
}

#[test]
fn a_node_name_is_checked_once_where_it_is_made() {
    let name: NodeName = "edge-01".parse().unwrap();
    assert_eq!(name, "edge-01");
    assert_eq!(name.len(), 7, "reads as a str");
    let err = NodeName::new("Edge_01").unwrap_err().to_string();
    assert!(
        err.starts_with("\"Edge_01\" is not a valid node name"),
        "{err}"
    );
    assert_eq!(
        NodeName::try_from("a".repeat(254)).unwrap_err(),
        RegistrationError::NodeName {
            name: "a".repeat(254)
        }
    );
    NodeName::try_from("a".repeat(253)).unwrap();
    // A DNS-1123 subdomain, as the apiserver's IsDNS1123Subdomain.
    for ok in ["a", "node.example.com", "0-edge"] {
        NodeName::new(ok).expect(ok);
    }
    for bad in ["", "Edge", "-a", "a-", "a_b", ".a", "a b"] {
        assert_eq!(
            NodeName::new(bad).unwrap_err(),
            RegistrationError::NodeName { name: bad.into() },
            "{bad:?}"
        );
    }
}

#[test]
fn taint_effects_are_the_apis_three_spelt_as_the_api() {
    for effect in TaintEffect::ALL {
        assert_eq!(effect.as_str().parse::<TaintEffect>(), Ok(effect));
    }
    assert_eq!(
        "NoSchedule".parse::<TaintEffect>(),
        Ok(TaintEffect::NoSchedule)
    );
    // Case-sensitive, as the apiserver's validation.
    assert_eq!(
        "noschedule".parse::<TaintEffect>(),
        Err(RegistrationError::TaintEffect {
            effect: "noschedule".into()
        })
    );
}
