//! The daemons' configuration files and environment overrides: TOML text (before the first NUL
//! byte) and `KEY=value` lines (after it), loaded the way each daemon loads them. Bad input is
//! a `ConfigError` naming the file, line and key, never a panic.
#![no_main]

use std::path::Path;

use flyt_daemon_kit::config::from_text;

#[path = "../../client-manager/src/config.rs"]
#[allow(dead_code, reason = "only the types and prefix are used here")]
mod client_manager;
#[path = "../../cluster-manager/src/config.rs"]
#[allow(dead_code, reason = "only the types and prefix are used here")]
mod cluster_manager;
#[path = "../../node-manager/src/config.rs"]
#[allow(dead_code, reason = "only the types and prefix are used here")]
mod node_manager;

fn load<T: serde::Serialize + serde::de::DeserializeOwned + Default>(text: &str, env: &str, prefix: &str) {
    let env = env.lines().filter_map(|line| line.split_once('=')).map(|(key, value)| (format!("{prefix}_{key}"), value.to_string()));
    if let Err(error) = from_text::<T>(Some((Path::new("fuzz.toml"), text)), prefix, env) {
        let _ = error.to_string();
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let Ok(rest) = std::str::from_utf8(rest) else { return };
    let (text, env) = rest.split_once('\0').unwrap_or((rest, ""));
    match selector % 3 {
        0 => load::<cluster_manager::ClusterManagerConfig>(text, env, cluster_manager::ENV_PREFIX),
        1 => load::<node_manager::NodeManagerConfig>(text, env, node_manager::ENV_PREFIX),
        _ => load::<client_manager::ClientManagerConfig>(text, env, client_manager::ENV_PREFIX),
    }
});
