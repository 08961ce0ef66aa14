//! Checks of what the binaries write to a log file, shared by `agent/tests/logs.rs` and
//! `gateway/tests/logs.rs` (each includes this file with `#[path]`).
#![allow(dead_code)] // each binary uses one of the two streams

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Which stream of the child carries its log.
#[derive(Clone, Copy)]
pub enum Stream {
    /// The gateway's.
    Stdout,
    /// The agent's.
    Stderr,
}

/// Starts `command` with its log `stream` to the file `log` (the other stream discarded)
/// and returns the log once it holds `lines` whole lines and a field `key` (`key=` in text,
/// `"key":` in JSON), the child killed: what the caller checks is then written, however
/// the lines before it came. Panics with what was written if that does not happen within
/// `deadline`.
pub fn log_of(
    mut command: Command,
    stream: Stream,
    log: &Path,
    lines: usize,
    key: &str,
    deadline: Duration,
) -> String {
    let (text_key, json_key) = (format!("{key}="), format!("\"{key}\":"));
    let file = std::fs::File::create(log).unwrap();
    match stream {
        Stream::Stdout => command.stdout(file).stderr(Stdio::null()),
        Stream::Stderr => command.stderr(file).stdout(Stdio::null()),
    };
    let mut child: Child = command.spawn().unwrap();
    let mut waited = Duration::ZERO;
    let text = loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        if whole.matches('\n').count() + usize::from(!whole.is_empty()) >= lines
            && (whole.contains(&text_key) || whole.contains(&json_key))
        {
            break text;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("exited with {status} after writing:\n{text}");
        }
        if waited > deadline {
            let _ = child.kill();
            panic!("fewer than {lines} lines, or none with {key}, within {deadline:?}:\n{text}");
        }
        // Polls the file: the condition is the file's content, bounded by the deadline.
        std::thread::sleep(Duration::from_millis(50));
        waited += Duration::from_millis(50);
    };
    let _ = child.kill();
    let _ = child.wait();
    text
}

/// No ANSI escape (ESC, 0x1b) anywhere, and some line at `level` holding `key=`.
pub fn assert_plain(text: &str, level: &str, key: &str) {
    assert!(
        !text.contains('\u{1b}'),
        "an escape byte in a file:\n{text:?}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains(level) && l.contains(&format!("{key}="))),
        "no {level} line with {key}=:\n{text}"
    );
}

/// Every whole line is one JSON object with `timestamp`, `level`, `target` and `message`
/// (the event flattened, its fields beside), no escape byte; some line at `level` holds
/// the field `key`. Returns the objects.
pub fn assert_json(text: &str, level: &str, key: &str) -> Vec<serde_json::Value> {
    assert!(
        !text.contains('\u{1b}'),
        "an escape byte in JSON lines:\n{text:?}"
    );
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for line in &lines {
        for field in ["timestamp", "level", "target", "message"] {
            assert!(
                line.get(field).is_some_and(|v| v.is_string()),
                "{field} missing: {line}"
            );
        }
    }
    assert!(
        lines
            .iter()
            .any(|l| l["level"] == level && l.get(key).is_some()),
        "no {level} line with the field {key}:\n{text}"
    );
    lines
}

/// Runs `binary(format)` for `text` then `json`, each with its log `stream` to a file in
/// `dir` until it holds `lines` lines (30 s at most), and checks both: no escape byte in
/// either; some line at `level` carries the field `key`; every JSON line has the standard
/// keys ([`assert_json`]). Returns the JSON lines.
pub fn check_both_formats(
    binary: impl Fn(&str) -> Command,
    stream: Stream,
    dir: &Path,
    lines: usize,
    level: &str,
    key: &str,
) -> Vec<serde_json::Value> {
    let deadline = Duration::from_secs(30);
    let text = log_of(
        binary("text"),
        stream,
        &dir.join("text.log"),
        lines,
        key,
        deadline,
    );
    assert_plain(&text, level, key);
    let json = log_of(
        binary("json"),
        stream,
        &dir.join("json.log"),
        lines,
        key,
        deadline,
    );
    assert_json(&json, level, key)
}
