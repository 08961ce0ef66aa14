//! `edgebeat-sign-cost`: what end-to-end MQTT signatures cost per message: CPU to sign (the
//! agent), CPU to verify (the gateway), CPU to verify a published node certificate against
//! the site CA (once per node and connection), and bytes added to each payload. For ECDSA
//! P-256 (kubelet's key type) and Ed25519, on this machine, with the real code paths
//! (`MessageSigner::seal`, `signing::unseal` + `NodeKey::verify`, `CertificateVerifier`).
//! Then the gateway's signed answers: CPU to sign (`AnswerSigner::seal`) and to verify on
//! the agent (`AnswerVerifier::verify`, chain and signature), and their size beside the
//! plain answer, for the answers an agent sees most.
//!
//! Run: `cargo run --release -p edgebeat-tests --bin edgebeat-sign-cost`.
// A benchmark times real CPU work: the real monotonic clock is the point (no tokio runtime,
// no paused time here).
#![allow(clippy::disallowed_methods)]

use std::time::Instant;

use edgebeat_tests::messages;
use edgebeat_tests::pki::Ca;
use edgebeat_transports::signing::{
    ANSWER_SIGNER_NAME, AnswerSigner, AnswerVerifier, CertificateVerifier, MessageSigner, unseal,
};
use prost::Message as _;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, SignatureAlgorithm};
use rustls::pki_types::UnixTime;

const ROUNDS: u32 = 2_000;

fn node_leaf(site: &Ca, alg: &'static SignatureAlgorithm) -> anyhow::Result<(String, String)> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(DnType::CommonName, "system:node:edge-0001");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate_for(alg)?;
    let leaf = site.issue_with_key(params, &key);
    Ok((leaf, key.serialize_pem()))
}

fn per_op(start: Instant, rounds: u32) -> f64 {
    start.elapsed().as_secs_f64() * 1e6 / f64::from(rounds)
}

fn main() -> anyhow::Result<()> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .ok();
    let site = Ca::new("edgebeat site CA");
    let verifier =
        CertificateVerifier::from_pem(site.cert_pem.as_bytes()).map_err(anyhow::Error::msg)?;
    let renewal = messages::renewal("edge-0001", 86_400_000_000).encode_to_vec();
    println!(
        "{ROUNDS} rounds each; lease renewal payload {} B unsigned",
        renewal.len()
    );
    println!("| key | sign (agent) | verify (gateway) | certificate check | bytes added |");
    println!("|---|---|---|---|---|");
    for (name, alg) in [
        ("ECDSA P-256", &rcgen::PKCS_ECDSA_P256_SHA256),
        ("Ed25519", &rcgen::PKCS_ED25519),
    ] {
        let (cert, key) = node_leaf(&site, alg)?;
        let signer =
            MessageSigner::from_pem(cert.as_bytes(), key.as_bytes()).map_err(anyhow::Error::msg)?;
        let start = Instant::now();
        let mut sealed = Vec::new();
        for _ in 0..ROUNDS {
            sealed = signer.seal(renewal.clone()).map_err(anyhow::Error::msg)?;
        }
        let sign_us = per_op(start, ROUNDS);
        let now = UnixTime::now();
        let start = Instant::now();
        let mut key_held = None;
        for _ in 0..ROUNDS / 10 {
            key_held = Some(
                verifier
                    .verify("edge-0001", signer.certificate(), now)
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
            );
        }
        let cert_us = per_op(start, ROUNDS / 10);
        let key_held = key_held.ok_or_else(|| anyhow::anyhow!("no key"))?;
        let start = Instant::now();
        for _ in 0..ROUNDS {
            let (message, signature) =
                unseal(&sealed).ok_or_else(|| anyhow::anyhow!("not sealed"))?;
            key_held
                .verify(&message, &signature, now)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let verify_us = per_op(start, ROUNDS);
        println!(
            "| {name} | {sign_us:.1} µs | {verify_us:.1} µs | {cert_us:.1} µs | {} B (certificate message {} B, once per connection) |",
            sealed.len() - renewal.len(),
            signer.certificate().len()
        );
    }
    signed_answers(&site)
}

/// The gateway's signed answers: CPU and bytes, for a P-256 answer key from the site CA.
fn signed_answers(site: &Ca) -> anyhow::Result<()> {
    let mut params = CertificateParams::new(vec![ANSWER_SIGNER_NAME.to_owned()])?;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let cert = site.issue_with_key(params, &key);
    let signer = AnswerSigner::from_pem(
        cert.as_bytes(),
        key.serialize_pem().as_bytes(),
        site.cert_pem.as_bytes(),
    )
    .map_err(anyhow::Error::msg)?;
    let verifier =
        AnswerVerifier::from_pem(site.cert_pem.as_bytes()).map_err(anyhow::Error::msg)?;
    println!();
    println!("Signed answers (P-256 answer key), {ROUNDS} rounds each:");
    println!("| answer | plain | signed | sign (gateway) | verify (agent) |");
    println!("|---|---|---|---|---|");
    let answers = [
        (
            "Registered",
            edgebeat_proto::Answer::Registered {
                headers: edgebeat_proto::HeaderForm::CompactBootTag,
                resend_status: false,
                certificate_due: false,
            },
        ),
        ("Written (status report)", edgebeat_proto::Answer::WRITTEN),
        (
            "SendCertificate",
            edgebeat_proto::Answer::SendCertificate {
                reason: "this gateway replica holds no current certificate for the node".into(),
            },
        ),
    ];
    for (name, answer) in answers {
        let plain = edgebeat_proto::GatewayMessage {
            kind: Some(edgebeat_proto::gateway_message::Kind::Ack(
                answer.into_ack(86_400_000_000),
            )),
        };
        let mut bound = plain.clone();
        if let Some(edgebeat_proto::gateway_message::Kind::Ack(ack)) = bound.kind.as_mut() {
            ack.node_name = "edge-0001".into();
            ack.boot_tag = 0x5eed_f00d;
        }
        let start = Instant::now();
        let mut sealed = Vec::new();
        for _ in 0..ROUNDS {
            sealed = signer.seal(&bound).map_err(anyhow::Error::msg)?;
        }
        let sign_us = per_op(start, ROUNDS);
        let now = UnixTime::now();
        let start = Instant::now();
        for _ in 0..ROUNDS {
            verifier
                .verify(&sealed, now)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let verify_us = per_op(start, ROUNDS);
        println!(
            "| {name} | {} B | {} B | {sign_us:.1} µs | {verify_us:.1} µs |",
            plain.encoded_len(),
            sealed.len()
        );
    }
    Ok(())
}
