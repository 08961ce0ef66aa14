//! The gateway's MQTT envelope verification on arbitrary bytes, both ways an attacker on
//! the broker can feed it: as a published node certificate (`P/certificates/<node>`,
//! `CertificateVerifier::verify`) and as a message payload (`signing::unseal` then
//! `NodeKey::verify` with a genuine node's key).
//!
//! Checks: nothing panics; no input is ever accepted as a certificate for the node (the
//! fuzzer holds no key of the site CA) and no input ever verifies as signed by the node
//! (it holds no node key); an unsealed payload's signed bytes decode or fail cleanly.
#![no_main]

use std::sync::OnceLock;

use edgebeat_proto::AgentMessage;
use edgebeat_transports::signing::{CertificateVerifier, MessageSigner, NodeKey, unseal};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use rustls::pki_types::UnixTime;

/// A site CA and one node's verified key, made once per run (fresh keys: a corpus entry
/// signed in an earlier run never verifies).
fn site() -> &'static (CertificateVerifier, NodeKey) {
    static SITE: OnceLock<(CertificateVerifier, NodeKey)> = OnceLock::new();
    SITE.get_or_init(|| {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().expect("key");
        let ca_pem = ca.self_signed(&ca_key).expect("CA").pem();
        let issuer = Issuer::new(ca, ca_key);
        let mut leaf = CertificateParams::new(Vec::<String>::new()).expect("params");
        leaf.distinguished_name
            .push(DnType::OrganizationName, "system:nodes");
        leaf.distinguished_name
            .push(DnType::CommonName, "system:node:edge-1");
        let key = KeyPair::generate().expect("key");
        let cert_pem = leaf.signed_by(&key, &issuer).expect("leaf").pem();
        let signer = MessageSigner::from_pem(cert_pem.as_bytes(), key.serialize_pem().as_bytes())
            .expect("signer");
        let verifier = CertificateVerifier::from_pem(ca_pem.as_bytes()).expect("verifier");
        let node_key = verifier
            .verify("edge-1", signer.certificate(), UnixTime::now())
            .expect("the genuine certificate verifies");
        (verifier, node_key)
    })
}

fuzz_target!(|data: &[u8]| {
    let (verifier, node_key) = site();
    let now = UnixTime::now();
    assert!(
        verifier.verify("edge-1", data, now).is_err(),
        "a certificate the site CA never issued was accepted"
    );
    if let Some((message, signature)) = unseal(data) {
        assert!(
            node_key.verify(&message, &signature, now).is_err(),
            "a payload nobody signed verified"
        );
        let _ = AgentMessage::decode(message.as_slice());
    }
});
