//! [`SettingsError`]: one variant per flag problem, each saying the flag and the fix (the
//! words the gateway has always printed: operators and scripts may look for them).

use std::path::PathBuf;

use edgebeat_hw::BoundedReadError;
use edgebeat_transports::signing::AnswerSignerError;
use edgebeat_transports::tls::TlsError;

use crate::cli::KubeConfigError;
use crate::enrollment::{DEFAULT_SIGNER_NAME, KUBELET_SIGNER_NAME};

/// Why the command line cannot be served: a flag without the one it needs, a value the
/// gateway does not take, or a file that cannot be read or used. The message names the
/// flag and the fix; a file's own problem follows as the error's source.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// No apiserver configuration from `--server`, `--kubeconfig` or the environment.
    #[error(transparent)]
    KubeConfig(#[from] KubeConfigError),
    /// A file of `flag` cannot be read, or is larger than a PEM file can be
    /// ([`edgebeat_hw::MAX_PEM_FILE_BYTES`]).
    #[error("{flag} {}", path.display())]
    ReadFile {
        /// The flag that names the file, e.g. `--grpc-tls-cert`.
        flag: &'static str,
        /// The file given.
        path: PathBuf,
        /// Why it cannot be read.
        #[source]
        source: BoundedReadError,
    },
    /// `--mqtt-password-file` cannot be read, or is not a short UTF-8 text
    /// ([`edgebeat_hw::read_password_file`]).
    #[error("--mqtt-password-file")]
    PasswordFile(#[source] BoundedReadError),
    /// A `--signer-name` other than the gateway's own and kubelet's: another signer's
    /// approval needs RBAC `approve` on it, and its intermediates would not reach the agents.
    #[error(
        "--signer-name {name:?}: {DEFAULT_SIGNER_NAME} (the gateway approves and signs) or {KUBELET_SIGNER_NAME} (kube-controller-manager approves and signs); no other signer is supported"
    )]
    UnsupportedSigner {
        /// The name given.
        name: String,
    },
    /// `--csr-approval=manual` with kubelet's signer, whose requests kube-controller-manager
    /// approves itself (`pkg/controller/certificates/approver/sarapprove.go`).
    #[error(
        "--csr-approval=manual with --signer-name {KUBELET_SIGNER_NAME}: kube-controller-manager approves that signer's requests itself (nodeclient), so none would wait for kubectl certificate approve; use --csr-approval=auto, or the gateway's own signer for manual approval"
    )]
    ManualApprovalWithKubeletSigner,
    /// Kubelet's signer without `--signer-ca`, the CA its certificates are verified against.
    #[error(
        "--signer-name {KUBELET_SIGNER_NAME} needs --signer-ca: the PEM file of the CA kube-controller-manager signs with (the cluster CA: the ConfigMap kube-root-ca.crt in most clusters), which the gateway verifies node certificates against"
    )]
    SignerCaMissing,
    /// `--signer-ca` with the gateway's own signer, whose CA is the site CA.
    #[error(
        "--signer-ca is for a --signer-name other than the gateway's own ({DEFAULT_SIGNER_NAME}), whose CA is the site CA"
    )]
    SignerCaWithOwnSigner,
    /// `--signer-ca` holds no usable CA certificate.
    #[error("--signer-ca {}", path.display())]
    SignerCaUnusable {
        /// The file given.
        path: PathBuf,
        /// What is wrong with its content.
        #[source]
        source: TlsError,
    },
    /// The `--resource-metrics-*` TLS files do not make a serving certificate.
    #[error(
        "--resource-metrics-tls-cert, --resource-metrics-tls-key, --resource-metrics-client-ca"
    )]
    ResourceMetricsTls(#[source] TlsError),
    /// `--mqtt-endpoint` URLs that are not `mqtt://` or `mqtts://` brokers of one cluster
    /// (every problem found, `; `-separated).
    #[error("--mqtt-endpoint: {}", problems.join("; "))]
    MqttEndpoint {
        /// What is wrong, one entry per problem.
        problems: Vec<String>,
    },
    /// An `mqtts://` `--mqtt-endpoint` without `--mqtt-ca-file`.
    #[error(
        "--mqtt-endpoint {url:?} is mqtts:// and needs --mqtt-ca-file (the CA of the broker's certificate)"
    )]
    MqttsWithoutCaFile {
        /// The first `--mqtt-endpoint`.
        url: String,
    },
    /// `--mqtt-ca-file` or `--mqtt-cert-file` with a plain `mqtt://` `--mqtt-endpoint`.
    #[error("--mqtt-ca-file and --mqtt-cert-file need an mqtts:// --mqtt-endpoint, not {url:?}")]
    MqttTlsFilesWithoutMqtts {
        /// The first `--mqtt-endpoint`.
        url: String,
    },
    /// The broker TLS files do not make a client configuration.
    #[error("--mqtt-ca-file, --mqtt-cert-file, --mqtt-key-file")]
    MqttTls(#[source] TlsError),
    /// `--mqtt-node-ca` holds no usable CA certificate.
    #[error("--mqtt-node-ca {}", path.display())]
    NodeCaUnusable {
        /// The file given.
        path: PathBuf,
        /// What is wrong with its content.
        #[source]
        source: TlsError,
    },
    /// The node CAs at serving (`--mqtt-node-ca` with the site CA under `--enrollment`)
    /// cannot verify signatures.
    #[error("--mqtt-node-ca")]
    NodeCas(#[source] TlsError),
    /// The answer key of `--mqtt-answer-cert-file` and `--mqtt-answer-key-file` cannot sign
    /// answers agents take.
    #[error("--mqtt-answer-cert-file, --mqtt-answer-key-file")]
    AnswerKey(#[source] AnswerSignerError),
    /// `--mqtt-node-ca` with no answer key: agents that sign take only signed answers.
    #[error(
        "--mqtt-node-ca needs --mqtt-answer-cert-file and --mqtt-answer-key-file (or --enrollment): agents that sign their messages take only answers the gateway signs; issue a server certificate for the DNS name {name} from the site CA (README, \"MQTT over TLS with signed messages\")",
        name = edgebeat_transports::signing::ANSWER_SIGNER_NAME
    )]
    NodeCaWithoutAnswerKey,
    /// `--mqtt-require-signatures` with no CA to verify them against.
    #[error(
        "--mqtt-require-signatures needs --mqtt-node-ca (or --enrollment): signatures are verified against node certificates from the site CA"
    )]
    SignaturesWithoutNodeCa,
    /// `--require-node-identity` with no CA for client certificates.
    #[error(
        "--require-node-identity needs --grpc-client-ca (or --enrollment): node identities come from client certificates"
    )]
    NodeIdentityWithoutClientCa,
    /// `--grpc-tls-cert` holds no certificate.
    #[error("--grpc-tls-cert {}", path.display())]
    GrpcTlsCert {
        /// The file given.
        path: PathBuf,
        /// What is wrong with its content.
        #[source]
        source: TlsError,
    },
    /// `--grpc-tls-key` holds no private key.
    #[error("--grpc-tls-key {}", path.display())]
    GrpcTlsKey {
        /// The file given.
        path: PathBuf,
        /// What is wrong with its content.
        #[source]
        source: TlsError,
    },
    /// The gRPC TLS files do not go together (a key not of the certificate, a client CA
    /// with no usable certificate).
    #[error("--grpc-tls-cert, --grpc-tls-key, --grpc-client-ca")]
    GrpcTls(#[source] TlsError),
    /// Neither `--grpc-listen` nor `--mqtt-endpoint`.
    #[error(
        "no ingress: pass --grpc-listen (with --grpc-client-ca for mTLS), --mqtt-endpoint (with --mqtt-node-ca for signed messages), or both"
    )]
    NoIngress,
    /// An ingress that lets agents in without a node identity, without
    /// `--allow-unidentified-agents`: `grpc` and `mqtt` say which.
    #[error(
        "{}; require node identities there, or pass --allow-unidentified-agents to accept that anyone who reaches it can write nodes",
        unidentified_ingresses(*grpc, *mqtt).join("; ")
    )]
    UnidentifiedAgents {
        /// The gRPC ingress lets in agents without a node certificate.
        grpc: bool,
        /// The MQTT ingress lets in unsigned messages.
        mqtt: bool,
    },
}

/// What the gRPC ingress lets in, and the fix, when it takes agents without a node
/// certificate.
const GRPC_UNIDENTIFIED: &str = "gRPC lets in agents without a node certificate (add --grpc-tls-cert, --grpc-tls-key and --grpc-client-ca, without --require-node-identity=false)";

/// What the MQTT ingress lets in, and the fix, when it takes unsigned messages.
const MQTT_UNIDENTIFIED: &str =
    "MQTT lets in unsigned messages (add --mqtt-node-ca, without --mqtt-require-signatures=false)";

/// The ingresses that let unidentified agents in, each with its fix: gRPC first.
pub(super) fn unidentified_ingresses(grpc: bool, mqtt: bool) -> Vec<&'static str> {
    [(grpc, GRPC_UNIDENTIFIED), (mqtt, MQTT_UNIDENTIFIED)]
        .into_iter()
        .filter_map(|(unidentified, text)| unidentified.then_some(text))
        .collect()
}
