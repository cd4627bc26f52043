//! flytctl (skeleton).
#![forbid(unsafe_code)]

fn main() {
    eprintln!("flytctl: not built yet");
    std::process::exit(2);
}
