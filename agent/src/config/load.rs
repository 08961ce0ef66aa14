//! Reading the configuration file: the file, its YAML, and, when the document does not
//! deserialize as a whole, every bad field named one by one before the rest is validated.

use super::error::{Problems, field_message};
use super::transport;
use super::validate::RawConfig;
use super::{AgentConfig, ConfigError, MAX_CONFIG_FILE_BYTES};

impl AgentConfig {
    /// Reads and validates the YAML file at `path`.
    ///
    /// The file may hold at most [`MAX_CONFIG_FILE_BYTES`] and must be UTF-8.
    ///
    /// Errors: [`ConfigError::Read`], [`ConfigError::Syntax`] (with serde's line and
    /// column, or for text that is not UTF-8), [`ConfigError::Invalid`] naming the field.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let bytes = edgebeat_hw::read_bounded(path, MAX_CONFIG_FILE_BYTES).map_err(|source| {
            ConfigError::Read {
                path: path.to_owned(),
                source,
            }
        })?;
        let text = String::from_utf8(bytes).map_err(|e| {
            ConfigError::Syntax(format!(
                "{}: not UTF-8 text ({e}); save the file as UTF-8 YAML",
                path.display()
            ))
        })?;
        Self::from_yaml(&text)
    }

    /// Parses and validates a YAML document (see the module docs for the shape).
    ///
    /// Errors: as [`AgentConfig::load`], without `Read`.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        match serde_saphyr::from_str::<RawConfig>(text) {
            Ok(raw) => Self::validate(raw),
            Err(first) => Self::validate_field_by_field(text, first),
        }
    }

    /// The document did not deserialize as a whole (an unknown field, a value of the wrong
    /// type): deserializes each top-level field on its own to name every bad one, then
    /// validates the others, so one error lists them all. A document that is not a YAML
    /// mapping at all is [`ConfigError::Syntax`] with `first`.
    fn validate_field_by_field(
        text: &str,
        first: serde_saphyr::Error,
    ) -> Result<Self, ConfigError> {
        let syntax = || ConfigError::Syntax(first.to_string());
        let Ok(serde_json::Value::Object(fields)) =
            serde_saphyr::from_str::<serde_json::Value>(text)
        else {
            return Err(syntax());
        };
        // Each field alone, as YAML (JSON is YAML): the same typing as in the whole file.
        let alone = |fields: serde_json::Map<String, serde_json::Value>| {
            serde_saphyr::from_str::<RawConfig>(&serde_json::Value::Object(fields).to_string())
        };
        let check = |key: &str, value: serde_json::Value| {
            alone(serde_json::Map::from_iter([(key.to_owned(), value)]))
                .map(drop)
                .map_err(|e| field_message(&e.to_string()))
        };
        let mut p = Problems::default();
        let mut good = serde_json::Map::new();
        for (key, value) in fields {
            if check(&key, value.clone()).is_ok() {
                good.insert(key, value);
                continue;
            }
            if key == "transport" {
                // Tagged on `kind`: its fields are checked with their kind.
                let kept = transport::name_bad_fields(&mut p, value, |v| check(&key, v));
                good.extend(kept.map(|kept| (key, kept)));
                continue;
            }
            // A mapping (a map of quantities, labels): name its bad entries one by one too.
            // The good ones are still validated, the bad ones reported.
            let mut named = false;
            if let serde_json::Value::Object(inner) = &value {
                let mut kept = serde_json::Map::new();
                for (sub, v) in inner {
                    let nested = serde_json::Map::from_iter([(sub.clone(), v.clone())]);
                    match check(&key, serde_json::Value::Object(nested)) {
                        Ok(()) => {
                            kept.insert(sub.clone(), v.clone());
                        }
                        Err(m) => {
                            p.push(format!("{key}.{sub}"), m);
                            named = true;
                        }
                    }
                }
                if named {
                    good.insert(key.clone(), serde_json::Value::Object(kept));
                }
            }
            if !named && let Err(m) = check(&key, value) {
                p.push(key, m);
            }
        }
        match alone(good).map(Self::validate) {
            Ok(Ok(_)) | Err(_) if p.len() == 0 => Err(syntax()),
            Ok(Ok(_)) | Err(_) => p.into_result(AgentConfig::default()),
            Ok(Err(ConfigError::Invalid(more))) => {
                p.0.extend(more);
                p.into_result(AgentConfig::default())
            }
            Ok(Err(other)) => Err(other),
        }
    }
}
