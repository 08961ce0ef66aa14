use super::*;

const MINIMAL: &str = "apiVersion: edgebeat.io/v1alpha1\nkind: AgentConfiguration\n";

#[test]
fn defaults_are_kubelets() {
    let c = AgentConfig::from_yaml(MINIMAL).unwrap();
    assert_eq!(c, AgentConfig::default());
    assert_eq!(c.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(300));
    assert_eq!(c.lease_renew_interval(), Duration::from_secs(10));
    assert_eq!(c.eviction_hard.len(), 4);
}

#[test]
fn explicit_update_frequency_carries_the_report_frequency() {
    let c = AgentConfig::from_yaml(&format!("{MINIMAL}nodeStatusUpdateFrequency: 20s\n")).unwrap();
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(20));
    let c = AgentConfig::from_yaml(&format!(
        "{MINIMAL}nodeStatusUpdateFrequency: 20s\nnodeStatusReportFrequency: 1m\n"
    ))
    .unwrap();
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(60));
}

#[test]
fn full_config_parses() {
    let yaml = format!(
        "{MINIMAL}nodeName: edge-01\nnodeLeaseDurationSeconds: 20\nregisterWithTaints:\n- {{key: example.com/edge, value: \"true\", effect: NoSchedule}}\nnodeLabels: {{site: plant-3}}\nevictionHard: {{memory.available: 200Mi, pid.available: 10%}}\nevictionPressureTransitionPeriod: 1m30s\nsystemReserved: {{cpu: 250m, memory: 128Mi}}\nmaxPods: 20\nnodeIP: 10.0.3.7\nhostRoot: /host\nrootDir: /var/lib/edgebeat\ntransport: {{kind: grpc, endpoint: \"http://gw:7443\", keepalive: 20s}}\n"
    );
    let c = AgentConfig::from_yaml(&yaml).unwrap();
    assert_eq!(c.node_name.as_deref(), Some("edge-01"));
    assert_eq!(c.lease_renew_interval(), Duration::from_secs(5));
    assert_eq!(c.register_with_taints[0].effect, TaintEffect::NoSchedule);
    assert_eq!(
        c.eviction_hard.len(),
        2,
        "setting evictionHard drops the other defaults"
    );
    assert_eq!(
        c.eviction_hard[&EvictionSignal::PidAvailable],
        Amount::Percentage(0.1)
    );
    assert_eq!(
        c.eviction_pressure_transition_period,
        Duration::from_secs(90)
    );
    assert_eq!(c.system_reserved["cpu"], 250);
    assert_eq!(c.system_reserved["memory"], 128 << 20);
    assert_eq!(c.node_ip, Some("10.0.3.7".parse().unwrap()));
    assert_eq!(
        c.transport,
        Some(TransportConfig::Grpc(GrpcUplinkOptions {
            keepalive: Duration::from_secs(20),
            ..GrpcUplinkOptions::new("http://gw:7443")
        }))
    );
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (
            "nodeStatusUpdateFrequency: 10x\n",
            "nodeStatusUpdateFrequency",
        ),
        (
            "nodeStatusUpdateFrequency: 0s\n",
            "nodeStatusUpdateFrequency",
        ),
        ("nodeLeaseDurationSeconds: 0\n", "nodeLeaseDurationSeconds"),
        (
            "evictionHard: {memory.free: 1Gi}\n",
            "evictionHard[\"memory.free\"]",
        ),
        (
            "evictionHard: {memory.available: lots}\n",
            "evictionHard[\"memory.available\"]",
        ),
        (
            "registerWithTaints: [{key: a, effect: Sometimes}]\n",
            "registerWithTaints[0].effect",
        ),
        ("nodeName: Edge_01\n", "nodeName"),
        ("maxPods: -1\n", "maxPods"),
        (
            "nodeLabels: {edgebeat.io/container-runtime: containerd}\n",
            "nodeLabels[\"edgebeat.io/container-runtime\"]",
        ),
        ("nodeIP: 127.0.0.1\n", "nodeIP"),
        ("transport: {kind: grpc}\n", "transport.endpoint"),
        ("transport: {kind: carrier-pigeon}\n", "transport.kind"),
        ("transport: {kind: mqtt}\n", "transport.endpoint"),
        (
            "transport: {kind: mqtt, endpoint: \"http://b:1883\"}\n",
            "transport.endpoint",
        ),
        (
            "transport: {kind: mqtt, endpoint: \"mqtt://b:99999\"}\n",
            "transport.endpoint",
        ),
        (
            "transport: {kind: mqtt, endpoint: \"mqtt://b\", topicPrefix: \"a/#\"}\n",
            "transport.topicPrefix",
        ),
        // Rules that once drifted from the MQTT transport's (a config that loaded but
        // failed to run): a leading `/`, a NUL, a keepalive over MQTT's 16 bits.
        (
            "transport: {kind: mqtt, endpoint: \"mqtt://b\", topicPrefix: /edgebeat}\n",
            "transport.topicPrefix",
        ),
        (
            "transport: {kind: mqtt, endpoint: \"mqtt://b\", topicPrefix: \"a\\0b\"}\n",
            "transport.topicPrefix",
        ),
        (
            "transport: {kind: mqtt, endpoint: \"mqtt://b\", keepalive: 20h}\n",
            "transport.keepalive",
        ),
        (
            "transport: {kind: mqtt, endpoint: \"mqtt://b\", username: u}\n",
            "transport.passwordFile",
        ),
        (
            "transport: {kind: mqtt, endpoint: \"mqtt://b\", keepalive: 1s}\n",
            "transport.keepalive",
        ),
        (
            "transport: {kind: grpc, endpoint: \"http://g:1\", topicPrefix: x}\n",
            "transport.topicPrefix",
        ),
        (
            "transport: {kind: grpc, endpoint: gw:7443}\n",
            "transport.endpoint",
        ),
        ("systemReserved: {gpu: 1}\n", "systemReserved[\"gpu\"]"),
        (
            "healthzBindAddress: localhost:10248\n",
            "healthzBindAddress",
        ),
        ("healthzBindAddress: \"10248\"\n", "healthzBindAddress"),
        ("healthzBindAddress: 127.0.0.1\n", "healthzBindAddress"),
        ("healthzBindAddress: 127.0.0.1:0\n", "healthzBindAddress"),
        ("healthzBindAddress: \"::1:10248\"\n", "healthzBindAddress"),
        // Rules that once drifted from the gateway's and the apiserver's (a config
        // that loaded but whose node never registered): the hostname label's length,
        // label and taint syntax, NodeRestriction's labels.
        (
            "nodeName: edge-01234567890123456789012345678901234567890123456789012345678\n",
            "nodeName",
        ),
        (
            "nodeLabels: {node-role.kubernetes.io/edge: \"\"}\n",
            "nodeLabels[\"node-role.kubernetes.io/edge\"]",
        ),
        ("nodeLabels: {site: plant 3}\n", "nodeLabels[\"site\"]"),
        (
            "nodeLabels: {Example.com/site: a}\n",
            "nodeLabels[\"Example.com/site\"]",
        ),
        (
            "registerWithTaints: [{key: a b, effect: NoSchedule}]\n",
            "registerWithTaints[0].key",
        ),
        (
            "registerWithTaints: [{key: a, value: -x, effect: NoSchedule}]\n",
            "registerWithTaints[0].value",
        ),
        // ... and from the gRPC uplink's endpoint parser.
        (
            "transport: {kind: grpc, endpoint: \"http://\"}\n",
            "transport.endpoint",
        ),
        (
            "transport: {kind: grpc, endpoint: \"http://gw:x\"}\n",
            "transport.endpoint",
        ),
    ];
    for (body, field) in cases {
        let err = AgentConfig::from_yaml(&format!("{MINIMAL}{body}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("{field}: ")),
            "{body:?} gave {err:?}"
        );
    }
}

/// The registration's label limit counts the agent's own labels: 59 more than its
/// six are one too many for the gateway, so the config says so.
#[test]
fn node_labels_are_counted_with_the_agents_own() {
    let labels = |n: usize| {
        let list: Vec<String> = (0..n).map(|i| format!("example.com/l{i}: v")).collect();
        format!("{MINIMAL}nodeLabels: {{{}}}\n", list.join(", "))
    };
    AgentConfig::from_yaml(&labels(58)).unwrap();
    let err = AgentConfig::from_yaml(&labels(59)).unwrap_err().to_string();
    assert!(err.starts_with("nodeLabels: 65 labels"), "{err}");
    // Overriding a default label adds none.
    let yaml = format!("{MINIMAL}nodeLabels: {{kubernetes.io/hostname: edge-01}}\n");
    AgentConfig::from_yaml(&yaml).unwrap();
}

#[test]
fn max_pods_defaults_to_zero_and_accepts_zero() {
    assert_eq!(AgentConfig::from_yaml(MINIMAL).unwrap().max_pods, 0);
    let c = AgentConfig::from_yaml(&format!("{MINIMAL}maxPods: 0\n")).unwrap();
    assert_eq!(c.max_pods, 0);
    let c = AgentConfig::from_yaml(&format!("{MINIMAL}maxPods: 110\n")).unwrap();
    assert_eq!(c.max_pods, 110);
}

#[test]
fn unknown_fields_and_wrong_kind_are_rejected() {
    let err = AgentConfig::from_yaml(&format!("{MINIMAL}nodeStatusUpdateFrequncy: 10s\n"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("nodeStatusUpdateFrequncy"), "{err}");
    let err = AgentConfig::from_yaml("apiVersion: v1\nkind: AgentConfiguration\n")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("apiVersion: "), "{err}");
    let err = AgentConfig::from_yaml("apiVersion: edgebeat.io/v1alpha1\nkind: Pod\n")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("kind: "), "{err}");
    assert!(matches!(
        AgentConfig::from_yaml("{ not yaml"),
        Err(ConfigError::Syntax(_))
    ));
    let err = AgentConfig::from_yaml(&format!("{MINIMAL}maxPods: many\n"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("maxPods") || err.contains("line"), "{err}");
}

/// Asserts that `transport` (a YAML flow mapping) is refused, naming `field` with `words`.
fn assert_transport_refused(transport: &str, field: &str, words: &str) {
    let err = AgentConfig::from_yaml(&format!("{MINIMAL}transport: {transport}\n"))
        .unwrap_err()
        .to_string();
    assert!(
        (err.starts_with(&format!("{field}: ")) || err.contains(&format!("\n- {field}: ")))
            && err.contains(words),
        "{transport}: {err}"
    );
}

#[test]
fn several_broker_endpoints_are_one_list_tried_in_turn() {
    let c = AgentConfig::from_yaml(&format!(
        "{MINIMAL}transport: {{kind: mqtt, endpoints: [\"mqtt://b0:1883\", \"mqtt://b1\", \"mqtt://[fd00::2]:2883\"]}}\n"
    ))
    .unwrap();
    let Some(TransportConfig::Mqtt(m)) = c.transport else {
        panic!("mqtt expected")
    };
    assert_eq!((m.host.as_str(), m.port), ("b0", 1883));
    assert_eq!(
        m.failover,
        [("b1".to_owned(), 1883), ("fd00::2".to_owned(), 2883)]
    );
    let one = AgentConfig::from_yaml(&format!(
        "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtt://b0\"}}\n"
    ))
    .unwrap();
    assert!(matches!(one.transport, Some(TransportConfig::Mqtt(m)) if m.failover.is_empty()));
    let cases = [
        (
            "{kind: mqtt, endpoint: \"mqtt://b0\", endpoints: [\"mqtt://b1\"]}",
            "transport.endpoints",
            "not both",
        ),
        (
            "{kind: mqtt, endpoints: []}",
            "transport.endpoints",
            "at least one",
        ),
        // An empty list does not hide the other fields' problems.
        (
            "{kind: mqtt, endpoints: [], topicPrefix: \"/x\"}",
            "transport.topicPrefix",
            "/x",
        ),
        (
            "{kind: mqtt, endpoints: [\"mqtt://b0\", \"http://b1\"]}",
            "transport.endpoints[1]",
            "http://b1",
        ),
        (
            "{kind: mqtt, endpoints: [\"mqtt://b0\", \"mqtts://b1\"]}",
            "transport.endpoints[1]",
            "differ in TLS",
        ),
        (
            "{kind: grpc, endpoints: [\"http://gw:7443\"]}",
            "transport.endpoints",
            "only valid with kind: mqtt",
        ),
    ];
    for (transport, field, words) in cases {
        assert_transport_refused(transport, field, words);
    }
}

#[test]
fn mqtt_transport_parses() {
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let yaml = format!(
        "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtt://broker.plant:8883\", clientID: edge-01, username: edge, passwordFile: {}, topicPrefix: plant3/edgebeat, keepalive: 1m}}\n",
        password.display()
    );
    let c = AgentConfig::from_yaml(&yaml).unwrap();
    let Some(TransportConfig::Mqtt(m)) = c.transport else {
        panic!("mqtt expected")
    };
    assert_eq!((m.host.as_str(), m.port), ("broker.plant", 8883));
    assert_eq!(m.credentials, Some(("edge".into(), "s3cret".into())));
    assert_eq!(m.topic_prefix, "plant3/edgebeat");
    assert_eq!(m.keepalive, Duration::from_secs(60));
    let c = AgentConfig::from_yaml(&format!(
        "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtt://10.0.0.1\"}}\n"
    ))
    .unwrap();
    let Some(TransportConfig::Mqtt(m)) = c.transport else {
        panic!("mqtt expected")
    };
    assert_eq!(
        (m.host.as_str(), m.port, m.topic_prefix.as_str()),
        ("10.0.0.1", 1883, "edgebeat/v1")
    );
}

/// The regression: `passwordFile: /dev/zero` used to read forever at load.
#[test]
fn endless_password_file_is_refused_naming_the_field() {
    let err = AgentConfig::from_yaml(&format!(
        "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtt://b\", username: edge, passwordFile: /dev/zero}}\n"
    ))
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "transport.passwordFile: /dev/zero: larger than 4096 bytes; point it at a regular file of at most 4096 bytes"
    );
    let dir = tempfile::tempdir().unwrap();
    let err = AgentConfig::from_yaml(&format!(
        "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtt://b\", username: edge, passwordFile: {}}}\n",
        dir.path().display()
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("transport.passwordFile: ") && err.contains("is a directory"),
        "{err}"
    );
}

#[test]
fn endless_pem_file_is_refused_naming_the_field() {
    let err = AgentConfig::from_yaml(&format!(
        "{MINIMAL}transport: {{kind: grpc, endpoint: \"https://gw:7443\", caFile: /dev/zero}}\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("transport.caFile: /dev/zero: larger than 1048576 bytes"),
        "{err}"
    );
}

#[test]
fn load_refuses_an_endless_config_file() {
    let err = AgentConfig::load(std::path::Path::new("/dev/zero"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "agent configuration: /dev/zero: larger than 1048576 bytes; point it at a regular file of at most 1048576 bytes"
    );
    let dir = tempfile::tempdir().unwrap();
    let err = AgentConfig::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("is a directory"), "{err}");
    let path = dir.path().join("agent.yaml");
    std::fs::write(&path, MINIMAL).unwrap();
    assert_eq!(AgentConfig::load(&path).unwrap(), AgentConfig::default());
    std::fs::write(&path, b"kind: \xff\n").unwrap();
    let err = AgentConfig::load(&path).unwrap_err().to_string();
    assert!(err.contains("not UTF-8"), "{err}");
}

/// Writes a CA certificate, a node certificate and its key as PEM files.
fn pki(dir: &std::path::Path) -> (PathBuf, PathBuf, PathBuf) {
    pki_with(dir, &rcgen::PKCS_ECDSA_P256_SHA256)
}

/// [`pki`] with a node key of `algorithm`.
fn pki_with(
    dir: &std::path::Path,
    algorithm: &'static rcgen::SignatureAlgorithm,
) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let node_key = rcgen::KeyPair::generate_for(algorithm).unwrap();
    let mut node = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    node.distinguished_name
        .push(rcgen::DnType::CommonName, "system:node:edge-01");
    node.distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    let node_cert = node.signed_by(&node_key, &issuer).unwrap();
    let paths = (
        dir.join("ca.crt"),
        dir.join("node.crt"),
        dir.join("node.key"),
    );
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, node_cert.pem()).unwrap();
    std::fs::write(&paths.2, node_key.serialize_pem()).unwrap();
    paths
}

/// The example site configs (`deploy/agent`) run the identified posture: each names a
/// CA, a node certificate and its key under /etc/edgebeat/pki, which load here from
/// [`pki`] (the paths rewritten to it).
#[test]
fn example_site_configs_load() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, _, _) = pki(dir.path());
    let pki_dir = format!("{}/", ca.parent().unwrap().display());
    for name in ["site-grpc.yaml", "site-mqtt.yaml"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/agent")
            .join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text.matches("/etc/edgebeat/pki/").count(),
            3,
            "{name}: caFile, certFile and keyFile are set"
        );
        let config = AgentConfig::from_yaml(&text.replace("/etc/edgebeat/pki/", &pki_dir))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(config.transport.is_some(), "{name}");
        assert!(
            config
                .transport
                .as_ref()
                .and_then(TransportConfig::tls)
                .is_some_and(|t| t.client_identity.is_some()),
            "{name}: a node identity"
        );
        assert_eq!(config.register_with_taints.len(), 1, "{name}");
    }
    // The enrolled site: a token and nothing else.
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/agent/site-enrolled.yaml");
    let config = AgentConfig::from_yaml(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let managed = config.certificates.expect("managed certificates");
    assert_eq!(managed.cert_dir, PathBuf::from(DEFAULT_CERT_DIR));
    assert!(managed.enrollment_endpoint.is_some());
}

#[test]
fn grpc_tls_files_are_read_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pki(dir.path());
    let c = AgentConfig::from_yaml(&format!(
        "{MINIMAL}transport: {{kind: grpc, endpoint: \"https://gw.plant:7443\", caFile: {}, certFile: {}, keyFile: {}}}\n",
        ca.display(),
        cert.display(),
        key.display()
    ))
    .unwrap();
    let tls = c.transport.as_ref().and_then(TransportConfig::tls).unwrap();
    assert_eq!(tls.ca_pem, std::fs::read(&ca).unwrap());
    let client = tls.client_identity.as_ref().unwrap();
    assert_eq!(client.key_pem, std::fs::read(&key).unwrap());
    assert!(
        !format!("{client:?}").contains("PRIVATE"),
        "key not in Debug"
    );
    // Server-authenticated TLS only: a CA without a client certificate.
    let c = AgentConfig::from_yaml(&format!(
        "{MINIMAL}transport: {{kind: grpc, endpoint: \"https://gw:7443\", caFile: {}}}\n",
        ca.display()
    ))
    .unwrap();
    let tls = c.transport.as_ref().and_then(TransportConfig::tls).unwrap();
    assert_eq!(tls.client_identity, None);
    // Plain gRPC has no TLS material.
    let c = AgentConfig::from_yaml(&format!(
        "{MINIMAL}transport: {{kind: grpc, endpoint: \"http://gw:7443\"}}\n"
    ))
    .unwrap();
    assert!(matches!(
        c.transport,
        Some(TransportConfig::Grpc(GrpcUplinkOptions { tls: None, .. }))
    ));
}

#[test]
fn mqtt_tls_files_are_read_at_load_and_the_key_must_sign() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pki(dir.path());
    let yaml = |key: &std::path::Path| {
        format!(
            "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtts://broker.plant\", caFile: {}, certFile: {}, keyFile: {}}}\n",
            ca.display(),
            cert.display(),
            key.display()
        )
    };
    let c = AgentConfig::from_yaml(&yaml(&key)).unwrap();
    let Some(TransportConfig::Mqtt(m)) = &c.transport else {
        panic!("mqtt expected");
    };
    assert_eq!((m.host.as_str(), m.port), ("broker.plant", 8883));
    assert!(m.tls.as_ref().unwrap().client_identity.is_some());
    // A key that is not the certificate's is refused at load by rustls, building the
    // TLS configuration the transport will use, naming the field.
    let other = dir.path().join("other.key");
    let key = rcgen::KeyPair::generate().unwrap();
    std::fs::write(&other, key.serialize_pem()).unwrap();
    let err = AgentConfig::from_yaml(&yaml(&other))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("transport.keyFile: unusable for TLS: client certificate and key:"),
        "{err}"
    );
    // A certificate and key that TLS accepts but that cannot sign compactly (P-384) are
    // refused at load, naming the field.
    let p384 = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pki_with(p384.path(), &rcgen::PKCS_ECDSA_P384_SHA384);
    let err = AgentConfig::from_yaml(&format!(
        "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtts://broker.plant\", caFile: {}, certFile: {}, keyFile: {}}}\n",
        ca.display(),
        cert.display(),
        key.display()
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("transport.keyFile: cannot sign MQTT messages"),
        "{err}"
    );
}

#[test]
fn grpc_tls_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pki(dir.path());
    let missing = dir.path().join("missing.crt");
    // PEM, but its DER is no certificate: only rustls, building the TLS configuration
    // the transport will use, can tell.
    let not_der = dir.path().join("not-der.crt");
    std::fs::write(
        &not_der,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let not_der = not_der.display().to_string();
    let (ca, cert, key, missing) = (
        ca.display().to_string(),
        cert.display().to_string(),
        key.display().to_string(),
        missing.display().to_string(),
    );
    let https = "kind: grpc, endpoint: \"https://gw:7443\"";
    let cases = [
        (format!("{{{https}}}"), "transport.caFile", "required"),
        (
            format!("{{{https}, caFile: {ca}, certFile: {cert}}}"),
            "transport.keyFile",
            "required",
        ),
        (
            format!("{{{https}, caFile: {ca}, keyFile: {key}}}"),
            "transport.certFile",
            "required",
        ),
        (
            format!("{{kind: grpc, endpoint: \"http://gw:7443\", caFile: {ca}}}"),
            "transport.caFile",
            "https://",
        ),
        (
            format!(
                "{{kind: grpc, endpoint: \"http://gw:7443\", certFile: {cert}, keyFile: {key}}}"
            ),
            "transport.certFile",
            "https://",
        ),
        (
            format!("{{kind: mqtt, endpoint: \"mqtt://b\", caFile: {ca}}}"),
            "transport.caFile",
            "mqtts://",
        ),
        (
            "{kind: mqtt, endpoint: \"mqtts://b\"}".to_owned(),
            "transport.caFile",
            "required for a mqtts:// endpoint",
        ),
        (
            format!("{{{https}, caFile: {missing}}}"),
            "transport.caFile",
            "reading",
        ),
        (
            format!("{{{https}, caFile: {key}}}"),
            "transport.caFile",
            "no PEM CERTIFICATE",
        ),
        (
            format!("{{{https}, caFile: {ca}, certFile: {key}, keyFile: {key}}}"),
            "transport.certFile",
            "no PEM CERTIFICATE",
        ),
        (
            format!("{{{https}, caFile: {ca}, certFile: {cert}, keyFile: {cert}}}"),
            "transport.keyFile",
            "private key",
        ),
        (
            format!("{{{https}, caFile: {not_der}}}"),
            "transport.caFile",
            "unusable for TLS: CA: not a usable CA certificate",
        ),
    ];
    for (transport, field, words) in cases {
        assert_transport_refused(&transport, field, words);
    }
}

/// The fields `yaml` is refused for, sorted, and the error.
fn refused_fields(yaml: &str) -> (Vec<String>, ConfigError) {
    let err = AgentConfig::from_yaml(yaml).unwrap_err();
    let ConfigError::Invalid(fields) = &err else {
        panic!("{err}");
    };
    let mut names: Vec<String> = fields.iter().map(|f| f.field.clone()).collect();
    names.sort_unstable();
    (names, err)
}

#[test]
fn health_condition_fields() {
    let c = AgentConfig::from_yaml(&format!(
        "{MINIMAL}systemMemoryContentionThreshold: 0.25\nsystemDiskContentionThreshold: 0\nthermalLimitCelsius: 75\nclockSyncCondition: false\nunderVoltageCondition: false\n"
    ))
    .unwrap();
    assert_eq!(
        c.health,
        HealthSettings {
            system_memory_contention_threshold: 0.25,
            system_disk_contention_threshold: 0.0,
            thermal_limit_celsius: Some(75.0),
            clock_sync: false,
            under_voltage: false,
            ..HealthSettings::default()
        }
    );
    let (names, err) = refused_fields(&format!(
        "{MINIMAL}systemMemoryContentionThreshold: 10\nthermalLimitCelsius: -3\nthermalCondition: maybe\n"
    ));
    assert_eq!(
        names,
        [
            "systemMemoryContentionThreshold",
            "thermalCondition",
            "thermalLimitCelsius"
        ],
        "{err}"
    );
    assert!(err.to_string().contains("between 0 (off) and 1"), "{err}");
}

/// A file with several mistakes names every one in a single error: type errors and
/// unknown fields (top level and inside transport) as well as invalid values.
#[test]
fn every_invalid_field_is_reported_at_once() {
    let (names, err) = refused_fields(
        "apiVersion: v1\nkind: AgentConfiguration\nmaxPods: many\nnodeStatusUpdateFrequncy: 10s\nnodeLeaseDurationSeconds: -5\nnodeIP: 127.0.0.1\ntransport: {kind: mqtt, endpoint: \"mqtt://b:1883\", keepalive: 1s, usernam: u, topicPrefix: \"a/#\"}\n",
    );
    assert_eq!(
        names,
        [
            "apiVersion",
            "maxPods",
            "nodeIP",
            "nodeLeaseDurationSeconds",
            "nodeStatusUpdateFrequncy",
            "transport.keepalive",
            "transport.topicPrefix",
            "transport.usernam",
        ]
    );
    let text = err.to_string();
    assert!(
        text.starts_with("8 invalid fields in the agent configuration:\n- "),
        "{text}"
    );
    assert!(
        !text.contains("line 1 column"),
        "no positions of the one-field documents: {text}"
    );
    // One mistake reads as before: `field: message`.
    let one = AgentConfig::from_yaml(&format!("{MINIMAL}maxPods: many\n"))
        .unwrap_err()
        .to_string();
    assert!(one.starts_with("maxPods: "), "{one}");
}

/// Every scalar is checked by its type as serde reads it (values.rs): a file with one bad
/// value of each names them all, each with its own rule's message.
#[test]
fn scalar_values_are_checked_by_their_types() {
    let (names, err) = refused_fields(&format!(
        "{MINIMAL}nodeName: Edge_1\nnodeStatusUpdateFrequency: 0s\nnodeLeaseDurationSeconds: -3\nmaxPods: -1\nnodeIP: 127.0.0.1\nrootDir: relative/dir\nthermalLimitCelsius: 900\nsystemDiskContentionThreshold: 2\nhealthzBindAddress: localhost:1\nevictionPressureTransitionPeriod: 48h\ntransport: {{kind: mqtt, endpoint: \"mqtt://b\", keepalive: 0s}}\n"
    ));
    assert_eq!(
        names,
        [
            "evictionPressureTransitionPeriod",
            "healthzBindAddress",
            "maxPods",
            "nodeIP",
            "nodeLeaseDurationSeconds",
            "nodeName",
            "nodeStatusUpdateFrequency",
            "rootDir",
            "systemDiskContentionThreshold",
            "thermalLimitCelsius",
            "transport.keepalive",
        ]
    );
    let text = err.to_string();
    for message in [
        "\"48h\" must be at most 24h",
        "is not an IP:port address",
        "got -1; must be 0",
        "use the node's own address",
        "got -3; must be a positive number of seconds",
        "\"Edge_1\" is not a valid node name",
        "\"0s\" must be greater than zero",
        "\"relative/dir\" is not absolute",
        "systemDiskContentionThreshold: got 2;",
        "between 0 (off) and 1",
        "degrees Celsius above 0",
    ] {
        assert!(text.contains(message), "{message:?} not in {text}");
    }
    // Floats are checked after reading, so a non-finite one is named too.
    let (names, err) = refused_fields(&format!(
        "{MINIMAL}thermalLimitCelsius: .nan\nsystemMemoryContentionThreshold: .inf\n"
    ));
    assert_eq!(
        names,
        ["systemMemoryContentionThreshold", "thermalLimitCelsius"],
        "{err}"
    );
    // An empty nodeName is no name: the hostname is used.
    let c = AgentConfig::from_yaml(&format!("{MINIMAL}nodeName: \"\"\n")).unwrap();
    assert_eq!(c.node_name, None);
}

#[test]
fn healthz_bind_address_is_off_by_default_and_parses_ip_port() {
    assert_eq!(AgentConfig::default().healthz_bind_address, None);
    let c =
        AgentConfig::from_yaml(&format!("{MINIMAL}healthzBindAddress: 127.0.0.1:10248\n")).unwrap();
    assert_eq!(
        c.healthz_bind_address,
        Some("127.0.0.1:10248".parse().unwrap())
    );
    let c =
        AgentConfig::from_yaml(&format!("{MINIMAL}healthzBindAddress: \"[::]:9100\"\n")).unwrap();
    assert_eq!(c.healthz_bind_address, Some("[::]:9100".parse().unwrap()));
    let err = parse_bind_address("0.0.0.0:0").unwrap_err();
    assert!(matches!(err, ValueError::PortZero { .. }), "{err:?}");
    assert!(err.to_string().contains("port 0"), "{err}");
}

#[test]
fn go_durations() {
    let cases = [
        ("10s", 10.0),
        ("5m", 300.0),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("300ms", 0.3),
        ("0", 0.0),
        ("2h45m", 9900.0),
    ];
    for (text, secs) in cases {
        assert_eq!(
            parse_duration(text).unwrap(),
            Duration::from_secs_f64(secs),
            "{text}"
        );
    }
    for bad in ["", "10", "s", "10x", "-1s", "1m-1s"] {
        assert_eq!(
            parse_duration(bad),
            Err(ValueError::Duration { text: bad.into() }),
            "{bad}"
        );
    }
}

/// `transport` is tagged on `kind`; its text fields still read any YAML scalar as text, as
/// the other string fields of the file do.
#[test]
fn transport_text_fields_take_any_scalar() {
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let c = AgentConfig::from_yaml(&format!(
        "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtt://b\", clientID: 12345, username: 1000, passwordFile: {}, topicPrefix: 2024}}\n",
        password.display()
    ))
    .unwrap();
    let Some(TransportConfig::Mqtt(m)) = c.transport else {
        panic!("mqtt expected")
    };
    assert_eq!(m.client_id.as_deref(), Some("12345"));
    assert_eq!(m.credentials, Some(("1000".into(), "s3cret".into())));
    assert_eq!(m.topic_prefix, "2024");
    assert_transport_refused(
        "{kind: mqtt, endpoint: \"mqtt://b\", clientID: 1.50}",
        "transport.clientID",
        "quote it",
    );
}

/// A signing agent takes only the gateway's signed answers, verified against `caFile` or,
/// where the broker's CA is another, `gatewayCAFile`; which means nothing without a node key.
#[test]
fn gateway_ca_file_verifies_answers_of_a_signing_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pki(dir.path());
    let signing = AgentConfig::from_yaml(&format!(
        "{MINIMAL}transport: {{kind: mqtt, endpoint: \"mqtts://broker.plant\", caFile: {}, certFile: {}, keyFile: {}, gatewayCAFile: {}}}\n",
        ca.display(),
        cert.display(),
        key.display(),
        ca.display()
    ))
    .unwrap();
    let Some(TransportConfig::Mqtt(m)) = &signing.transport else {
        panic!("mqtt expected");
    };
    assert!(m.signer.is_some() && m.answers.is_some());
    assert_transport_refused(
        &format!(
            "{{kind: mqtt, endpoint: \"mqtts://broker.plant\", caFile: {}, gatewayCAFile: {}}}",
            ca.display(),
            ca.display()
        ),
        "transport.gatewayCAFile",
        "only valid with transport.certFile",
    );
    assert_transport_refused(
        &format!(
            "{{kind: grpc, endpoint: \"http://gw:7443\", gatewayCAFile: {}}}",
            ca.display()
        ),
        "transport.gatewayCAFile",
        "only valid with kind: mqtt",
    );
}

/// With `bootstrapTokenFile` the agent enrolls for its certificate and rotates it: `certDir`
/// defaults to kubelet's layout under edgebeat's state directory, `rotateCertificates` to
/// true, gRPC needs the enrollment listener, and hand-made certificate files are refused.
#[test]
fn bootstrap_token_file_turns_on_managed_certificates() {
    let c = AgentConfig::from_yaml(&format!(
        "{MINIMAL}bootstrapTokenFile: /etc/edgebeat/token\ntransport: {{kind: grpc, endpoint: \"https://gw:7443\", enrollmentEndpoint: \"http://gw:7444\"}}\n"
    ))
    .unwrap();
    assert_eq!(
        c.certificates,
        Some(ManagedCertificates {
            bootstrap_token_file: PathBuf::from("/etc/edgebeat/token"),
            cert_dir: PathBuf::from(DEFAULT_CERT_DIR),
            rotate_certificates: true,
            enrollment_endpoint: Some("http://gw:7444".into()),
        })
    );
    let Some(TransportConfig::Grpc(g)) = &c.transport else {
        panic!("grpc expected");
    };
    assert_eq!(g.tls, None, "the TLS comes from the enrollment");

    let c = AgentConfig::from_yaml(&format!(
        "{MINIMAL}bootstrapTokenFile: /etc/edgebeat/token\ncertDir: /data/pki\nrotateCertificates: false\ntransport: {{kind: mqtt, endpoint: \"mqtts://broker.plant\"}}\n"
    ))
    .unwrap();
    let managed = c.certificates.unwrap();
    assert_eq!(managed.cert_dir, PathBuf::from("/data/pki"));
    assert!(!managed.rotate_certificates);
    assert_eq!(managed.enrollment_endpoint, None);

    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = pki(dir.path());
    let (fields, err) = refused_fields(&format!(
        "{MINIMAL}bootstrapTokenFile: /t\ntransport: {{kind: grpc, endpoint: \"https://gw:7443\", certFile: {}, keyFile: {}}}\n",
        cert.display(),
        key.display()
    ));
    assert_eq!(
        fields,
        ["transport.certFile", "transport.enrollmentEndpoint"],
        "{err}"
    );
    let (fields, err) = refused_fields(&format!("{MINIMAL}bootstrapTokenFile: token\n"));
    assert_eq!(fields, ["bootstrapTokenFile"], "{err}");
    assert!(err.to_string().contains("not absolute"), "{err}");
    let (fields, err) = refused_fields(&format!(
        "{MINIMAL}certDir: /data/pki\ntransport: {{kind: mqtt, endpoint: \"mqtts://broker.plant\", caFile: {}, enrollmentEndpoint: \"http://gw:7444\"}}\n",
        ca.display()
    ));
    assert_eq!(fields, ["certDir", "transport.enrollmentEndpoint"], "{err}");
    assert!(
        err.to_string()
            .contains("only valid with bootstrapTokenFile"),
        "{err}"
    );
    let (fields, err) = refused_fields(&format!(
        "{MINIMAL}bootstrapTokenFile: /t\ntransport: {{kind: mqtt, endpoint: \"mqtts://broker.plant\", caFile: {}, gatewayCAFile: {}}}\n",
        ca.display(),
        ca.display()
    ));
    assert_eq!(fields, ["transport.gatewayCAFile"], "{err}");
    let (fields, err) = refused_fields(&format!(
        "{MINIMAL}bootstrapTokenFile: /t\ntransport: {{kind: grpc, endpoint: \"https://gw:7443\", enrollmentEndpoint: \"https://gw:7444\"}}\n"
    ));
    assert_eq!(fields, ["transport.enrollmentEndpoint"], "{err}");
    assert!(err.to_string().contains("caFile"), "{err}");
    let (fields, err) = refused_fields(&format!("{MINIMAL}bootstrapTokenFile: /t\n"));
    assert_eq!(fields, ["bootstrapTokenFile"], "{err}");
    for transport in [
        "{kind: mqtt, endpoint: \"mqtt://broker.plant\"}",
        "{kind: grpc, endpoint: \"http://gw:7443\", enrollmentEndpoint: \"http://gw:7444\"}",
    ] {
        let (fields, err) = refused_fields(&format!(
            "{MINIMAL}bootstrapTokenFile: /t\ntransport: {transport}\n"
        ));
        assert_eq!(fields, ["transport.endpoint"], "{err}");
    }
}

/// The refusal of an unknown eviction signal names every signal kubelet knows.
#[test]
fn an_unknown_signal_lists_every_known_one() {
    let err = "memory.free".parse::<EvictionSignal>().unwrap_err();
    assert_eq!(err.name, "memory.free");
    let text = err.to_string();
    for signal in EvictionSignal::ALL {
        assert!(text.contains(signal.as_str()), "{signal} missing: {text}");
    }
}
