//! An overloaded kube-apiserver (issue 50, item 3): API Priority and Fairness saturated at
//! `workload-low` by a flood from many ServiceAccounts, while a real kubelet for this host
//! and the edgebeat gateway as `deploy/gateway` runs it (with its FlowSchema
//! `edgebeat-gateway`) keep their nodes' Leases.
//!
//! The flood: `FLOODERS` ServiceAccounts, each its own fair-queuing flow (the bootstrap
//! FlowSchema `service-accounts` distinguishes by user), each keeping `IN_FLIGHT` ConfigMap
//! creations outstanding, each held `WEBHOOK_DELAY` by a slow admission webhook (a
//! stand-in, `edgebeat_tests::webhook`) while it occupies a seat. At a control plane with
//! `--max-requests-inflight=10 --max-mutating-requests-inflight=5` (15 seats, about 7 of
//! them `workload-low`'s), `workload-low` serves about one request a second against
//! thousands queued: its queues (128, 50 deep, hands of 6) are full of the flood, and a
//! request of another flow queued behind it waits until APF's queue-wait limit (a quarter
//! of the 60 s request timeout) and is refused with 429.
//!
//! Measured: the age of each Lease (now − `renewTime`, read as the admin, whom APF exempts)
//! every second. With the FlowSchema, the gateway's requests ride `node-high` beside
//! kubelet's (FlowSchema `system-node-high`) and its Leases must stay as fresh as
//! kubelet's. Then the FlowSchema is deleted, the gateway's ServiceAccount falls into
//! `service-accounts` → `workload-low` with the flood, and the same figure is measured
//! again, to show the overload was real and what the FlowSchema is for.
//!
//! Needs root, the control plane, kubelet and containerd, and the gateway built
//! (`scripts/test.sh` does all).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

use edgebeat_tests::control_plane::{ControlPlane, DeployedGateway, gateway_requests, kube_client};
use edgebeat_tests::kubelet::Kubelet;
use edgebeat_tests::wait::eventually;
use edgebeat_tests::webhook::SlowWebhook;

/// ServiceAccounts flooding, each one flow.
const FLOODERS: usize = 24;
/// ConfigMap creations each keeps outstanding (kube-apiserver's HTTP/2 stream limit per
/// connection is 100: one connection each).
const IN_FLIGHT: usize = 100;
/// How long the webhook holds each creation (its seat).
const WEBHOOK_DELAY: Duration = Duration::from_secs(5);
/// Each measurement window: four Lease renewal intervals and more.
const WINDOW: Duration = Duration::from_secs(45);
/// The edge nodes behind the gateway.
const EDGE_NODES: [&str; 2] = ["apf-edge-1", "apf-edge-2"];

/// What the flood did, counted by its clients.
#[derive(Debug, Default)]
struct FloodCounts {
    created: AtomicU64,
    /// Refused with 429 (after kube-rs' own retries of a 429).
    refused_429: AtomicU64,
    other_errors: AtomicU64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs root, kubelet and containerd (scripts/test.sh)"]
async fn under_an_apf_overload_edgebeats_leases_stay_as_fresh_as_kubelets() {
    let control_plane = ControlPlane::start(&[(
        "EDGEBEAT_APISERVER_FLAGS",
        "--max-requests-inflight=10 --max-mutating-requests-inflight=5",
    )])
    .unwrap();
    let mut kubelet = tokio::task::block_in_place(|| {
        Kubelet::start(
            &control_plane,
            "evictionHard:\n  memory.available: 100Mi\nimageGCHighThresholdPercent: 100\n",
        )
    })
    .unwrap();
    let gateway = DeployedGateway::start(&control_plane, &[]).await;
    let agents: Vec<_> = EDGE_NODES.iter().map(|n| gateway.agent(n)).collect();
    let admin = control_plane.admin_client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let mut names: Vec<String> = EDGE_NODES.iter().map(|n| (*n).to_owned()).collect();
    names.push(kubelet.node_name.clone());
    eventually("every Lease renewed", Duration::from_secs(120), || {
        let (leases, names) = (leases.clone(), names.clone());
        async move {
            let ages = lease_ages(&leases, &names).await;
            ages.len() == names.len() && ages.values().all(|age| *age < 15.0)
        }
    })
    .await;

    let webhook = SlowWebhook::start(WEBHOOK_DELAY).await.unwrap();
    let (stop_flood, counts, flood) = start_flood(&control_plane, &admin, &webhook).await;
    // Half the flood waiting in workload-low's queues: the level is saturated.
    let saturated = (FLOODERS * IN_FLIGHT / 2) as f64;
    eventually(
        "the flood queued at workload-low",
        Duration::from_secs(60),
        || {
            let queued = inqueue(&control_plane, "workload-low");
            async move { queued >= saturated }
        },
    )
    .await;
    let queued_at_start = inqueue(&control_plane, "workload-low");

    let with_from = jiff::Timestamp::now();
    let with_flow_schema = measure(&leases, &names).await;
    control_plane
        .kubectl(&["delete", "flowschema", "edgebeat-gateway"])
        .unwrap();
    let without_from = jiff::Timestamp::now();
    let without_flow_schema = measure(&leases, &names).await;
    let without_to = jiff::Timestamp::now();
    let queued_at_end = inqueue(&control_plane, "workload-low");
    // The gateway's Lease updates the apiserver answered in each window, by status code.
    let updates = gateway_requests(&control_plane, with_from);
    let answered = |from: jiff::Timestamp, to: jiff::Timestamp| {
        let mut codes = BTreeMap::<u16, usize>::new();
        for event in &updates {
            let at = event.at().unwrap();
            if event.verb == "update" && event.resource() == "leases" && at >= from && at < to {
                *codes.entry(event.code()).or_default() += 1;
            }
        }
        codes
    };
    let updates_with = answered(with_from, without_from);
    let updates_without = answered(without_from, without_to);

    stop_flood.cancel();
    for task in flood {
        task.await.unwrap();
    }
    for agent in agents {
        agent.stop().await.unwrap();
    }
    drop(gateway);
    let before = kubelet.before().clone();
    let after = tokio::task::block_in_place(|| kubelet.stop()).unwrap();
    drop(control_plane);

    let kubelets = &kubelet.node_name;
    println!(
        "flood: {FLOODERS} ServiceAccounts × {IN_FLIGHT} creations in flight, each held {} s: {} created, {} refused with 429, {} other errors; {} reviews; queued at workload-low {queued_at_start} then {queued_at_end}",
        WEBHOOK_DELAY.as_secs(),
        counts.created.load(Ordering::Relaxed),
        counts.refused_429.load(Ordering::Relaxed),
        counts.other_errors.load(Ordering::Relaxed),
        webhook.reviews(),
    );
    println!(
        "the gateway's Lease updates answered, by code: with the FlowSchema {updates_with:?}, without it {updates_without:?}"
    );
    println!("| Lease | oldest, with the FlowSchema (s) | oldest, without it (s) |");
    println!("|---|---|---|");
    for name in &names {
        println!(
            "| {} | {:.1} | {:.1} |",
            if name == kubelets { "kubelet's" } else { name },
            with_flow_schema.get(name).copied().unwrap_or(f64::NAN),
            without_flow_schema.get(name).copied().unwrap_or(f64::NAN),
        );
    }

    assert_eq!(
        before, after,
        "kubelet and containerd left the machine changed"
    );
    assert!(
        queued_at_start >= saturated,
        "{queued_at_start} queued at workload-low"
    );
    // Two edge nodes, a renewal each every 10 s: 9 in 45 s, less the window's edges.
    let renewed = updates_with.get(&200).copied().unwrap_or(0);
    assert!(
        renewed >= 2 * 3,
        "the gateway's Lease updates with the FlowSchema: {updates_with:?}"
    );
    let kubelet_oldest = with_flow_schema[kubelets];
    for node in EDGE_NODES {
        // A renewal every 10 s: a Lease is at most 10 s old plus the request's own time
        // and this sampling's second; kubelet's is the yardstick for "as fresh".
        let oldest = with_flow_schema[node];
        assert!(
            oldest <= kubelet_oldest + 3.0 && oldest < 15.0,
            "{node}'s Lease {oldest:.1} s old at worst under the overload, kubelet's {kubelet_oldest:.1} s"
        );
    }
    assert!(
        without_flow_schema[kubelets] < 15.0,
        "kubelet's Lease stayed fresh: {without_flow_schema:?}"
    );
    let stale = EDGE_NODES
        .iter()
        .map(|n| without_flow_schema[*n])
        .fold(0.0_f64, f64::max);
    assert!(
        stale > 20.0,
        "without the FlowSchema the gateway's requests wait at workload-low behind the flood: its Leases should have gone stale, yet the oldest was {stale:.1} s (was the overload real?)"
    );
}

/// Each Lease's age (s) now: now − `renewTime`, for those that exist and have one.
async fn lease_ages(leases: &Api<Lease>, names: &[String]) -> BTreeMap<String, f64> {
    let now = jiff::Timestamp::now();
    let mut ages = BTreeMap::new();
    for name in names {
        let Ok(lease) = leases.get(name).await else {
            continue;
        };
        if let Some(renewed) = lease.spec.and_then(|s| s.renew_time) {
            let age = now.duration_since(renewed.0).as_secs_f64();
            ages.insert(name.clone(), age);
        }
    }
    ages
}

/// The oldest each Lease was over [`WINDOW`], sampled every second.
async fn measure(leases: &Api<Lease>, names: &[String]) -> BTreeMap<String, f64> {
    let mut oldest: BTreeMap<String, f64> = BTreeMap::new();
    let mut every = tokio::time::interval(Duration::from_secs(1));
    // A measurement window: the samples are the figure, nothing is waited for.
    let end = tokio::time::Instant::now() + WINDOW;
    while tokio::time::Instant::now() < end {
        every.tick().await;
        for (name, age) in lease_ages(leases, names).await {
            let worst = oldest.entry(name).or_insert(0.0);
            *worst = worst.max(age);
        }
    }
    oldest
}

/// `apiserver_flowcontrol_current_inqueue_requests` at `priority_level`, summed.
fn inqueue(control_plane: &ControlPlane, priority_level: &str) -> f64 {
    let text = control_plane
        .kubectl(&["get", "--raw", "/metrics"])
        .unwrap();
    let level = format!("priority_level=\"{priority_level}\"");
    text.lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_current_inqueue_requests{"))
        .filter(|l| l.contains(&level))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Starts the flood: namespace `flood`, [`FLOODERS`] ServiceAccounts allowed to create
/// ConfigMaps there, the webhook on those creations, and [`IN_FLIGHT`] creation loops each.
async fn start_flood(
    control_plane: &ControlPlane,
    admin: &kube::Client,
    webhook: &SlowWebhook,
) -> (
    CancellationToken,
    Arc<FloodCounts>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    for args in [
        &["create", "namespace", "flood"][..],
        &[
            "-n",
            "flood",
            "create",
            "role",
            "flood",
            "--verb=create",
            "--resource=configmaps",
        ],
        &[
            "-n",
            "flood",
            "create",
            "rolebinding",
            "flood",
            "--role=flood",
            "--group=system:serviceaccounts:flood",
        ],
    ] {
        control_plane.kubectl(args).unwrap();
    }
    let configuration = ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some("edgebeat-test-slow".into()),
            ..Default::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            name: "slow.edgebeat.test".into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            failure_policy: Some("Ignore".into()),
            timeout_seconds: Some(10),
            client_config: WebhookClientConfig {
                url: Some(format!("https://{}/", webhook.addr)),
                ca_bundle: Some(ByteString(webhook.ca_pem.clone().into_bytes())),
                ..Default::default()
            },
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_owned(),
                    "flood".to_owned(),
                )])),
                ..Default::default()
            }),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into()]),
                resources: Some(vec!["configmaps".into()]),
                scope: Some("Namespaced".into()),
            }]),
            ..Default::default()
        }]),
    };
    Api::<ValidatingWebhookConfiguration>::all(admin.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();

    let stop = CancellationToken::new();
    let counts = Arc::new(FloodCounts::default());
    let mut tasks = Vec::new();
    for flooder in 0..FLOODERS {
        let account = format!("flood-{flooder}");
        control_plane
            .kubectl(&["-n", "flood", "create", "serviceaccount", &account])
            .unwrap();
        let kubeconfig = control_plane
            .service_account_kubeconfig("flood", &account)
            .unwrap();
        let client = kube_client(&kubeconfig).await.unwrap();
        let configmaps: Api<ConfigMap> = Api::namespaced(client, "flood");
        for _ in 0..IN_FLIGHT {
            let (configmaps, stop, counts) = (configmaps.clone(), stop.clone(), counts.clone());
            tasks.push(tokio::spawn(async move {
                flood(&configmaps, &stop, &counts).await;
            }));
        }
    }
    (stop, counts, tasks)
}

/// One creation after another until `stop`; after a refusal, a second's pause (the flood's
/// pace, so that refused requests do not spin the 2 cores).
async fn flood(configmaps: &Api<ConfigMap>, stop: &CancellationToken, counts: &FloodCounts) {
    let configmap = ConfigMap {
        metadata: ObjectMeta {
            generate_name: Some("flood-".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let post = PostParams::default();
    loop {
        let created = tokio::select! {
            () = stop.cancelled() => return,
            created = configmaps.create(&post, &configmap) => created,
        };
        let count = match &created {
            Ok(_) => &counts.created,
            Err(kube::Error::Api(status)) if status.code == 429 => &counts.refused_429,
            Err(_) => &counts.other_errors,
        };
        count.fetch_add(1, Ordering::Relaxed);
        if created.is_err() {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}
