//! The process's log subscriber, the same for both binaries ([`init_logging`]).

/// Where a binary's log lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTo {
    /// Standard output (the gateway: a container's log).
    Stdout,
    /// Standard error (the agent, whose `--once` prints JSON on standard output).
    Stderr,
}

/// How log lines are written (`--log-format` of both binaries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// tracing-subscriber's `fmt` lines: `2026-11-25T10:00:00.123456Z  INFO target: message
    /// key=value…`, coloured only on a terminal (see [`init_logging`]).
    #[default]
    Text,
    /// One JSON object per line (tracing-subscriber's `json` format, event flattened):
    /// `timestamp`, `level`, `target`, `message` and every field of the event as keys, the
    /// innermost span under `span` and all open spans under `spans`. For log shippers
    /// (Loki, Elasticsearch, journald's `MESSAGE`).
    Json,
}

/// A `--log-format` value that is neither `text` nor `json`.
#[derive(Debug, thiserror::Error)]
#[error("unknown log format {0:?}: use text or json")]
pub struct UnknownLogFormat(String);

impl std::str::FromStr for LogFormat {
    type Err = UnknownLogFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(UnknownLogFormat(other.to_owned())),
        }
    }
}

/// Whether log lines to a stream that `is_terminal` may carry ANSI colour escapes: only on
/// a terminal, and only while `NO_COLOR` (`no_color`, its value) is unset or empty, as
/// <https://no-color.org> asks. Files, pipes, `kubectl logs` and journald get plain text.
pub fn colour(is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs the process's log subscriber, the same for both binaries: lines in `format`,
/// filtered by `filter` (a level such as `info`, or `target=level,…`: tracing-subscriber's
/// `Targets` syntax), written to `to`. Text lines are coloured only when `to` is a terminal
/// and `NO_COLOR` is unset ([`colour`]); JSON lines never are.
///
/// Errors: why `filter` does not parse. Nothing is installed then.
pub fn init_logging(
    filter: &str,
    to: LogTo,
    format: LogFormat,
) -> Result<(), tracing_subscriber::filter::ParseError> {
    use std::io::IsTerminal as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let targets: tracing_subscriber::filter::Targets = filter.parse()?;
    let terminal = match to {
        LogTo::Stdout => std::io::stdout().is_terminal(),
        LogTo::Stderr => std::io::stderr().is_terminal(),
    };
    let ansi = colour(terminal, std::env::var_os("NO_COLOR").as_deref());
    let writer = || match to {
        LogTo::Stdout => BoxMakeWriter::new(std::io::stdout),
        LogTo::Stderr => BoxMakeWriter::new(std::io::stderr),
    };
    let layer = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(writer())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_ansi(false)
            .with_writer(writer())
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(layer.with_filter(targets))
        .init();
    Ok(())
}
