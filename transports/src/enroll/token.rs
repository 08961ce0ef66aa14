//! Bootstrap tokens: their text (`<id>.<secret>.sha256:<hex>`), and the HMAC proof with which
//! a token vouches for one certificate request while its secret never travels.

use std::fmt;
use std::str::FromStr;

use edgebeat_proto::Header;

use super::EnrollError;

/// Domain separation prefix of a bootstrap token's proof: `"edgebeat.v1 certificate
/// request"` and a NUL byte (32 bytes).
pub const ENROLL_CONTEXT: &[u8] = b"edgebeat.v1 certificate request\0";

/// Length of a token id (`[a-z0-9]`), as kubeadm's bootstrap tokens: 6.
pub const TOKEN_ID_LEN: usize = 6;

/// Length of a token secret (`[a-z0-9]`), as kubeadm's bootstrap tokens: 16.
pub const TOKEN_SECRET_LEN: usize = 16;

/// A bootstrap token as operators give it to boards: `<id>.<secret>.sha256:<hex>`, where id
/// and secret are kubeadm's token halves (6 and 16 characters of `[a-z0-9]`) and the hex is
/// the SHA-256 of the site CA's SubjectPublicKeyInfo (kubeadm's
/// `discovery-token-ca-cert-hash`, [`ca_pin`](super::ca_pin)): the board trusts the CA that has it, and
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
/// [`CertificateRequest`](edgebeat_proto::CertificateRequest)): it binds the token to this request, so the secret never
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
