//! Health, readiness and Prometheus metrics over HTTP/1.1, one small server for both binaries
//! (feature `observe`), and the process plumbing they share: one [`init_logging`], one
//! [`shutdown_signal`].
//!
//! | request          | answer                                                                     |
//! |------------------|----------------------------------------------------------------------------|
//! | `GET /healthz`   | `200 ok` while the server runs (it runs alongside the process's loops and stops with them) |
//! | `GET /readyz`    | `200 ok` when the readiness closure returns `Ok(())`, else `503` and its one-line reason |
//! | `GET /metrics`   | `200`, the registry in the OpenMetrics text format ([`METRICS_CONTENT_TYPE`], ends with `# EOF`); `503` until the registry is set |
//! | other path       | `404`                                                                      |
//! | other method     | `405` with `Allow: GET, HEAD` (on the three paths above)                   |
//!
//! `HEAD` is answered like `GET` without a body. Text bodies end with a newline. The server
//! is hyper 1's HTTP/1 connection driver on tokio, with no router: three paths do not need
//! one, and the agent's binary stays small. It is for a local scraper and kubelet-style
//! probes, and no client can hold the probes hostage ([`Slots`]): at most
//! [`MAX_CONNECTIONS`] connections at once and [`MAX_CONNECTIONS_PER_ADDRESS`] from one
//! address; a new connection is always taken, the oldest connection of the address that
//! holds the most making room for it (so whoever holds many connections only displaces its
//! own, and a prober's fresh connection is served); [`HEADER_READ_TIMEOUT`] to send a
//! request head, [`IDLE_TIMEOUT`] between requests, and a connection closes after
//! [`MAX_CONNECTION_AGE`] however busy (keep-alive is bounded).
//!
//! | file          | what                                                                       |
//! |---------------|----------------------------------------------------------------------------|
//! | `http.rs`     | the server ([`serve`]), its accept loop and connection driver, its limits  |
//! | `slots.rs`    | which connection a full server closes for a new one ([`Slots`]), the limits |
//! | `metrics.rs`  | what `/metrics` encodes ([`Exposition`]), [`register_family`]               |
//! | `process.rs`  | the process's own metrics ([`ProcessCollector`])                           |
//! | `logging.rs`  | the log subscriber ([`init_logging`], [`LogFormat`], [`LogTo`])             |
//! | `exit.rs`     | the error line and exit status ([`error_report`], [`exit_code`])            |
//! | `shutdown.rs` | SIGTERM or Ctrl-C ([`shutdown_signal`])                                     |
//!
//! Each item has one public path, `edgebeat_transports::observe::<item>`: the files are
//! private modules, re-exported here.

mod exit;
mod http;
mod logging;
mod metrics;
mod process;
mod shutdown;
mod slots;

pub use exit::{error_report, exit_code};
pub use http::{
    HEADER_READ_TIMEOUT, IDLE_TIMEOUT, MAX_CONNECTION_AGE, accept_connections, drive_connection,
    serve,
};
pub use logging::{LogFormat, LogTo, UnknownLogFormat, colour, init_logging};
pub use metrics::{Exposition, METRICS_CONTENT_TYPE, register_family};
pub use process::{ProcessCollector, ProcessStats};
pub use shutdown::shutdown_signal;
pub use slots::{MAX_CONNECTIONS, MAX_CONNECTIONS_PER_ADDRESS, SlotId, Slots, Succeeded};

#[cfg(test)]
mod tests;
