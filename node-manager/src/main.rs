//! flyt-node-manager (skeleton).
#![forbid(unsafe_code)]

fn main() {
    eprintln!("flyt-node-manager: not built yet");
    std::process::exit(2);
}
