//! `AgentMessage::decode` on arbitrary bytes: the first thing every gateway ingress (gRPC
//! stream, MQTT publish) does with an agent's bytes.
//!
//! Checks: decoding never panics; a message that decodes re-encodes to exactly
//! `encoded_len()` bytes and decodes again to an equal message (round trip); `header()` and
//! `kind_name()` never panic and agree with each other. The same bytes read as an
//! enrollment `CertificateRequest`: the clock window (`signing::check_clock_window`, the
//! gateway's one rule for MQTT messages and certificate requests) judges any header's
//! `wall_time_ms` without panicking and agrees with the same rule in 128-bit arithmetic.
#![no_main]

use std::time::Duration;

use edgebeat_proto::{AgentMessage, CertificateRequest, Header};
use edgebeat_transports::signing::check_clock_window;
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// The clock window at a fixed gateway clock, against its definition in `i128`.
fn clock_window_agrees(header: &Header) {
    const NOW: Duration = Duration::from_millis(1_780_000_000_123);
    const MAX: Duration = Duration::from_secs(30);
    let inside = (i128::from(header.wall_time_ms) - NOW.as_millis() as i128).abs()
        <= MAX.as_millis() as i128;
    assert_eq!(
        check_clock_window(header.wall_time_ms, NOW, MAX).is_ok(),
        inside,
        "clock window wrong for wall_time_ms {}",
        header.wall_time_ms
    );
}

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = CertificateRequest::decode(data)
        && let Some(header) = &request.header
    {
        clock_window_agrees(header);
    }
    let Ok(msg) = AgentMessage::decode(data) else {
        return;
    };

    let kind = msg.kind_name();
    assert!(["register", "status", "lease", "unknown"].contains(&kind));
    if kind == "unknown" {
        assert!(msg.header().is_none(), "no kind but a header");
    }
    if let Some(h) = msg.header() {
        let _ = (h.node_name.len(), h.boot_id.len(), h.seq);
        clock_window_agrees(h);
    }

    let bytes = msg.encode_to_vec();
    assert_eq!(
        bytes.len(),
        msg.encoded_len(),
        "encoded_len disagrees with encode"
    );
    let again = match AgentMessage::decode(bytes.as_slice()) {
        Ok(m) => m,
        Err(e) => panic!("re-encoded message does not decode: {e}"),
    };
    assert_eq!(again, msg, "round trip changed the message");
    assert_eq!(again.kind_name(), kind);
    assert_eq!(again.header(), msg.header());
});
