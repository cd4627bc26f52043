//! flyt-client-manager (skeleton).
#![forbid(unsafe_code)]

fn main() {
    eprintln!("flyt-client-manager: not built yet");
    std::process::exit(2);
}
