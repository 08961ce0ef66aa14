//! Bootstrap tokens: Secrets of type [`TOKEN_SECRET_TYPE`] in the gateway's namespace, one per
//! token, each bound to node names or name patterns, an expiry and a use limit.

use std::time::Duration;

use edgebeat_transports::enroll::{BootstrapToken, TOKEN_ID_LEN, TOKEN_SECRET_LEN};
use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use super::EnrollmentError;
use crate::apiserver::answers;

/// Type of a bootstrap token's Secret.
pub const TOKEN_SECRET_TYPE: &str = "edgebeat.io/bootstrap-token";

/// Name of token `id`'s Secret: `edgebeat-token-<id>`.
pub fn token_secret_name(id: &str) -> String {
    format!("edgebeat-token-{id}")
}

/// One bootstrap token as the cluster keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSpec {
    /// The token's id.
    pub id: String,
    secret: String,
    /// When it stops enrolling.
    pub expires: Timestamp,
    /// Node names it may enroll: exact names, or prefixes ending in `*` (`plant-3-*`).
    pub nodes: Vec<String>,
    /// How many nodes it may enroll (CertificateSigningRequests it may create).
    pub usage_limit: u32,
    /// How many it has enrolled, as recorded in the Secret ([`USAGE_COUNT_KEY`]; 0 when
    /// absent).
    pub used: u32,
}

/// Key of a token Secret's data that counts the CSRs the token created, written by the
/// gateways ([`record_uses`]): the count survives CSRs being garbage-collected
/// (kube-controller-manager's csrcleaner deletes issued ones after an hour) and restarts.
pub const USAGE_COUNT_KEY: &str = "usage-count";

impl TokenSpec {
    /// The token's secret half.
    pub fn secret(&self) -> &[u8] {
        self.secret.as_bytes()
    }

    /// Whether the token may enroll `node`: it matches one of [`TokenSpec::nodes`], exactly
    /// or, for a pattern `prefix*`, by prefix.
    pub fn allows(&self, node: &str) -> bool {
        self.nodes
            .iter()
            .any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => node.starts_with(prefix),
                None => node == pattern,
            })
    }

    /// The token of `secret`; `None` when it is not a bootstrap token's Secret.
    ///
    /// Errors: [`EnrollmentError::Token`] naming the field that is missing or malformed.
    pub fn from_secret(secret: &Secret) -> Result<Self, EnrollmentError> {
        if secret.type_.as_deref() != Some(TOKEN_SECRET_TYPE) {
            return Err(EnrollmentError::Token(format!(
                "not of type {TOKEN_SECRET_TYPE}"
            )));
        }
        let field = |key: &str| {
            super::secret_text(secret, key)
                .ok_or_else(|| EnrollmentError::Token(format!("no {key}")))
        };
        let bad = |key: &str| EnrollmentError::Token(format!("malformed {key}"));
        Ok(Self {
            id: field("token-id")?,
            secret: field("token-secret")?,
            expires: field("expiration")?
                .parse()
                .map_err(|_| bad("expiration"))?,
            nodes: field("nodes")?
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect(),
            usage_limit: field("usage-limit")?
                .parse()
                .map_err(|_| bad("usage-limit"))?,
            used: match field(USAGE_COUNT_KEY) {
                Ok(count) => count.parse().map_err(|_| bad(USAGE_COUNT_KEY))?,
                Err(_) => 0,
            },
        })
    }

    fn to_secret(&self) -> Secret {
        let data = [
            ("token-id", self.id.clone()),
            ("token-secret", self.secret.clone()),
            (
                "expiration",
                self.expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            ),
            ("nodes", self.nodes.join(",")),
            ("usage-limit", self.usage_limit.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
        .collect();
        Secret {
            metadata: ObjectMeta {
                name: Some(token_secret_name(&self.id)),
                ..ObjectMeta::default()
            },
            type_: Some(TOKEN_SECRET_TYPE.to_owned()),
            data: Some(data),
            ..Secret::default()
        }
    }
}

/// Adds `n` to token `id`'s [`USAGE_COUNT_KEY`] in `namespace`, with the Secret's
/// resourceVersion (a PUT that another writer's change makes fail with 409 is read and tried
/// again, up to 10 times). Returns the count written.
///
/// Errors: [`EnrollmentError::Apiserver`] (the Secret gone, conflicts past the tries), or
/// [`EnrollmentError::Token`] for a Secret that is not a token's.
pub async fn record_uses(
    client: kube::Client,
    namespace: &str,
    id: &str,
    n: u32,
) -> Result<u32, EnrollmentError> {
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    let name = token_secret_name(id);
    let mut tries = 0;
    loop {
        let mut secret = secrets.get(&name).await?;
        let count = TokenSpec::from_secret(&secret)?.used.saturating_add(n);
        secret.data.get_or_insert_default().insert(
            USAGE_COUNT_KEY.to_owned(),
            ByteString(count.to_string().into_bytes()),
        );
        match secrets
            .replace(&name, &PostParams::default(), &secret)
            .await
        {
            Ok(_) => return Ok(count),
            Err(e) if answers::is_conflict(&e) && tries < 10 => tries += 1,
            Err(e) => return Err(e.into()),
        }
    }
}

/// `len` random characters of `[a-z0-9]` from the system's random source.
fn random_chars(len: usize) -> Result<String, EnrollmentError> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(len);
    let rng = ring::rand::SystemRandom::new();
    while out.len() < len {
        let mut byte = [0u8; 1];
        ring::rand::SecureRandom::fill(&rng, &mut byte)
            .map_err(|_| EnrollmentError::Token("the random source failed".into()))?;
        // 252 = 7 × 36: drop the rest, so every character is equally likely.
        if byte[0] < 252 {
            out.push(char::from(ALPHABET[usize::from(byte[0]) % ALPHABET.len()]));
        }
    }
    Ok(out)
}

/// Makes a bootstrap token for `nodes` (names or `prefix*` patterns) that enrolls at most
/// `uses` nodes within `ttl` from `now`, stores it as a Secret in `namespace`, and returns
/// the token (with the site CA's `pin`) to give the boards.
///
/// Errors: [`EnrollmentError::Token`] for no node names, or one that is neither a node name
/// nor a non-empty prefix ending in `*`; [`EnrollmentError::Apiserver`] when the Secret
/// cannot be created.
pub async fn create_token(
    client: kube::Client,
    namespace: &str,
    nodes: Vec<String>,
    ttl: Duration,
    uses: u32,
    pin: [u8; 32],
    now: Timestamp,
) -> Result<BootstrapToken, EnrollmentError> {
    if nodes.is_empty() {
        return Err(EnrollmentError::Token(
            "no node names: give --nodes, e.g. 'plant-3-*' or 'edge-01,edge-02'".into(),
        ));
    }
    for pattern in &nodes {
        let name = pattern.strip_suffix('*').unwrap_or(pattern);
        let node_chars = name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if name.is_empty() || !node_chars {
            return Err(EnrollmentError::Token(format!(
                "{pattern:?} is not a node name or a name prefix ending in * (e.g. plant-3-*)"
            )));
        }
    }
    let ttl = jiff::SignedDuration::try_from(ttl)
        .map_err(|e| EnrollmentError::Token(format!("--ttl: {e}")))?;
    let spec = TokenSpec {
        id: random_chars(TOKEN_ID_LEN)?,
        secret: random_chars(TOKEN_SECRET_LEN)?,
        expires: now
            .checked_add(ttl)
            .map_err(|e| EnrollmentError::Token(format!("--ttl: {e}")))?,
        nodes,
        usage_limit: uses,
        used: 0,
    };
    let token = BootstrapToken::new(&spec.id, &spec.secret, pin)
        .map_err(|e| EnrollmentError::Token(e.to_string()))?;
    Api::<Secret>::namespaced(client, namespace)
        .create(&PostParams::default(), &spec.to_secret())
        .await?;
    Ok(token)
}

/// The token `id` of `namespace`, `None` when there is no such Secret.
///
/// Errors: [`EnrollmentError::Apiserver`], or [`EnrollmentError::Token`] for a Secret that
/// is not a well-formed bootstrap token.
pub async fn read_token(
    client: kube::Client,
    namespace: &str,
    id: &str,
) -> Result<Option<TokenSpec>, EnrollmentError> {
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    match secrets.get_opt(&token_secret_name(id)).await? {
        Some(secret) => TokenSpec::from_secret(&secret).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_by_name_or_prefix() {
        let spec = TokenSpec {
            id: "abcdef".into(),
            secret: "0123456789abcdef".into(),
            expires: Timestamp::UNIX_EPOCH,
            nodes: vec!["plant-3-*".into(), "edge-01".into()],
            usage_limit: 2,
            used: 0,
        };
        assert!(spec.allows("plant-3-17"));
        assert!(spec.allows("edge-01"));
        assert!(!spec.allows("plant-4-01"));
        assert!(!spec.allows("edge-011"));
        assert!(!spec.allows("xplant-3-1"));
        let again = TokenSpec::from_secret(&spec.to_secret()).unwrap();
        assert_eq!(again, spec);
    }

    #[test]
    fn random_tokens_are_kubeadms_shape() {
        let id = random_chars(TOKEN_ID_LEN).unwrap();
        let secret = random_chars(TOKEN_SECRET_LEN).unwrap();
        BootstrapToken::new(&id, &secret, [0; 32]).unwrap();
        assert_ne!(random_chars(16).unwrap(), random_chars(16).unwrap());
    }
}
