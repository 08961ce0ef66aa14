//! `AgentMessage::decode` on arbitrary bytes: the first thing every gateway ingress (gRPC
//! stream, MQTT publish) does with an agent's bytes.
//!
//! Checks: decoding never panics; a message that decodes re-encodes to exactly
//! `encoded_len()` bytes and decodes again to an equal message (round trip); `header()` and
//! `kind_name()` never panic and agree with each other.
#![no_main]

use edgebeat_proto::AgentMessage;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = AgentMessage::decode(data) else {
        return;
    };

    let kind = msg.kind_name();
    assert!(["register", "status", "lease", "unknown"].contains(&kind));
    if kind == "unknown" {
        assert!(msg.header().is_none(), "no kind but a header");
    }
    if let Some(h) = msg.header() {
        let _ = (h.node_name.len(), h.boot_id.len(), h.seq, h.wall_time_ms);
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
