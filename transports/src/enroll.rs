//! Node certificates without hands, on the wire: bootstrap tokens and the proof a request
//! carries, the PKCS#10 request an agent builds for a key made on the board, the pin that
//! lets a board with nothing but a token trust the site CA, and reading the gateway's
//! signed answer. Both sides use it; what the gateway does with a request (a Kubernetes
//! CertificateSigningRequest, approval, signing) is the gateway's.
//!
//! The scheme is kubelet's TLS bootstrap and certificate rotation
//! (`pkg/kubelet/certificate/bootstrap/bootstrap.go`, client-go
//! `util/certificate/certificate_manager.go`) with kubeadm's discovery by CA hash
//! (`discovery-token-ca-cert-hash`), over edgebeat's transports: see
//! [`CertificateRequest`](edgebeat_proto::CertificateRequest) for the wire shapes.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use edgebeat_proto::{CertificateRequest, Header};
use prost::Message as _;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair as _};
use rustls::pki_types::CertificateDer;

/// Domain separation prefix of a bootstrap token's proof: `"edgebeat.v1 certificate
/// request"` and a NUL byte (32 bytes).
pub const ENROLL_CONTEXT: &[u8] = b"edgebeat.v1 certificate request\0";

/// The last level of the MQTT topic certificate requests go to:
/// `P/nodes/{node}/csr`.
pub const CSR_KIND: &str = "csr";

/// Length of a token id (`[a-z0-9]`), as kubeadm's bootstrap tokens: 6.
pub const TOKEN_ID_LEN: usize = 6;

/// Length of a token secret (`[a-z0-9]`), as kubeadm's bootstrap tokens: 16.
pub const TOKEN_SECRET_LEN: usize = 16;

/// Why enrollment material could not be read or made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnrollError {
    /// A bootstrap token is not `<id>.<secret>.sha256:<hex>` as described on
    /// [`BootstrapToken`].
    #[error(
        "bootstrap token: {0}; expected <6 of [a-z0-9]>.<16 of [a-z0-9]>.sha256:<64 hex digits> (edgebeat-gateway token create prints one)"
    )]
    Token(&'static str),
    /// A certificate does not parse as X.509 DER.
    #[error("certificate: {0}")]
    Certificate(String),
    /// The node key cannot be made, read or used (ring reports no detail).
    #[error("node key: {0}")]
    Key(String),
}

/// A bootstrap token as operators give it to boards: `<id>.<secret>.sha256:<hex>`, where id
/// and secret are kubeadm's token halves (6 and 16 characters of `[a-z0-9]`) and the hex is
/// the SHA-256 of the site CA's SubjectPublicKeyInfo (kubeadm's
/// `discovery-token-ca-cert-hash`, [`ca_pin`]): the board trusts the CA that has it, and
/// no other, without a CA file placed beforehand.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    /// The public half: names the token (the gateway's Secret `edgebeat-token-<id>`).
    pub id: String,
    secret: String,
    /// SHA-256 of the site CA's SubjectPublicKeyInfo (DER).
    pub ca_pin: [u8; 32],
}

impl fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BootstrapToken")
            .field("id", &self.id)
            .field("secret", &format_args!("<redacted>"))
            .finish_non_exhaustive()
    }
}

/// `[a-z0-9]` only.
fn token_chars(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

impl BootstrapToken {
    /// A token of `id` and `secret` for the CA whose pin is `ca_pin`.
    ///
    /// Errors: [`EnrollError::Token`] when id or secret are not kubeadm's shapes.
    pub fn new(id: &str, secret: &str, ca_pin: [u8; 32]) -> Result<Self, EnrollError> {
        if id.len() != TOKEN_ID_LEN || !token_chars(id) {
            return Err(EnrollError::Token("the id is not 6 characters of [a-z0-9]"));
        }
        if secret.len() != TOKEN_SECRET_LEN || !token_chars(secret) {
            return Err(EnrollError::Token(
                "the secret is not 16 characters of [a-z0-9]",
            ));
        }
        Ok(Self {
            id: id.to_owned(),
            secret: secret.to_owned(),
            ca_pin,
        })
    }

    /// The secret half (to store on the gateway's side).
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// The proof of a request with `header` for `csr` (see [`token_proof`]).
    pub fn proof(&self, header: &Header, csr: &[u8]) -> Vec<u8> {
        token_proof(self.secret.as_bytes(), header, csr)
    }
}

impl fmt::Display for BootstrapToken {
    /// The token's text, secret included: what a board's token file holds.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}.sha256:{}",
            self.id,
            self.secret,
            hex(&self.ca_pin)
        )
    }
}

impl FromStr for BootstrapToken {
    type Err = EnrollError;

    /// Parses `<id>.<secret>.sha256:<hex>` (surrounding whitespace ignored, as a file's
    /// trailing newline).
    fn from_str(text: &str) -> Result<Self, EnrollError> {
        let mut parts = text.trim().splitn(3, '.');
        let (Some(id), Some(secret), Some(pin)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(EnrollError::Token(
                "fewer than three parts separated by '.'",
            ));
        };
        let pin = pin.strip_prefix("sha256:").ok_or(EnrollError::Token(
            "the CA hash does not start with sha256:",
        ))?;
        let pin = unhex(pin).ok_or(EnrollError::Token("the CA hash is not 64 hex digits"))?;
        Self::new(id, secret, pin)
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 32 bytes from 64 hex digits; `None` otherwise.
fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(text.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// The bytes a token proof covers: [`ENROLL_CONTEXT`], the node name's length (one byte) and
/// the name, the CSR, then `wall_time_ms` and `seq` as 8 bytes big-endian each.
fn proved_bytes(header: &Header, csr: &[u8]) -> Vec<u8> {
    let name = header.node_name.as_bytes();
    let mut out = Vec::with_capacity(ENROLL_CONTEXT.len() + 1 + name.len() + csr.len() + 16);
    out.extend_from_slice(ENROLL_CONTEXT);
    out.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(name);
    out.extend_from_slice(csr);
    out.extend_from_slice(&header.wall_time_ms.to_be_bytes());
    out.extend_from_slice(&header.seq.to_be_bytes());
    out
}

/// A bootstrap token's proof of a request: HMAC-SHA256 under the token's `secret` of the
/// request's node name, CSR, wall time and sequence number (see
/// [`CertificateRequest`]): it binds the token to this request, so the secret never
/// travels and the proof cannot be moved to another node, key or time.
pub fn token_proof(secret: &[u8], header: &Header, csr: &[u8]) -> Vec<u8> {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    ring::hmac::sign(&key, &proved_bytes(header, csr))
        .as_ref()
        .to_vec()
}

/// Whether `proof` is the token proof of `header` and `csr` under `secret`, compared in
/// constant time.
pub fn verify_token_proof(secret: &[u8], header: &Header, csr: &[u8], proof: &[u8]) -> bool {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    ring::hmac::verify(&key, &proved_bytes(header, csr), proof).is_ok()
}

/// SHA-256 of a certificate's SubjectPublicKeyInfo (DER, its outer SEQUENCE included): the
/// pin a bootstrap token carries, computed as kubeadm's `discovery-token-ca-cert-hash`
/// (`x509.MarshalPKIXPublicKey` of the CA's key).
///
/// Errors: [`EnrollError::Certificate`] when `cert_der` does not parse.
pub fn ca_pin(cert_der: &[u8]) -> Result<[u8; 32], EnrollError> {
    let cert = CertificateDer::from(cert_der);
    let anchor = webpki::anchor_from_trusted_cert(&cert)
        .map_err(|e| EnrollError::Certificate(format!("{e:?}")))?;
    // webpki keeps the SPKI's contents: put its SEQUENCE header back.
    let spki = der(0x30, anchor.subject_public_key_info.as_ref());
    let digest = ring::digest::digest(&ring::digest::SHA256, &spki);
    let mut pin = [0u8; 32];
    pin.copy_from_slice(digest.as_ref());
    Ok(pin)
}

/// One DER TLV: `tag`, the definite length of `content`, `content`.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let len = content.len();
    let mut out = Vec::with_capacity(content.len() + 6);
    out.push(tag);
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// DER of an OBJECT IDENTIFIER whose encoded value is `value`.
fn oid(value: &[u8]) -> Vec<u8> {
    der(0x06, value)
}

/// id-at-organizationName, 2.5.4.10.
const OID_ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];
/// id-at-commonName, 2.5.4.3.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// id-ecPublicKey, 1.2.840.10045.2.1.
const OID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
/// prime256v1, 1.2.840.10045.3.1.7.
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
/// ecdsa-with-SHA256, 1.2.840.10045.4.3.2.
const OID_ECDSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];

/// One relative distinguished name of one attribute, a UTF8String value.
fn rdn(attribute: &[u8], value: &str) -> Vec<u8> {
    let pair = [oid(attribute), der(0x0c, value.as_bytes())].concat();
    der(0x31, &der(0x30, &pair))
}

/// A node's key pair, ECDSA P-256 (kubelet's key type), made on the board and never sent:
/// it signs the node's certificate request and, once issued, its messages and TLS.
pub struct NodeKeyPair {
    pkcs8: Vec<u8>,
    key: EcdsaKeyPair,
}

impl fmt::Debug for NodeKeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeKeyPair").finish_non_exhaustive()
    }
}

impl NodeKeyPair {
    /// A fresh P-256 key from the system's random source.
    ///
    /// Errors: [`EnrollError::Key`] when the random source fails.
    pub fn generate() -> Result<Self, EnrollError> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(|_| EnrollError::Key("could not generate a P-256 key".into()))?;
        Self::from_pkcs8(pkcs8.as_ref())
    }

    /// The key of a PKCS#8 DER document (P-256).
    ///
    /// Errors: [`EnrollError::Key`] when it is not a P-256 PKCS#8 key.
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<Self, EnrollError> {
        let key =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8, &SystemRandom::new())
                .map_err(|e| EnrollError::Key(format!("not a P-256 PKCS#8 key: {e}")))?;
        Ok(Self {
            pkcs8: pkcs8.to_vec(),
            key,
        })
    }

    /// The key as PEM (`PRIVATE KEY`, PKCS#8), for the node's certificate file.
    pub fn to_pem(&self) -> String {
        pem("PRIVATE KEY", &self.pkcs8)
    }

    /// The uncompressed public point (65 bytes).
    pub fn public_key(&self) -> &[u8] {
        self.key.public_key().as_ref()
    }

    /// The PKCS#10 certificate request (DER, RFC 2986) for node `node`: subject
    /// O=`system:nodes`, CN=`system:node:<node>` (kubelet's,
    /// `pkg/kubelet/certificate/bootstrap/bootstrap.go: requestNodeCertificate`), this key,
    /// no attributes (the usages go on the Kubernetes CertificateSigningRequest), signed
    /// with ECDSA-SHA256.
    ///
    /// Errors: [`EnrollError::Key`] when signing fails.
    pub fn certificate_request(&self, node: &str) -> Result<Vec<u8>, EnrollError> {
        let subject = der(
            0x30,
            &[
                rdn(OID_ORGANIZATION, crate::tls::NODES_GROUP),
                rdn(
                    OID_COMMON_NAME,
                    &format!("{}{node}", crate::tls::NODE_USER_PREFIX),
                ),
            ]
            .concat(),
        );
        let mut point = vec![0u8];
        point.extend_from_slice(self.public_key());
        let spki = der(
            0x30,
            &[
                der(0x30, &[oid(OID_EC_PUBLIC_KEY), oid(OID_P256)].concat()),
                der(0x03, &point),
            ]
            .concat(),
        );
        let version = der(0x02, &[0]);
        let attributes = der(0xa0, &[]);
        let info = der(0x30, &[version, subject, spki, attributes].concat());
        let signature = self
            .key
            .sign(&SystemRandom::new(), &info)
            .map_err(|_| EnrollError::Key("signing the request failed".into()))?;
        let mut bits = vec![0u8];
        bits.extend_from_slice(signature.as_ref());
        Ok(der(
            0x30,
            &[info, der(0x30, &oid(OID_ECDSA_SHA256)), der(0x03, &bits)].concat(),
        ))
    }
}

/// PEM of `der` under `label`: base64 in 64-character lines (RFC 7468).
pub fn pem(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The encoded [`CertificateRequest`] proved by a bootstrap `token`: the payload for the
/// enrollment endpoint.
pub fn token_request(token: &BootstrapToken, header: Header, csr: Vec<u8>) -> Vec<u8> {
    let token_proof = token.proof(&header, &csr);
    CertificateRequest {
        header: Some(header),
        csr,
        token_id: token.id.clone(),
        token_proof,
        certificate_chain: Vec::new(),
    }
    .encode_to_vec()
}

/// The request proved by the node's certificate: a
/// [`SignedMessage`](edgebeat_proto::SignedMessage) of the [`CertificateRequest`] carrying
/// `signer`'s certificate chain, signed with its key (which may have expired, within the
/// gateway's grace period).
///
/// Errors: [`EnrollError::Key`] when signing fails.
pub fn certificate_request(
    signer: &crate::signing::MessageSigner,
    header: Header,
    csr: Vec<u8>,
) -> Result<Vec<u8>, EnrollError> {
    let chain = edgebeat_proto::NodeCertificate::decode(signer.certificate())
        .map_err(|e| EnrollError::Certificate(e.to_string()))?
        .certificate_chain;
    let request = CertificateRequest {
        header: Some(header),
        csr,
        token_id: String::new(),
        token_proof: Vec::new(),
        certificate_chain: chain,
    };
    signer
        .seal(request.encode_to_vec())
        .map_err(|e| EnrollError::Key(e.to_string()))
}

/// `(notBefore, notAfter)` of an X.509 certificate (DER), Unix seconds; `None` when it does
/// not parse that far. A reader of the validity alone (RFC 5280 §4.1.2.5: UTCTime for years
/// before 2050, GeneralizedTime after), so that the agent judges its certificate's age
/// without a certificate parser of its own.
pub fn certificate_validity(der: &[u8]) -> Option<(i64, i64)> {
    let mut input = der;
    let (_, mut certificate) = read_tlv(&mut input, 0x30)?;
    let (_, mut tbs) = read_tlv(&mut certificate, 0x30)?;
    if tbs.first() == Some(&0xa0) {
        read_tlv(&mut tbs, 0xa0)?; // version
    }
    read_tlv(&mut tbs, 0x02)?; // serialNumber
    read_tlv(&mut tbs, 0x30)?; // signature
    read_tlv(&mut tbs, 0x30)?; // issuer
    let (_, mut validity) = read_tlv(&mut tbs, 0x30)?;
    let mut time = || {
        let tag = *validity.first()?;
        let (_, text) = read_tlv(&mut validity, tag)?;
        parse_time(tag, std::str::from_utf8(text).ok()?)
    };
    Some((time()?, time()?))
}

/// Reads one TLV of tag `tag` from the front of `input`: `(tag, content)`.
fn read_tlv<'a>(input: &mut &'a [u8], tag: u8) -> Option<(u8, &'a [u8])> {
    let (&found, rest) = input.split_first()?;
    if found != tag {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b))
    };
    if rest.len() < len {
        return None;
    }
    let (content, after) = rest.split_at(len);
    *input = after;
    Some((found, content))
}

/// A UTCTime (`0x17`, `YYMMDDHHMMSSZ`) or GeneralizedTime (`0x18`, `YYYYMMDDHHMMSSZ`) as
/// Unix seconds.
fn parse_time(tag: u8, text: &str) -> Option<i64> {
    let digits = text.strip_suffix('Z')?;
    let (year, rest) = match (tag, digits.len()) {
        (0x17, 12) => {
            let yy: i64 = digits.get(..2)?.parse().ok()?;
            (
                if yy < 50 { 2000 + yy } else { 1900 + yy },
                digits.get(2..)?,
            )
        }
        (0x18, 14) => (digits.get(..4)?.parse().ok()?, digits.get(4..)?),
        _ => return None,
    };
    let field = |i: usize| -> Option<i64> { rest.get(i..i + 2)?.parse().ok() };
    let (month, day, hour, minute, second) =
        (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
    // days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
}

/// What the gateway answered a certificate request, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered {
    /// Granted: the new certificate chain (DER, leaf first, the site CA last), and the site
    /// CA (DER) it was verified against.
    Issued {
        /// DER certificates, the new one first.
        chain: Vec<Vec<u8>>,
        /// The site CA, DER.
        ca: Vec<u8>,
        /// The answer CAs the gateway named (`IssuedCertificate.answer_cas`, DER), each
        /// checked to have issued the answer key of this very answer or to come with it:
        /// the only issuers of answers to trust from now on (see
        /// [`crate::signing::AnswerVerifier::pinned`]). Empty from a gateway without them.
        answer_cas: Vec<Vec<u8>>,
    },
    /// Not now (pending approval, the apiserver unreachable): ask again later.
    Pending(String),
    /// Refused for good as it stands (a token that does not cover the node, used up,
    /// expired; a CSR the gateway will not sign): a new token, or a fix, is needed.
    Refused(String),
}

/// How an agent trusts the gateway's answer to its certificate request.
#[derive(Debug, Clone, Copy)]
pub enum AnswerTrust<'a> {
    /// First enrollment: only the pin of its bootstrap token. The granted answer carries the
    /// site CA (the chain's last certificate), which must have the pin; then the answer is
    /// verified against it. Anything else (pending, refused) cannot be verified yet and is
    /// taken as "ask again later".
    Pin([u8; 32]),
    /// Rotation by an agent that has learnt no answer CA: the site CA it already trusts,
    /// whose PEM this is.
    Ca(&'a [u8]),
    /// Rotation: the answer CAs (DER) the agent learnt at enrollment or at its last
    /// rotation; only an answer key they issued is taken.
    AnswerCas(&'a [Vec<u8>]),
}

/// Why an answer to a certificate request was not taken (the agent ignores it and asks
/// again later).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadAnswerError {
    /// The trusted CA's PEM is unusable.
    #[error("the site CA: {0}")]
    Ca(String),
    /// The answer does not verify against the trusted CA (unsigned, another key, a bad
    /// signature, an expired or foreign answer certificate).
    #[error("unverified answer: {0}")]
    Unverified(#[from] crate::signing::AnswerError),
    /// An issued chain whose CA is not the one the bootstrap token pins.
    #[error("the issued chain's CA is not the bootstrap token's")]
    NotPinned,
    /// A verified answer, but to another node, boot or request (on a shared ack topic,
    /// someone else's; keep waiting for this one's).
    #[error("an answer to another request")]
    OtherRequest,
    /// A verified answer that makes no sense (no CA in an issued chain, an unknown kind, a
    /// contradictory Ack).
    #[error("malformed answer: {0}")]
    Malformed(String),
}

/// Reads the gateway's answer `payload` (a [`SignedAnswer`](edgebeat_proto::SignedAnswer))
/// to the certificate request of `node` with `boot_tag` and `seq`, trusting it as `trust`
/// says (see [`AnswerTrust`]) at `now`.
///
/// Errors: [`ReadAnswerError`] when the answer does not verify or is not for this request.
pub fn read_answer(
    payload: &[u8],
    trust: AnswerTrust<'_>,
    node: &str,
    boot_tag: u32,
    seq: u64,
    now: rustls::pki_types::UnixTime,
) -> Result<Answered, ReadAnswerError> {
    use edgebeat_proto::gateway_message::Kind;
    use edgebeat_proto::{Answer, GatewayMessage};

    let malformed = |what: &str| ReadAnswerError::Malformed(what.to_owned());
    let verifier = match trust {
        AnswerTrust::Ca(pem) => crate::signing::AnswerVerifier::from_pem(pem)
            .map_err(|e| ReadAnswerError::Ca(e.to_string()))?,
        AnswerTrust::AnswerCas(answer_cas) => crate::signing::AnswerVerifier::pinned(answer_cas)
            .map_err(|e| ReadAnswerError::Ca(e.to_string()))?,
        AnswerTrust::Pin(pin) => {
            // The claim, unverified until its CA has the pin and its signature verifies.
            let signed = crate::signing::unseal_answer(payload)
                .ok_or(crate::signing::AnswerError::Unsigned)?;
            let claimed = GatewayMessage::decode(signed.signed_message.as_slice())
                .map_err(|e| ReadAnswerError::Malformed(e.to_string()))?;
            let Some(Kind::Certificate(issued)) = claimed.kind else {
                return Ok(Answered::Pending(
                    "an answer that cannot be verified before the site CA is known".into(),
                ));
            };
            let ca = issued
                .certificate_chain
                .last()
                .ok_or_else(|| malformed("an issued certificate without its CA"))?;
            if ca_pin(ca).map_err(|_| ReadAnswerError::NotPinned)? != pin {
                return Err(ReadAnswerError::NotPinned);
            }
            crate::signing::AnswerVerifier::from_der(ca)
                .map_err(|e| ReadAnswerError::Ca(e.to_string()))?
        }
    };
    let message = verifier.verify(payload, now)?;
    match message.kind {
        Some(Kind::Certificate(issued)) => {
            if issued.node_name != node || issued.boot_tag != boot_tag || issued.seq != seq {
                return Err(ReadAnswerError::OtherRequest);
            }
            if issued.certificate_chain.len() < 2 {
                return Err(malformed("an issued chain without the site CA"));
            }
            let ca = issued
                .certificate_chain
                .last()
                .cloned()
                .ok_or_else(|| malformed("an issued certificate without its CA"))?;
            if !issued.answer_cas.is_empty() {
                // The answer CAs named must include the issuer of this answer's key, and
                // none may be the site CA: a certificate the site CA issued directly can
                // then neither sign this answer nor name CAs of its own.
                let site_key = crate::signing::public_key_info(&ca)
                    .map_err(|e| ReadAnswerError::Malformed(format!("site CA: {e}")))?;
                for answer_ca in &issued.answer_cas {
                    if crate::signing::public_key_info(answer_ca)
                        .map_err(|e| ReadAnswerError::Malformed(format!("answer CA: {e}")))?
                        == site_key
                    {
                        return Err(malformed("the site CA named as an answer CA"));
                    }
                }
                crate::signing::AnswerVerifier::pinned(&issued.answer_cas)
                    .map_err(|e| ReadAnswerError::Malformed(format!("answer CAs: {e}")))?
                    .verify(payload, now)?;
            }
            Ok(Answered::Issued {
                chain: issued.certificate_chain,
                ca,
                answer_cas: issued.answer_cas,
            })
        }
        Some(Kind::Ack(ack)) => {
            if ack.node_name != node || ack.boot_tag != boot_tag || ack.seq != seq {
                return Err(ReadAnswerError::OtherRequest);
            }
            match Answer::try_from(ack).map_err(|e| ReadAnswerError::Malformed(e.to_string()))? {
                Answer::Rejected { reason } => Ok(Answered::Refused(reason)),
                other => Ok(Answered::Pending(other.reason().to_owned())),
            }
        }
        None => Err(malformed("an answer of an unknown kind")),
    }
}

/// A TLS server verifier for a board that knows only its bootstrap token's pin: the server
/// must present, in its chain, a CA certificate whose SubjectPublicKeyInfo has the pin
/// ([`ca_pin`]), and its certificate must chain to that CA and be valid for the name
/// dialled, as webpki checks against a CA file. For an MQTT broker whose certificate the
/// site CA issued (its certificate file holding the CA too), before the agent holds the CA.
#[derive(Debug)]
pub struct PinnedCaVerifier {
    pin: [u8; 32],
    provider: std::sync::Arc<rustls::crypto::CryptoProvider>,
}

impl PinnedCaVerifier {
    /// A verifier for the CA with `pin`, on ring.
    pub fn new(pin: [u8; 32]) -> Self {
        Self {
            pin,
            provider: std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        }
    }

    /// A rustls client configuration verifying servers with this pin (TLS 1.2 and 1.3),
    /// presenting no client certificate.
    ///
    /// Errors: [`TlsError::Rustls`](crate::tls::TlsError::Rustls) when the protocol
    /// versions cannot be set.
    pub fn client_config(pin: [u8; 32]) -> Result<rustls::ClientConfig, crate::tls::TlsError> {
        let verifier = std::sync::Arc::new(Self::new(pin));
        Ok(
            rustls::ClientConfig::builder_with_provider(verifier.provider.clone())
                .with_safe_default_protocol_versions()?
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth(),
        )
    }
}

impl rustls::client::danger::ServerCertVerifier for PinnedCaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| ca_pin(c).is_ok_and(|pin| pin == self.pin))
            .ok_or(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ))?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            self.provider.clone(),
        )
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?
        .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests;
