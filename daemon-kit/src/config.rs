//! Config loading: defaults, then an optional TOML file, then environment overrides.
//!
//! Every setting has a default (the config type's `Default`). Every leaf key has an override
//! named `<PREFIX>_<TABLE>_<KEY>` in capitals, e.g. `[store] uri` of the cluster manager is
//! `FLYT_CLUSTER_MANAGER_STORE_URI`. String settings take the variable's text as is; other
//! settings take a TOML value (`8080`, `true`, `["a", "b"]`, `[{ name = "x" }]`).
//!
//! Errors name what to fix: `cluster-manager.toml:12: key `listen`: invalid type ...`, or
//! `FLYT_..._PORT (key `port`): ...`.

use std::path::{Path, PathBuf};

use serde::{Serialize, de::DeserializeOwned};
use toml::{Table, Value};

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum ConfigError {
    /// cannot read config file {0}: {1}
    Read(PathBuf, std::io::Error),
    /// {file}:{line}: key `{key}`: {message}
    Invalid { file: PathBuf, line: usize, key: String, message: String },
    /// environment variable {variable} (key `{key}`): {message}
    Env { variable: String, key: String, message: String },
    /// the built-in defaults do not serialize to TOML (a bug): {0}
    Defaults(String),
}

/// One overridable setting: its dotted key and its environment variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub key: String,
    pub variable: String,
}

/// Every leaf setting of `T` and the variable that overrides it.
pub fn settings<T: Serialize + Default>(env_prefix: &str) -> Result<Vec<Setting>, ConfigError> {
    let defaults = Table::try_from(T::default()).map_err(|error| ConfigError::Defaults(error.to_string()))?;
    let mut out = Vec::new();
    collect_settings(&defaults, &mut Vec::new(), env_prefix, &mut out);
    Ok(out)
}

fn collect_settings(table: &Table, path: &mut Vec<String>, env_prefix: &str, out: &mut Vec<Setting>) {
    for (name, value) in table {
        path.push(name.clone());
        if let Value::Table(inner) = value {
            collect_settings(inner, path, env_prefix, out);
        } else {
            let variable = std::iter::once(env_prefix.to_string())
                .chain(path.iter().map(|segment| segment.replace('-', "_").to_uppercase()))
                .collect::<Vec<_>>()
                .join("_");
            out.push(Setting { key: path.join("."), variable });
        }
        path.pop();
    }
}

/// Loads `T`: defaults, then the file at `path` (when given), then `env_prefix`'s variables from
/// `env` (pass `std::env::vars()`; tests pass their own).
pub fn load<T: Serialize + DeserializeOwned + Default>(
    path: Option<&Path>,
    env_prefix: &str,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<T, ConfigError> {
    let text = match path {
        Some(path) => Some(std::fs::read_to_string(path).map_err(|error| ConfigError::Read(path.to_path_buf(), error))?),
        None => None,
    };
    from_text(path.zip(text.as_deref()), env_prefix, env)
}

/// `load` with the file's text already read (`(its path, for messages; its text)`).
pub fn from_text<T: Serialize + DeserializeOwned + Default>(
    file: Option<(&Path, &str)>,
    env_prefix: &str,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<T, ConfigError> {
    let mut table = match file {
        Some((path, text)) => {
            // Deserializing the file alone first pins type errors to a line of the file.
            toml::from_str::<T>(text).map_err(|error| file_error(path, text, &error))?;
            text.parse::<Table>().map_err(|error| file_error(path, text, &error))?
        }
        None => Table::new(),
    };
    let defaults = Table::try_from(T::default()).map_err(|error| ConfigError::Defaults(error.to_string()))?;
    let env: std::collections::HashMap<String, String> = env.into_iter().collect();
    for setting in settings::<T>(env_prefix)? {
        let Some(raw) = env.get(&setting.variable) else { continue };
        let env_error = |message: String| ConfigError::Env { variable: setting.variable.clone(), key: setting.key.clone(), message };
        let path: Vec<&str> = setting.key.split('.').collect();
        let default = lookup(&defaults, &path);
        let value = match default {
            Some(Value::String(_)) => Value::String(raw.clone()),
            _ => parse_value(raw).map_err(env_error)?,
        };
        set(&mut table, &path, value);
        Value::Table(table.clone()).try_into::<T>().map_err(|error| env_error(error.message().to_string()))?;
    }
    Value::Table(table).try_into::<T>().map_err(|error| ConfigError::Defaults(error.to_string()))
}

/// Checks that the example config at `example` documents `T`: loaded alone it gives exactly the
/// built-in defaults, and it names every environment override. The managers' tests call it on
/// `configs/*.toml`; the error says what is off.
pub fn check_example<T: Serialize + DeserializeOwned + Default + PartialEq + std::fmt::Debug>(
    example: &Path,
    env_prefix: &str,
) -> Result<(), String> {
    let loaded: T = load(Some(example), env_prefix, Vec::new()).map_err(|error| error.to_string())?;
    let defaults = T::default();
    if loaded != defaults {
        return Err(format!("{} differs from the defaults:\n{loaded:#?}\nvs\n{defaults:#?}", example.display()));
    }
    let text = std::fs::read_to_string(example).map_err(|error| format!("{}: {error}", example.display()))?;
    let settings = settings::<T>(env_prefix).map_err(|error| error.to_string())?;
    match settings.iter().find(|setting| !text.contains(&setting.variable)) {
        Some(missing) => Err(format!("{} does not mention {}", example.display(), missing.variable)),
        None => Ok(()),
    }
}

/// The test each manager's config module carries: `configs/FILE` (its example config) documents
/// the real defaults of `$config` and every environment override (`ENV_PREFIX` of the module
/// where the macro stands), as [`check_example`] checks.
#[macro_export]
macro_rules! example_config_test {
    ($config:ident, $file:literal) => {
        #[cfg(test)]
        mod example_config {
            /// The example config documents the real defaults and every environment override.
            #[test]
            fn the_example_config_shows_every_default_and_override() {
                let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/", $file);
                $crate::config::check_example::<super::$config>(std::path::Path::new(example), super::ENV_PREFIX).unwrap();
            }
        }
    };
}

fn parse_value(raw: &str) -> Result<Value, String> {
    let mut table: Table = format!("value = {raw}").parse().map_err(|error: toml::de::Error| {
        format!("`{raw}` is not a TOML value such as 8080, true, 0o666 or [\"a\"] ({})", error.message().trim())
    })?;
    table.remove("value").ok_or_else(|| "empty value".to_string())
}

fn lookup<'a>(table: &'a Table, path: &[&str]) -> Option<&'a Value> {
    let (last, parents) = path.split_last()?;
    let mut current = table;
    for segment in parents {
        current = current.get(*segment)?.as_table()?;
    }
    current.get(*last)
}

fn set(table: &mut Table, path: &[&str], value: Value) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut current = table;
    for segment in parents {
        let entry = current.entry(segment.to_string()).or_insert_with(|| Value::Table(Table::new()));
        if !entry.is_table() {
            *entry = Value::Table(Table::new());
        }
        let Value::Table(inner) = entry else { return };
        current = inner;
    }
    current.insert(last.to_string(), value);
}

fn file_error(path: &Path, text: &str, error: &toml::de::Error) -> ConfigError {
    let offset = error.span().map(|span| span.start).unwrap_or(0).min(text.len());
    let line = text[..offset].matches('\n').count() + 1;
    ConfigError::Invalid { file: path.to_path_buf(), line, key: key_at(text, offset), message: error.message().trim().to_string() }
}

/// The dotted key whose line holds `offset`: the nearest `[table]` header above it plus the key
/// before `=` on that line (`-` when the line has no key, e.g. a syntax error in a header).
fn key_at(text: &str, offset: usize) -> String {
    let line_start = text[..offset].rfind('\n').map(|index| index + 1).unwrap_or(0);
    let line = text[line_start..].lines().next().unwrap_or("");
    let table = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|candidate| candidate.starts_with('['))
        .map(|header| header.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    let trimmed = line.trim();
    if trimmed.starts_with('[') {
        return trimmed.trim_matches(|c| c == '[' || c == ']').trim().to_string();
    }
    let key = line.split_once('=').map(|(key, _)| key.trim().trim_matches('"').to_string()).filter(|key| !key.is_empty());
    match (table, key) {
        (Some(table), Some(key)) => format!("{table}.{key}"),
        (None, Some(key)) => key,
        (Some(table), None) => table,
        (None, None) => "-".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Example {
        name: String,
        port: u16,
        store: Store,
        gpus: Vec<Gpu>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Store {
        uri: String,
        state_dir: String,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Gpu {
        name: String,
        sm_count: u32,
    }

    impl Default for Example {
        fn default() -> Self {
            Self { name: "x".into(), port: 1, store: Store::default(), gpus: Vec::new() }
        }
    }

    impl Default for Store {
        fn default() -> Self {
            Self { uri: String::new(), state_dir: "/var/lib/flyt".into() }
        }
    }

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("example.toml");
        std::fs::write(&path, text).unwrap();
        (folder, path)
    }

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect()
    }

    #[test]
    fn defaults_file_then_env() {
        let (_folder, path) = write("name = \"file\"\n[store]\nuri = \"mongodb://a\"\n");
        let config: Example =
            load(Some(&path), "FLYT_T", vars(&[("FLYT_T_PORT", "99"), ("FLYT_T_STORE_STATE_DIR", "/tmp/s"), ("OTHER", "1")])).unwrap();
        assert_eq!(config.name, "file");
        assert_eq!(config.port, 99);
        assert_eq!(config.store, Store { uri: "mongodb://a".into(), state_dir: "/tmp/s".into() });
        let config: Example = load(None, "FLYT_T", vars(&[("FLYT_T_GPUS", "[{ name = \"emu\", sm_count = 8 }]")])).unwrap();
        assert_eq!(config.gpus, vec![Gpu { name: "emu".into(), sm_count: 8 }]);
        let names: Vec<String> = settings::<Example>("FLYT_T").unwrap().into_iter().map(|setting| setting.variable).collect();
        assert!(names.contains(&"FLYT_T_STORE_URI".to_string()), "{names:?}");
    }

    #[test]
    fn file_errors_name_file_line_and_key() {
        let (_folder, path) = write("name = \"a\"\n\n[store]\nstate_dir = 5\n");
        let error = load::<Example>(Some(&path), "FLYT_T", vars(&[])).unwrap_err().to_string();
        assert!(error.contains("example.toml:4: key `store.state_dir`"), "{error}");
        let (_folder, path) = write("name = \"a\"\nprot = 5\n");
        let error = load::<Example>(Some(&path), "FLYT_T", vars(&[])).unwrap_err().to_string();
        assert!(error.contains(":2: key `prot`") && error.contains("unknown field"), "{error}");
        let (_folder, path) = write("name = \n");
        let error = load::<Example>(Some(&path), "FLYT_T", vars(&[])).unwrap_err().to_string();
        assert!(error.contains(":1:"), "{error}");
    }

    #[test]
    fn check_example_wants_the_defaults_and_every_variable() {
        let (_folder, path) = write("# FLYT_T_NAME FLYT_T_PORT FLYT_T_STORE_URI FLYT_T_STORE_STATE_DIR FLYT_T_GPUS\nname = \"x\"\n");
        check_example::<Example>(&path, "FLYT_T").unwrap();
        let (_folder, path) = write("# FLYT_T_NAME FLYT_T_PORT FLYT_T_STORE_URI FLYT_T_GPUS\n");
        let error = check_example::<Example>(&path, "FLYT_T").unwrap_err();
        assert!(error.contains("does not mention FLYT_T_STORE_STATE_DIR"), "{error}");
        let (_folder, path) = write("# FLYT_T_NAME FLYT_T_PORT FLYT_T_STORE_URI FLYT_T_STORE_STATE_DIR FLYT_T_GPUS\nport = 2\n");
        let error = check_example::<Example>(&path, "FLYT_T").unwrap_err();
        assert!(error.contains("differs from the defaults"), "{error}");
    }

    #[test]
    fn env_errors_name_the_variable() {
        let error = load::<Example>(None, "FLYT_T", vars(&[("FLYT_T_PORT", "many")])).unwrap_err().to_string();
        assert!(error.contains("FLYT_T_PORT") && error.contains("`port`"), "{error}");
        let error = load::<Example>(None, "FLYT_T", vars(&[("FLYT_T_PORT", "70000")])).unwrap_err().to_string();
        assert!(error.contains("FLYT_T_PORT"), "{error}");
    }
}
