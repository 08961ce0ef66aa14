//! The subcommands of `edgebeat-gateway`: one-shot actions on the site's Secrets, beside
//! serving ([`crate::server::Server`]).

use std::time::Duration;

use crate::apiserver::kube_client;
use crate::cli::{ClusterArgs, KubeConfigError};
use crate::enrollment::EnrollmentError;
use crate::enrollment::ca::{AnswerCaRotation, SiteCa};

/// Why a subcommand did not do its work.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// No apiserver configuration from `--server`, `--kubeconfig` or the environment.
    #[error(transparent)]
    KubeConfig(#[from] KubeConfigError),
    /// The apiserver client cannot be built from the configuration found.
    #[error(transparent)]
    Client(#[from] kube::Error),
    /// The site CA cannot be read, made or used, or the bootstrap token cannot be written
    /// (the apiserver refused, or the Secret's content is not a site CA).
    #[error(transparent)]
    Token(#[from] EnrollmentError),
    /// A step of the answer CA's rotation failed (`answer-ca rotate`).
    #[error("rotating the answer CA")]
    RotateAnswerCa(#[source] EnrollmentError),
}

/// `token create`: makes a bootstrap token for `uses` nodes matching `nodes`, valid for
/// `ttl`, and prints it on stdout (and what it allows on stderr). Makes the site CA first
/// when there is none (README "Enrolling boards").
///
/// # Errors
/// [`CommandError::KubeConfig`] or [`CommandError::Client`]: no apiserver configuration;
/// [`CommandError::Token`]: the apiserver refused reading or writing the Secrets, or the
/// site CA's Secret holds no usable CA.
pub async fn token_create(
    cluster: &ClusterArgs,
    nodes: Vec<String>,
    ttl: Duration,
    uses: u32,
) -> Result<(), CommandError> {
    let client = kube_client(
        cluster.kube_config().await?,
        0,
        &crate::apiserver::requests::RequestMetrics::default(),
    )?;
    let namespace = cluster.namespace();
    let now = jiff::Timestamp::now();
    let ca = SiteCa::load_or_create(client.clone(), &namespace, now.as_second()).await?;
    let token = crate::enrollment::tokens::create_token(
        client,
        &namespace,
        nodes.clone(),
        ttl,
        uses,
        ca.pin()?,
        now,
    )
    .await?;
    eprintln!(
        "bootstrap token {} for {} node(s) matching {}, valid {}s (Secret {}/{}):",
        token.id,
        uses,
        nodes.join(","),
        ttl.as_secs(),
        namespace,
        crate::enrollment::tokens::token_secret_name(&token.id)
    );
    println!("{token}");
    Ok(())
}

/// `answer-ca rotate`: one step of a rotation of the answer CA in the Secret
/// edgebeat-site-ca of `--namespace`, said on stderr (README "Rotating the answer CA").
///
/// # Errors
/// [`CommandError::KubeConfig`] or [`CommandError::Client`]: no apiserver configuration;
/// [`CommandError::RotateAnswerCa`]: no usable site CA, or the apiserver refused the write.
pub async fn answer_ca_rotate(cluster: &ClusterArgs) -> Result<(), CommandError> {
    let client = kube_client(
        cluster.kube_config().await?,
        0,
        &crate::apiserver::requests::RequestMetrics::default(),
    )?;
    let namespace = cluster.namespace();
    let now = jiff::Timestamp::now().as_second();
    let step = SiteCa::rotate_in_secret(client, &namespace, now)
        .await
        .map_err(CommandError::RotateAnswerCa)?;
    eprintln!(
        "{}",
        match step {
            AnswerCaRotation::Added =>
                "added a new answer CA behind the current one: restart the gateway; agents learn it at their next certificate. Run this again, to retire the old one, once every agent has rotated (a node certificate lifetime).",
            AnswerCaRotation::Retired =>
                "retired the old answer CA: restart the gateway; it signs with the new one, and agents drop the old one at their next certificate.",
        }
    );
    Ok(())
}
