//! End-to-end harness: a stand-in apiserver, gateway replicas, a real Mosquitto broker when
//! the transport is MQTT, and agents started in-process with short heartbeat intervals.
//!
//! Everything talks over real sockets: the agent's tonic client to the gateway's tonic
//! server or rumqttc through Mosquitto, the gateway's kube-rs client to the stand-in over
//! HTTP. Each replica is the binary's own [`edgebeat_gateway::server::Server`], given
//! [`edgebeat_gateway::settings::Settings`] built here instead of from flags (in-memory
//! TLS material, test-sized limits), so every scenario runs the binary's wiring: its
//! posture check, its wait for the watches, its ingresses and their drain.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use edgebeat_agent::config::{GrpcUplinkOptions, MqttUplinkOptions, TransportConfig};
use edgebeat_agent::{Agent, AgentConfig};
use edgebeat_gateway::apiserver::kube_client;
use edgebeat_gateway::message_path::{Gateway, GatewayOptions};
use edgebeat_hw::{Clock, SystemClock};
use edgebeat_transports::grpc::GrpcServerOptions;
use edgebeat_transports::mqtt::MqttIngressOptions;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::standin::{StandIn, StandInHandle};

/// Which transport the agents of a [`Cluster`] use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// gRPC to the gateway's listener.
    Grpc,
    /// MQTT 5 through a real Mosquitto broker; gateways share one subscription group.
    Mqtt,
}

/// One running gateway replica.
pub struct Replica {
    /// The gateway core, for its counters.
    pub gateway: Arc<Gateway>,
    /// Its enrollment side, in a [`Cluster::start_enrolling`] cluster.
    pub enrollment: Option<Arc<edgebeat_gateway::enrollment::Enrollment>>,
    /// Its kube clients' requests, as the gateway binary registers them on `/metrics`.
    pub requests: edgebeat_gateway::apiserver::requests::RequestMetrics,
    /// Where it serves `/healthz`, `/readyz` and `/metrics`.
    pub metrics_addr: SocketAddr,
    cancel: CancellationToken,
    /// The replica's server ([`edgebeat_gateway::server::Running::wait`]): aborting it
    /// aborts every task of the replica.
    task: JoinHandle<()>,
}

/// A stand-in apiserver, gateway replicas and (for MQTT) a broker.
pub struct Cluster {
    /// The stand-in apiserver (a test double).
    pub standin: StandInHandle,
    /// The Mosquitto broker, for [`Transport::Mqtt`].
    pub broker: Option<Broker>,
    /// Gateway replicas by index; `None` once stopped. gRPC has only replica 0.
    pub replicas: Vec<Option<Replica>>,
    /// `http://127.0.0.1:PORT` of the gateway's gRPC listener (`https://` with TLS).
    pub grpc_url: String,
    /// Transport the agents use.
    pub transport: Transport,
    /// gRPC server options every replica is started with (TLS, node identity).
    grpc_options: GrpcServerOptions,
    /// MQTT over TLS with signed messages, when the cluster was started with it.
    mqtt_security: Option<MqttSecurity>,
    /// Enrollment of node certificates, when the cluster was started with it.
    pub enrolling: Option<EnrollingSite>,
}

/// What the replicas of a [`Cluster::start_enrolling`] cluster enroll with, and where.
#[derive(Debug, Clone)]
pub struct EnrollingSite {
    /// Every replica's enrollment options (one site CA Secret between them).
    pub options: edgebeat_gateway::enrollment::EnrollmentOptions,
    /// The broker's own CA (MQTT): a CA of its own, not the site CA, as a broker run by a
    /// third party has; agents carry it as `transport.caFile`.
    pub broker_ca_pem: Option<String>,
    /// `http://127.0.0.1:PORT` of each replica's gRPC enrollment listener (gRPC), by
    /// replica index.
    pub enrollment_urls: Vec<String>,
}

/// MQTT over TLS with end-to-end signatures: what the broker, the gateways and the agents
/// of a [`Cluster::start_mqtt_secure`] use.
#[derive(Debug, Clone)]
pub struct MqttSecurity {
    /// The site CA (PEM): it signed the broker's, the gateways' and the nodes' certificates.
    pub site_ca_pem: String,
    /// The gateways' client certificate at the broker.
    pub gateway: crate::pki::Leaf,
    /// The gateways' answer key (see [`crate::pki::Ca::answers`]).
    pub answers: crate::pki::Leaf,
    /// Whether gateways refuse unsigned messages.
    pub require_signatures: bool,
}

/// A running in-process agent.
pub struct AgentHandle {
    /// The node name it speaks for.
    pub node_name: String,
    /// The agent itself, for its metrics and observe address.
    pub agent: Arc<Agent>,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), edgebeat_agent::AgentError>>,
}

impl AgentHandle {
    /// Ends the agent as SIGKILL ends a process: its task dropped where it stands, no
    /// goodbye, nothing more sent.
    pub async fn kill(self) {
        self.task.abort();
        // Cancelled (the abort) or finished before it: either way it has ended.
        let _ = self.task.await;
    }

    /// Stops the agent (as SIGTERM would) and waits for it to finish.
    ///
    /// Errors: the agent's own error, or a join error if it panicked.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.cancel.cancel();
        self.task.await.context("agent task")?.context("agent")?;
        Ok(())
    }
}

/// The user an operator's requests to the stand-in carry (`Impersonate-User`), so that a
/// test tells them from the gateway's: `edgebeat-operator`.
pub const OPERATOR: &str = "edgebeat-operator";

/// A kube client of the stand-in acting as the operator ([`OPERATOR`]): what an operator's
/// `kubectl` or `edgebeat-gateway token create` sends, with their own credentials.
///
/// Errors: the stand-in's URL does not parse, or the client cannot be built.
pub fn operator_client(standin: &StandInHandle) -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::new(standin.url().parse()?);
    config.auth_info.impersonate = Some(OPERATOR.to_owned());
    Ok(kube_client(config, 1000, &Default::default())?)
}

/// Approves CertificateSigningRequest `name` as `kubectl certificate approve` does, as the
/// operator ([`OPERATOR`]): the Approved condition (reason `KubectlApprove`) through the
/// `/approval` subresource.
///
/// Errors: the CSR cannot be read or the approval is refused.
pub async fn approve_csr(standin: &StandInHandle, name: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequest, CertificateSigningRequestCondition,
    };
    let api: kube::Api<CertificateSigningRequest> = kube::Api::all(operator_client(standin)?);
    let mut csr = api.get(name).await?;
    csr.status
        .get_or_insert_default()
        .conditions
        .get_or_insert_default()
        .push(CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            reason: Some("KubectlApprove".into()),
            message: Some("This CSR was approved by kubectl certificate approve.".into()),
            ..Default::default()
        });
    api.replace_subresource("approval", name, &kube::api::PostParams::default(), &csr)
        .await?;
    Ok(())
}

/// Path of a committed fixture host tree (`tests/fixtures/<name>`).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// Copies a fixture tree into a fresh temporary directory so a test can change host facts
/// (boot ID, meminfo) while an agent runs.
///
/// Errors: I/O errors while copying.
pub fn fixture_copy(name: &str) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    copy_tree(&fixture(name), dir.path())?;
    Ok(dir)
}

fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Sends component logs to the test output when `EDGEBEAT_TEST_LOG` is set (a filter such
/// as `debug` or `edgebeat_transports=debug`); safe to call from every test.
pub fn init_test_logging() {
    if let Ok(filter) = std::env::var("EDGEBEAT_TEST_LOG")
        && let Ok(targets) = filter.parse::<tracing_subscriber::filter::Targets>()
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        let _ = tracing_subscriber::registry()
            .with(tracing_subscriber::fmt::layer().with_test_writer())
            .with(targets)
            .try_init();
    }
}

/// Gateway options for the harness: the defaults, but a per-node rate limit that fits the
/// harness's short intervals (a renewal every 250 ms, status every 100 ms when changing).
pub fn gateway_options() -> GatewayOptions {
    GatewayOptions {
        per_node_rate: 50.0,
        per_node_burst: 100.0,
        ..GatewayOptions::default()
    }
}

impl Cluster {
    /// Starts a stand-in apiserver, a broker for MQTT, and one gateway with
    /// [`gateway_options`].
    ///
    /// Errors: binding, broker start-up or client construction failures.
    pub async fn start(transport: Transport) -> anyhow::Result<Self> {
        Self::start_with(transport, gateway_options()).await
    }

    /// As [`Cluster::start`], with gateway options.
    ///
    /// Errors: binding, broker start-up or client construction failures.
    pub async fn start_with(transport: Transport, options: GatewayOptions) -> anyhow::Result<Self> {
        Self::start_on_port(transport, options, 0).await
    }

    /// As [`Cluster::start_with`], with the stand-in apiserver on `127.0.0.1:port`
    /// (0: any free port), so a person can point kubectl at a known address.
    ///
    /// Errors: binding, broker start-up or client construction failures.
    pub async fn start_on_port(
        transport: Transport,
        options: GatewayOptions,
        port: u16,
    ) -> anyhow::Result<Self> {
        Self::start_inner(transport, options, port, GrpcServerOptions::default(), None).await
    }

    /// An MQTT cluster secured with `site`: Mosquitto serves only MQTT over TLS and requires
    /// client certificates from `site`; gateways connect with their own `site` certificate
    /// and verify node signatures against `site` (refusing unsigned messages when
    /// `require_signatures`). Agents need [`Cluster::secure_agent_config`].
    ///
    /// Errors: as [`Cluster::start`].
    pub async fn start_mqtt_secure(
        site: &crate::pki::Ca,
        require_signatures: bool,
        options: GatewayOptions,
    ) -> anyhow::Result<Self> {
        let security = MqttSecurity {
            site_ca_pem: site.cert_pem.clone(),
            gateway: site.client("edgebeat-gateway", None),
            answers: site.answers(),
            require_signatures,
        };
        Self::start_inner(
            Transport::Mqtt,
            options,
            0,
            GrpcServerOptions::default(),
            Some((security, site.server())),
        )
        .await
    }

    /// A gRPC cluster whose gateway serves with `grpc` options, e.g. TLS with a client CA
    /// (mTLS) and `require_node_identity`; [`Cluster::grpc_url`] is then `https://`.
    /// Agents need their transport's TLS ([`TransportConfig::set_tls`]) set to connect.
    ///
    /// Errors: binding or client construction failures.
    pub async fn start_grpc_with(
        grpc: GrpcServerOptions,
        options: GatewayOptions,
    ) -> anyhow::Result<Self> {
        Self::start_inner(Transport::Grpc, options, 0, grpc, None).await
    }

    /// A cluster whose gateways enroll node certificates (see
    /// [`edgebeat_gateway::enrollment`]) with `enrollment`: every ingress requires node
    /// identities from the site CA the first replica makes. gRPC: each replica serves TLS
    /// with its own certificate from the site CA and an enrollment listener
    /// ([`EnrollingSite::enrollment_urls`]). MQTT: Mosquitto serves TLS with a certificate
    /// from a CA of its own and lets clients in without a certificate. Agents need
    /// [`Cluster::enrolled_agent_config`] and a token ([`Cluster::bootstrap_token`]).
    ///
    /// Errors: as [`Cluster::start`], or the site CA cannot be made.
    pub async fn start_enrolling(
        transport: Transport,
        enrollment: edgebeat_gateway::enrollment::EnrollmentOptions,
        options: GatewayOptions,
    ) -> anyhow::Result<Self> {
        Self::start_enrolling_on_port(transport, enrollment, options, 0).await
    }

    /// As [`Cluster::start_enrolling`], with the stand-in apiserver on `127.0.0.1:port` (0:
    /// any free port).
    ///
    /// Errors: as [`Cluster::start_enrolling`].
    pub async fn start_enrolling_on_port(
        transport: Transport,
        enrollment: edgebeat_gateway::enrollment::EnrollmentOptions,
        options: GatewayOptions,
        port: u16,
    ) -> anyhow::Result<Self> {
        init_test_logging();
        let standin = StandIn::serve(
            tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .with_context(|| format!("binding 127.0.0.1:{port}"))?,
            std::future::pending(),
        )
        .await?;
        // As deploy/gateway's namespace.yaml: the gateway's own namespace.
        standin.create_namespace(&enrollment.namespace);
        let (listener, broker, broker_ca_pem) = match transport {
            Transport::Grpc => (
                Some(tokio::net::TcpListener::bind("127.0.0.1:0").await?),
                None,
                None,
            ),
            Transport::Mqtt => {
                let ca = crate::pki::Ca::new("broker CA");
                let server = ca.server();
                let broker = Broker::start_tls(crate::broker::BrokerTls {
                    require_certificate: false,
                    bind_client_ids: false,
                    ca_pem: ca.cert_pem.clone(),
                    cert_pem: server.cert_pem,
                    key_pem: server.key_pem,
                })
                .await?;
                (None, Some(broker), Some(ca.cert_pem))
            }
        };
        let grpc_url = match &listener {
            Some(l) => format!("https://{}", l.local_addr()?),
            None => String::new(),
        };
        let mut cluster = Self {
            standin,
            broker,
            replicas: Vec::new(),
            grpc_url,
            transport,
            grpc_options: GrpcServerOptions {
                require_node_identity: true,
                ..GrpcServerOptions::default()
            },
            mqtt_security: None,
            enrolling: Some(EnrollingSite {
                options: enrollment,
                broker_ca_pem,
                enrollment_urls: Vec::new(),
            }),
        };
        cluster
            .start_replica_on(options, listener, Vec::new())
            .await?;
        Ok(cluster)
    }

    /// The enrollment side of the first running replica of a [`Cluster::start_enrolling`]
    /// cluster, for its counters and CA.
    ///
    /// # Panics
    /// When no running replica enrolls (a test mistake).
    pub fn enrollment(&self) -> Arc<edgebeat_gateway::enrollment::Enrollment> {
        #[allow(clippy::expect_used)]
        self.replicas
            .iter()
            .flatten()
            .find_map(|r| r.enrollment.clone())
            .expect("an enrolling gateway replica")
    }

    /// A bootstrap token of this cluster's site (see [`Cluster::start_enrolling`]) for
    /// `nodes` (names or `prefix*`), `uses` nodes, valid `ttl`.
    ///
    /// Errors: no enrolling replica, or the apiserver refused the token's Secret.
    pub async fn bootstrap_token(
        &self,
        nodes: &[&str],
        uses: u32,
        ttl: Duration,
    ) -> anyhow::Result<edgebeat_transports::enroll::BootstrapToken> {
        let enrollment = self
            .replicas
            .iter()
            .flatten()
            .find_map(|r| r.enrollment.clone())
            .context("no enrolling gateway replica")?;
        let client = operator_client(&self.standin)?;
        Ok(edgebeat_gateway::enrollment::tokens::create_token(
            client,
            &enrollment.options().namespace,
            nodes.iter().map(|n| (*n).to_owned()).collect(),
            ttl,
            uses,
            enrollment.pin()?,
            jiff::Timestamp::now(),
        )
        .await?)
    }

    /// [`Cluster::agent_config`] for an agent of a [`Cluster::start_enrolling`] cluster that
    /// has nothing but `token` (written to `dir/token`) and keeps its certificates in
    /// `dir/pki`: gRPC over TLS to the gateway (verified against the site CA its enrollment
    /// brings) enrolling at replica 0's listener, or MQTT over TLS trusting the broker's
    /// CA.
    ///
    /// Errors: the token file cannot be written, or the cluster does not enroll.
    pub fn enrolled_agent_config(
        &self,
        node_name: &str,
        host_root: &Path,
        token: &edgebeat_transports::enroll::BootstrapToken,
        dir: &Path,
    ) -> anyhow::Result<AgentConfig> {
        let site = self
            .enrolling
            .as_ref()
            .context("not an enrolling cluster")?;
        let token_file = dir.join("token");
        std::fs::write(&token_file, format!("{token}\n"))?;
        let mut config = self.agent_config(node_name, host_root);
        if let (Some(TransportConfig::Mqtt(mqtt)), Some(ca)) =
            (config.transport.as_mut(), &site.broker_ca_pem)
        {
            mqtt.set_tls(edgebeat_agent::config::ClientTls {
                ca_pem: ca.clone().into_bytes(),
                client_identity: None,
            })?;
        }
        config.certificates = Some(edgebeat_agent::config::ManagedCertificates {
            bootstrap_token_file: token_file,
            cert_dir: dir.join("pki"),
            rotate_certificates: true,
            enrollment_endpoint: site.enrollment_urls.first().cloned(),
        });
        Ok(config)
    }

    async fn start_inner(
        transport: Transport,
        options: GatewayOptions,
        port: u16,
        grpc_options: GrpcServerOptions,
        mqtt_security: Option<(MqttSecurity, crate::pki::Leaf)>,
    ) -> anyhow::Result<Self> {
        init_test_logging();
        let standin_listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .with_context(|| format!("binding 127.0.0.1:{port}"))?;
        let standin = StandIn::serve(standin_listener, std::future::pending()).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let scheme = if grpc_options.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let grpc_url = format!("{scheme}://{}", listener.local_addr()?);
        let broker = match (transport, &mqtt_security) {
            (Transport::Grpc, _) => None,
            (Transport::Mqtt, None) => Some(Broker::start().await?),
            (Transport::Mqtt, Some((security, server))) => Some(
                Broker::start_tls(crate::broker::BrokerTls {
                    require_certificate: true,
                    bind_client_ids: true,
                    ca_pem: security.site_ca_pem.clone(),
                    cert_pem: server.cert_pem.clone(),
                    key_pem: server.key_pem.clone(),
                })
                .await?,
            ),
        };
        let mut cluster = Self {
            standin,
            broker,
            replicas: Vec::new(),
            grpc_url,
            transport,
            grpc_options,
            mqtt_security: mqtt_security.map(|(security, _)| security),
            enrolling: None,
        };
        cluster
            .start_replica_on(options, Some(listener), Vec::new())
            .await?;
        Ok(cluster)
    }

    /// The first running gateway replica.
    ///
    /// # Panics
    /// When every replica has been stopped (a test mistake).
    pub fn gateway(&self) -> &Arc<Gateway> {
        #[allow(clippy::expect_used)]
        &self
            .replicas
            .iter()
            .flatten()
            .next()
            .expect("a running gateway replica")
            .gateway
    }

    /// Starts another gateway replica (MQTT: another member of the shared subscription) and
    /// waits until it serves. Returns its index.
    ///
    /// Errors: client construction, or the replica not subscribing within 10 s.
    pub async fn start_replica(&mut self, options: GatewayOptions) -> anyhow::Result<usize> {
        let listener = match self.transport {
            Transport::Grpc => {
                let addr = self
                    .grpc_url
                    .split_once("://")
                    .map_or(self.grpc_url.as_str(), |(_, addr)| addr)
                    .to_owned();
                Some(
                    tokio::net::TcpListener::bind(&addr)
                        .await
                        .with_context(|| format!("rebinding {addr}"))?,
                )
            }
            Transport::Mqtt => None,
        };
        self.start_replica_on(options, listener, Vec::new()).await
    }

    /// Starts another gateway replica subscribed at the brokers `(host, port)` instead of
    /// the cluster's own (MQTT only): the first, then the next in turn after a lost
    /// connection ([`MqttIngressOptions::failover`]), as a replica of a broker cluster's
    /// nodes. Returns its index.
    ///
    /// Errors: as [`Cluster::start_replica`]; no broker named.
    pub async fn start_replica_at(
        &mut self,
        options: GatewayOptions,
        brokers: &[(&str, u16)],
    ) -> anyhow::Result<usize> {
        anyhow::ensure!(
            self.transport == Transport::Mqtt,
            "a replica at a broker needs Transport::Mqtt"
        );
        anyhow::ensure!(!brokers.is_empty(), "a replica at no broker");
        let brokers = brokers.iter().map(|(h, p)| ((*h).to_owned(), *p)).collect();
        self.start_replica_on(options, None, brokers).await
    }

    async fn start_replica_on(
        &mut self,
        options: GatewayOptions,
        listener: Option<tokio::net::TcpListener>,
        mut brokers: Vec<(String, u16)>,
    ) -> anyhow::Result<usize> {
        use edgebeat_gateway::server::{Listeners, Server};
        use edgebeat_gateway::settings::{GrpcSettings, MqttSettings, Settings};
        // As the gateway binary: an ingress that lets unidentified agents in (plain gRPC or
        // unsigned MQTT, what most scenarios here run) needs the explicit opt-in
        // (`--allow-unidentified-agents`).
        let unidentified = match self.transport {
            Transport::Grpc => !self.grpc_options.require_node_identity,
            Transport::Mqtt => {
                self.enrolling.is_none()
                    && !self
                        .mqtt_security
                        .as_ref()
                        .is_some_and(|s| s.require_signatures)
            }
        };
        let index = self.replicas.len();
        // gRPC only in a gRPC cluster, as the binary serves only the ingresses it is given.
        let listener = listener.filter(|_| self.transport == Transport::Grpc);
        let grpc = match &listener {
            Some(listener) => Some(GrpcSettings {
                listen: listener.local_addr()?,
                // Under enrollment: TLS with the replica's certificate from the site CA.
                options: self.grpc_options.clone(),
                client_ca_pem: None,
                reload: Vec::new(),
            }),
            None => None,
        };
        let enrollment_listener = match (&self.enrolling, self.transport) {
            (Some(_), Transport::Grpc) => Some(tokio::net::TcpListener::bind("127.0.0.1:0").await?),
            _ => None,
        };
        if brokers.is_empty()
            && let Some(b) = &self.broker
        {
            brokers.push((b.host().to_owned(), b.port()));
        }
        let mqtt = match brokers.is_empty() {
            true => None,
            false => {
                let (host, port) = brokers.remove(0);
                let mut options =
                    MqttIngressOptions::new(host, port, format!("edgebeat-gateway-{index}"));
                options.failover = brokers;
                let mut mqtt = MqttSettings {
                    options,
                    node_ca_pem: None,
                    require_signatures: false,
                    max_clock_skew: edgebeat_transports::mqtt::DEFAULT_MAX_CLOCK_SKEW,
                };
                if let Some(site) = &self.enrolling {
                    // Signatures from node certificates of the site CA, answers signed with
                    // the replica's own key from it.
                    mqtt.options.tls =
                        site.broker_ca_pem
                            .as_ref()
                            .map(|ca| edgebeat_transports::tls::ClientTls {
                                ca_pem: ca.clone().into_bytes(),
                                client_identity: None,
                            });
                    mqtt.require_signatures = true;
                }
                if let Some(security) = &self.mqtt_security {
                    use edgebeat_transports::tls::{ClientTls, TlsIdentity};
                    mqtt.options.tls = Some(ClientTls {
                        ca_pem: security.site_ca_pem.clone().into_bytes(),
                        client_identity: Some(TlsIdentity {
                            cert_pem: security.gateway.cert_pem.clone().into_bytes(),
                            key_pem: security.gateway.key_pem.clone().into_bytes(),
                        }),
                    });
                    mqtt.options.answer_signer = Some(Arc::new(
                        edgebeat_transports::signing::AnswerSigner::from_pem(
                            security.answers.cert_pem.as_bytes(),
                            security.answers.key_pem.as_bytes(),
                            security.site_ca_pem.as_bytes(),
                        )
                        .map_err(anyhow::Error::msg)?,
                    ));
                    mqtt.node_ca_pem = Some(security.site_ca_pem.clone().into_bytes());
                    mqtt.require_signatures = security.require_signatures;
                }
                Some(mqtt)
            }
        };
        let settings = Settings {
            kube: kube::Config::new(self.standin.url().parse()?),
            // The stand-in speaks HTTP/2 over plain http:// (h2c).
            apiserver_http: edgebeat_gateway::apiserver::client::HttpVersion::Http2,
            qps: 1000,
            gateway: options,
            allow_unidentified_agents: unidentified,
            enrollment: self.enrolling.as_ref().map(|site| site.options.clone()),
            grpc,
            grpc_enrollment: match &enrollment_listener {
                Some(listener) => Some((listener.local_addr()?, Default::default())),
                None => None,
            },
            mqtt,
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            resource_metrics: None,
        };
        if let (Some(site), Some(listener)) = (self.enrolling.as_mut(), &enrollment_listener) {
            site.enrollment_urls
                .push(format!("http://{}", listener.local_addr()?));
        }
        let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let server = Server::with_listeners(
            settings,
            Listeners {
                metrics,
                grpc: listener,
                grpc_enrollment: enrollment_listener,
                resource_metrics: None,
            },
        )?;
        let metrics_addr = server.metrics_addr()?;
        // The binary's own start: the replica follows its Nodes and Leases, and starts
        // serving once both watches have listed (so a scenario's first messages meet a
        // known view).
        let cancel = CancellationToken::new();
        let running = tokio::time::timeout(
            Duration::from_secs(40),
            server.start(cancel.clone().cancelled_owned()),
        )
        .await
        .context("gateway replica did not start within 40 s")??
        .context("gateway replica stopped while starting")?;
        anyhow::ensure!(
            running.gateway().view().nodes_watched() && running.gateway().view().leases_watched(),
            "the gateway's Node and Lease watches did not list"
        );
        if let Some(mut subscribed) = running.mqtt_subscribed() {
            tokio::time::timeout(Duration::from_secs(10), subscribed.wait_for(|s| *s))
                .await
                .context("gateway replica did not subscribe within 10 s")??;
        }
        let (gateway, enrollment, requests) = (
            running.gateway().clone(),
            running.enrollment().cloned(),
            running.requests().clone(),
        );
        let task = tokio::spawn(async move {
            if let Err(error) = running.wait().await {
                tracing::error!(
                    error = edgebeat_transports::observe::error_report(&error),
                    "gateway replica failed"
                );
            }
        });
        self.replicas.push(Some(Replica {
            gateway,
            enrollment,
            requests,
            metrics_addr,
            cancel,
            task,
        }));
        Ok(index)
    }

    /// Stops replica `index` (its listener or subscription goes away) and waits for it.
    pub async fn stop_replica(&mut self, index: usize) {
        if let Some(replica) = self.replicas.get_mut(index).and_then(Option::take) {
            replica.cancel.cancel();
            let _ = replica.task.await;
        }
    }

    /// Kills replica `index` as `kill -9` would, as far as one process can: its watch, gRPC
    /// and MQTT tasks are aborted where they stand, with no shutdown, so its broker
    /// connection closes without DISCONNECT and its apiserver requests in flight are
    /// dropped (the kernel closes a killed process's sockets the same way). Handlers
    /// already running a message finish their current apiserver call, as a process killed
    /// a moment later would have.
    pub async fn kill_replica(&mut self, index: usize) {
        if let Some(replica) = self.replicas.get_mut(index).and_then(Option::take) {
            replica.task.abort();
            let _ = replica.task.await;
        }
    }

    /// Replaces every gateway replica by one fresh gateway (no memory of any node), as a
    /// gateway restart would.
    ///
    /// Errors: as [`Cluster::start_replica`].
    pub async fn restart_gateway(&mut self, options: GatewayOptions) -> anyhow::Result<()> {
        for i in 0..self.replicas.len() {
            self.stop_replica(i).await;
        }
        self.start_replica(options).await.map(|_| ())
    }

    /// [`test_agent_config`] for `node_name` over this cluster's transport (its broker, or
    /// its gRPC listener).
    ///
    /// # Panics
    /// When `node_name` is not a valid Node name (a test mistake).
    pub fn agent_config(&self, node_name: &str, host_root: &Path) -> AgentConfig {
        let transport = match (self.transport, &self.broker) {
            (Transport::Mqtt, Some(broker)) => TransportConfig::Mqtt(MqttUplinkOptions {
                keepalive: Duration::from_secs(30),
                // As the config sets it from the lease duration: 1 s.
                lease_expiry: Duration::from_secs(1),
                ..MqttUplinkOptions::new(broker.host(), broker.port())
            }),
            _ => grpc_transport(&self.grpc_url),
        };
        test_agent_config(node_name, host_root, transport)
    }

    /// [`Cluster::agent_config`] for an agent of a [`Cluster::start_mqtt_secure`] cluster:
    /// MQTT over TLS trusting the site CA, presenting `node_certificate` (which also signs
    /// every message).
    pub fn secure_agent_config(
        &self,
        node_name: &str,
        host_root: &Path,
        node_certificate: &crate::pki::Leaf,
    ) -> AgentConfig {
        let mut config = self.agent_config(node_name, host_root);
        let ca_pem = self
            .mqtt_security
            .as_ref()
            .map(|s| s.site_ca_pem.clone().into_bytes())
            .unwrap_or_default();
        if let Some(transport) = config.transport.as_mut() {
            let tls = edgebeat_agent::config::ClientTls {
                ca_pem,
                client_identity: Some(edgebeat_agent::config::TlsIdentity {
                    cert_pem: node_certificate.cert_pem.clone().into_bytes(),
                    key_pem: node_certificate.key_pem.clone().into_bytes(),
                }),
            };
            #[allow(clippy::expect_used)]
            transport
                .set_tls(tls)
                .expect("a test PKI's node certificate signs MQTT messages");
        }
        config
    }

    /// The MQTT security this cluster was started with, if any.
    pub fn mqtt_security(&self) -> Option<&MqttSecurity> {
        self.mqtt_security.as_ref()
    }

    /// Waits until `node`'s Lease has been renewed (PUT answered 200) `more` times beyond
    /// what the stand-in has recorded so far, or `timeout` passes.
    ///
    /// Errors: the timeout, with the stand-in's state.
    pub async fn wait_for_renewals(
        &self,
        node: &str,
        more: usize,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let renewed = |requests: &[crate::standin::RecordedRequest]| {
            crate::requests::count(requests, |r| crate::requests::is_lease_renewed(r, node))
        };
        let target = renewed(&self.standin.requests()) + more;
        self.standin
            .wait_until(timeout, &format!("{more} more renewals of {node}"), |v| {
                renewed(v.requests()) >= target
            })
            .await
    }

    /// Messages the first running gateway replica rejected for `why` so far.
    pub fn rejections(&self, why: edgebeat_transports::ingress::RejectReason) -> u64 {
        self.gateway().counters.rejections(why)
    }

    /// Waits until the first running replica has rejected at least `at_least` messages for
    /// `why`.
    ///
    /// # Panics
    /// When `deadline` passes first, naming the reason.
    pub async fn wait_for_rejections(
        &self,
        why: edgebeat_transports::ingress::RejectReason,
        at_least: u64,
        deadline: Duration,
    ) {
        wait_for(
            &format!("{} rejections ≥ {at_least}", why.as_str()),
            deadline,
            || self.rejections(why) >= at_least,
        )
        .await;
    }

    /// Starts an in-process agent with `config` ([`start_agent`]).
    ///
    /// Errors: the agent's start-up errors (unreadable host facts, bad node name).
    pub fn start_agent(&self, config: AgentConfig) -> anyhow::Result<AgentHandle> {
        start_agent(config, Arc::new(SystemClock))
    }

    /// As [`Cluster::start_agent`], reading time from `clock` (e.g. a [`ShiftedClock`]).
    ///
    /// Errors: as [`Cluster::start_agent`].
    pub fn start_agent_with_clock(
        &self,
        config: AgentConfig,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<AgentHandle> {
        start_agent(config, clock)
    }
}

/// An agent configuration for `node_name` reading host facts from `host_root` over
/// `transport`, with short intervals: status computed every 100 ms and reported every 2 s
/// when unchanged, lease duration 1 s (renewal every 250 ms).
///
/// # Panics
/// When `node_name` is not a valid Node name (a test mistake).
pub fn test_agent_config(
    node_name: &str,
    host_root: &Path,
    transport: TransportConfig,
) -> AgentConfig {
    #[allow(clippy::expect_used)]
    let node_name = edgebeat_agent::config::NodeName::new(node_name)
        .expect("a test's node name is a valid Node name");
    AgentConfig {
        node_name: Some(node_name),
        node_status_update_frequency: Duration::from_millis(100),
        node_status_report_frequency: Duration::from_secs(2),
        node_lease_duration_seconds: 1,
        host_root: host_root.to_owned(),
        transport: Some(transport),
        // ClockUnsynchronized reads the running kernel, not the fixture tree: off, so a
        // scenario sees the same conditions (and events) on every machine.
        health: edgebeat_agent::health::HealthSettings {
            clock_sync: false,
            ..Default::default()
        },
        // So does DiskPressure: a fixture tree's filesystems are this host's (statvfs of its
        // rootDir), and under kubelet's disk thresholds a host with less than 10 % free (a
        // CI clone's) turns it True. Memory's threshold alone (as kubelet, setting any key
        // drops the other defaults).
        eviction_hard: std::collections::BTreeMap::from([(
            edgebeat_agent::config::EvictionSignal::MemoryAvailable,
            edgebeat_agent::quantity::Amount::Absolute(100 * 1024 * 1024),
        )]),
        ..AgentConfig::default()
    }
}

/// Plain gRPC to `url` (e.g. `http://127.0.0.1:7443`), keepalive 30 s.
pub fn grpc_transport(url: &str) -> TransportConfig {
    TransportConfig::Grpc(GrpcUplinkOptions {
        keepalive: Duration::from_secs(30),
        ..GrpcUplinkOptions::new(url.to_owned())
    })
}

/// Starts an in-process agent with `config`, reading time from `clock`.
///
/// Errors: the agent's start-up errors (unreadable host facts, bad node name).
pub fn start_agent(config: AgentConfig, clock: Arc<dyn Clock>) -> anyhow::Result<AgentHandle> {
    let agent = Agent::new(config, clock)?;
    let node_name = agent.node_name().to_owned();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(agent.clone().run(cancel.clone()));
    Ok(AgentHandle {
        node_name,
        agent,
        cancel,
        task,
    })
}

/// The real clocks with the wall clock stepped by an offset that a test changes while the
/// agent runs: a board without an RTC whose clock jumps (NTP's first sync, a wrong manual
/// date). CLOCK_BOOTTIME is untouched, as a wall-clock step leaves it.
#[derive(Debug, Default)]
pub struct ShiftedClock {
    offset_ms: std::sync::atomic::AtomicI64,
}

impl ShiftedClock {
    /// Sets the wall clock to real time plus `offset_ms` milliseconds (negative: behind).
    pub fn shift(&self, offset_ms: i64) {
        self.offset_ms
            .store(offset_ms, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Clock for ShiftedClock {
    fn now(&self) -> std::time::SystemTime {
        let real = SystemClock.now();
        let offset = self.offset_ms.load(std::sync::atomic::Ordering::Relaxed);
        let by = Duration::from_millis(offset.unsigned_abs());
        if offset >= 0 {
            real + by
        } else {
            real.checked_sub(by).unwrap_or(std::time::UNIX_EPOCH)
        }
    }

    fn boottime(&self) -> Duration {
        SystemClock.boottime()
    }
}

/// gRPC server options for mutual TLS with `site`: its server certificate (for
/// 127.0.0.1), `site` as the client CA, node identities required.
pub fn mtls_options(site: &crate::pki::Ca) -> GrpcServerOptions {
    let server = site.server();
    GrpcServerOptions {
        tls: Some(edgebeat_transports::grpc::GrpcServerTls {
            cert_pem: server.cert_pem.into_bytes(),
            key_pem: server.key_pem.into_bytes(),
            client_ca_pem: Some(site.cert_pem.clone().into_bytes()),
        }),
        require_node_identity: true,
        ..GrpcServerOptions::default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for replica in self.replicas.iter().flatten() {
            replica.cancel.cancel();
        }
        self.standin.shutdown();
    }
}

/// One sample of an agent's `/metrics` (its observe server), e.g.
/// `edgebeat_agent_node_not_found` or `edgebeat_agent_answers_refused_total{reason="certificate"}`.
/// Panics when the agent serves no such series (a test helper).
pub async fn agent_sample(agent: &AgentHandle, series: &str) -> f64 {
    #[allow(clippy::unwrap_used)]
    let observe = agent.agent.observe_addr().unwrap();
    #[allow(clippy::unwrap_used)]
    let text = http_get(observe, "/metrics").await.unwrap().1;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .parse()
        .unwrap_or_else(|e| panic!("{series}: {e}"))
}

/// `GET path` over HTTP/1.1 to `addr` (`Connection: close`): the status code and body.
///
/// Errors: connecting, writing, reading, or an answer that is not HTTP.
pub async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let code = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("not an HTTP answer")?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

/// [`crate::wait::eventually`] for a synchronous yes/no `condition`, checking every 20 ms,
/// for at most `deadline`.
///
/// For state only observable by looking (counters, an external process); state the
/// stand-in holds has [`StandInHandle::wait_until`], which is woken by changes. A check that
/// can say what it saw instead of `false` is better written with `eventually`.
///
/// # Panics
/// When the deadline passes, naming `what`.
pub async fn wait_for(what: &str, deadline: Duration, condition: impl Fn() -> bool) {
    crate::wait::eventually(what, deadline, || std::future::ready(condition())).await;
}
