//! Diagnostic: 1 GiB one way over loopback TCP, plain and through Flyt's TLS (handshake, then
//! the record threads of `flyt_ring::tls`), printing GB/s and the CPU the process spent per
//! GiB. Shows what the TLS layer itself costs on a machine, apart from the rest of Flyt.
//!   cargo run --release -p flyt-ring --example tls_loopback

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use flyt_ring::tls;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

const TOTAL: usize = 1 << 30;
const WRITE: usize = 1 << 20;

/// CPU seconds this process has used.
fn cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is a valid value for getrusage to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Sends TOTAL bytes from `sender` while `receiver` (on its own thread) reads them; prints the rate.
fn measure(label: &str, mut sender: impl Write, receiver: std::thread::JoinHandle<usize>) {
    let chunk = vec![7u8; WRITE];
    let (started, cpu) = (Instant::now(), cpu_seconds());
    for _ in 0..TOTAL / WRITE {
        sender.write_all(&chunk).expect("send");
    }
    drop(sender);
    assert_eq!(receiver.join().expect("receiver"), TOTAL);
    let seconds = started.elapsed().as_secs_f64();
    println!("{label}: {:.2} GB/s, {:.2} CPU-s per GiB", TOTAL as f64 / seconds / 1e9, cpu_seconds() - cpu);
}

fn read_all(mut reader: impl Read) -> usize {
    let mut buffer = vec![0u8; WRITE];
    let mut total = 0;
    loop {
        match reader.read(&mut buffer).expect("receive") {
            0 => return total,
            read => total += read,
        }
    }
}

fn main() {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let der = CertificateDer::from(certified.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der.clone()).expect("root");
    let client = tls::client_config_trusting(roots).expect("client config");
    let server = tls::server_config_showing(vec![der], key).expect("server config");

    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let receiver = std::thread::spawn(move || read_all(listener.accept().expect("accept").0));
    measure("plain TCP", TcpStream::connect(address).expect("connect"), receiver);

    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let receiver = std::thread::spawn(move || {
        let tcp = listener.accept().expect("accept").0;
        read_all(tls::accept(server, tcp, Duration::from_secs(5)).expect("TLS accept"))
    });
    let tcp = TcpStream::connect(address).expect("connect");
    let name = ServerName::try_from("localhost").expect("name");
    measure("TCP + TLS", tls::connect(client, name, tcp, Duration::from_secs(5)).expect("TLS connect"), receiver);
}
