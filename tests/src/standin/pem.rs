//! PEM and X.509 as the certificates API checks them: Go's `encoding/pem` `Decode`
//! (`src/encoding/pem/pem.go`), `certificates.ParseCSR` followed by `CheckSignature`
//! (`pkg/apis/certificates/helpers.go`, `validateCSR` in
//! `pkg/apis/certificates/validation/validation.go`) and `validateCertificate`'s
//! `x509.ParseCertificates`.
//!
//! The PKCS#10 parse and signature check is rcgen's (x509-parser's parser and verifier;
//! rcgen's `x509-parser` feature is on in this build through edgebeat-gateway), the X.509
//! certificate parse is webpki's (through rustls). Their error texts are not Go's: where Go
//! would print an `encoding/asn1` or `crypto/x509` error, the stand-in says so in its own
//! words; the messages Kubernetes itself writes are exact.

use rustls::pki_types::{CertificateDer, CertificateSigningRequestDer};

/// A PEM block (`pem.Block`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    /// The label of the `-----BEGIN <label>-----` line (`Type`).
    pub(crate) label: String,
    /// Whether the block had `Key: value` header lines.
    pub(crate) has_headers: bool,
    /// The decoded body.
    pub(crate) bytes: Vec<u8>,
}

const PEM_START: &[u8] = b"\n-----BEGIN ";
const PEM_END: &[u8] = b"\n-----END ";
const PEM_END_OF_LINE: &[u8] = b"-----";

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Go's `getLine`: the line (without `\r\n`, trailing spaces and tabs) and what follows it.
fn get_line(data: &[u8]) -> (&[u8], &[u8]) {
    let (mut end, next) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (i, i + 1),
        None => (data.len(), data.len()),
    };
    if end > 0 && end < data.len() && data[end - 1] == b'\r' {
        end -= 1;
    }
    let mut line = &data[..end];
    while let [head @ .., b' ' | b'\t'] = line {
        line = head;
    }
    (line, &data[next..])
}

/// Standard base64 with padding, ignoring `\r`, `\n`, spaces and tabs (what `pem.Decode`
/// feeds `base64.StdEncoding.Decode`).
fn base64_decode(data: &[u8]) -> Option<Vec<u8>> {
    let clean: String = data
        .iter()
        .filter(|b| !matches!(b, b'\r' | b'\n' | b' ' | b'\t'))
        .map(|&b| char::from(b))
        .collect();
    serde_json::from_value::<k8s_openapi::ByteString>(serde_json::Value::String(clean))
        .ok()
        .map(|b| b.0)
}

/// `pem.Decode`: the first well-formed PEM block of `data` and the bytes after it.
pub(crate) fn decode(data: &[u8]) -> Option<(Block, &[u8])> {
    let mut rest = data;
    loop {
        if let Some(after) = rest.strip_prefix(&PEM_START[1..]) {
            rest = after;
        } else if let Some(i) = find(rest, PEM_START) {
            rest = &rest[i + PEM_START.len()..];
        } else {
            return None;
        }
        let (type_line, after_type) = get_line(rest);
        rest = after_type;
        let Some(label) = type_line.strip_suffix(PEM_END_OF_LINE) else {
            continue;
        };
        let mut has_headers = false;
        loop {
            if rest.is_empty() {
                return None;
            }
            let (line, next) = get_line(rest);
            if !line.contains(&b':') {
                break;
            }
            has_headers = true;
            rest = next;
        }
        let (end_index, end_trailer_index) = if !has_headers && rest.starts_with(&PEM_END[1..]) {
            (0, PEM_END.len() - 1)
        } else {
            match find(rest, PEM_END) {
                Some(i) => (i, i + PEM_END.len()),
                None => continue,
            }
        };
        let end_trailer = &rest[end_trailer_index..];
        let trailer_len = label.len() + PEM_END_OF_LINE.len();
        if end_trailer.len() < trailer_len {
            continue;
        }
        let (trailer, rest_of_end_line) = end_trailer.split_at(trailer_len);
        if !trailer.starts_with(label) || !trailer.ends_with(PEM_END_OF_LINE) {
            continue;
        }
        if !get_line(rest_of_end_line).0.is_empty() {
            continue;
        }
        let Some(bytes) = base64_decode(&rest[..end_index]) else {
            continue;
        };
        let (_, after) = get_line(&rest[end_index + PEM_END.len() - 1..]);
        let block = Block {
            label: String::from_utf8_lossy(label).into_owned(),
            has_headers,
            bytes,
        };
        return Some((block, after));
    }
}

/// The length of the DER element at the start of `der` (tag, length and contents), if its
/// header is well formed and it fits.
fn der_element_len(der: &[u8]) -> Option<usize> {
    let first = *der.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let len = der
            .get(2..2 + n)?
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, 2 + n)
    };
    let total = header.checked_add(len)?;
    (total <= der.len()).then_some(total)
}

/// What `certificates.ParseCSR` returns for `pem` (without the signature check): the DER
/// of the first PEM block if it is a `CERTIFICATE REQUEST`.
fn csr_der(pem: &[u8]) -> Result<Vec<u8>, String> {
    match decode(pem) {
        Some((block, _)) if block.label == "CERTIFICATE REQUEST" => Ok(block.bytes),
        _ => Err("PEM block type must be CERTIFICATE REQUEST".to_string()),
    }
}

/// `ParseCSR` then `CheckSignature`: Ok when the request parsed and its self-signature
/// verified; the error text is what `spec.request` is Invalid with.
pub(crate) fn parse_and_verify_csr(pem: &[u8]) -> Result<(), String> {
    let der = csr_der(pem)?;
    match der_element_len(&der) {
        Some(n) if der.first() == Some(&0x30) && n == der.len() => {}
        Some(n) if der.first() == Some(&0x30) && n < der.len() => {
            return Err("asn1: syntax error: trailing data".to_string());
        }
        _ => return Err(malformed_request()),
    }
    let params = rcgen::CertificateSigningRequestParams::from_der(
        &CertificateSigningRequestDer::from(der.as_slice()),
    );
    match params {
        Ok(_) => Ok(()),
        Err(rcgen::Error::CouldNotParseCertificationRequest) => Err(malformed_request()),
        Err(rcgen::Error::InvalidCertificationRequestSignature) => Err(signature_error(&der)),
        // Everything rcgen checks after the signature is beyond what Go checks: the request
        // parsed and its signature verified.
        Err(_) => Ok(()),
    }
}

fn malformed_request() -> String {
    "asn1: structure error: the edgebeat stand-in cannot parse this as a PKCS#10 \
     CertificationRequest (the real server reports encoding/asn1's error)"
        .to_string()
}

/// `CheckSignature`'s error, by the key algorithm named in the request.
fn signature_error(der: &[u8]) -> String {
    // OIDs as DER: id-Ed25519 (1.3.101.112), id-ecPublicKey (1.2.840.10045.2.1).
    const ED25519: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];
    const EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    if find(der, ED25519).is_some() {
        "x509: Ed25519 verification failure".to_string()
    } else if find(der, EC_PUBLIC_KEY).is_some() {
        "x509: ECDSA verification failure".to_string()
    } else {
        "crypto/rsa: verification error".to_string()
    }
}

/// `validateCertificate` of `pkg/apis/certificates/validation/validation.go`: empty is
/// fine; otherwise one or more PEM blocks, all `CERTIFICATE` without headers, each holding
/// one or more X.509 certificates. Non-PEM text around the blocks is ignored.
pub(crate) fn validate_certificate(pem: &[u8]) -> Result<(), String> {
    if pem.is_empty() {
        return Ok(());
    }
    let mut rest = pem;
    let mut blocks = 0;
    while let Some((block, after)) = decode(rest) {
        if block.label != "CERTIFICATE" {
            return Err(format!(
                "only CERTIFICATE PEM blocks are allowed, found {}",
                super::validation::q(&block.label)
            ));
        }
        if block.has_headers {
            return Err("no PEM block headers are permitted".to_string());
        }
        blocks += 1;
        let mut der = block.bytes.as_slice();
        if der.is_empty() {
            return Err("found CERTIFICATE PEM block containing 0 certificates".to_string());
        }
        while !der.is_empty() {
            let n = der_element_len(der).ok_or_else(malformed_certificate)?;
            let cert = CertificateDer::from(&der[..n]);
            rustls::server::ParsedCertificate::try_from(&cert)
                .map_err(|_| malformed_certificate())?;
            der = &der[n..];
        }
        rest = after;
    }
    if blocks == 0 {
        return Err("must contain at least one CERTIFICATE PEM block".to_string());
    }
    Ok(())
}

fn malformed_certificate() -> String {
    "x509: malformed certificate (the edgebeat stand-in's wording; it parses with webpki)"
        .to_string()
}
