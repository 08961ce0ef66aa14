//! The real Prometheus in tests (Debian's `prometheus` package, which `scripts/test.sh`
//! installs): start one with a config, and ask it over its HTTP API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

/// `prometheus` on PATH.
///
/// # Panics
/// When there is none, saying where to get it.
pub fn binary() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("prometheus"))
                .find(|p| p.is_file())
        })
        .expect("prometheus not found on PATH: install Debian's prometheus package (scripts/test.sh does)")
}

/// A real Prometheus with `config` (YAML text), its storage under `dir`, listening on a
/// free port of 127.0.0.1, once `/-/ready` answers 200: its address and the process (killed
/// when dropped).
///
/// # Panics
/// When it cannot start, or is not listening and ready within 30 s each.
pub async fn start(dir: &Path, config: &str) -> (SocketAddr, tokio::process::Child) {
    let file = dir.join("prometheus.yml");
    std::fs::write(&file, config).unwrap();
    let mut child = crate::process::spawn_async(
        tokio::process::Command::new(binary())
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true),
    )
    .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let find = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            // `msg="Listening on" address=127.0.0.1:39507`: the port it bound.
            if line.contains("msg=\"Listening on\"") {
                let addr = line.rsplit("address=").next().unwrap().trim();
                return addr.parse::<SocketAddr>().unwrap();
            }
        }
        panic!("prometheus exited before listening");
    };
    let addr = tokio::time::timeout(Duration::from_secs(30), find)
        .await
        .expect("prometheus listening within 30 s");
    // Keep draining its log so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    // It answers queries once its storage is open: /-/ready says 200 then.
    crate::wait::eventually("prometheus ready", Duration::from_secs(30), || async {
        match get(addr, "/-/ready").await {
            (200, _) => Ok(()),
            other => Err(other),
        }
    })
    .await;
    (addr, child)
}

/// `s` percent-encoded for a query string (RFC 3986 unreserved characters kept).
fn percent_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A GET of `path` over HTTP/1.0 (so Go's server answers without chunking): the status
/// code and the body.
///
/// # Panics
/// When the connection fails.
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let code = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (code, body.to_owned())
}

/// A GET of `path`, its body as JSON.
///
/// # Panics
/// When the body is not JSON.
pub async fn get_json(addr: SocketAddr, path: &str) -> Value {
    let (code, body) = get(addr, path).await;
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {code} {e}: {body}"))
}

/// Prometheus's instant query of `expr`: the series it returns.
///
/// # Panics
/// When the query does not succeed.
pub async fn query(prometheus: SocketAddr, expr: &str) -> Vec<Value> {
    let answer = get_json(
        prometheus,
        &format!("/api/v1/query?query={}", percent_encoded(expr)),
    )
    .await;
    assert_eq!(answer["status"], "success", "{expr}: {answer}");
    answer["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}
