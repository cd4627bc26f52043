//! Fail points: named places in the daemons' state changes where a test makes the process die
//! as `kill -9` would, so that every step of placement, resize, release and server start is
//! proven to recover after a crash.
//!
//! `FLYT_FAILPOINT=name[,name...]` arms the named points: the first time the process reaches
//! one of them it writes one line to stderr and kills itself with SIGKILL (no destructor runs,
//! no buffer is flushed, exactly as a crash). Unset, as in production, [`hit`] compares nothing.
//! The points a daemon offers are listed next to the step they follow (`grep failpoint::hit`).

use std::sync::OnceLock;

/// The variable that arms fail points.
pub const ENV: &str = "FLYT_FAILPOINT";

fn armed() -> &'static [String] {
    static ARMED: OnceLock<Vec<String>> = OnceLock::new();
    ARMED.get_or_init(|| parse(&std::env::var(ENV).unwrap_or_default()))
}

fn parse(value: &str) -> Vec<String> {
    value.split(',').map(str::trim).filter(|name| !name.is_empty()).map(str::to_string).collect()
}

/// Kills this process at once when `name` is armed; does nothing otherwise.
pub fn hit(name: &str) {
    if armed().iter().any(|armed| armed == name) {
        eprintln!("fail point {name} reached ({ENV}): killing this process with SIGKILL");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        // SIGKILL cannot be caught; this only runs if raising it failed.
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_a_comma_separated_list() {
        assert_eq!(parse(""), Vec::<String>::new());
        assert_eq!(parse("place.stored_starting"), vec!["place.stored_starting".to_string()]);
        assert_eq!(parse(" a , b,,"), vec!["a".to_string(), "b".to_string()]);
        // Nothing is armed in the test process: reaching a point is harmless.
        hit("place.stored_starting");
    }
}
