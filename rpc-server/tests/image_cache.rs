//! The module image cache, spoken to directly: a large image sent once is loaded by later
//! sessions from its digest alone; the server files images under the digest it computes itself;
//! a digest it does not hold, or a server without a cache, asks for the bytes.

#![allow(clippy::tests_outside_test_module, reason = "an integration test crate: every function in it is a test")]

use std::path::Path;
use std::time::{Duration, Instant};

use flyt_protocol::CudaError;
use flyt_protocol::ops::{CACHED_IMAGE_MIN, image_digest, req};
use flyt_test_support::{artifact, scratch_dir};

mod raw;
use raw::{RawSession, emulated_server};

fn large_image(fill: u8) -> Vec<u8> {
    let mut image = b".version 8.0\n.target sm_90\n.address_size 64\n".to_vec();
    image.resize(CACHED_IMAGE_MIN + 1000, fill);
    image
}

fn cached_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(Result::ok).map(|entry| entry.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.retain(|name| name.ends_with(".image"));
    names
}

fn hex(digest: &[u8; 32]) -> String {
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[test]
fn a_large_image_sent_once_serves_later_sessions_by_digest() {
    let cache = scratch_dir("image-cache-folder").join("cache");
    let cache_arg = cache.display().to_string();
    let (server, socket) = emulated_server("image-cache", &["--image-cache", &cache_arg]);
    let image = large_image(b' ');
    let digest = image_digest(&image);

    // First session: the server has nothing under the digest and asks for the bytes.
    let mut first = RawSession::open(&socket, None).unwrap();
    let (offer, _) = first.call(req::RegisterModule { module: 1, cached: Some(digest) });
    assert_eq!(offer.map(|reply| reply.image_needed), Ok(true));
    // The emulated device loads no code, but the bytes are filed all the same.
    let (sent, _) = first.call_with_bulk(req::RegisterModule { module: 1, cached: None }, &image);
    assert_eq!(sent.result.err(), Some(CudaError::NOT_SUPPORTED));
    let deadline = Instant::now() + Duration::from_secs(10);
    while cached_files(&cache).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(cached_files(&cache), [format!("{}.image", hex(&digest))], "filed under the digest the server computed");

    // A small image is never filed: sending it costs less than a round trip.
    let small = b".version 8.0\n.target sm_90\n".to_vec();
    assert_eq!(
        first.call_with_bulk(req::RegisterModule { module: 2, cached: None }, &small).0.result.err(),
        Some(CudaError::NOT_SUPPORTED)
    );

    // A later session loads it from the digest alone: the device's own answer, not a request for bytes.
    let mut second = RawSession::open(&socket, None).unwrap();
    let (hit, _) = second.call(req::RegisterModule { module: 7, cached: Some(digest) });
    assert_eq!(hit.err(), Some(CudaError::NOT_SUPPORTED));
    assert!(server.wait_for_log("module image from the cache", Duration::from_secs(5)), "{}", server.log_text());
    // A digest nobody sent asks for the bytes; a digest with bytes attached is refused.
    let unknown = image_digest(&large_image(b'x'));
    assert_eq!(second.call(req::RegisterModule { module: 8, cached: Some(unknown) }).0.map(|reply| reply.image_needed), Ok(true));
    assert_eq!(
        second.call_with_bulk(req::RegisterModule { module: 9, cached: Some(digest) }, &image).0.result.err(),
        Some(CudaError::INVALID_VALUE)
    );
    second.round_trip(5);
    assert_eq!(cached_files(&cache).len(), 1, "neither the small image nor a refused one was filed");

    // A damaged file is a miss, never wrong code.
    let path = cache.join(format!("{}.image", hex(&digest)));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0x20;
    std::fs::write(&path, bytes).unwrap();
    let (damaged, _) = second.call(req::RegisterModule { module: 10, cached: Some(digest) });
    assert_eq!(damaged.map(|reply| reply.image_needed), Ok(true));
    assert!(!path.exists(), "the damaged file is removed");
}

#[test]
fn a_server_without_a_cache_asks_for_every_image() {
    let (_server, socket) = emulated_server("image-cache-off", &["--image-cache", "off"]);
    let mut session = RawSession::open(&socket, None).unwrap();
    let image = large_image(b' ');
    assert_eq!(
        session.call_with_bulk(req::RegisterModule { module: 1, cached: None }, &image).0.result.err(),
        Some(CudaError::NOT_SUPPORTED)
    );
    let (offer, _) = session.call(req::RegisterModule { module: 2, cached: Some(image_digest(&image)) });
    assert_eq!(offer.map(|reply| reply.image_needed), Ok(true));
}

#[test]
fn a_cache_folder_others_may_write_stops_the_server_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = scratch_dir("image-cache-mode");
    let cache = scratch.join("open-to-all");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = format!("unix:{}", scratch.join("flyt.sock").display());
    let output = std::process::Command::new(artifact("flyt-rpc-server"))
        .args(["--device", "emulated", "--listen", &socket, "--image-cache"])
        .arg(&cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("writable by others"), "{stderr}");
}
