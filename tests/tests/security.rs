//! Node identity end to end over MQTT with real TLS (issue 5): Mosquitto serves only MQTT
//! over TLS and requires client certificates from the site CA; agents sign every message
//! with their node key; gateways verify against the site CA.
//!
//! The attacker here is anyone who can publish on the broker with a certificate the broker
//! accepts (a misconfigured ACL, another tenant, a compromised device): a "spy" MQTT client
//! with a site certificate that is not a node's. It replays, tampers, strips signatures,
//! publishes foreign and expired certificates, and a real agent holding node A's key claims
//! to be node B. Every forgery must be refused and counted under its reason while the
//! genuine nodes keep renewing. The gRPC side of the same suite (mTLS handshakes refused
//! and counted, node A cannot write B) is `tests/mtls.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use edgebeat_proto::SignedMessage;
use edgebeat_tests::harness::{Cluster, fixture, gateway_options};
use edgebeat_tests::pki::Ca;
use edgebeat_tests::requests::{self, is_lease_put};
use edgebeat_tests::spy::Spy;
use edgebeat_tests::standin::RecordedRequest;
use edgebeat_transports::ingress::RejectReason;
use edgebeat_transports::signing::MessageSigner;
use prost::Message as _;

const DEADLINE: Duration = Duration::from_secs(20);
const FACTS: &str = "rpi4-cgroup1";
const PREFIX: &str = "edgebeat/v1";

fn mentions(r: &RecordedRequest, text: &str) -> bool {
    r.path.contains(text) || String::from_utf8_lossy(&r.body).contains(text)
}

/// The whole MQTT security suite against one cluster, in order; each step asserts its
/// rejection reason was counted, and at the end the genuine nodes are still renewing and
/// nothing was written for a node that never had a genuine agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_replayed_and_foreign_mqtt_messages_are_refused_while_nodes_keep_renewing() {
    let site = Ca::new("edgebeat site CA");
    let cluster = Cluster::start_mqtt_secure(&site, true, gateway_options())
        .await
        .unwrap();
    let root = fixture(FACTS);
    let cert_a = site.node("edge-a");
    let cert_b = site.node("edge-b");
    let a = cluster
        .start_agent(cluster.secure_agent_config("edge-a", &root, &cert_a))
        .unwrap();
    let b = cluster
        .start_agent(cluster.secure_agent_config("edge-b", &root, &cert_b))
        .unwrap();
    cluster
        .wait_for_renewals("edge-a", 3, DEADLINE)
        .await
        .unwrap();
    cluster
        .wait_for_renewals("edge-b", 3, DEADLINE)
        .await
        .unwrap();
    assert!(cluster.standin.node("edge-a").is_some());
    for why in RejectReason::ALL {
        assert_eq!(
            cluster.rejections(why),
            0,
            "{} before any attack",
            why.as_str()
        );
    }

    let lease_topic = format!("{PREFIX}/nodes/edge-a/lease");
    let mut spy = Spy::connect(&cluster, &site.client("spy", None), &[&lease_topic]).await;
    let captured = spy.next_on(&lease_topic).await;
    let sealed = SignedMessage::decode(captured.as_slice()).unwrap();
    assert!(!sealed.signature.is_empty(), "agents sign every message");
    // A quiet renewal leaves its node name to the topic (Ack.compact_headers) and names its
    // boot by tag (Ack.boot_tags); signed, it keeps the seq and wall time the replay and
    // clock checks need.
    let inner = edgebeat_proto::AgentMessage::decode(sealed.signed_message.as_slice()).unwrap();
    let header = inner.header().unwrap();
    assert!(inner.is_quiet());
    assert_eq!(header.node_name, "", "the topic names the node");
    let boot_id = std::fs::read_to_string(root.join("proc/sys/kernel/random/boot_id")).unwrap();
    assert!(header.boot_id.is_empty());
    assert_eq!(
        header.boot_tag,
        edgebeat_proto::boot_tag(&edgebeat_proto::boot_id_to_bytes(boot_id.trim()))
    );
    assert!(header.wall_time_ms > 0 && header.seq > 0);

    // 1. Replayed verbatim: the signature is good, the per-boot seq is not new.
    spy.publish(&lease_topic, captured.clone(), false).await;
    cluster
        .wait_for_rejections(RejectReason::Replayed, 1, DEADLINE)
        .await;

    // 2. Tampered: one bit of the signed message flipped.
    let mut tampered = sealed.clone();
    let last = tampered.signed_message.len() - 1;
    tampered.signed_message[last] ^= 1;
    spy.publish(&lease_topic, tampered.encode_to_vec(), false)
        .await;
    cluster
        .wait_for_rejections(RejectReason::BadSignature, 1, DEADLINE)
        .await;

    // 3. Signature stripped: the bare AgentMessage.
    spy.publish(&lease_topic, sealed.signed_message.clone(), false)
        .await;
    cluster
        .wait_for_rejections(RejectReason::Unsigned, 1, DEADLINE)
        .await;

    // 4. A certificate from another CA for edge-a, retained: refused, and edge-a's key is
    //    not replaced (it keeps renewing below).
    let other_site = Ca::new("another site CA");
    let foreign = MessageSigner::from_pem(
        other_site.node("edge-a").cert_pem.as_bytes(),
        other_site.node("edge-a").key_pem.as_bytes(),
    )
    .unwrap();
    let certificates_a = format!("{PREFIX}/certificates/edge-a");
    spy.publish(&certificates_a, foreign.certificate().to_vec(), false)
        .await;
    cluster
        .wait_for_rejections(RejectReason::Certificate, 1, DEADLINE)
        .await;

    // 5. An expired certificate of the site CA for edge-x, and a renewal signed with its
    //    key: the certificate is refused, so the signer is unknown; nothing is written.
    let expired = site.client_with("system:node:edge-x", Some("system:nodes"), true);
    let expired =
        MessageSigner::from_pem(expired.cert_pem.as_bytes(), expired.key_pem.as_bytes()).unwrap();
    spy.publish(
        &format!("{PREFIX}/certificates/edge-x"),
        expired.certificate().to_vec(),
        false,
    )
    .await;
    cluster
        .wait_for_rejections(RejectReason::Certificate, 2, DEADLINE)
        .await;
    let forged = expired
        .seal(edgebeat_tests::messages::register("edge-x", 1).encode_to_vec())
        .unwrap();
    spy.publish(&format!("{PREFIX}/nodes/edge-x/register"), forged, false)
        .await;
    cluster
        .wait_for_rejections(RejectReason::UnknownSigner, 1, DEADLINE)
        .await;

    // 6. A real agent holding edge-a's key claims to be edge-b: its certificate does not
    //    name edge-b, and its signatures do not verify with edge-b's key.
    let impostor = cluster
        .start_agent(cluster.secure_agent_config("edge-b", &root, &cert_a))
        .unwrap();
    cluster
        .wait_for_rejections(RejectReason::BadSignature, 2, DEADLINE)
        .await;
    cluster
        .wait_for_rejections(RejectReason::Certificate, 3, DEADLINE)
        .await;
    impostor.stop().await.unwrap();

    // 7. A message genuinely signed with edge-a's key, with a new seq, but a wall time a
    //    minute old: what a recording replayed to a replica that does not remember the boot
    //    looks like. Outside the 30 s clock window.
    let signer_a =
        MessageSigner::from_pem(cert_a.cert_pem.as_bytes(), cert_a.key_pem.as_bytes()).unwrap();
    let mut recorded =
        edgebeat_proto::AgentMessage::decode(sealed.signed_message.as_slice()).unwrap();
    if let Some(edgebeat_proto::agent_message::Kind::Lease(renewal)) = recorded.kind.as_mut()
        && let Some(header) = renewal.header.as_mut()
    {
        header.seq += 3_600_000_000;
        let minute_ago = std::time::SystemTime::now() - Duration::from_secs(60);
        header.wall_time_ms = i64::try_from(
            minute_ago
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap();
    }
    let old = signer_a.seal(recorded.encode_to_vec()).unwrap();
    spy.publish(&lease_topic, old, false).await;
    cluster
        .wait_for_rejections(RejectReason::ClockSkew, 1, DEADLINE)
        .await;

    // 8. edge-a's captured renewal, which names no node, published on edge-b's topic: the
    //    topic's node is the signer the gateway checks, and edge-a's signature does not
    //    verify with edge-b's key.
    let bad_signatures = cluster.rejections(RejectReason::BadSignature);
    spy.publish(
        &format!("{PREFIX}/nodes/edge-b/lease"),
        captured.clone(),
        false,
    )
    .await;
    cluster
        .wait_for_rejections(RejectReason::BadSignature, bad_signatures + 1, DEADLINE)
        .await;

    // The genuine nodes kept renewing throughout and still do; edge-x never existed.
    cluster
        .wait_for_renewals("edge-a", 3, DEADLINE)
        .await
        .unwrap();
    cluster
        .wait_for_renewals("edge-b", 3, DEADLINE)
        .await
        .unwrap();
    assert!(cluster.standin.node("edge-x").is_none());
    assert!(cluster.standin.lease("kube-node-lease", "edge-x").is_none());
    assert_eq!(
        requests::count(&cluster.standin.requests(), |r| mentions(r, "edge-x")),
        0,
        "no apiserver call for edge-x at all"
    );
    assert!(requests::count(&cluster.standin.requests(), |r| is_lease_put(r, "edge-a")) > 0);
    let lease_b = cluster.standin.lease("kube-node-lease", "edge-b").unwrap();
    assert_eq!(
        lease_b.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("edge-b")
    );
    // Nothing was refused for a reason no attack explains.
    for why in [
        RejectReason::Malformed,
        RejectReason::Foreign,
        RejectReason::TooLarge,
        RejectReason::Invalid,
        RejectReason::RateLimited,
    ] {
        assert_eq!(cluster.rejections(why), 0, "{}", why.as_str());
    }
    let figures: Vec<String> = RejectReason::ALL
        .iter()
        .map(|why| format!("{}={}", why.as_str(), cluster.rejections(*why)))
        .collect();
    println!("rejections observed: {}", figures.join(" "));
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// A gateway that requires signatures refuses an unsigned Register (counted as `unsigned`,
/// nothing written); one that does not require them (a fleet moving to signing) registers
/// the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_agents_are_refused_only_when_signatures_are_required() {
    let site = Ca::new("edgebeat site CA");
    for required in [true, false] {
        let cluster = Cluster::start_mqtt_secure(&site, required, gateway_options())
            .await
            .unwrap();
        // An agent without a node key can only publish unsigned messages.
        let spy = Spy::connect(&cluster, &site.client("unsigned-agent", None), &[]).await;
        let plain = edgebeat_tests::messages::register("edge-u", 1).encode_to_vec();
        spy.publish(&format!("{PREFIX}/nodes/edge-u/register"), plain, false)
            .await;
        if required {
            cluster
                .wait_for_rejections(RejectReason::Unsigned, 1, DEADLINE)
                .await;
            assert!(cluster.standin.node("edge-u").is_none());
        } else {
            cluster
                .standin
                .wait_until(DEADLINE, "edge-u registered unsigned", |v| {
                    v.node("edge-u").is_some()
                })
                .await
                .unwrap();
            assert_eq!(cluster.rejections(RejectReason::Unsigned), 0);
        }
    }
}
