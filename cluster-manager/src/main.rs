//! flyt-cluster-manager (skeleton).
#![forbid(unsafe_code)]

fn main() {
    eprintln!("flyt-cluster-manager: not built yet");
    std::process::exit(2);
}
