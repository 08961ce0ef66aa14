//! The gateway's apiserver client speaks HTTP/2, as kubelet's client-go does: one
//! connection carries a burst of calls well beyond the server's 100 concurrent streams
//! (queued on the connection, none refused), Lease calls have a connection of their own,
//! and `--apiserver-http=1.1` speaks HTTP/1.1.
//! Against the stand-in apiserver, which serves both on one port as kube-apiserver does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use edgebeat_gateway::apiserver::client::HttpVersion;
use edgebeat_gateway::{kube_client, kube_client_with};
use edgebeat_tests::standin::{MAX_STREAMS, StandIn};
use k8s_openapi::api::coordination::v1::Lease;

/// Calls at once: three times the stand-in's stream limit.
const BURST: usize = 3 * MAX_STREAMS as usize;

async fn burst(client: kube::Client) {
    let leases: kube::Api<Lease> = kube::Api::namespaced(client, "kube-node-lease");
    let calls = (0..BURST).map(|i| {
        let leases = leases.clone();
        async move { leases.get_opt(&format!("node-{i}")).await }
    });
    let answers = futures_util::future::join_all(calls).await;
    let failed: Vec<_> = answers.iter().filter(|a| a.is_err()).collect();
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        failed.first()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_http2_connection_carries_a_burst_beyond_the_stream_limit() {
    let standin = StandIn::start().await.unwrap();
    let config = kube::Config::new(standin.url().parse().unwrap());
    let client = kube_client(config, 0, &Default::default()).unwrap();
    burst(client).await;
    let requests = standin.requests();
    assert_eq!(requests.len(), BURST);
    assert!(
        requests.iter().all(|r| r.version == http::Version::HTTP_2),
        "{:?}",
        requests.iter().map(|r| r.version).collect::<Vec<_>>()
    );
    assert_eq!(standin.connections(), 1, "one connection, every call on it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_calls_have_a_connection_of_their_own() {
    let standin = StandIn::start().await.unwrap();
    let config = kube::Config::new(standin.url().parse().unwrap());
    let client = kube_client(config, 0, &Default::default()).unwrap();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let calls = (0..BURST).map(|i| {
        let nodes = nodes.clone();
        async move { nodes.get_opt(&format!("node-{i}")).await }
    });
    let (answers, ()) = futures_util::join!(futures_util::future::join_all(calls), burst(client));
    assert!(answers.iter().all(Result::is_ok));
    assert_eq!(
        standin.connections(),
        2,
        "Nodes on one connection, Leases on the other"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_takes_a_connection_per_call_in_flight() {
    let standin = StandIn::start().await.unwrap();
    let config = kube::Config::new(standin.url().parse().unwrap());
    let client = kube_client_with(config, 0, &Default::default(), HttpVersion::Http1).unwrap();
    burst(client).await;
    let requests = standin.requests();
    assert!(requests.iter().all(|r| r.version == http::Version::HTTP_11));
    assert!(
        standin.connections() > 1,
        "HTTP/1.1 answers one call at a time per connection: {}",
        standin.connections()
    );
}
