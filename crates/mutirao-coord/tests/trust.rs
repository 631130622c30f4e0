//! Issue 29 ("Trust"), the coordinator's part, over real sockets to a coordinator in this
//! process: a refused upload is answered before its body is read and its connection closed; a
//! half-sent header is closed after the header timeout; connections past the cap are answered
//! 503 at once; a heartbeat from another address than the host registered at is refused and
//! journalled until the agent registers again.

use mutirao_coord::api::{Coordinator, Limits};
use mutirao_coord::auth::{Kind, Tokens};
use mutirao_coord::client::Client;
use mutirao_coord::{Error, HostReport, Repo, SqliteStore, Store};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ANA: &str = "ana-token-0123456789";
const N1: &str = "n1-agent-token-012345";

#[path = "common/serve.rs"]
mod serve;

struct Server {
    addr: SocketAddr,
    c: Arc<Coordinator>,
    _serving: serve::InProcess,
    dir: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tokens() -> Tokens {
    let mut t = Tokens::new();
    t.add(Kind::User, "ana", ANA).unwrap();
    t.add(Kind::Agent, "n1", N1).unwrap();
    t
}

/// A coordinator serving on loopback with `limits`, over `store`.
fn serve_on(tag: &str, limits: Limits, store: Arc<dyn Store>) -> Server {
    let dir = std::env::temp_dir().join(format!("mutirao-trust-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let repo = Repo::open(&dir.join("repo"), 256 << 20).unwrap();
    let c = Coordinator::with_limits(store, tokens(), repo, Duration::from_secs(5), limits);
    let serving = serve::InProcess::start(c.clone());
    Server {
        addr: serving.addr,
        c,
        _serving: serving,
        dir,
    }
}

fn serve_fresh(tag: &str, limits: Limits) -> Server {
    serve_on(
        tag,
        limits,
        Arc::new(SqliteStore::open_in_memory().unwrap()),
    )
}

/// What arrives on `s` until it is closed or `limit` passes: the bytes, and whether it was
/// closed (end of file or reset) rather than still open.
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return (got, false);
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return (got, false)
            }
            Err(_) => return (got, true),
        }
    }
}

/// The status line of the answer in `got` (up to its first CRLF).
fn status_line(got: &[u8]) -> String {
    let text = String::from_utf8_lossy(got);
    text.split("\r\n").next().unwrap_or("").to_string()
}

/// The headers of a 150 MiB upload, with `token` if given.
fn big_upload_head(token: Option<&str>) -> String {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    format!("POST /blobs HTTP/1.1\r\nHost: coordinator\r\nContent-Type: application/octet-stream\r\nContent-Length: 157286400\r\n{auth}\r\n")
}

#[test]
fn a_refused_150_mib_upload_is_answered_before_its_first_mib_is_read_and_then_closed() {
    let s = serve_fresh("early401", Limits::default());
    for (token, want) in [
        (None, "HTTP/1.1 401"),
        (Some("not-a-known-token-at-all"), "HTTP/1.1 401"),
        // An agent's token is known but uploads are for users: refused the same way.
        (Some(N1), "HTTP/1.1 403"),
    ] {
        let mut conn = TcpStream::connect(s.addr).unwrap();
        conn.write_all(big_upload_head(token).as_bytes()).unwrap();
        // 1 MiB of the 150 announced, from another thread (the server may close on us).
        let mut w = conn.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            let chunk = vec![b'x'; 64 << 10];
            let mut sent = 0usize;
            while sent < 1 << 20 {
                match w.write(&chunk) {
                    Ok(n) => sent += n,
                    Err(_) => break,
                }
            }
            sent
        });
        let t0 = Instant::now();
        let (got, _) = read_until_closed(&mut conn, Duration::from_secs(5));
        let sent = writer.join().unwrap();
        assert!(
            status_line(&got).starts_with(want),
            "{token:?}: {want} expected within 5 s with at most {sent} body bytes sent; got {:?} after {:?}",
            String::from_utf8_lossy(&got),
            t0.elapsed()
        );
        assert!(sent <= 1 << 20);
        // The server does not go on reading the 149 MiB left: the connection is closed, so
        // sending more fails long before it is all sent (the socket buffers take a few MiB).
        let chunk = vec![b'x'; 256 << 10];
        let mut more = 0usize;
        let t1 = Instant::now();
        conn.set_write_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let refused = loop {
            match conn.write(&chunk) {
                Ok(n) => more += n,
                Err(_) => break true,
            }
            if more >= 64 << 20 || t1.elapsed() > Duration::from_secs(10) {
                break false;
            }
        };
        assert!(
            refused && more < 32 << 20,
            "{token:?}: the server read on: {more} more bytes were sent without an error"
        );
    }
    let audit = s.c.audit();
    assert!(
        audit.iter().any(|l| l.starts_with("401 POST /blobs")),
        "{audit:#?}"
    );
    assert!(
        audit.iter().any(|l| l.starts_with("403 POST /blobs")),
        "{audit:#?}"
    );
}

#[test]
fn a_half_sent_header_is_closed_after_the_header_timeout() {
    assert!(Limits::default().header_read_timeout <= Duration::from_secs(10));
    let s = serve_fresh(
        "halfhead",
        Limits {
            header_read_timeout: Duration::from_secs(1),
            ..Limits::default()
        },
    );
    let mut conn = TcpStream::connect(s.addr).unwrap();
    conn.write_all(b"GET /jobs HTTP/1.1\r\nHost: coordinator\r\nAuthor")
        .unwrap();
    let t0 = Instant::now();
    let (_, closed) = read_until_closed(&mut conn, Duration::from_secs(8));
    let took = t0.elapsed();
    assert!(closed, "still open after {took:?}");
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(4),
        "closed after {took:?}, expected about 1 s"
    );
    // Whole requests are still served.
    let mut ok = TcpStream::connect(s.addr).unwrap();
    ok.write_all(b"GET /openapi.json HTTP/1.1\r\nHost: coordinator\r\nConnection: close\r\n\r\n")
        .unwrap();
    let (got, _) = read_until_closed(&mut ok, Duration::from_secs(5));
    assert_eq!(status_line(&got), "HTTP/1.1 200 OK");
}

#[test]
fn connections_past_the_cap_are_answered_503_and_closed_at_once() {
    let s = serve_fresh(
        "cap",
        Limits {
            max_connections: 2,
            header_read_timeout: Duration::from_secs(30),
            ..Limits::default()
        },
    );
    // Two clients that never finish their header hold both places.
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut c = TcpStream::connect(s.addr).unwrap();
            c.write_all(b"GET /jobs HTTP/1.1\r\n").unwrap();
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut third = TcpStream::connect(s.addr).unwrap();
    let t0 = Instant::now();
    let (got, closed) = read_until_closed(&mut third, Duration::from_secs(3));
    assert!(
        closed && status_line(&got) == "HTTP/1.1 503 Service Unavailable",
        "after {:?}: {:?} (closed: {closed})",
        t0.elapsed(),
        String::from_utf8_lossy(&got)
    );
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert!(String::from_utf8_lossy(&got).contains("maximum of connections"));
    assert!(s
        .c
        .audit()
        .iter()
        .any(|l| l.starts_with("503") && l.contains("2 connections")));
    // A place freed is taken again.
    drop(held.pop());
    let t0 = Instant::now();
    loop {
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.write_all(b"GET /openapi.json HTTP/1.1\r\nHost: c\r\nConnection: close\r\n\r\n")
            .unwrap();
        let (got, _) = read_until_closed(&mut c, Duration::from_secs(3));
        if status_line(&got) == "HTTP/1.1 200 OK" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no place freed: {:?}",
            String::from_utf8_lossy(&got)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn host_at(addr: &str) -> HostReport {
    HostReport {
        name: "n1".into(),
        addr: addr.into(),
        idle_cpu: 2.0,
        free_mem_mib: 1000,
        load: 0.0,
        owner_active: false,
        ..Default::default()
    }
}

fn status_of(e: Error) -> (u16, String) {
    match e {
        Error::Remote { status, message } => (status, message),
        e => panic!("not a refusal: {e}"),
    }
}

#[test]
fn a_heartbeat_from_another_address_is_refused_and_journalled_until_the_agent_registers_again() {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
    let s = serve_on("pin", Limits::default(), store.clone());
    let agent = Client::new(&format!("http://{}", s.addr), N1).unwrap();
    agent.register(&host_at("127.0.0.1:7301")).unwrap();
    agent.heartbeat(&host_at("127.0.0.1:7301")).unwrap();
    // Someone with the agent's token re-points the host at another address.
    let (status, message) = status_of(agent.heartbeat(&host_at("127.0.0.9:7999")).unwrap_err());
    assert_eq!(status, 409, "{message}");
    assert!(
        message.contains("registered at \"127.0.0.1:7301\"") && message.contains("register again"),
        "{message}"
    );
    assert_eq!(
        store.host("n1").unwrap().unwrap().report.addr,
        "127.0.0.1:7301"
    );
    assert!(
        s.c.audit()
            .iter()
            .any(|l| l.starts_with("409 POST /agents/heartbeat") && l.contains("127.0.0.9:7999")),
        "{:#?}",
        s.c.audit()
    );
    // A coordinator restarted on the same store pins the stored address too.
    drop(s);
    let s = serve_on("pin2", Limits::default(), store.clone());
    let agent = Client::new(&format!("http://{}", s.addr), N1).unwrap();
    let (status, _) = status_of(agent.heartbeat(&host_at("127.0.0.9:7999")).unwrap_err());
    assert_eq!(status, 409);
    // Registering again moves the host (journalled), and the old address is refused then.
    agent.register(&host_at("127.0.0.1:7302")).unwrap();
    agent.heartbeat(&host_at("127.0.0.1:7302")).unwrap();
    assert_eq!(
        store.host("n1").unwrap().unwrap().report.addr,
        "127.0.0.1:7302"
    );
    assert!(
        s.c.audit()
            .iter()
            .any(|l| l.contains("registered again") && l.contains("127.0.0.1:7302")),
        "{:#?}",
        s.c.audit()
    );
    let (status, _) = status_of(agent.heartbeat(&host_at("127.0.0.1:7301")).unwrap_err());
    assert_eq!(status, 409);
    // A user of the grid sees nothing of it but the host where it registered.
    let ana = Client::new(&format!("http://{}", s.addr), ANA).unwrap();
    assert_eq!(ana.hosts().unwrap()[0].host.report.addr, "127.0.0.1:7302");
}
