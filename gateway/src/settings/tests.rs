#![allow(clippy::unwrap_used)]

use super::*;
use crate::admission::Posture;
use crate::cli::{Args, Command, CsrApproval, TokenCommand, parse_duration};
use clap::Parser;
use edgebeat_hw::BoundedReadError;
use edgebeat_transports::observe::error_report;

fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
    Args::try_parse_from(std::iter::once("edgebeat-gateway").chain(flags.iter().copied()))
}

/// `flags` with `--grpc-listen`, which the gRPC flags need.
fn parse_grpc(flags: &[&str]) -> Result<Args, clap::Error> {
    let mut with_listener = vec!["--grpc-listen=127.0.0.1:0"];
    with_listener.extend_from_slice(flags);
    parse(&with_listener)
}

/// The MQTT ingress's options of `args`, without a site CA.
fn mqtt_ingress_options(
    args: &Args,
    enrollment: Option<&Enrollment>,
) -> Result<Option<MqttIngressOptions>, SettingsError> {
    MqttSettings::from_args(args)?
        .map(|mqtt| mqtt.ingress_options(enrollment))
        .transpose()
}

/// The gRPC server's options of `args`, as with `--grpc-listen`, without a site CA.
fn grpc_server_options(
    args: &Args,
    enrollment: Option<&Arc<Enrollment>>,
) -> Result<GrpcServerOptions, SettingsError> {
    let mut args = args.clone();
    args.grpc_listen
        .get_or_insert(SocketAddr::from(([127, 0, 0, 1], 0)));
    let grpc = GrpcSettings::from_args(&args)?.expect("gRPC settings with --grpc-listen");
    Ok(grpc.server_options(enrollment))
}

#[test]
fn mqtt_security_flags_are_checked_with_the_flag_named() {
    let err = |flags: &[&str]| mqtt_ingress_options(&parse(flags).unwrap(), None).unwrap_err();
    // Flags that need --mqtt-endpoint are refused by the command line itself, naming it.
    for flags in [
        &["--mqtt-node-ca", "ca.pem"][..],
        &["--mqtt-ca-file", "ca.pem"],
        &["--mqtt-require-signatures"],
    ] {
        let refused = parse(flags).unwrap_err();
        assert_eq!(
            refused.kind(),
            clap::error::ErrorKind::MissingRequiredArgument,
            "{flags:?}"
        );
        assert!(refused.to_string().contains("--mqtt-endpoint"), "{refused}");
    }
    let mqtts = err(&["--mqtt-endpoint", "mqtts://b"]);
    assert!(
        matches!(&mqtts, SettingsError::MqttsWithoutCaFile { url } if url == "mqtts://b"),
        "{mqtts:?}"
    );
    // The message names the flag and the fix.
    assert!(
        mqtts.to_string().contains("needs --mqtt-ca-file"),
        "{mqtts}"
    );
    assert!(matches!(
        err(&["--mqtt-endpoint", "mqtt://b", "--mqtt-ca-file", "ca.pem"]),
        SettingsError::MqttTlsFilesWithoutMqtts { url } if url == "mqtt://b"
    ));
    assert!(matches!(
        err(&["--mqtt-endpoint", "mqtt://b", "--mqtt-require-signatures"]),
        SettingsError::SignaturesWithoutNodeCa
    ));
    assert!(matches!(
        err(&["--mqtt-endpoint", "mqtt://b", "--mqtt-node-ca", "/dev/zero"]),
        SettingsError::ReadFile { flag: "--mqtt-node-ca", path, .. } if path == Path::new("/dev/zero")
    ));
    let plain = mqtt_ingress_options(&parse(&["--mqtt-endpoint", "mqtt://b"]).unwrap(), None)
        .unwrap()
        .unwrap();
    assert!(plain.tls.is_none() && plain.signatures.is_none());
    assert_eq!((plain.host.as_str(), plain.port), ("b", 1883));
    let tcp = err(&["--mqtt-endpoint", "tcp://b"]);
    assert!(matches!(tcp, SettingsError::MqttEndpoint { .. }), "{tcp:?}");
    assert!(tcp.to_string().starts_with("--mqtt-endpoint: "), "{tcp}");
    // A broker cluster: repeated or comma-separated, the first dialled first.
    for flags in [
        &["--mqtt-endpoint", "mqtt://a,mqtt://b:1884"][..],
        &[
            "--mqtt-endpoint",
            "mqtt://a",
            "--mqtt-endpoint",
            "mqtt://b:1884",
        ][..],
    ] {
        let cluster = mqtt_ingress_options(&parse(flags).unwrap(), None)
            .unwrap()
            .unwrap();
        assert_eq!((cluster.host.as_str(), cluster.port), ("a", 1883));
        assert_eq!(cluster.failover, [("b".to_owned(), 1884)]);
    }
    let mixed = err(&["--mqtt-endpoint", "mqtt://a,mqtts://b"]);
    assert!(
        matches!(&mixed, SettingsError::MqttEndpoint { problems } if problems.iter().any(|p| p.contains("differ in TLS"))),
        "{mixed:?}"
    );
}

fn posture_of(flags: &[&str]) -> Result<Posture, SettingsError> {
    let args = parse(flags).unwrap();
    let grpc = GrpcSettings::from_args(&args)?;
    let mqtt = MqttSettings::from_args(&args)?;
    posture(args.allow_unidentified_agents, grpc.as_ref(), mqtt.as_ref())
}

/// One posture for the whole gateway: no gRPC listener unless asked for, and no ingress
/// that lets unidentified agents in without the explicit opt-in (the plaintext gRPC
/// listener beside signed MQTT was the way around the signatures).
#[test]
fn every_ingress_requires_identities_unless_explicitly_allowed() {
    let dir = std::env::temp_dir().join(format!("edgebeat-gw-posture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("site-ca.pem");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    std::fs::write(&ca, params.self_signed(&key).unwrap().pem()).unwrap();
    let ca = ca.to_str().unwrap();
    // The gateway's answer key, from the site CA.
    let issuer = rcgen::Issuer::new(params, key);
    let name = edgebeat_transports::signing::ANSWER_SIGNER_NAME;
    let mut answers = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
    answers.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let answers_key = rcgen::KeyPair::generate().unwrap();
    let (answers_cert, answers_key_file) = (dir.join("answers.crt"), dir.join("answers.key"));
    std::fs::write(
        &answers_cert,
        answers.signed_by(&answers_key, &issuer).unwrap().pem(),
    )
    .unwrap();
    std::fs::write(&answers_key_file, answers_key.serialize_pem()).unwrap();
    let (answers_cert, answers_key_file) = (
        answers_cert.to_str().unwrap(),
        answers_key_file.to_str().unwrap(),
    );

    assert!(
        parse(&[]).unwrap().grpc_listen.is_none(),
        "no default listener"
    );
    assert!(matches!(posture_of(&[]), Err(SettingsError::NoIngress)));
    let signed_mqtt = [
        "--mqtt-endpoint",
        "mqtt://b",
        "--mqtt-node-ca",
        ca,
        "--mqtt-answer-cert-file",
        answers_cert,
        "--mqtt-answer-key-file",
        answers_key_file,
    ];
    // Signed messages need signed answers.
    let err = posture_of(&signed_mqtt[..4]).unwrap_err();
    assert!(
        matches!(err, SettingsError::NodeCaWithoutAnswerKey),
        "{err:?}"
    );
    assert!(err.to_string().contains("--mqtt-answer-cert-file"), "{err}");
    assert_eq!(posture_of(&signed_mqtt).unwrap(), Posture::Identified);
    // Plaintext gRPC beside signed MQTT: refused, naming the fix and the opt-in.
    let mut beside = signed_mqtt.to_vec();
    beside.extend(["--grpc-listen", "127.0.0.1:0"]);
    let err = posture_of(&beside).unwrap_err();
    assert!(
        matches!(
            err,
            SettingsError::UnidentifiedAgents {
                grpc: true,
                mqtt: false
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("--grpc-client-ca") && text.contains("--allow-unidentified-agents"),
        "{text}"
    );
    beside.push("--allow-unidentified-agents");
    assert_eq!(posture_of(&beside).unwrap(), Posture::AllowUnidentified);
    for (unidentified, grpc, mqtt) in [
        (&["--mqtt-endpoint", "mqtt://b"][..], false, true),
        (
            &[
                "--mqtt-endpoint",
                "mqtt://b",
                "--mqtt-node-ca",
                ca,
                "--mqtt-answer-cert-file",
                answers_cert,
                "--mqtt-answer-key-file",
                answers_key_file,
                "--mqtt-require-signatures=false",
            ],
            false,
            true,
        ),
        (&["--grpc-listen", "127.0.0.1:0"], true, false),
    ] {
        let err = posture_of(unidentified).unwrap_err();
        assert!(
            matches!(err, SettingsError::UnidentifiedAgents { grpc: g, mqtt: m } if (g, m) == (grpc, mqtt)),
            "{unidentified:?}: {err:?}"
        );
    }
    // The opt-in with nothing unidentified changes nothing.
    let mut allowed = signed_mqtt.to_vec();
    allowed.push("--allow-unidentified-agents");
    assert_eq!(posture_of(&allowed).unwrap(), Posture::Identified);
    // gRPC flags without a listener are an error, not ignored.
    for flags in [
        &["--grpc-tls-cert", "c", "--grpc-tls-key", "k"][..],
        &["--require-node-identity"],
    ] {
        let refused = parse(flags).unwrap_err();
        assert_eq!(
            refused.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        assert!(refused.to_string().contains("--grpc-listen"), "{refused}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tls_flags_go_together() {
    for (flags, missing) in [
        (&["--grpc-tls-cert", "c.pem"][..], "--grpc-tls-key"),
        (&["--grpc-tls-key", "k.pem"], "--grpc-tls-cert"),
        (&["--grpc-client-ca", "ca.pem"], "--grpc-tls-cert"),
    ] {
        let refused = parse_grpc(flags).unwrap_err();
        assert_eq!(
            refused.kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        assert!(refused.to_string().contains(missing), "{refused}");
    }
    let args = parse_grpc(&[
        "--grpc-tls-cert",
        "c.pem",
        "--grpc-tls-key",
        "k.pem",
        "--grpc-client-ca",
        "ca.pem",
    ])
    .unwrap();
    assert_eq!(args.require_node_identity, None);
}

#[test]
fn node_identity_is_required_by_default_only_with_a_client_ca() {
    let plain = grpc_server_options(&parse_grpc(&[]).unwrap(), None).unwrap();
    assert!(plain.tls.is_none() && !plain.require_node_identity);
    assert_eq!(
        parse_grpc(&["--require-node-identity"])
            .unwrap()
            .require_node_identity,
        Some(true)
    );
    assert_eq!(
        parse_grpc(&["--require-node-identity=false"])
            .unwrap()
            .require_node_identity,
        Some(false)
    );
    let err =
        grpc_server_options(&parse_grpc(&["--require-node-identity"]).unwrap(), None).unwrap_err();
    assert!(
        matches!(err, SettingsError::NodeIdentityWithoutClientCa),
        "{err:?}"
    );
    assert!(err.to_string().contains("--grpc-client-ca"), "{err}");
    let err = grpc_server_options(
        &parse_grpc(&[
            "--grpc-tls-cert",
            "/nonexistent/c.pem",
            "--grpc-tls-key",
            "/nonexistent/k.pem",
        ])
        .unwrap(),
        None,
    )
    .unwrap_err();
    assert!(
        matches!(&err, SettingsError::ReadFile { flag: "--grpc-tls-cert", path, .. } if path == Path::new("/nonexistent/c.pem")),
        "{err:?}"
    );
}

/// `/dev/zero` (or any endless or huge file) is refused at once, naming the flag.
#[test]
fn endless_files_are_refused_naming_the_flag() {
    let err = read_password_file(std::path::Path::new("/dev/zero")).unwrap_err();
    assert!(
        matches!(
            err,
            SettingsError::PasswordFile(BoundedReadError::TooLarge { limit: 4096, .. })
        ),
        "{err:?}"
    );
    // The whole report names the flag, the file and the fix.
    let report = error_report(&err);
    assert!(
        report.starts_with("--mqtt-password-file: /dev/zero: ")
            && report.contains("larger than 4096 bytes"),
        "{report}"
    );
    let err = grpc_server_options(
        &parse_grpc(&[
            "--grpc-tls-cert",
            "/dev/zero",
            "--grpc-tls-key",
            "/dev/zero",
        ])
        .unwrap(),
        None,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            SettingsError::ReadFile {
                flag: "--grpc-tls-cert",
                source: BoundedReadError::TooLarge {
                    limit: 1_048_576,
                    ..
                },
                ..
            }
        ),
        "{err:?}"
    );
    let report = error_report(&err);
    assert!(
        report.starts_with("--grpc-tls-cert /dev/zero: ")
            && report.contains("larger than 1048576 bytes"),
        "{report}"
    );
}

/// `token create` takes the cluster flags before or after it, and durations with a unit.
#[test]
fn token_create_parses_with_the_cluster_flags_anywhere() {
    for flags in [
        &[
            "--server",
            "http://127.0.0.1:1",
            "token",
            "create",
            "--nodes",
            "plant-3-*,edge-01",
            "--ttl",
            "2h",
            "--uses",
            "5",
        ][..],
        &[
            "token",
            "create",
            "--server",
            "http://127.0.0.1:1",
            "--nodes=plant-3-*,edge-01",
            "--ttl=2h",
            "--uses=5",
        ][..],
    ] {
        let args = parse(flags).unwrap();
        let Some(Command::Token(TokenCommand::Create { nodes, ttl, uses })) = args.command else {
            panic!("{flags:?}: no token create");
        };
        assert_eq!(nodes, ["plant-3-*", "edge-01"]);
        assert_eq!(ttl, Duration::from_secs(7200));
        assert_eq!(uses, 5);
        assert_eq!(args.cluster.server.as_deref(), Some("http://127.0.0.1:1"));
    }
    let refused = parse(&["token", "create"]).unwrap_err();
    assert_eq!(
        refused.kind(),
        clap::error::ErrorKind::MissingRequiredArgument,
        "--nodes is required"
    );
    assert!(refused.to_string().contains("--nodes"), "{refused}");
    // Go's grammar, as the agent's configuration file.
    assert!(parse_duration("30m").is_ok_and(|d| d == Duration::from_secs(1800)));
    assert!(parse_duration("1h30m").is_ok_and(|d| d == Duration::from_secs(5400)));
    for bad in ["", "h", "10", "10y", "7d", "0s", "0", "-1h"] {
        assert!(
            matches!(parse_duration(bad), Err(crate::cli::BadDuration(text)) if text == bad),
            "{bad:?}"
        );
    }
    let enrolling = parse(&[
        "--enrollment",
        "--grpc-enrollment-listen",
        "0.0.0.0:7444",
        "--csr-approval",
        "manual",
    ])
    .unwrap();
    assert!(enrolling.enrollment && enrolling.csr_approval == CsrApproval::Manual);
    let refused = parse(&["--grpc-enrollment-listen", "0.0.0.0:7444"]).unwrap_err();
    assert_eq!(
        refused.kind(),
        clap::error::ErrorKind::MissingRequiredArgument,
        "the enrollment listener needs --enrollment"
    );
    assert!(refused.to_string().contains("--enrollment"), "{refused}");
}

/// The enrollment listener's TLS never turns into plain HTTP/2 behind the operator's back:
/// a certificate that cannot be read is an error naming its flag (it used to be `None`,
/// a plain listener), no certificate is plain on purpose, and a readable pair is TLS: the
/// gRPC listener's own, read once, without its client CA.
#[test]
fn enrollment_tls_that_cannot_be_read_is_an_error_not_plain_http2() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let flags = |cert: &std::path::Path, key: &std::path::Path| {
        parse_grpc(&[
            "--grpc-tls-cert",
            cert.to_str().unwrap(),
            "--grpc-tls-key",
            key.to_str().unwrap(),
        ])
        .unwrap()
    };
    let err = GrpcSettings::from_args(&flags(&cert, &key)).unwrap_err();
    assert!(
        matches!(&err, SettingsError::ReadFile { flag: "--grpc-tls-cert", path, .. } if *path == cert),
        "{err:?}"
    );
    let pair = rcgen::generate_simple_self_signed(vec!["edgebeat-gateway".to_owned()]).unwrap();
    std::fs::write(&cert, pair.cert.pem()).unwrap();
    let err = GrpcSettings::from_args(&flags(&cert, &key)).unwrap_err();
    assert!(
        matches!(&err, SettingsError::ReadFile { flag: "--grpc-tls-key", path, .. } if *path == key),
        "{err:?}"
    );
    std::fs::write(&key, pair.signing_key.serialize_pem()).unwrap();
    let grpc = GrpcSettings::from_args(&flags(&cert, &key)).unwrap();
    let tls = enrollment_tls(grpc.as_ref()).expect("TLS, as the gRPC listener's");
    assert_eq!(
        (tls.cert_pem, tls.key_pem, tls.client_ca_pem),
        (
            pair.cert.pem().into_bytes(),
            pair.signing_key.serialize_pem().into_bytes(),
            None
        )
    );
    let plain = GrpcSettings::from_args(&parse_grpc(&[]).unwrap()).unwrap();
    assert!(
        plain.is_some(),
        "--grpc-listen alone is a plain gRPC listener"
    );
    assert!(enrollment_tls(plain.as_ref()).is_none());
}

/// `--resource-metrics-address` takes an IP (the port then is the one bound: 0 until
/// bound) or a Service's `IP:PORT`; anything else is refused naming the flag and both forms.
#[test]
fn the_resource_metrics_address_is_an_ip_or_a_services_ip_and_port() {
    let endpoint = |address: &str| {
        let flags = [
            "--resource-metrics-listen=0.0.0.0:10250".to_owned(),
            format!("--resource-metrics-address={address}"),
            "--resource-metrics-tls-cert=c.pem".to_owned(),
            "--resource-metrics-tls-key=k.pem".to_owned(),
        ];
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        parse(&flags).map(|args| gateway_options(&args).resource_metrics)
    };
    let ip = |text: &str| text.parse::<std::net::IpAddr>().unwrap();
    for (address, expected) in [
        ("10.0.0.7", (ip("10.0.0.7"), 0)),
        ("10.96.0.20:443", (ip("10.96.0.20"), 443)),
        ("fd00::7", (ip("fd00::7"), 0)),
        ("[fd00::20]:10250", (ip("fd00::20"), 10250)),
    ] {
        let got = endpoint(address).unwrap().unwrap();
        assert_eq!((got.address, got.port), expected, "{address}");
    }
    for bad in ["gateway.edgebeat.svc", "10.0.0.7:http", "10.0.0.300"] {
        let refused = endpoint(bad).unwrap_err();
        assert_eq!(refused.kind(), clap::error::ErrorKind::ValueValidation);
        let text = refused.to_string();
        assert!(
            text.contains("--resource-metrics-address")
                && text.contains("neither an IP nor IP:PORT"),
            "{text}"
        );
    }
}

#[test]
fn signer_flags_are_checked_with_the_flag_named() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.crt");
    let pair = rcgen::generate_simple_self_signed(vec!["cluster-ca".to_owned()]).unwrap();
    std::fs::write(&ca, pair.cert.pem()).unwrap();
    let ca = ca.to_str().unwrap();
    let outcome = |flags: &[&str]| {
        let mut all = vec!["--enrollment"];
        all.extend_from_slice(flags);
        signer_ca(&parse(&all).unwrap())
    };
    let kubelet = "--signer-name=kubernetes.io/kube-apiserver-client-kubelet";
    // The gateway's own signer: its CA is the site CA.
    assert_eq!(outcome(&[]).unwrap(), None);
    let own_with_ca = outcome(&["--signer-ca", ca]).unwrap_err();
    assert!(
        matches!(own_with_ca, SettingsError::SignerCaWithOwnSigner),
        "{own_with_ca:?}"
    );
    // Another signer needs its CA, read and checked now.
    let missing = outcome(&[kubelet]).unwrap_err();
    assert!(
        matches!(missing, SettingsError::SignerCaMissing),
        "{missing:?}"
    );
    assert!(
        missing.to_string().contains("needs --signer-ca"),
        "{missing}"
    );
    assert_eq!(
        outcome(&[kubelet, "--signer-ca", ca]).unwrap(),
        Some(pair.cert.pem().into_bytes())
    );
    let absent = outcome(&[kubelet, "--signer-ca", "/nonexistent/ca.crt"]).unwrap_err();
    assert!(
        matches!(&absent, SettingsError::ReadFile { flag: "--signer-ca", path, .. } if path == Path::new("/nonexistent/ca.crt")),
        "{absent:?}"
    );
    // kube-controller-manager would approve what manual approval holds back.
    let manual = outcome(&[kubelet, "--signer-ca", ca, "--csr-approval", "manual"]).unwrap_err();
    assert!(
        matches!(manual, SettingsError::ManualApprovalWithKubeletSigner),
        "{manual:?}"
    );
    let text = manual.to_string();
    assert!(
        text.starts_with("--csr-approval=manual with --signer-name")
            && text.contains("use --csr-approval=auto"),
        "{text}"
    );
    // No other signer: its approval and chain are not proved.
    let other = outcome(&["--signer-name=cert-manager.io/edge", "--signer-ca", ca]).unwrap_err();
    assert!(
        matches!(&other, SettingsError::UnsupportedSigner { name } if name == "cert-manager.io/edge"),
        "{other:?}"
    );
    // Without --enrollment the signer flags are refused by the command line.
    let refused = parse(&[kubelet]).unwrap_err();
    assert_eq!(
        refused.kind(),
        clap::error::ErrorKind::MissingRequiredArgument
    );
}
