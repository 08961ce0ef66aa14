//! `edgebeat-rmqtt-node`: one node of an RMQTT broker cluster, for edgebeat's clustered-broker
//! benchmark (`scripts/rmqtt-cluster.sh`).
//!
//! It is rmqttd's own startup (`rmqtt-bin/src/server.rs` in github.com/rmqtt/rmqtt, 0.24):
//! the same `rmqtt.toml` and command line (`-f rmqtt.toml --id N --node-grpc-addrs …
//! --raft-peer-addrs …`, read by `rmqtt-conf`), the same node gRPC server, and plain TCP
//! listeners built from the `listener.tcp.*` sections. What differs is the plugin set: only
//! `rmqtt-cluster-raft` (the Raft cluster: replicated routes and sessions, messages forwarded
//! between nodes) and `rmqtt-shared-subscription` (MQTT 5 `$share/{group}/…`, how gateway
//! replicas split a fleet), registered as rmqttd registers them, each starting when
//! `plugins.default_startups` names it. rmqttd links every RMQTT plugin, Kafka's and
//! Pulsar's clients among them, and has no feature to leave them out.
//!
//! TLS, WebSocket and QUIC listeners are not built (the benchmark runs plain MQTT on
//! loopback). Logs go to stderr through `env_logger` (`RUST_LOG`, default `info`).
//!
//! Exits 1 with the error logged when the configuration cannot be read or a listener cannot
//! bind; on SIGTERM or Ctrl-C it exits 0.

use anyhow::Context;
use clap::Parser;
use rmqtt::args::CommandArgs;
use rmqtt::context::ServerContext;
use rmqtt::net::Builder;
use rmqtt::node::Node;
use rmqtt::server::MqttServer;
use rmqtt_conf::listener::Listener;
use rmqtt_conf::{Options, Settings};

#[tokio::main]
async fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    if let Err(e) = run().await {
        log::error!("{e:#}");
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    let conf = Settings::init(Options::parse())
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("reading the configuration (-f rmqtt.toml)")?;
    let node = Node::new(
        conf.node.id,
        conf.node.busy.loadavg,
        conf.node.busy.cpuloadavg,
        conf.node.busy.update_interval,
    );
    log::info!(
        "starting edgebeat-rmqtt-node {} (rmqtt {})",
        conf.node.id,
        Node::version()
    );
    let scx = ServerContext::new()
        .args(CommandArgs {
            node_id: conf.opts.node_id,
            plugins_default_startups: conf.opts.plugins_default_startups.clone(),
            node_grpc_addrs: conf.opts.node_grpc_addrs.clone(),
            raft_peer_addrs: conf.opts.raft_peer_addrs.clone(),
            raft_leader_id: conf.opts.raft_leader_id,
        })
        .node(node)
        .task_exec_workers(conf.task.exec_workers)
        .task_exec_queue_max(conf.task.exec_queue_max)
        .busy_check_enable(conf.node.busy.check_enable)
        .busy_handshaking_limit(conf.node.busy.handshaking)
        .mqtt_max_sessions(conf.mqtt.max_sessions)
        .plugins_config_dir(conf.plugins.dir.as_str())
        .build()
        .await;
    scx.node.start_grpc_server(
        scx.clone(),
        conf.rpc.server_addr,
        conf.rpc.reuseaddr,
        conf.rpc.reuseport,
    );
    // As rmqttd's generated `plugin::registers`: a plugin starts when it is a default
    // startup and not disabled.
    let starts = |name: &str| {
        let named = |list: &[String]| list.iter().any(|n| n == name);
        named(&conf.plugins.default_startups) && !named(&conf.plugins.disabled_default_startups)
    };
    rmqtt_cluster_raft::register_named(
        &scx,
        "rmqtt-cluster-raft",
        starts("rmqtt-cluster-raft"),
        true,
    )
    .await
    .map_err(|e| anyhow::anyhow!("registering rmqtt-cluster-raft: {e}"))?;
    rmqtt_shared_subscription::register_named(
        &scx,
        "rmqtt-shared-subscription",
        starts("rmqtt-shared-subscription"),
        false,
    )
    .await
    .map_err(|e| anyhow::anyhow!("registering rmqtt-shared-subscription: {e}"))?;

    let mut server = MqttServer::new(scx);
    for listener in Settings::instance().listeners.tcps.values() {
        let bound = builder(listener)
            .bind()
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("binding the TCP listener on {}", listener.addr))?;
        server = server.listener(bound.tcp().map_err(|e| anyhow::anyhow!("{e}"))?);
    }
    server.build().start();

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    std::process::exit(0);
}

/// rmqttd's `config_builder`, for the settings of a plain TCP listener.
fn builder(cfg: &Listener) -> Builder {
    Builder::new()
        .name(cfg.name.as_str())
        .laddr(cfg.addr)
        .max_connections(cfg.max_connections)
        .max_handshaking_limit(cfg.max_handshaking_limit)
        .max_packet_size(cfg.max_packet_size.as_u32())
        .backlog(cfg.backlog)
        .nodelay(cfg.nodelay)
        .reuseaddr(cfg.reuseaddr)
        .reuseport(cfg.reuseport)
        .tcp_keepalive(cfg.tcp_keepalive)
        .allow_anonymous(cfg.allow_anonymous)
        .min_keepalive(cfg.min_keepalive)
        .max_keepalive(cfg.max_keepalive)
        .allow_zero_keepalive(cfg.allow_zero_keepalive)
        .keepalive_backoff(cfg.keepalive_backoff)
        .max_inflight(cfg.max_inflight)
        .handshake_timeout(cfg.handshake_timeout)
        .max_mqueue_len(cfg.max_mqueue_len)
        .mqueue_rate_limit(cfg.mqueue_rate_limit.0, cfg.mqueue_rate_limit.1)
        .max_clientid_len(cfg.max_clientid_len)
        .max_qos_allowed(cfg.max_qos_allowed)
        .max_topic_levels(cfg.max_topic_levels)
        .session_expiry_interval(cfg.session_expiry_interval)
        .max_session_expiry_interval(cfg.max_session_expiry_interval)
        .message_retry_interval(cfg.message_retry_interval)
        .message_expiry_interval(cfg.message_expiry_interval)
        .max_subscriptions(cfg.max_subscriptions)
        .max_topic_aliases(cfg.max_topic_aliases)
        .limit_subscription(cfg.limit_subscription)
        .idle_timeout(cfg.idle_timeout)
}
