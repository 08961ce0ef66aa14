//! Configuration errors: each names the field, what is wrong, and how to fix it.

use std::path::PathBuf;

/// A configuration error: which field, what is wrong, and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read: missing, unreadable, a directory, or larger than
    /// [`MAX_CONFIG_FILE_BYTES`](super::MAX_CONFIG_FILE_BYTES), e.g. `agent configuration:
    /// /dev/zero: larger than 1048576 bytes; point it at a regular file of at most 1048576
    /// bytes`.
    #[error("agent configuration: {source}")]
    Read {
        /// The config file path.
        path: PathBuf,
        /// What went wrong, naming the path.
        source: edgebeat_hw::BoundedReadError,
    },
    /// The YAML is malformed or has an unknown field or a value of the wrong type.
    #[error("parsing the agent configuration: {0}")]
    Syntax(String),
    /// Fields have values the agent cannot use: every one of them, each naming the field
    /// and the fix (values a field's type refuses as it is read come first, by field name,
    /// then those `validate` refuses). Shown as `field: message` for one, and as a count
    /// followed by one `- field: message` line each for several.
    #[error("{}", InvalidFields(.0))]
    Invalid(Vec<FieldError>),
}

/// One invalid field of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path, e.g. `transport.endpoint` or `evictionHard["memory.available"]`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

pub(super) struct InvalidFields<'a>(&'a [FieldError]);

impl std::fmt::Display for InvalidFields<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            [one] => write!(f, "{one}"),
            all => {
                write!(
                    f,
                    "{} invalid fields in the agent configuration:",
                    all.len()
                )?;
                for e in all {
                    write!(f, "\n- {e}")?;
                }
                Ok(())
            }
        }
    }
}

/// `got "x"` for a value given, `missing` for none.
pub(super) fn got(value: Option<&str>) -> String {
    value.map_or_else(|| "missing".to_owned(), |v| format!("got {v:?}"))
}

pub(super) fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(vec![FieldError {
        field: field.into(),
        message: message.into(),
    }])
}

/// serde's message for one field deserialized alone, without the position and snippet
/// (of the one-field document, not of the file): `error: line 1 column 12: invalid i64`
/// and what follows become `invalid i64`.
pub(super) fn field_message(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message);
    let first = first.strip_prefix("error: ").unwrap_or(first);
    match first.split_once(": ") {
        Some((position, rest)) if position.starts_with("line ") => rest.to_owned(),
        _ => first.to_owned(),
    }
}

/// The invalid fields found so far while validating, so that one error reports them all.
#[derive(Default)]
pub(super) struct Problems(pub(super) Vec<FieldError>);

impl Problems {
    pub(super) fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    /// The value of `result`, or `None` with its problems recorded.
    pub(super) fn take<T>(&mut self, result: Result<T, ConfigError>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(ConfigError::Invalid(fields)) => {
                self.0.extend(fields);
                None
            }
            // Not raised by validation helpers (they return `Invalid`); kept whole if one is.
            Err(other) => {
                self.push("agent configuration", other.to_string());
                None
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// `value` when nothing was found, otherwise [`ConfigError::Invalid`] with everything.
    pub(super) fn into_result<T>(self, value: T) -> Result<T, ConfigError> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(ConfigError::Invalid(self.0))
        }
    }
}
