#![allow(clippy::unwrap_used, clippy::expect_used)]

use rcgen::{CertificateParams, DnType, KeyPair};

use super::*;

fn cert(subject: &[(DnType, &str)]) -> Vec<u8> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    for (ty, value) in subject {
        params.distinguished_name.push(ty.clone(), *value);
    }
    let key = KeyPair::generate().unwrap();
    params.self_signed(&key).unwrap().der().to_vec()
}

#[test]
fn node_certificate_yields_the_node_name() {
    let der = cert(&[
        (DnType::OrganizationName, "system:nodes"),
        (DnType::CommonName, "system:node:edge-01.plant-3"),
    ]);
    assert_eq!(node_identity(&der).unwrap(), "edge-01.plant-3");
}

#[test]
fn the_node_user_is_the_prefix_and_the_name_and_reads_back() {
    assert_eq!(node_user("edge-01"), "system:node:edge-01");
    assert_eq!(NODES_GROUP, "system:nodes");
    for name in ["edge-01", "edge-01.plant-3", "a"] {
        let der = cert(&[
            (DnType::OrganizationName, NODES_GROUP),
            (DnType::CommonName, &node_user(name)),
        ]);
        assert_eq!(node_identity(&der).unwrap(), name);
    }
    // Unchecked: no name, or one that is not a Node name, is no node's user.
    for name in ["", "Edge_01"] {
        let der = cert(&[
            (DnType::OrganizationName, NODES_GROUP),
            (DnType::CommonName, &node_user(name)),
        ]);
        assert!(
            matches!(
                node_identity(&der),
                Err(IdentityError::InvalidNodeName { .. })
            ),
            "{name:?}"
        );
    }
}

#[test]
fn certificates_that_are_not_nodes_are_refused_with_a_reason() {
    let cases = [
        (
            vec![(DnType::CommonName, "system:node:edge-01")],
            "lacks O=system:nodes",
        ),
        (
            vec![
                (DnType::OrganizationName, "system:masters"),
                (DnType::CommonName, "system:node:edge-01"),
            ],
            "lacks O=system:nodes",
        ),
        (
            vec![
                (DnType::OrganizationName, "system:nodes"),
                (DnType::CommonName, "edge-01"),
            ],
            "not a node identity",
        ),
        (
            vec![
                (DnType::OrganizationName, "system:nodes"),
                (DnType::CommonName, "system:node:"),
            ],
            "valid node",
        ),
        (
            vec![
                (DnType::OrganizationName, "system:nodes"),
                (DnType::CommonName, "system:node:Edge_01"),
            ],
            "valid node",
        ),
        (
            vec![(DnType::OrganizationName, "system:nodes")],
            "exactly one CN",
        ),
    ];
    for (subject, expected) in cases {
        let err = node_identity(&cert(&subject)).unwrap_err().to_string();
        assert!(err.contains(expected), "{subject:?}: {err}");
    }
    assert!(matches!(
        node_identity(b"not DER"),
        Err(IdentityError::Unparsable(_))
    ));
}

#[test]
fn server_material_is_checked_before_serving() {
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let good = GrpcServerTls {
        cert_pem: params.self_signed(&key).unwrap().pem().into_bytes(),
        key_pem: key.serialize_pem().into_bytes(),
        client_ca_pem: None,
    };
    good.check().unwrap();
    let other_key = KeyPair::generate().unwrap();
    let cases = [
        (
            GrpcServerTls {
                cert_pem: b"junk".to_vec(),
                ..good.clone()
            },
            "certificate: ",
        ),
        (
            GrpcServerTls {
                key_pem: good.cert_pem.clone(),
                ..good.clone()
            },
            "key: ",
        ),
        (
            GrpcServerTls {
                key_pem: other_key.serialize_pem().into_bytes(),
                ..good.clone()
            },
            "certificate and key: ",
        ),
        (
            GrpcServerTls {
                client_ca_pem: Some(b"".to_vec()),
                ..good.clone()
            },
            "client CA: ",
        ),
    ];
    for (tls, prefix) in cases {
        let err = tls.check().unwrap_err();
        // The part is named both in the type and in the message.
        let TlsError::In { part, .. } = &err else {
            panic!("not in a part: {err:?}");
        };
        assert_eq!(format!("{part}: "), prefix);
        assert!(err.to_string().starts_with(prefix), "{err}");
    }
    let debug = format!("{good:?}");
    assert!(
        debug.contains("<redacted>") && !debug.contains("PRIVATE"),
        "{debug}"
    );
}
