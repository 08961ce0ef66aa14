use std::os::unix::fs::PermissionsExt as _;
use std::time::{Duration, UNIX_EPOCH};

use edgebeat_transports::enroll::BootstrapToken;
use tokio_util::sync::CancellationToken;

use super::*;

/// A site CA and a node certificate of `node` from it, valid from January `first` to
/// January `last` 2027, midnight UTC: `(certificate + key PEM, CA PEM)`.
fn issued(node: &str, first: u8, last: u8) -> (String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.not_before = rcgen::date_time_ymd(2027, 1, first);
    params.not_after = rcgen::date_time_ymd(2027, 1, last);
    let cert = params.signed_by(&key, &issuer).unwrap();
    (
        format!("{}{}", cert.pem(), key.serialize_pem()),
        ca_cert.pem(),
    )
}

/// 2027-01-01 00:00:00 UTC.
const JAN_1_2027: i64 = 1_798_761_600;
const DAY: i64 = 86_400;

#[test]
fn an_identity_reads_its_validity_and_rotates_at_its_fraction() {
    let (pair, ca) = issued("edge-01", 1, 11);
    let identity = NodeIdentity::from_pem(&pair, &ca).unwrap();
    assert_eq!(
        (identity.not_before, identity.not_after),
        (JAN_1_2027, JAN_1_2027 + 10 * DAY)
    );
    assert_eq!(identity.rotation_deadline(0.7), JAN_1_2027 + 7 * DAY);
    assert_eq!(identity.rotation_deadline(0.9), JAN_1_2027 + 9 * DAY);
    identity.signer().expect("its key signs rotation requests");
    let no_key = NodeIdentity::from_pem(&ca, &ca).map(|_| ());
    assert!(
        matches!(no_key, Err(CertificateError::Tls(_))),
        "a CA alone has no key: {no_key:?}"
    );
}

#[test]
fn the_store_keeps_the_previous_pair_until_told_and_falls_back_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = CertStore::open(&dir.path().join("pki")).unwrap();
    assert_eq!(
        std::fs::metadata(dir.path().join("pki"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    assert_eq!(store.load(), None);
    let (pair, ca) = issued("edge-01", 1, 11);
    let first = NodeIdentity::from_pem(&pair, &ca).unwrap();
    store.save(&first).unwrap();
    assert_eq!(store.load().as_ref(), Some(&first));
    let current = dir.path().join("pki").join(CURRENT_FILE);
    assert_eq!(
        std::fs::metadata(&current).unwrap().permissions().mode() & 0o777,
        0o600,
        "the key is the node's alone"
    );

    let (pair, _) = issued("edge-01", 5, 15);
    let second = NodeIdentity::from_pem(&pair, &ca).unwrap();
    store.save(&second).unwrap();
    assert_eq!(store.load().as_ref(), Some(&second));
    // A current file torn or corrupted: the previous pair is used.
    std::fs::write(&current, "-----BEGIN CERTIFICATE-----\ngarbage\n").unwrap();
    assert_eq!(store.load().as_ref(), Some(&first));
    store.forget_previous().unwrap();
    assert_eq!(store.load(), None);
    store.forget_previous().unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("pki"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_pending_key_survives_until_its_certificate_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = CertStore::open(dir.path()).unwrap();
    let key = store.pending_key().unwrap();
    assert_eq!(
        store.pending_key().unwrap().public_key(),
        key.public_key(),
        "asked again (a restart during a manual approval), the same key: the same CSR"
    );
    let (pair, ca) = issued("edge-01", 1, 11);
    store
        .save(&NodeIdentity::from_pem(&pair, &ca).unwrap())
        .unwrap();
    assert!(!dir.path().join(PENDING_KEY_FILE).exists());
    assert_ne!(store.pending_key().unwrap().public_key(), key.public_key());
}

#[test]
fn a_bad_token_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    let missing = read_token(&file).unwrap_err().to_string();
    assert!(
        missing.contains("bootstrapTokenFile") && missing.contains("token"),
        "{missing}"
    );
    std::fs::write(&file, "not-a-token\n").unwrap();
    assert!(
        read_token(&file)
            .unwrap_err()
            .to_string()
            .contains("bootstrapTokenFile")
    );
    let pin = [7u8; 32];
    let token = BootstrapToken::new("abcdef", "0123456789abcdef", pin).unwrap();
    std::fs::write(&file, format!("  {token}\n")).unwrap();
    assert_eq!(read_token(&file).unwrap().ca_pin, pin);
}

/// The gateway's "certificate due" that came with the first Register, before the manager
/// started waiting, still starts a rotation (a board without a real-time clock hears it
/// once per connection).
#[tokio::test(start_paused = true)]
async fn a_due_word_that_came_before_the_wait_still_counts() {
    let dir = tempfile::tempdir().unwrap();
    let (pair, ca) = issued("edge-01", 1, 11);
    let identity = NodeIdentity::from_pem(&pair, &ca).unwrap();
    let clock: std::sync::Arc<dyn Clock> = std::sync::Arc::new(Before2027);
    let headers = HeaderFactory::new(
        "edge-01".parse().unwrap(),
        "0f8fad5b-d9cb-469f-a165-70867728950e",
        clock.clone(),
    );
    let (metrics, _) = AgentMetrics::new("edge-01", "grpc");
    let managed = ManagedCertificates {
        bootstrap_token_file: dir.path().join("token"),
        cert_dir: dir.path().join("pki"),
        rotate_certificates: true,
        enrollment_endpoint: Some("http://127.0.0.1:1".into()),
    };
    let transport =
        TransportConfig::Grpc(crate::config::GrpcUplinkOptions::new("https://127.0.0.1:1"));
    let manager = Manager {
        managed: &managed,
        transport: &transport,
        headers: &headers,
        clock: clock.as_ref(),
        metrics: &metrics,
        store: CertStore::open(&managed.cert_dir).unwrap(),
    };
    let (said, mut due) = tokio::sync::watch::channel(0u64);
    said.send_replace(1);
    let cancel = CancellationToken::new();
    // By the clock the certificate is years from its deadline: only the gateway's word can
    // end the wait at once.
    let waited = tokio::time::timeout(
        Duration::from_secs(1),
        manager.wait_due(&identity, &mut due, &cancel),
    )
    .await;
    assert_eq!(waited, Ok(true));
}

/// A wall clock standing at 2026-01-01, a year before [`issued`]'s certificates.
struct Before2027;

impl Clock for Before2027 {
    fn now(&self) -> std::time::SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_767_225_600)
    }
    fn boottime(&self) -> Duration {
        Duration::from_secs(60)
    }
}
