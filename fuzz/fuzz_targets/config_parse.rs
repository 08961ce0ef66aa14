//! `AgentConfig::from_yaml` on arbitrary text (bytes read as lossy UTF-8): the agent's
//! configuration file, parsed by serde-saphyr and then validated field by field (durations,
//! quantities, addresses, node name, transport).
//!
//! Checks: parsing never panics, whatever the YAML; errors are fine. An accepted config
//! answers `lease_renew_interval()` without panicking.
#![no_main]

use edgebeat_agent::AgentConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match AgentConfig::from_yaml(&text) {
        Ok(config) => {
            let _ = config.lease_renew_interval();
            let _ = format!("{config:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
