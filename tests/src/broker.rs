//! A real MQTT broker for tests: Debian's Mosquitto, run as a child process with its own
//! configuration and log in a temporary directory, on a free loopback port.
//!
//! Install it with `apt-get install mosquitto` (2.0.11 on Debian 12: MQTT 5, shared
//! subscriptions, Last Will, Message Expiry).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

/// Attempts to find a port the broker can bind (another process may take the probed port
/// before Mosquitto binds it).
const PORT_ATTEMPTS: usize = 5;

/// How long the broker may take to accept TCP connections.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A running Mosquitto; killed when dropped.
pub struct Broker {
    child: Option<Child>,
    binary: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
    tls: Option<BrokerTls>,
    /// Log only errors and warnings (benchmarks): `log_type all` writes a line per PUBLISH.
    quiet: bool,
    /// A site broker's bridge to the cluster's broker.
    bridge: Option<Bridge>,
    /// Run inside this network namespace (`ip netns exec`), listening on `listen`.
    namespace: Option<String>,
    /// Address the listener binds, `127.0.0.1` unless in a namespace.
    listen: String,
    /// A second listener for the gateway replicas alone ([`Broker::start_tls_with_gateways`]):
    /// its port and the CA (PEM) only gateways hold certificates of.
    gateways: Option<(u16, String)>,
}

/// A site broker's bridge to the cluster's broker, as an edge site runs it: the site's
/// agents publish to the site broker, which forwards `P/nodes/#` (and certificates) to the
/// cluster and `P/acks/#` back, and announces its uplink on `P/sites/{site}/uplink`
/// (`notifications true`, retained `1` on connect, `0` as its Last Will on the cluster's
/// broker).
#[derive(Debug, Clone)]
pub struct Bridge {
    /// The cluster broker's address, as the site reaches it.
    pub remote_host: String,
    /// Its port.
    pub remote_port: u16,
    /// The site (the agents' zone).
    pub site: String,
    /// Topic prefix (the agents' `transport.topicPrefix`).
    pub topic_prefix: String,
    /// The bridge's MQTT keepalive in seconds: the cluster's broker publishes the `0` at
    /// 1.5 × this after the link goes quiet.
    pub keepalive_secs: u16,
}

impl Bridge {
    /// The `mosquitto.conf` lines of the bridge (`mosquitto.conf(5)`, "Configuring
    /// Bridges"): a clean session both ways, so nothing queued while the uplink was down
    /// floods the gateway when it returns (agents retry with fresh messages); MQTT 5, so
    /// expiry and properties cross it.
    pub fn config(&self) -> String {
        let p = &self.topic_prefix;
        let id: String = self
            .site
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        format!(
            "connection edgebeat-site-{id}\n\
             address {host}:{port}\n\
             remote_clientid edgebeat-site-{id}\n\
             bridge_protocol_version mqttv50\n\
             cleansession true\n\
             keepalive_interval {keepalive}\n\
             restart_timeout 1 2\n\
             notifications true\n\
             notification_topic {uplink}\n\
             topic {p}/nodes/# out 1\n\
             topic {p}/certificates/# both 1\n\
             topic {p}/acks/# in 1\n",
            host = self.remote_host,
            port = self.remote_port,
            keepalive = self.keepalive_secs,
            uplink = edgebeat_transports::mqtt::uplink_topic(p, &self.site),
        )
    }
}

/// TLS for the broker's listener: with `require_certificate`, clients must present a
/// certificate from `ca_pem` (its CN becomes the MQTT username); without, they may connect
/// with none (boards that enroll through the broker have none yet).
#[derive(Debug, Clone)]
pub struct BrokerTls {
    /// Whether clients must present a certificate from `ca_pem`.
    pub require_certificate: bool,
    /// With `require_certificate`: each client's ID is its certificate's identity, whatever
    /// it asked for (`use_username_as_clientid true`), so no client can take another's
    /// session (MQTT gives a client ID to whoever connects last): the broker posture the
    /// README asks for.
    pub bind_client_ids: bool,
    /// CA (PEM) of client certificates, and of the broker's own for clients to trust.
    pub ca_pem: String,
    /// The broker's certificate (PEM), valid for 127.0.0.1.
    pub cert_pem: String,
    /// Its private key (PEM).
    pub key_pem: String,
}

impl Broker {
    /// Starts Mosquitto on a free port of 127.0.0.1 and waits until it accepts connections.
    ///
    /// The configuration: `listener PORT 127.0.0.1`, `allow_anonymous true`,
    /// `persistence false`, `max_queued_messages 1000`, everything logged to a file (see
    /// [`Broker::log`]).
    ///
    /// Errors: Mosquitto is not installed (the message says how to install it), the
    /// temporary directory cannot be written, or the broker did not start (its log is in the
    /// error).
    pub async fn start() -> anyhow::Result<Broker> {
        Self::start_inner(None, false).await
    }

    /// As [`Broker::start`], bridged to the cluster's broker as a site broker ([`Bridge`]).
    ///
    /// Errors: as [`Broker::start`].
    pub async fn start_site(bridge: Bridge) -> anyhow::Result<Broker> {
        Self::start_with(None, false, Some(bridge), None, "127.0.0.1", None).await
    }

    /// As [`Broker::start_site`], inside network namespace `namespace` (`ip netns exec`,
    /// root), listening on `listen` (an address of the namespace this namespace reaches,
    /// so that it can tell when the broker is up).
    ///
    /// Errors: as [`Broker::start`].
    pub async fn start_site_in(
        bridge: Bridge,
        namespace: &str,
        listen: &str,
    ) -> anyhow::Result<Broker> {
        Self::start_with(
            None,
            false,
            Some(bridge),
            Some(namespace.into()),
            listen,
            None,
        )
        .await
    }

    /// As [`Broker::start`], logging only errors and warnings, so that a fleet benchmark
    /// measures the broker and not its log.
    ///
    /// Errors: as [`Broker::start`].
    pub async fn start_quiet() -> anyhow::Result<Broker> {
        Self::start_inner(None, true).await
    }

    /// As [`Broker::start`], with a TLS-only listener (MQTT over TLS, what `mqtts://`
    /// endpoints speak) that requires client certificates from `tls.ca_pem`.
    ///
    /// Errors: as [`Broker::start`], or the PEM files cannot be written.
    pub async fn start_tls(tls: BrokerTls) -> anyhow::Result<Broker> {
        Self::start_inner(Some(tls), false).await
    }

    /// As [`Broker::start_tls`] (the agents' listener), with a second TLS listener for the
    /// gateway replicas alone, as README "MQTT broker: client IDs bound to identities" asks:
    /// `per_listener_settings true`, no anonymous clients, client certificates from
    /// `gateways_ca_pem` only (a CA only gateways hold), and the client ID each replica asks
    /// for kept (no `use_username_as_clientid`), so replicas sharing one certificate keep
    /// their own sessions. Its port is [`Broker::gateway_port`].
    ///
    /// Errors: as [`Broker::start_tls`].
    pub async fn start_tls_with_gateways(
        tls: BrokerTls,
        gateways_ca_pem: &str,
    ) -> anyhow::Result<Broker> {
        let gateways = Some((0, gateways_ca_pem.to_owned()));
        Self::start_with(Some(tls), false, None, None, "127.0.0.1", gateways).await
    }

    async fn start_inner(tls: Option<BrokerTls>, quiet: bool) -> anyhow::Result<Broker> {
        Self::start_with(tls, quiet, None, None, "127.0.0.1", None).await
    }

    async fn start_with(
        tls: Option<BrokerTls>,
        quiet: bool,
        bridge: Option<Bridge>,
        namespace: Option<String>,
        listen: &str,
        gateways: Option<(u16, String)>,
    ) -> anyhow::Result<Broker> {
        let binary = find_mosquitto()?;
        let dir = tempfile::Builder::new()
            .prefix("edgebeat-mosquitto-")
            .tempdir()
            .context("creating the broker's directory")?;
        let mut broker = Broker {
            child: None,
            binary,
            port: 0,
            dir,
            tls,
            quiet,
            bridge,
            namespace,
            listen: listen.to_owned(),
            gateways,
        };
        for _ in 0..PORT_ATTEMPTS {
            broker.port = free_port()?;
            if let Some((port, _)) = &mut broker.gateways {
                *port = free_port()?;
            }
            broker.write_config()?;
            if broker.spawn().await? {
                return Ok(broker);
            }
            tracing::debug!(
                port = broker.port,
                "Mosquitto could not take the port; retrying"
            );
        }
        bail!(
            "Mosquitto did not start after {PORT_ATTEMPTS} attempts; log:\n{}",
            broker.log()
        )
    }

    /// The broker's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of the gateways' listener ([`Broker::start_tls_with_gateways`]).
    pub fn gateway_port(&self) -> Option<u16> {
        self.gateways.as_ref().map(|(port, _)| *port)
    }

    /// The broker process's id while it runs (for its RSS and open files in /proc).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// The broker's host, `127.0.0.1` (or the address it listens on in its namespace).
    pub fn host(&self) -> &str {
        &self.listen
    }

    /// Stops the broker and waits for it to exit. It is killed outright (SIGKILL): with
    /// persistence off there is nothing to save, and to its clients it looks like a crash,
    /// which is what restart tests want.
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Stops the broker and starts it again on the same port with the same configuration
    /// (no sessions or messages survive: persistence is off).
    ///
    /// Errors: the broker did not come back (its log is in the error).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await;
        if self.spawn().await? {
            return Ok(());
        }
        bail!(
            "Mosquitto did not restart on port {}; log:\n{}",
            self.port,
            self.log()
        )
    }

    /// The broker's log so far (connections, subscriptions, every packet), for assertion
    /// messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("mosquitto.log")
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("mosquitto.conf")
    }

    fn write_config(&self) -> anyhow::Result<()> {
        // `user root`: started as root, Mosquitto would switch to the `mosquitto` user, who
        // cannot write the log in our directory; it has no effect for other users.
        let config = format!(
            "{per_listener}listener {port} {listen}\n\
             allow_anonymous true\n\
             persistence false\n\
             max_queued_messages 1000\n\
             set_tcp_nodelay true\n\
             user root\n\
             log_dest file {log}\n\
             {log_types}\
             log_timestamp true\n",
            per_listener = if self.gateways.is_some() {
                "per_listener_settings true\n"
            } else {
                ""
            },
            port = self.port,
            listen = self.listen,
            log = self.log_path().display(),
            log_types = if self.quiet {
                "log_type error\nlog_type warning\n"
            } else {
                "log_type all\n"
            },
        );
        let mut config = config;
        if let Some(bridge) = &self.bridge {
            config.push_str(&bridge.config());
        }
        if let Some(tls) = &self.tls {
            let file = |name: &str, pem: &str| -> anyhow::Result<PathBuf> {
                let path = self.dir.path().join(name);
                std::fs::write(&path, pem).with_context(|| format!("writing {name}"))?;
                Ok(path)
            };
            config.push_str(&format!(
                "cafile {}\ncertfile {}\nkeyfile {}\n",
                file("ca.pem", &tls.ca_pem)?.display(),
                file("server.pem", &tls.cert_pem)?.display(),
                file("server.key", &tls.key_pem)?.display(),
            ));
            if tls.require_certificate {
                config.push_str("require_certificate true\nuse_identity_as_username true\n");
                if tls.bind_client_ids {
                    config.push_str("use_username_as_clientid true\n");
                }
            }
            if let Some((port, gateways_ca_pem)) = &self.gateways {
                config.push_str(&format!(
                    "listener {port} {listen}\n\
                     allow_anonymous false\n\
                     cafile {}\ncertfile {}\nkeyfile {}\n\
                     require_certificate true\n\
                     use_identity_as_username true\n",
                    file("gateways-ca.pem", gateways_ca_pem)?.display(),
                    self.dir.path().join("server.pem").display(),
                    self.dir.path().join("server.key").display(),
                    listen = self.listen,
                ));
            }
        }
        std::fs::write(self.config_path(), config).context("writing mosquitto.conf")
    }

    /// Spawns Mosquitto and waits until it accepts TCP connections. `Ok(false)` when it
    /// exited first (typically: the port was taken).
    async fn spawn(&mut self) -> anyhow::Result<bool> {
        let mut command = match &self.namespace {
            Some(namespace) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", namespace]).arg(&self.binary);
                c
            }
            None => Command::new(&self.binary),
        };
        let child = crate::process::spawn_async(
            command
                .arg("-c")
                .arg(self.config_path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true),
        )
        .with_context(|| format!("starting {}", self.binary.display()))?;
        self.child = Some(child);
        // Waiting for an external process to listen: nothing to subscribe to, so its port is
        // polled. Done: it listens (true), or it exited (false).
        let listening = crate::wait::until(
            "Mosquitto listening",
            READY_TIMEOUT,
            || {
                let exited = match self.child.as_mut() {
                    Some(child) => child.try_wait().ok().flatten().is_some(),
                    None => true,
                };
                let addr = (self.host().to_owned(), self.port);
                async move {
                    if tokio::net::TcpStream::connect(addr).await.is_ok() {
                        Some(true)
                    } else {
                        exited.then_some(false)
                    }
                }
            },
            crate::wait::every(crate::wait::POLL),
        )
        .await;
        match listening {
            Ok(true) => return Ok(true),
            Ok(false) => {
                self.child = None;
                return Ok(false);
            }
            Err(_) => self.stop().await,
        }
        bail!(
            "Mosquitto did not accept connections on port {} within {READY_TIMEOUT:?}; log:\n{}",
            self.port,
            self.log()
        )
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
    }
}

/// `mosquitto` from `PATH`, else `/usr/sbin/mosquitto` (Debian's location, often not in a
/// user's `PATH`).
fn find_mosquitto() -> anyhow::Result<PathBuf> {
    let in_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("mosquitto"))
                .find(|p| p.is_file())
        })
        .unwrap_or_default();
    let fallback = Path::new("/usr/sbin/mosquitto");
    match in_path {
        Some(path) => Ok(path),
        None if fallback.is_file() => Ok(fallback.to_path_buf()),
        None => bail!("mosquitto not found in PATH or /usr/sbin: apt-get install mosquitto"),
    }
}

/// A loopback port that was free a moment ago (bound to port 0, then released).
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("probing a free port")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn starts_restarts_and_logs() {
        let mut broker = Broker::start().await.unwrap();
        let port = broker.port();
        assert!(
            tokio::net::TcpStream::connect((broker.host(), port))
                .await
                .is_ok()
        );
        broker.restart().await.unwrap();
        assert_eq!(broker.port(), port);
        assert!(
            tokio::net::TcpStream::connect((broker.host(), port))
                .await
                .is_ok()
        );
        assert!(
            broker.log().contains("mosquitto version"),
            "{}",
            broker.log()
        );
        broker.stop().await;
        assert!(
            tokio::net::TcpStream::connect((broker.host(), port))
                .await
                .is_err()
        );
    }
}
