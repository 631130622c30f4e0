//! Issue 29: four unauthenticated 150 MiB uploads in parallel to a coordinator in this process
//! do not grow its peak memory (VmHWM) by 32 MiB: each is refused from its headers. Alone in
//! its test binary, so no other test's allocations are counted.

use mutirao_coord::api::{Coordinator, Limits};
use mutirao_coord::auth::{Kind, Tokens};
use mutirao_coord::{Repo, SqliteStore};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

#[path = "common/serve.rs"]
mod serve;

/// A field of /proc/self/status, in KiB.
fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Send a whole 150 MiB upload with `auth` (until the server closes on us); the answer's
/// status line and how many body bytes were sent.
fn upload_150_mib(addr: std::net::SocketAddr, auth: &str) -> (String, usize) {
    let mut conn = TcpStream::connect(addr).unwrap();
    let total = 150usize << 20;
    conn.write_all(
        format!("POST /blobs HTTP/1.1\r\nHost: c\r\nContent-Length: {total}\r\n{auth}\r\n")
            .as_bytes(),
    )
    .unwrap();
    let mut r = conn.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        r.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut got = Vec::new();
        let _ = r.read_to_end(&mut got);
        String::from_utf8_lossy(&got)
            .split("\r\n")
            .next()
            .unwrap_or("")
            .to_string()
    });
    let chunk = vec![b'x'; 256 << 10];
    let mut sent = 0usize;
    conn.set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    while sent < total {
        match conn.write(&chunk[..chunk.len().min(total - sent)]) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    let _ = conn.shutdown(std::net::Shutdown::Write);
    (reader.join().unwrap(), sent)
}

#[test]
fn four_unauthenticated_150_mib_uploads_in_parallel_grow_peak_memory_by_less_than_32_mib() {
    let dir = std::env::temp_dir().join(format!("mutirao-trust-mem-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut tokens = Tokens::new();
    tokens
        .add(Kind::User, "ana", "ana-token-0123456789")
        .unwrap();
    // The repository takes 256 MiB uploads: only authentication stands in their way.
    let c = Coordinator::with_limits(
        Arc::new(SqliteStore::open_in_memory().unwrap()),
        tokens,
        Repo::open(&dir.join("repo"), 256 << 20).unwrap(),
        Duration::from_secs(5),
        Limits::default(),
    );
    let serving = serve::InProcess::start(c);
    let addr = serving.addr;
    // Warm up (runtime threads, first connections), then take the baseline.
    let (warm, _) = upload_150_mib(addr, "");
    assert!(warm.starts_with("HTTP/1.1 401"), "{warm:?}");
    let (hwm0, rss0) = (status_kib("VmHWM"), status_kib("VmRSS"));
    let clients: Vec<_> = [
        "",
        "",
        "Authorization: Bearer unknown-token-0123456789\r\n",
        "",
    ]
    .into_iter()
    .map(|auth| std::thread::spawn(move || upload_150_mib(addr, auth)))
    .collect();
    for c in clients {
        let (status, sent) = c.join().unwrap();
        assert!(
            status.starts_with("HTTP/1.1 401"),
            "{status:?} after {sent} bytes"
        );
    }
    let (hwm1, rss1) = (status_kib("VmHWM"), status_kib("VmRSS"));
    eprintln!(
        "four refused 150 MiB uploads: peak memory {hwm0} -> {hwm1} KiB (+{} KiB), resident {rss0} -> {rss1} KiB",
        hwm1.saturating_sub(hwm0)
    );
    assert!(
        hwm1.saturating_sub(hwm0) < 32 << 10,
        "peak memory grew by {} KiB",
        hwm1 - hwm0
    );
    drop(serving);
    let _ = std::fs::remove_dir_all(&dir);
}
