//! Node certificates without hands, end to end: boards with nothing but a bootstrap token
//! enroll through the gateway (each request a CertificateSigningRequest in the stand-in
//! apiserver), heartbeat identified, and rotate their certificates live; what is not
//! entitled to a certificate is refused, counted, and writes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use edgebeat_gateway::apiserver::kube_client;
use edgebeat_gateway::enrollment::{Approval, EnrollmentOptions};
use edgebeat_proto::Header;
use edgebeat_tests::harness::{Cluster, Transport, fixture_copy, gateway_options};
use edgebeat_tests::requests::longest_renewal_gap;
use edgebeat_transports::enroll::{self, AnswerTrust, Answered, NodeKeyPair};
use edgebeat_transports::ingress::RejectReason;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use prost::Message as _;

const DEADLINE: Duration = Duration::from_secs(30);
const LEASE_NAMESPACE: &str = "kube-node-lease";

/// An enrolling cluster over `transport`, a token for `nodes` with `uses`, and a host
/// tree for agents.
async fn enrolling(
    transport: Transport,
    options: EnrollmentOptions,
    nodes: &[&str],
    uses: u32,
) -> (
    Cluster,
    edgebeat_transports::enroll::BootstrapToken,
    tempfile::TempDir,
) {
    let cluster = Cluster::start_enrolling(transport, options, gateway_options())
        .await
        .unwrap();
    let token = cluster
        .bootstrap_token(nodes, uses, Duration::from_secs(3600))
        .await
        .unwrap();
    (cluster, token, fixture_copy("rpi4-cgroup1").unwrap())
}

/// Waits until `node`'s Lease exists.
async fn leased(cluster: &Cluster, node: &str) {
    cluster
        .standin
        .wait_until(DEADLINE, &format!("{node} enrolled and leased"), |v| {
            v.lease(LEASE_NAMESPACE, node).is_some()
        })
        .await
        .unwrap();
}

/// The CSRs the stand-in holds.
async fn csrs(cluster: &Cluster) -> Vec<CertificateSigningRequest> {
    let client = kube_client(
        kube::Config::new(cluster.standin.url().parse().unwrap()),
        1000,
        &Default::default(),
    )
    .unwrap();
    Api::<CertificateSigningRequest>::all(client)
        .list(&Default::default())
        .await
        .unwrap()
        .items
}

fn condition(csr: &CertificateSigningRequest, type_: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

fn issued(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
}

/// The certificate the gateway recorded on `node`'s Node, if any.
fn recorded_certificate(cluster: &Cluster, node: &str) -> Option<String> {
    cluster
        .standin
        .node(node)?
        .metadata
        .annotations?
        .get("edgebeat.io/node-certificate-sha256")
        .cloned()
}

/// A board with only a token (and, over MQTT, the broker's CA) enrolls, its CSR approved and
/// signed by the gateway, then heartbeats with the identity it got: the Lease renews and
/// the Node records its certificate. A second board with the same one-use token is refused.
async fn enrolls_and_heartbeats_identified(transport: Transport) {
    let (cluster, token, host) =
        enrolling(transport, EnrollmentOptions::default(), &["plant-3-*"], 1).await;
    let dir = tempfile::tempdir().unwrap();
    let config = cluster
        .enrolled_agent_config("plant-3-01", host.path(), &token, dir.path())
        .unwrap();
    let agent = cluster.start_agent(config).unwrap();
    leased(&cluster, "plant-3-01").await;
    cluster
        .wait_for_renewals("plant-3-01", 3, DEADLINE)
        .await
        .unwrap();
    assert!(
        recorded_certificate(&cluster, "plant-3-01").is_some(),
        "the node speaks with its enrolled identity"
    );
    let all = csrs(&cluster).await;
    assert_eq!(all.len(), 1, "one CSR per enrollment");
    let csr = &all[0];
    assert!(condition(csr, "Approved") && issued(csr), "{csr:?}");
    assert_eq!(
        csr.spec.signer_name,
        edgebeat_gateway::enrollment::DEFAULT_SIGNER_NAME
    );
    let labels = csr.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get(edgebeat_gateway::enrollment::TOKEN_LABEL),
        Some(&token.id)
    );
    let pair = dir
        .path()
        .join("pki")
        .join(edgebeat_agent::certificates::CURRENT_FILE);
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&pair).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let enrollment = cluster.enrollment();
    assert_eq!(enrollment.counters.get("token", "issued"), 1);

    // The token enrolled its one node: another board with it gets nothing, also once the
    // garbage collector has deleted the issued CSR (kube-controller-manager's csrcleaner
    // does after an hour): the token's Secret counts its uses.
    let operator = edgebeat_tests::harness::operator_client(&cluster.standin).unwrap();
    Api::<CertificateSigningRequest>::all(operator)
        .delete(csr.metadata.name.as_deref().unwrap(), &Default::default())
        .await
        .unwrap();
    let dir2 = tempfile::tempdir().unwrap();
    let config = cluster
        .enrolled_agent_config("plant-3-02", host.path(), &token, dir2.path())
        .unwrap();
    let refused = cluster.start_agent(config).unwrap();
    edgebeat_tests::harness::wait_for("the used-up token refused", DEADLINE, || {
        enrollment.counters.get("token", "token_used_up") >= 1
    })
    .await;
    assert!(csrs(&cluster).await.is_empty(), "nothing written for it");
    assert!(cluster.standin.node("plant-3-02").is_none());
    refused.stop().await.unwrap();
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_board_with_only_a_token_enrolls_over_grpc_and_heartbeats_identified() {
    enrolls_and_heartbeats_identified(Transport::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_board_with_only_a_token_enrolls_over_mqtt_and_heartbeats_identified() {
    enrolls_and_heartbeats_identified(Transport::Mqtt).await;
}

/// Short certificates (10 s): the agent rotates each at 70–90 % of its life with a new key,
/// proved by the current one, and swaps it live three times in a row; the Lease never goes
/// a lease duration (1 s here) without a renewal. The first certificate is refused once
/// it has expired.
async fn rotates_live(transport: Transport) {
    const LIFETIME: Duration = Duration::from_secs(10);
    let enrollment = EnrollmentOptions {
        lifetime: LIFETIME,
        ..EnrollmentOptions::default()
    };
    let (cluster, token, host) = enrolling(transport, enrollment, &["edge-01"], 1).await;
    let dir = tempfile::tempdir().unwrap();
    let config = cluster
        .enrolled_agent_config("edge-01", host.path(), &token, dir.path())
        .unwrap();
    let agent = cluster.start_agent(config).unwrap();
    leased(&cluster, "edge-01").await;
    let first = recorded_certificate(&cluster, "edge-01");
    let first_pair = std::fs::read_to_string(
        dir.path()
            .join("pki")
            .join(edgebeat_agent::certificates::CURRENT_FILE),
    )
    .unwrap();
    let enrollment = cluster.enrollment();
    edgebeat_tests::harness::wait_for("three rotations", Duration::from_secs(60), || {
        enrollment.counters.get("certificate", "issued") >= 3
    })
    .await;
    // Each new certificate carried the node's messages, so the gateway recorded it.
    cluster
        .wait_for_renewals("edge-01", 3, DEADLINE)
        .await
        .unwrap();
    assert_ne!(recorded_certificate(&cluster, "edge-01"), first);
    let gap = longest_renewal_gap(&cluster.standin.requests(), "edge-01").unwrap();
    assert!(
        gap < Duration::from_secs(1),
        "the Lease went {gap:?} without a renewal across the rotations"
    );
    assert_eq!(
        csrs(&cluster).await.len(),
        4,
        "one enrollment and three rotations, each a CSR"
    );
    assert!(
        !dir.path()
            .join("pki")
            .join(edgebeat_agent::certificates::PREVIOUS_FILE)
            .exists()
            || enrollment.counters.get("certificate", "issued") > 3,
        "the previous pair goes once the new one is accepted"
    );
    agent.stop().await.unwrap();

    // The first certificate expired (10 s after it was issued): it opens nothing.
    if transport == Transport::Grpc {
        let before = cluster.rejections(RejectReason::TlsHandshake);
        let identity =
            edgebeat_agent::certificates::NodeIdentity::from_pem(&first_pair, &enrollment.ca_pem())
                .unwrap();
        assert!(identity.not_after < jiff::Timestamp::now().as_second());
        let mut config = cluster.agent_config("edge-01", host.path());
        if let Some(edgebeat_agent::config::TransportConfig::Grpc(g)) = config.transport.as_mut() {
            g.tls_server_name = Some(edgebeat_transports::signing::ANSWER_SIGNER_NAME.into());
            g.tls = Some(edgebeat_agent::config::ClientTls {
                ca_pem: enrollment.ca_pem().into_bytes(),
                client_identity: Some(edgebeat_agent::config::TlsIdentity {
                    cert_pem: identity.cert_pem.clone().into_bytes(),
                    key_pem: first_pair.clone().into_bytes(),
                }),
            });
        }
        let stale = cluster.start_agent(config).unwrap();
        edgebeat_tests::harness::wait_for("the expired certificate refused", DEADLINE, || {
            cluster.rejections(RejectReason::TlsHandshake) > before
        })
        .await;
        stale.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_live_over_grpc_without_a_lease_gap() {
    rotates_live(Transport::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_live_over_mqtt_without_a_lease_gap() {
    rotates_live(Transport::Mqtt).await;
}

/// With `--csr-approval=manual` a first enrollment waits, pending, asking again with
/// backoff (not a flood), until someone approves its CSR through `/approval` (what
/// `kubectl certificate approve` sends); then the board enrolls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_approval_waits_without_flooding_until_approved() {
    let enrollment = EnrollmentOptions {
        approval: Approval::Manual,
        ..EnrollmentOptions::default()
    };
    let (cluster, token, host) = enrolling(Transport::Grpc, enrollment, &["edge-*"], 10).await;
    let dir = tempfile::tempdir().unwrap();
    let config = cluster
        .enrolled_agent_config("edge-07", host.path(), &token, dir.path())
        .unwrap();
    let agent = cluster.start_agent(config).unwrap();
    let enrollment = cluster.enrollment();
    edgebeat_tests::harness::wait_for("two pending answers", DEADLINE, || {
        enrollment.counters.get("token", "pending") >= 2
    })
    .await;
    let started = tokio::time::Instant::now();
    let pending = enrollment.counters.get("token", "pending");
    let all = csrs(&cluster).await;
    assert_eq!(
        all.len(),
        1,
        "retries reuse their CSR (same key, same name)"
    );
    assert!(!condition(&all[0], "Approved"));
    assert!(cluster.standin.node("edge-07").is_none());
    assert_eq!(enrollment.counters.pending(), 1);

    // Approve it as kubectl certificate approve does: PUT .../approval with the condition.
    let name = all[0].metadata.name.clone().unwrap();
    edgebeat_tests::harness::approve_csr(&cluster.standin, &name)
        .await
        .unwrap();
    cluster
        .standin
        .wait_until(
            Duration::from_secs(90),
            "enrolled after the approval",
            |v| v.lease(LEASE_NAMESPACE, "edge-07").is_some(),
        )
        .await
        .unwrap();
    // Backoff from 2 s doubling: a handful of requests, not one per renew interval.
    let asked = enrollment.counters.get("token", "pending") - pending;
    let waited = started.elapsed().as_secs();
    assert!(
        asked <= 2 + waited / 4,
        "{asked} more pending requests in {waited} s"
    );
    assert_eq!(enrollment.counters.get("token", "issued"), 1);
    assert_eq!(enrollment.counters.pending(), 0);
    agent.stop().await.unwrap();
}

/// A header for a hand-made request of `node`, now.
fn header(node: &str, seq: u64) -> Header {
    Header {
        node_name: node.into(),
        boot_id: "4c1e6f0a-6d3b-4b7e-9a51-2f7d8c9e0b13".into(),
        seq,
        wall_time_ms: jiff::Timestamp::now().as_millisecond(),
        ..Header::default()
    }
}

/// Sends `payload` to the cluster's gRPC enrollment listener.
async fn ask(cluster: &Cluster, payload: Vec<u8>) -> Option<Vec<u8>> {
    let url = cluster.enrolling.as_ref().unwrap().enrollment_urls[0].clone();
    edgebeat_transports::grpc::enroll::request_certificate(&url, None, payload, DEADLINE)
        .await
        .ok()
}

/// What has no right to a certificate gets none, is counted by its reason, and writes no
/// CSR: a token for other names, an expired token, a replayed request, a rotation proved
/// by another node's certificate, a CSR for other names, SANs or usages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_are_counted_and_write_nothing() {
    let cluster = Cluster::start_enrolling(
        Transport::Grpc,
        EnrollmentOptions::default(),
        gateway_options(),
    )
    .await
    .unwrap();
    let enrollment = cluster.enrollment();
    let token = cluster
        .bootstrap_token(&["plant-3-*"], 10, Duration::from_secs(3600))
        .await
        .unwrap();
    let key = NodeKeyPair::generate().unwrap();
    let refused_with = |answer: Option<Vec<u8>>, h: &Header| {
        let answer = answer.expect("an answer");
        enroll::read_answer(
            &answer,
            AnswerTrust::Ca(enrollment.ca_pem().as_bytes()),
            &h.node_name,
            h.named_boot_tag(),
            h.seq,
            rustls::pki_types::UnixTime::now(),
        )
        .unwrap()
    };

    // A token for plant-3-* asking for plant-4-01.
    let h = header("plant-4-01", 1);
    let csr = key.certificate_request("plant-4-01").unwrap();
    let answer = ask(&cluster, enroll::token_request(&token, h.clone(), csr)).await;
    assert!(matches!(refused_with(answer, &h), Answered::Rejected(_)));
    assert_eq!(enrollment.counters.get("token", "token_node"), 1);

    // A CSR naming another node than the request.
    let h = header("plant-3-01", 2);
    let csr = key.certificate_request("plant-3-99").unwrap();
    let answer = ask(&cluster, enroll::token_request(&token, h.clone(), csr)).await;
    assert!(matches!(refused_with(answer, &h), Answered::Rejected(_)));
    // A CSR with a subject alternative name and server auth.
    let h = header("plant-3-01", 3);
    let mut params = rcgen::CertificateParams::new(vec!["gateway.example".to_owned()]).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:node:plant-3-01");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let rogue = rcgen::KeyPair::generate().unwrap();
    let csr = params.serialize_request(&rogue).unwrap().der().to_vec();
    let answer = ask(&cluster, enroll::token_request(&token, h.clone(), csr)).await;
    assert!(matches!(refused_with(answer, &h), Answered::Rejected(_)));
    assert_eq!(enrollment.counters.get("token", "csr_subject"), 1);
    assert_eq!(enrollment.counters.get("token", "csr_names"), 1);

    // An expired token.
    let expired = cluster
        .bootstrap_token(&["plant-3-*"], 10, Duration::from_secs(3600))
        .await
        .unwrap();
    expire_token(&cluster, &expired.id).await;
    let h = header("plant-3-01", 4);
    let csr = key.certificate_request("plant-3-01").unwrap();
    let answer = ask(&cluster, enroll::token_request(&expired, h.clone(), csr)).await;
    assert!(matches!(refused_with(answer, &h), Answered::Rejected(_)));
    assert_eq!(enrollment.counters.get("token", "token_expired"), 1);

    // A genuine request, then the same bytes again: the replay gets no answer.
    let h = header("plant-3-01", 5);
    let csr = key.certificate_request("plant-3-01").unwrap();
    let payload = enroll::token_request(&token, h.clone(), csr);
    let Answered::Issued { chain, .. } = refused_with(ask(&cluster, payload.clone()).await, &h)
    else {
        panic!("the genuine request is granted");
    };
    assert!(
        ask(&cluster, payload).await.is_none(),
        "a replay is not answered"
    );
    assert_eq!(enrollment.counters.get("token", "replayed"), 1);
    assert_eq!(
        csrs(&cluster).await.len(),
        1,
        "only the genuine request wrote"
    );

    // plant-3-01's certificate proving a rotation for plant-3-02.
    let pair = format!("{}{}", enroll::pem("CERTIFICATE", &chain[0]), key.to_pem());
    let signer = edgebeat_transports::signing::MessageSigner::from_pem(
        pair.as_bytes(),
        key.to_pem().as_bytes(),
    )
    .unwrap();
    let h = header("plant-3-02", 6);
    let other = NodeKeyPair::generate().unwrap();
    let csr = other.certificate_request("plant-3-02").unwrap();
    let payload = enroll::certificate_request(&signer, h.clone(), csr).unwrap();
    let answer = ask(&cluster, payload).await;
    assert!(matches!(refused_with(answer, &h), Answered::Rejected(_)));
    assert_eq!(enrollment.counters.get("certificate", "certificate"), 1);
    assert_eq!(csrs(&cluster).await.len(), 1, "refusals write nothing");
}

/// An unproved request in a victim's name, with its boot ID (readable from its Node) and
/// the highest sequence, moves nothing: the victim's genuine request that follows, of the
/// same boot and a low sequence, is issued (it was refused as a replay when the window
/// recorded requests before their proof).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unproved_request_cannot_poison_a_nodes_replay_window() {
    let cluster = Cluster::start_enrolling(
        Transport::Grpc,
        EnrollmentOptions::default(),
        gateway_options(),
    )
    .await
    .unwrap();
    let enrollment = cluster.enrollment();
    let token = cluster
        .bootstrap_token(&["plant-3-*"], 10, Duration::from_secs(3600))
        .await
        .unwrap();
    let key = NodeKeyPair::generate().unwrap();
    let csr = key.certificate_request("plant-3-01").unwrap();
    // The attacker knows the token's public id, not its secret.
    for proof in [vec![0u8; 32], Vec::new()] {
        let forged = edgebeat_proto::CertificateRequest {
            header: Some(header("plant-3-01", u64::MAX)),
            csr: csr.clone(),
            token_id: if proof.is_empty() {
                String::new()
            } else {
                token.id.clone()
            },
            token_proof: proof,
            ..Default::default()
        };
        ask(&cluster, forged.encode_to_vec()).await;
    }
    assert_eq!(enrollment.counters.get("token", "bad_proof"), 1);
    assert_eq!(enrollment.counters.get("token", "unproved"), 1);
    let h = header("plant-3-01", 1);
    let answer = ask(&cluster, enroll::token_request(&token, h.clone(), csr))
        .await
        .expect("the genuine request is answered, not taken for a replay");
    let answered = enroll::read_answer(
        &answer,
        AnswerTrust::Ca(enrollment.ca_pem().as_bytes()),
        "plant-3-01",
        h.named_boot_tag(),
        h.seq,
        rustls::pki_types::UnixTime::now(),
    )
    .unwrap();
    assert!(
        matches!(answered, Answered::Issued { .. }),
        "issued: {answered:?}"
    );
    assert_eq!(enrollment.counters.get("token", "replayed"), 0);
}

/// Sets bootstrap token `id`'s expiration to the past, as time would.
async fn expire_token(cluster: &Cluster, id: &str) {
    let client = kube_client(
        kube::Config::new(cluster.standin.url().parse().unwrap()),
        1000,
        &Default::default(),
    )
    .unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client, &EnrollmentOptions::default().namespace);
    let name = edgebeat_gateway::enrollment::tokens::token_secret_name(id);
    let mut secret = secrets.get(&name).await.unwrap();
    secret.data.as_mut().unwrap().insert(
        "expiration".into(),
        k8s_openapi::ByteString(b"2020-01-01T00:00:00Z".to_vec()),
    );
    secrets
        .replace(&name, &kube::api::PostParams::default(), &secret)
        .await
        .unwrap();
}

/// Over MQTT, a recorded request published again (by anyone on the broker) gets no answer
/// and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_mqtt_enrollment_gets_no_answer() {
    let (cluster, token, host) = enrolling(
        Transport::Mqtt,
        EnrollmentOptions::default(),
        &["edge-01"],
        1,
    )
    .await;
    let enrollment = cluster.enrollment();
    let dir = tempfile::tempdir().unwrap();
    let config = cluster
        .enrolled_agent_config("edge-01", host.path(), &token, dir.path())
        .unwrap();
    let Some(edgebeat_agent::config::TransportConfig::Mqtt(options)) = config.transport.clone()
    else {
        panic!("mqtt");
    };
    let key = NodeKeyPair::generate().unwrap();
    let h = header("edge-01", 1);
    let payload = enroll::token_request(
        &token,
        h.clone(),
        key.certificate_request("edge-01").unwrap(),
    );
    let ca = enrollment.ca_pem();
    let accept = |answer: &[u8]| {
        enroll::read_answer(
            answer,
            AnswerTrust::Ca(ca.as_bytes()),
            "edge-01",
            h.named_boot_tag(),
            h.seq,
            rustls::pki_types::UnixTime::now(),
        )
        .is_ok()
    };
    let answer = edgebeat_transports::mqtt::enroll::request_certificate(
        &options,
        "edge-01",
        None,
        payload.clone(),
        accept,
        DEADLINE,
    )
    .await
    .unwrap();
    assert!(accept(&answer));
    let replay = edgebeat_transports::mqtt::enroll::request_certificate(
        &options,
        "edge-01",
        None,
        payload,
        accept,
        Duration::from_secs(3),
    )
    .await;
    assert!(
        matches!(
            &replay,
            Err(edgebeat_transports::mqtt::enroll::MqttEnrollmentError::Unanswered(why))
                if why.starts_with("none within")
        ),
        "the replay got an answer: {replay:?}"
    );
    assert_eq!(enrollment.counters.get("token", "replayed"), 1);
    assert_eq!(csrs(&cluster).await.len(), 1);
}

/// Requests flooding the enrollment listener from one address are cut by its limits, and
/// an enrolled node's renewals keep their pace meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enrollment_flood_leaves_enrolled_nodes_renewals_on_time() {
    let (cluster, token, host) = enrolling(
        Transport::Grpc,
        EnrollmentOptions::default(),
        &["edge-01"],
        1,
    )
    .await;
    let enrollment = cluster.enrollment();
    let dir = tempfile::tempdir().unwrap();
    let config = cluster
        .enrolled_agent_config("edge-01", host.path(), &token, dir.path())
        .unwrap();
    let agent = cluster.start_agent(config).unwrap();
    leased(&cluster, "edge-01").await;
    let before = cluster.standin.requests().len();
    // 16 senders, 50 requests each: tokens that do not exist, for made-up nodes.
    let forged =
        edgebeat_transports::enroll::BootstrapToken::new("zzzzzz", "0123456789abcdef", [0; 32])
            .unwrap();
    let url = cluster.enrolling.as_ref().unwrap().enrollment_urls[0].clone();
    let senders = (0..16u64).map(|s| {
        let (url, forged) = (url.clone(), forged.clone());
        tokio::spawn(async move {
            let key = NodeKeyPair::generate().unwrap();
            for i in 0..50u64 {
                let node = format!("flood-{s}-{i}");
                let payload = enroll::token_request(
                    &forged,
                    header(&node, i + 1),
                    key.certificate_request(&node).unwrap(),
                );
                let _ = edgebeat_transports::grpc::enroll::request_certificate(
                    &url,
                    None,
                    payload,
                    Duration::from_secs(5),
                )
                .await;
            }
        })
    });
    for sender in senders.collect::<Vec<_>>() {
        sender.await.unwrap();
    }
    cluster
        .wait_for_renewals("edge-01", 3, DEADLINE)
        .await
        .unwrap();
    let during = &cluster.standin.requests()[before..];
    let gap = longest_renewal_gap(during, "edge-01").unwrap();
    assert!(
        gap < Duration::from_secs(1),
        "renewals {gap:?} apart during the flood"
    );
    assert!(
        enrollment.counters.get("unknown", "rate_limited") > 0,
        "the limits cut the flood"
    );
    assert_eq!(csrs(&cluster).await.len(), 1, "the flood wrote no CSR");
    agent.stop().await.unwrap();
}

/// Replicas starting together against one cluster make one site CA between them: the
/// Secret is created if absent, and the one that loses the race reads the winner's. Boards
/// enrolling through either replica are then identified by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_enrolling_one_fleet_make_one_ca() {
    let mut cluster = Cluster::start_enrolling(
        Transport::Mqtt,
        EnrollmentOptions::default(),
        gateway_options(),
    )
    .await
    .unwrap();
    let client = kube_client(
        kube::Config::new(cluster.standin.url().parse().unwrap()),
        1000,
        &Default::default(),
    )
    .unwrap();
    // Two more at once, racing for a CA of a new namespace's.
    let options = EnrollmentOptions {
        namespace: "edgebeat-race".into(),
        ..EnrollmentOptions::default()
    };
    cluster.standin.create_namespace(&options.namespace);
    let clock: std::sync::Arc<dyn edgebeat_hw::Clock> =
        std::sync::Arc::new(edgebeat_hw::SystemClock);
    let (a, b) = tokio::join!(
        edgebeat_gateway::enrollment::Enrollment::with_site_ca(
            client.clone(),
            options.clone(),
            clock.clone()
        ),
        edgebeat_gateway::enrollment::Enrollment::with_site_ca(
            client.clone(),
            options,
            clock.clone()
        ),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.ca_pem(), b.ca_pem(), "one CA");
    assert_eq!(a.answer_cas(), b.answer_cas(), "one answer CA");
    assert_eq!(a.answer_cas().len(), 1);

    // A site CA an older gateway made (no answer CA): two replicas starting together add
    // one answer CA to it, the same for both, and keep the site CA.
    let options = EnrollmentOptions {
        namespace: "edgebeat-upgrade".into(),
        ..EnrollmentOptions::default()
    };
    cluster.standin.create_namespace(&options.namespace);
    let old =
        edgebeat_gateway::enrollment::ca::SiteCa::generate(jiff::Timestamp::now().as_second())
            .unwrap();
    let mut secret = old.to_secret();
    let data = secret.data.as_mut().unwrap();
    data.remove(edgebeat_gateway::enrollment::ca::ANSWER_CAS_KEY);
    data.remove(edgebeat_gateway::enrollment::ca::ANSWER_CA_KEYS_KEY);
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &options.namespace)
        .create(&Default::default(), &secret)
        .await
        .unwrap();
    let (a, b) = tokio::join!(
        edgebeat_gateway::enrollment::Enrollment::with_site_ca(
            client.clone(),
            options.clone(),
            clock.clone()
        ),
        edgebeat_gateway::enrollment::Enrollment::with_site_ca(client.clone(), options, clock),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        a.ca_pem(),
        old.ca.cert_pem,
        "the older gateway's site CA kept"
    );
    assert_eq!((a.answer_cas().len(), a.answer_cas()), (1, b.answer_cas()));
    assert_ne!(
        a.answer_cas(),
        old.answer_cas(),
        "a new answer CA, not the one dropped"
    );

    cluster.start_replica(gateway_options()).await.unwrap();
    let cas: Vec<String> = cluster
        .replicas
        .iter()
        .flatten()
        .map(|r| r.enrollment.as_ref().unwrap().ca_pem())
        .collect();
    assert_eq!(cas.len(), 2);
    assert_eq!(cas[0], cas[1]);
    let token = cluster
        .bootstrap_token(&["edge-*"], 4, Duration::from_secs(3600))
        .await
        .unwrap();
    let host = fixture_copy("rpi4-cgroup1").unwrap();
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut agents = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let config = cluster
            .enrolled_agent_config(&format!("edge-{i:02}"), host.path(), &token, dir.path())
            .unwrap();
        agents.push(cluster.start_agent(config).unwrap());
    }
    cluster
        .standin
        .wait_until(DEADLINE, "four enrolled and leased", |v| {
            (0..4).all(|i| v.lease(LEASE_NAMESPACE, &format!("edge-{i:02}")).is_some())
        })
        .await
        .unwrap();
    for i in 0..4 {
        let node = format!("edge-{i:02}");
        edgebeat_tests::harness::wait_for("identified", DEADLINE, || {
            recorded_certificate(&cluster, &node).is_some()
        })
        .await;
    }
    for agent in agents {
        agent.stop().await.unwrap();
    }
}

/// A field of the Secret holding the site CA and the answer CAs, as text.
async fn site_ca_secret_field(cluster: &Cluster, key: &str) -> String {
    let operator = edgebeat_tests::harness::operator_client(&cluster.standin).unwrap();
    let namespace = &cluster.enrolling.as_ref().unwrap().options.namespace;
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(operator, namespace)
        .get(edgebeat_gateway::enrollment::ca::SITE_CA_SECRET)
        .await
        .unwrap();
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

/// The site CA as an issuer, with its key from the Secret the gateway keeps it in.
async fn site_ca_issuer(cluster: &Cluster) -> rcgen::Issuer<'static, rcgen::KeyPair> {
    rcgen::Issuer::from_ca_cert_pem(
        &site_ca_secret_field(cluster, "tls.crt").await,
        rcgen::KeyPair::from_pem(&site_ca_secret_field(cluster, "tls.key").await).unwrap(),
    )
    .unwrap()
}

/// `message` signed as an answer by `signer` with the one certificate `certificate`.
fn forge_answer(
    message: &edgebeat_proto::GatewayMessage,
    (certificate, signer): &(Vec<u8>, Box<dyn rustls::sign::Signer>),
) -> Vec<u8> {
    use prost::Message as _;
    let signed_message = message.encode_to_vec();
    let mut covered = edgebeat_transports::signing::ANSWER_CONTEXT.to_vec();
    covered.extend_from_slice(&signed_message);
    edgebeat_proto::SignedAnswer {
        signed_message,
        signature: signer.sign(&covered).unwrap(),
        certificate_chain: vec![certificate.clone()],
    }
    .encode_to_vec()
}

/// A certificate the site CA issues with the gateway's name, and its key: what a CA that
/// issued one by mistake, or a compromised issuer, would hand out. `usages` its extended
/// key usages; a node's (`system:node:…`, clientAuth) when `node`.
fn site_issued(
    issuer: &rcgen::Issuer<'static, rcgen::KeyPair>,
    usages: Vec<rcgen::ExtendedKeyUsagePurpose>,
    node: bool,
) -> (Vec<u8>, Box<dyn rustls::sign::Signer>) {
    let mut params = rcgen::CertificateParams::new(vec![
        edgebeat_transports::signing::ANSWER_SIGNER_NAME.to_owned(),
    ])
    .unwrap();
    if node {
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:plant-7-99");
    }
    params.extended_key_usages = usages;
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    let der = edgebeat_transports::tls::parse_private_key(key.serialize_pem().as_bytes()).unwrap();
    let signer = rustls::crypto::ring::sign::any_supported_type(&der)
        .unwrap()
        .choose_scheme(&[rustls::SignatureScheme::ECDSA_NISTP256_SHA256])
        .unwrap();
    (cert.der().to_vec(), signer)
}

/// An enrolled agent learns the answer CA the gateway names and takes answers from it
/// alone: `node_not_found` answers for its pending renewals, signed by three certificates
/// the site CA itself issued with the gateway's name (serverAuth; no extended key usage; a
/// node's clientAuth certificate), are each refused and counted, and the node keeps
/// renewing; the gateway's real answers are taken all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enrolled_agent_takes_answers_only_from_the_answer_ca_it_learnt() {
    use edgebeat_tests::harness::agent_sample;
    use prost::Message as _;
    use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
    const NODE: &str = "plant-7-01";
    const ROUNDS: usize = 5;
    let (cluster, token, host) = enrolling(
        Transport::Mqtt,
        EnrollmentOptions::default(),
        &["plant-7-*"],
        1,
    )
    .await;
    let (agent, dir) = observed_enrolled_agent(&cluster, NODE, host.path(), &token).await;
    cluster.wait_for_renewals(NODE, 2, DEADLINE).await.unwrap();
    assert_eq!(
        learnt_answer_cas(dir.path()),
        cluster.enrollment().answer_cas(),
        "the answer CA the gateway named"
    );
    let registered = agent_sample(&agent, "edgebeat_agent_registrations_total").await;
    assert!(
        registered >= 1.0,
        "the gateway's own signed answer was taken"
    );

    let issuer = site_ca_issuer(&cluster).await;
    let forgers = [
        site_issued(&issuer, vec![ServerAuth], false),
        site_issued(&issuer, vec![], false),
        site_issued(&issuer, vec![ClientAuth], true),
    ];
    let prefix = edgebeat_transports::mqtt::DEFAULT_TOPIC_PREFIX;
    let lease_topic = format!("{prefix}/nodes/{NODE}/lease");
    let acks_topic = format!("{prefix}/acks/{NODE}");
    let mut spy = edgebeat_tests::spy::Spy::connect_anonymous(&cluster, &[&lease_topic]).await;
    let refused = r#"edgebeat_agent_answers_refused_total{reason="certificate"}"#;
    let before = agent_sample(&agent, refused).await;
    let requests_before = cluster.standin.requests().len();
    for _ in 0..ROUNDS {
        // What a signed answer binds is readable on the lease topic: node, boot, sequence.
        let renewal = spy.next_on(&lease_topic).await;
        let (signed, _) = edgebeat_transports::signing::unseal(&renewal).unwrap();
        let header = edgebeat_proto::AgentMessage::decode(signed.as_slice())
            .unwrap()
            .header()
            .cloned()
            .unwrap();
        let forged = edgebeat_proto::GatewayMessage {
            kind: Some(edgebeat_proto::gateway_message::Kind::Ack(
                edgebeat_proto::Ack {
                    node_name: NODE.into(),
                    boot_tag: header.named_boot_tag(),
                    ..edgebeat_proto::Answer::NodeNotFound {
                        reason: "forged".into(),
                    }
                    .into_ack(header.seq)
                },
            )),
        };
        for forger in &forgers {
            spy.publish(&acks_topic, forge_answer(&forged, forger), false)
                .await;
        }
    }
    let expected = before + (ROUNDS * forgers.len()) as f64;
    let counted = edgebeat_tests::wait::eventually(
        &format!("{expected} forgeries counted"),
        DEADLINE,
        || async {
            let now = agent_sample(&agent, refused).await;
            if now >= expected { Ok(now) } else { Err(now) }
        },
    )
    .await;
    assert_eq!(counted, expected, "each forgery refused and counted once");
    cluster.wait_for_renewals(NODE, 4, DEADLINE).await.unwrap();
    assert_eq!(
        agent_sample(&agent, "edgebeat_agent_node_not_found").await,
        0.0
    );
    let requests = cluster.standin.requests();
    let gap = longest_renewal_gap(&requests[requests_before..], NODE).unwrap();
    assert!(gap < Duration::from_secs(12), "Lease unrenewed for {gap:?}");
    agent.stop().await.unwrap();
}

/// An agent of `node` with nothing but `token`, its `certDir` under the directory returned,
/// serving its `/metrics` (for `agent_sample`), once its Lease exists.
async fn observed_enrolled_agent(
    cluster: &Cluster,
    node: &str,
    host: &std::path::Path,
    token: &enroll::BootstrapToken,
) -> (edgebeat_tests::harness::AgentHandle, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = cluster
        .enrolled_agent_config(node, host, token, dir.path())
        .unwrap();
    config.healthz_bind_address = Some("127.0.0.1:0".parse().unwrap());
    let agent = cluster.start_agent(config).unwrap();
    leased(cluster, node).await;
    (agent, dir)
}

/// The answer CAs (DER) an agent keeps in `dir`'s `certDir`.
fn learnt_answer_cas(dir: &std::path::Path) -> Vec<Vec<u8>> {
    std::fs::read(
        dir.join("pki")
            .join(edgebeat_agent::certificates::ANSWER_CAS_FILE),
    )
    .ok()
    .and_then(|pem| edgebeat_transports::tls::parse_certificates(&pem).ok())
    .map(|certs| certs.iter().map(|c| c.to_vec()).collect())
    .unwrap_or_default()
}

/// An answer to another node: verified or refused by an agent, and ignored as not its own
/// either way.
fn to_someone_else() -> edgebeat_proto::GatewayMessage {
    edgebeat_proto::GatewayMessage {
        kind: Some(edgebeat_proto::gateway_message::Kind::Ack(
            edgebeat_proto::Ack {
                node_name: "someone-else".into(),
                ..edgebeat_proto::Answer::Retry {
                    reason: "probe".into(),
                }
                .into_ack(1)
            },
        )),
    }
}

/// [`to_someone_else`] signed with a fresh key from each answer CA of the Secret, in its
/// order, as a gateway replica signs.
async fn answers_from_each_answer_ca(cluster: &Cluster) -> Vec<Vec<u8>> {
    use edgebeat_gateway::enrollment::ca::{ANSWER_CA_KEYS_KEY, ANSWER_CAS_KEY};
    let now = jiff::Timestamp::now().as_second();
    let site_ca = site_ca_secret_field(cluster, "tls.crt").await;
    edgebeat_gateway::enrollment::answer_ca::from_bundles(
        &site_ca_secret_field(cluster, ANSWER_CAS_KEY).await,
        &site_ca_secret_field(cluster, ANSWER_CA_KEYS_KEY).await,
    )
    .unwrap()
    .iter()
    .map(|answer_ca| {
        let key = answer_ca.issue_answer_key(now).unwrap();
        edgebeat_transports::signing::AnswerSigner::from_pem(
            key.cert_pem.as_bytes(),
            key.key_pem.as_bytes(),
            site_ca.as_bytes(),
        )
        .unwrap()
        .seal(&to_someone_else())
        .unwrap()
    })
    .collect()
}

/// Publishes `answers` on `topic`, then an unsigned control (refused as `unsigned`), and
/// waits until the agent has counted the control: the broker keeps one publisher's order,
/// so every answer before it was read by then. Returns how many of `answers` the agent
/// refused for their certificate.
async fn refusals_of(
    agent: &edgebeat_tests::harness::AgentHandle,
    spy: &edgebeat_tests::spy::Spy,
    topic: &str,
    answers: Vec<Vec<u8>>,
) -> f64 {
    use edgebeat_tests::harness::agent_sample;
    use prost::Message as _;
    let refused = r#"edgebeat_agent_answers_refused_total{reason="certificate"}"#;
    let unsigned = r#"edgebeat_agent_answers_refused_total{reason="unsigned"}"#;
    let (before, controls) = (
        agent_sample(agent, refused).await,
        agent_sample(agent, unsigned).await,
    );
    for answer in answers {
        spy.publish(topic, answer, false).await;
    }
    spy.publish(topic, to_someone_else().encode_to_vec(), false)
        .await;
    edgebeat_tests::wait::eventually("the unsigned control refused", DEADLINE, || async {
        let now = agent_sample(agent, unsigned).await;
        if now == controls { Err(now) } else { Ok(()) }
    })
    .await;
    agent_sample(agent, refused).await - before
}

/// `edgebeat-gateway answer-ca rotate`, end to end over MQTT: after the first step (and a
/// gateway restart) boards learn the new answer CA at their next certificate and take
/// answers from keys of both; after the second the gateway signs with the new one, boards
/// keep it alone, and a key from the retired one is refused and counted. The node renews
/// throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_ca_rotates_with_an_overlap_and_boards_follow() {
    use edgebeat_gateway::enrollment::ca::{AnswerCaRotation, SiteCa};
    use edgebeat_tests::harness::wait_for;
    const NODE: &str = "edge-02";
    // Agents rotate their certificate every 7 to 9 s.
    let enrollment = EnrollmentOptions {
        lifetime: Duration::from_secs(10),
        ..EnrollmentOptions::default()
    };
    let (mut cluster, token, host) = enrolling(Transport::Mqtt, enrollment, &[NODE], 1).await;
    let (agent, dir) = observed_enrolled_agent(&cluster, NODE, host.path(), &token).await;
    let old = cluster.enrollment().answer_cas().to_vec();
    assert_eq!(old.len(), 1);
    assert_eq!(learnt_answer_cas(dir.path()), old);
    let operator = edgebeat_tests::harness::operator_client(&cluster.standin).unwrap();
    let namespace = cluster
        .enrolling
        .as_ref()
        .unwrap()
        .options
        .namespace
        .clone();
    let rotate = || {
        SiteCa::rotate_in_secret(
            operator.clone(),
            &namespace,
            jiff::Timestamp::now().as_second(),
        )
    };
    let acks_topic = format!(
        "{}/acks/{NODE}",
        edgebeat_transports::mqtt::DEFAULT_TOPIC_PREFIX
    );
    let spy = edgebeat_tests::spy::Spy::connect_anonymous(&cluster, &[]).await;

    // Step 1: a second answer CA behind the first.
    assert_eq!(rotate().await.unwrap(), AnswerCaRotation::Added);
    cluster.restart_gateway(gateway_options()).await.unwrap();
    let both = cluster.enrollment().answer_cas().to_vec();
    assert_eq!(
        (both.len(), &both[..1]),
        (2, &old[..]),
        "the old one first, still signing"
    );
    wait_for("the board learnt both", Duration::from_secs(30), || {
        learnt_answer_cas(dir.path()) == both
    })
    .await;
    // The overlap: keys of either are taken (verified, then ignored as another node's).
    let overlap = answers_from_each_answer_ca(&cluster).await;
    let retired_key = overlap[0].clone();
    assert_eq!(
        refusals_of(&agent, &spy, &acks_topic, overlap).await,
        0.0,
        "keys of both answer CAs taken in the overlap"
    );

    // Step 2: the first retired; the gateway signs with the new one and names it alone.
    assert_eq!(rotate().await.unwrap(), AnswerCaRotation::Retired);
    cluster.restart_gateway(gateway_options()).await.unwrap();
    assert_eq!(cluster.enrollment().answer_cas(), &both[1..]);
    wait_for(
        "the board dropped the old one",
        Duration::from_secs(30),
        || learnt_answer_cas(dir.path()) == both[1..],
    )
    .await;
    let mut after = vec![retired_key];
    after.extend(answers_from_each_answer_ca(&cluster).await);
    assert_eq!(
        refusals_of(&agent, &spy, &acks_topic, after).await,
        1.0,
        "the retired answer CA's key refused, the new one's taken"
    );
    cluster.wait_for_renewals(NODE, 3, DEADLINE).await.unwrap();
    let gap = longest_renewal_gap(&cluster.standin.requests(), NODE).unwrap();
    assert!(
        gap < Duration::from_secs(40),
        "the Lease expired: {gap:?} without a renewal"
    );
    agent.stop().await.unwrap();
}
