//! edgebeat test harness (publish = false).
//!
//! - [`standin`]: a stand-in for the kube-apiserver's Node/Lease subset. It is a test double,
//!   not a kube-apiserver: see its module docs for what it does and does not do.
//! - [`control_plane`]: the real kube-apiserver, etcd and kube-controller-manager, built
//!   from their Go modules, and the gateway's arguments as `deploy/` gives them.
//! - [`harness`]: starts the stand-in, a gateway and in-process agents for end-to-end tests
//!   and the demo.
//! - [`fleet`]: the fleet simulator, many simulated agents on the real transports.
//! - [`messages`]: hand-built `edgebeat.v1` messages for direct gateway tests.
//! - [`requests`]: which recorded stand-in request is which kubelet call.
//! - [`pki`]: a test PKI made per test (CA, server, client and node certificates).
//! - [`spy`]: a raw MQTT client over TLS, the attacker on the broker.
//! - [`process`]: every child process of the tests, started so that it dies with the test
//!   process however that ends; the real `edgebeat-gateway` binary as one, its JSON log read.
//! - [`kubelet`]: a real kubelet and containerd for this host, beside the agent, put back
//!   as they were found when stopped.
//! - [`link`]: an edge link of a network namespace and a veth pair, with its counters.
//! - [`wait`]: the one way the tests wait for something: `eventually`, with a deadline and
//!   the last value seen in its failure.
//! - [`webhook`]: a stand-in admission webhook that answers after a delay, to hold
//!   kube-apiserver's seats in an overload test.

pub mod broker;
pub mod control_plane;
pub mod faults;
pub mod fleet;
pub mod harness;
pub mod kubelet;
pub mod link;
pub mod messages;
pub mod pki;
pub mod process;
pub mod procfs;
pub mod prometheus;
pub mod requests;
pub mod spy;
pub mod standin;
pub mod wait;
pub mod webhook;
