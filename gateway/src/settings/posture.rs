//! The gateway's one security posture ([`Posture`]), decided from the configured ingresses
//! and `--allow-unidentified-agents`.

use crate::admission::Posture;

use super::error::{self, SettingsError};
use super::{GrpcSettings, MqttSettings};

/// The gateway's one security posture, from the configured ingresses: at least one
/// ingress; every ingress requires node identities ([`Posture::Identified`]) unless
/// --allow-unidentified-agents, and then each unidentified ingress is logged as a warning.
///
/// Errors: [`SettingsError::NoIngress`], or [`SettingsError::UnidentifiedAgents`] for an
/// ingress that lets unidentified agents in without the opt-in; the message names the
/// flags that fix it.
pub(crate) fn posture(
    allow_unidentified_agents: bool,
    grpc: Option<&GrpcSettings>,
    mqtt: Option<&MqttSettings>,
) -> Result<Posture, SettingsError> {
    if grpc.is_none() && mqtt.is_none() {
        return Err(SettingsError::NoIngress);
    }
    let grpc_unidentified = grpc.is_some_and(|g| !g.options.require_node_identity);
    let mqtt_unidentified = mqtt.is_some_and(|m| !m.require_signatures);
    let unidentified = error::unidentified_ingresses(grpc_unidentified, mqtt_unidentified);
    match (unidentified.is_empty(), allow_unidentified_agents) {
        (true, false) => Ok(Posture::Identified),
        (true, true) => {
            tracing::info!(
                "--allow-unidentified-agents has no effect: every ingress requires node identities"
            );
            Ok(Posture::Identified)
        }
        (false, true) => {
            for ingress in &unidentified {
                tracing::warn!(
                    "--allow-unidentified-agents: {ingress}; anyone who reaches it can write any node that has not spoken with its identity"
                );
            }
            Ok(Posture::AllowUnidentified)
        }
        (false, false) => Err(SettingsError::UnidentifiedAgents {
            grpc: grpc_unidentified,
            mqtt: mqtt_unidentified,
        }),
    }
}
