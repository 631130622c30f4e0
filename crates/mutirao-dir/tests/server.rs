//! Digest 002 §7.8 directory checks through real servers (Unix sockets + loopback TCP), and
//! issue 29's: who a server listens to, and what its listeners hold at most.

use hmac::{Hmac, Mac};
use mutirao_dir::client::Client;
use mutirao_dir::net::{frame_into, FrameReader};
use mutirao_dir::server::{
    run_blocking, DirServer, ServerConfig, ServerHandles, DEFAULT_MAX_HANDSHAKES,
};
use mutirao_dir::wire::{Header, Kind, Packet, HEADER_LEN};
use mutirao_dir::{Acl, Attr, AttrList, Cred, DirConfig, DirError, Gid, Scope};
use sha2::Sha256;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

struct Grid {
    rt: tokio::runtime::Runtime,
    servers: Vec<DirServer>,
    socks: Vec<PathBuf>,
    handles: Vec<ServerHandles>,
    _dir: tempfile::TempDir,
}

impl Drop for Grid {
    fn drop(&mut self) {
        for h in &self.handles {
            h.abort();
        }
    }
}

/// Starts one server per `(cluster, node)`, all peers of each other.
fn grid(ids: &[(u64, u64)], heartbeat: Duration) -> Grid {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let listeners: Vec<tokio::net::TcpListener> = ids
        .iter()
        .map(|_| {
            rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .unwrap()
        })
        .collect();
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let mut servers = vec![];
    let mut socks = vec![];
    let mut handles = vec![];
    for (i, (l, &(cluster, node))) in listeners.into_iter().zip(ids).enumerate() {
        let cfg = ServerConfig {
            dir: DirConfig {
                cluster,
                node,
                heartbeat_timeout: heartbeat,
                ..DirConfig::default()
            },
            peers: addrs
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, a)| *a)
                .collect(),
            cluster_key: b"test cluster key".to_vec(),
            peer_timeout: Duration::from_millis(150),
            ..ServerConfig::default()
        };
        let s = DirServer::new(cfg).unwrap();
        let sock = dir.path().join(format!("s{i}.sock"));
        let _g = rt.enter();
        handles.push(s.spawn(Some(sock.clone()), Some(l)).unwrap());
        servers.push(s);
        socks.push(sock);
    }
    Grid {
        rt,
        servers,
        socks,
        handles,
        _dir: dir,
    }
}

fn al(pairs: &[(&str, &str)]) -> AttrList {
    AttrList::from_pairs(
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.as_bytes().to_vec())),
    )
    .unwrap()
}

/// A server of cluster 1 with a cluster key and these peers.
fn peer_server(node: u64, key: &[u8], peers: Vec<SocketAddr>, peer_timeout: Duration) -> DirServer {
    DirServer::new(ServerConfig {
        dir: DirConfig {
            cluster: 1,
            node,
            ..DirConfig::default()
        },
        peers,
        cluster_key: key.to_vec(),
        peer_timeout,
        ..ServerConfig::default()
    })
    .unwrap()
}

/// Registers `attrs` in `s` as `cred`, bound to the server (in-process, no socket).
fn register_in(s: &DirServer, cred: Cred, attrs: AttrList, acl: Acl) -> Gid {
    s.with_directory(|d| d.register(cred, Gid::NONE, attrs, acl, false))
        .unwrap()
        .gid
}

fn wait_until(mut f: impl FnMut() -> bool, what: &str) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn check_01_register_sends_nothing_to_peers() {
    // A "peer" that only counts connections.
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    fake.set_nonblocking(true).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("d.sock");
    let s = DirServer::new(ServerConfig {
        dir: DirConfig {
            cluster: 2,
            node: 5,
            ..DirConfig::default()
        },
        peers: vec![fake.local_addr().unwrap()],
        cluster_key: b"k".to_vec(),
        peer_timeout: Duration::from_millis(50),
        connect_timeout: Duration::from_millis(100),
        ..ServerConfig::default()
    })
    .unwrap();
    let h = {
        let _g = rt.enter();
        s.spawn(Some(sock.clone()), None).unwrap()
    };
    let mut c = Client::connect(&sock).unwrap();
    let ctx = c.open_context().unwrap();
    for i in 0..20 {
        let r = c
            .register(ctx, &al(&[("i", &i.to_string())]), &Acl::Public, false)
            .unwrap();
        let p = mutirao_dir::GidSplit::default().decode(r.gid);
        assert_eq!((p.cluster, p.node), (2, 5));
    }
    assert!(fake.accept().is_err(), "register contacted a peer");
    // a local-scope miss does not either; a grid miss does (so the probe works)
    assert_eq!(
        c.query(None, &al(&[("x", "y")]), Scope::Local),
        Err(DirError::NoMatch)
    );
    assert!(fake.accept().is_err(), "local query contacted a peer");
    assert_eq!(
        c.query(None, &al(&[("x", "y")]), Scope::Grid),
        Err(DirError::NoMatch)
    );
    fake.set_nonblocking(false).unwrap();
    assert!(fake.accept().is_ok(), "grid query did not contact the peer");
    h.abort();
}

#[test]
fn check_04_scopes_local_site_grid() {
    // A and B in site 1, C in site 2.
    let g = grid(&[(1, 1), (1, 2), (2, 3)], Duration::from_secs(5));
    let mut a = Client::connect(&g.socks[0]).unwrap();
    let mut b = Client::connect(&g.socks[1]).unwrap();
    let mut c = Client::connect(&g.socks[2]).unwrap();
    let on_b = b
        .register(Gid::NONE, &al(&[("where", "b")]), &Acl::Public, false)
        .unwrap()
        .gid;
    let on_c = c
        .register(Gid::NONE, &al(&[("where", "c")]), &Acl::Public, false)
        .unwrap()
        .gid;
    let qb = al(&[("where", "b")]);
    let qc = al(&[("where", "c")]);
    assert_eq!(a.query(None, &qb, Scope::Local), Err(DirError::NoMatch));
    assert_eq!(a.query(None, &qb, Scope::Site).unwrap().0, on_b);
    assert_eq!(a.query(None, &qb, Scope::Grid).unwrap().0, on_b);
    assert_eq!(a.query(None, &qc, Scope::Local), Err(DirError::NoMatch));
    assert_eq!(a.query(None, &qc, Scope::Site), Err(DirError::NoMatch));
    let (gid, attrs) = a.query(None, &qc, Scope::Grid).unwrap();
    assert_eq!(gid, on_c);
    assert_eq!(attrs, qc);
    // by gid, the same scoping
    assert_eq!(
        a.query(Some(on_b), &AttrList::new(), Scope::Local),
        Err(DirError::NotFound(on_b))
    );
    assert_eq!(
        a.query(Some(on_b), &AttrList::new(), Scope::Site)
            .unwrap()
            .0,
        on_b
    );
    assert_eq!(
        a.query(Some(on_c), &AttrList::new(), Scope::Site),
        Err(DirError::NotFound(on_c))
    );
    let want = AttrList::from_attrs([Attr::want("where", 8)]).unwrap();
    assert_eq!(a.query(Some(on_c), &want, Scope::Grid).unwrap().1, qc);
}

#[test]
fn check_05_paged_grid_query_yields_each_once_and_frees_state() {
    let g = grid(&[(1, 1), (1, 2), (1, 3), (1, 4)], Duration::from_secs(5));
    let mut want = HashSet::new();
    for s in &g.socks {
        let mut c = Client::connect(s).unwrap();
        for _ in 0..5 {
            want.insert(
                c.register(Gid::NONE, &al(&[("kind", "robot")]), &Acl::Public, false)
                    .unwrap()
                    .gid,
            );
        }
        c.register(Gid::NONE, &al(&[("kind", "other")]), &Acl::Public, false)
            .unwrap();
    }
    assert_eq!(want.len(), 20);
    let mut c = Client::connect(&g.socks[0]).unwrap();
    let mut got = vec![];
    for r in c
        .query_iter(&al(&[("kind", "robot")]), Scope::Site)
        .unwrap()
    {
        got.push(r.unwrap().0);
    }
    assert_eq!(got.len(), 20, "each result exactly once");
    assert_eq!(got.iter().copied().collect::<HashSet<_>>(), want);
    wait_until(
        || g.servers.iter().all(|s| s.open_queries() == 0),
        "state freed after exhaustion",
    );
    // stopping early frees every server's state too
    let mut it = c
        .query_iter(&al(&[("kind", "robot")]), Scope::Site)
        .unwrap();
    for _ in 0..8 {
        it.next().unwrap().unwrap();
    }
    assert!(g.servers.iter().map(|s| s.open_queries()).sum::<usize>() > 0);
    it.stop().unwrap();
    wait_until(
        || g.servers.iter().all(|s| s.open_queries() == 0),
        "state freed after stop",
    );
}

#[test]
fn check_06_concurrent_unique_registrations_on_k_servers_give_one_gid() {
    let k = 4;
    let g = grid(&[(1, 1), (1, 2), (1, 3), (1, 4)], Duration::from_secs(5));
    for round in 0..3 {
        let attrs = al(&[("group", &format!("g{round}")), ("type", "domain")]);
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..k)
                .map(|i| {
                    let sock = g.socks[i].clone();
                    let attrs = attrs.clone();
                    s.spawn(move || {
                        let mut c = Client::connect(&sock).unwrap();
                        c.register(Gid::NONE, &attrs, &Acl::Public, true).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            results.iter().all(|r| r.gid == results[0].gid),
            "{results:?}"
        );
        assert_eq!(
            results.iter().filter(|r| r.created).count(),
            1,
            "{results:?}"
        );
        let mut c = Client::connect(&g.socks[0]).unwrap();
        let n = c.query_iter(&attrs, Scope::Grid).unwrap().count();
        assert_eq!(n, 1, "exactly one resource exists");
    }
}

#[test]
fn check_07_outsider_gets_not_found_across_servers() {
    let g = grid(&[(1, 1), (1, 2)], Duration::from_secs(5));
    let alice = Cred::new(1000, 100);
    let outsider = Cred::new(4242, 4242);
    let acl = Acl::Only {
        users: vec![],
        groups: vec![100],
    };
    let reg = g.servers[1]
        .with_directory(|d| d.register(alice, Gid::NONE, al(&[("secret", "1")]), acl, false))
        .unwrap();
    let q = |who: Cred, gid: Option<Gid>, attrs: AttrList| {
        g.rt.block_on(g.servers[0].query(who, gid, &attrs, Scope::Grid))
    };
    assert_eq!(q(alice, None, al(&[("secret", "1")])).unwrap().0, reg.gid);
    assert_eq!(
        q(Cred::new(7, 100), Some(reg.gid), AttrList::new())
            .unwrap()
            .0,
        reg.gid
    );
    assert_eq!(
        q(outsider, None, al(&[("secret", "1")])),
        Err(DirError::NoMatch)
    );
    assert_eq!(
        q(outsider, None, al(&[("nothing", "1")])),
        Err(DirError::NoMatch)
    );
    assert_eq!(
        q(outsider, Some(reg.gid), AttrList::new()),
        Err(DirError::NotFound(reg.gid))
    );
    let missing = Gid(reg.gid.0 + 99);
    assert_eq!(
        q(outsider, Some(missing), AttrList::new()),
        Err(DirError::NotFound(missing))
    );
}

#[test]
fn check_03_killed_context_disappears_from_every_scope() {
    let hb = Duration::from_millis(150);
    let g = grid(&[(1, 1), (1, 2), (1, 3)], hb);
    let mut observer = Client::connect(&g.socks[0]).unwrap();
    let mut victim = Client::connect(&g.socks[1]).unwrap();
    let ctx = victim.open_context().unwrap();
    let plain = victim
        .register(ctx, &al(&[("v", "plain")]), &Acl::Public, false)
        .unwrap()
        .gid;
    let uniq = victim
        .register(ctx, &al(&[("v", "unique")]), &Acl::Public, true)
        .unwrap()
        .gid;
    // alive while heartbeating
    for _ in 0..4 {
        std::thread::sleep(hb / 3);
        victim.heartbeat(ctx).unwrap();
    }
    assert_eq!(
        observer
            .query(None, &al(&[("v", "plain")]), Scope::Grid)
            .unwrap()
            .0,
        plain
    );
    assert_eq!(
        observer
            .query(None, &al(&[("v", "unique")]), Scope::Grid)
            .unwrap()
            .0,
        uniq
    );
    // "kill" the process: no more heartbeats
    drop(victim);
    let killed = Instant::now();
    wait_until(
        || {
            observer
                .query(None, &al(&[("v", "plain")]), Scope::Grid)
                .is_err()
                && observer
                    .query(None, &al(&[("v", "unique")]), Scope::Grid)
                    .is_err()
        },
        "purge",
    );
    // heartbeat timeout + maintenance period (timeout/4) + the last fan-out's timeout
    assert!(
        killed.elapsed() <= hb * 3 + Duration::from_millis(400),
        "{:?}",
        killed.elapsed()
    );
}

#[test]
fn bad_requests_get_clear_errors_and_change_nothing() {
    let g = grid(&[(1, 1)], Duration::from_secs(5));
    let mut c = Client::connect(&g.socks[0]).unwrap();
    let keep = c
        .register(Gid::NONE, &al(&[("a", "1")]), &Acl::Public, false)
        .unwrap()
        .gid;
    let count = || g.servers[0].with_directory(|d| d.len());
    let before = count();
    // unknown scope
    let mut h = Header::new(Kind::Query);
    h.scope = 9;
    let e = c.call(Packet::new(h, al(&[("a", "1")]))).unwrap_err();
    assert_eq!(e, DirError::UnknownScope(9));
    // system namespace in a registration
    let e = c
        .call(Packet::new(
            Header::new(Kind::Register),
            al(&[("sys.context", "x")]),
        ))
        .unwrap_err();
    assert!(matches!(e, DirError::SystemNamespace(_)), "{e}");
    // malformed ACL
    let e = c
        .call(Packet::new(
            Header::new(Kind::Register),
            al(&[("b", "2"), ("sys.acl", "zz")]),
        ))
        .unwrap_err();
    assert!(matches!(e, DirError::BadAttrs(_)), "{e}");
    // unknown context, unknown query, delete of a missing gid
    let mut h = Header::new(Kind::Register);
    h.target = Gid(12345);
    assert_eq!(
        c.call(Packet::new(h, al(&[("b", "2")]))).unwrap_err(),
        DirError::UnknownContext(Gid(12345))
    );
    let mut h = Header::new(Kind::QueryNext);
    h.query_id = 777;
    assert_eq!(
        c.call(Packet::new(h, AttrList::new())).unwrap_err(),
        DirError::UnknownQuery(777)
    );
    assert_eq!(
        c.delete(Gid(keep.0 + 50)),
        Err(DirError::NotFound(Gid(keep.0 + 50)))
    );
    // a raw oversized / truncated packet on the socket
    {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&g.socks[0]).unwrap();
        let mut raw = Packet::new(Header::new(Kind::Register), AttrList::new()).encode();
        raw[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&1u32.to_le_bytes());
        raw.extend_from_slice(&1u16.to_le_bytes());
        raw.push(b'z');
        raw.push(0);
        raw.extend_from_slice(&(200_000u32).to_le_bytes());
        raw.extend(std::iter::repeat_n(0u8, 200_000));
        s.write_all(&(raw.len() as u32).to_le_bytes()).unwrap();
        s.write_all(&raw).unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut buf = vec![0; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut buf).unwrap();
        let reply = Packet::decode(&buf).unwrap();
        let e = mutirao_dir::server::error_from_packet(&reply);
        assert!(matches!(e, DirError::TooLarge(_)), "{e}");
        assert!(e.to_string().contains("limit"), "{e}");
    }
    assert_eq!(count(), before);
    assert_eq!(
        c.query(Some(keep), &AttrList::new(), Scope::Local)
            .unwrap()
            .0,
        keep
    );
}

#[test]
fn peer_with_wrong_key_is_rejected() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let l1 = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let a1 = l1.local_addr().unwrap();
    let mk = |node, key: &[u8], peers| peer_server(node, key, peers, Duration::from_millis(100));
    let holder = mk(1, b"right", vec![]);
    register_in(&holder, Cred::new(0, 0), al(&[("x", "1")]), Acl::Public);
    let intruder = mk(2, b"wrong", vec![a1]);
    let _g = rt.enter();
    let h1 = holder.spawn(None, Some(l1)).unwrap();
    let sock = dir.path().join("i.sock");
    let h2 = intruder.spawn(Some(sock.clone()), None).unwrap();
    let mut c = Client::connect(&sock).unwrap();
    assert_eq!(
        c.query(None, &al(&[("x", "1")]), Scope::Grid),
        Err(DirError::NoMatch)
    );
    h1.abort();
    h2.abort();
}

// ------------------------------------------------------------------ issue 29: trust and limits

/// A TCP listener on a free loopback port.
fn loopback_listener(rt: &tokio::runtime::Runtime) -> tokio::net::TcpListener {
    rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_server_without_a_cluster_key_opens_no_tcp_listener() {
    let rt = runtime();
    let s = DirServer::new(ServerConfig::default()).unwrap();
    let l = loopback_listener(&rt);
    let spawned = {
        let _g = rt.enter();
        s.spawn(None, Some(l))
    };
    match spawned {
        Err(DirError::BadConfig(m)) => assert!(m.contains("--key-file"), "{m}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(h) => {
            h.abort();
            panic!("a keyless server spawned a TCP listener");
        }
    }
    // serve_tcp refuses at once instead of serving.
    let l = loopback_listener(&rt);
    let served =
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(2), s.serve_tcp(l)).await });
    assert!(
        matches!(served, Ok(Err(DirError::BadConfig(_)))),
        "{served:?}"
    );
    // run_blocking fails before it is ready (and before it binds anything).
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = run_blocking(
            ServerConfig::default(),
            None,
            Some("127.0.0.1:0".parse().unwrap()),
            |bound| eprintln!("ready on {bound:?}"),
        );
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Err(DirError::BadConfig(m))) => assert!(m.contains("Unix socket only"), "{m}"),
        other => panic!("run_blocking without a key on TCP: {other:?}"),
    }
}

/// The connecting side of the peer handshake, written out by hand (what an attacker does).
fn raw_handshake(s: &mut TcpStream, key: &[u8]) -> std::io::Result<()> {
    type H = Hmac<Sha256>;
    let nc = [7u8; 32];
    let (cc, cn) = (0u64.to_le_bytes(), 99u64.to_le_bytes());
    let mut hello = b"MDIR1".to_vec();
    hello.extend_from_slice(&cc);
    hello.extend_from_slice(&cn);
    hello.extend_from_slice(&nc);
    s.write_all(&hello)?;
    let mut resp = [0u8; 16 + 32 + 32];
    s.read_exact(&mut resp)?;
    let ns = &resp[16..48];
    let mut m = H::new_from_slice(key).unwrap();
    for p in [&b"mdir-c"[..], ns, &nc, &cc, &cn] {
        m.update(p);
    }
    s.write_all(&m.finalize().into_bytes())
}

/// Sends `p` on `s` and waits (at most the socket's read timeout) for one reply.
fn peer_request(s: &mut TcpStream, p: &Packet) -> Option<Packet> {
    let mut f = Vec::new();
    frame_into(p, &mut f);
    s.write_all(&f).ok()?;
    let mut r = FrameReader::new(Duration::ZERO);
    let frame = r.next_frame(&*s).ok()??;
    Packet::decode(frame).ok()
}

#[test]
fn an_unauthenticated_peer_claiming_uid_0_cannot_read_or_delete_a_root_owned_restricted_entry() {
    let rt = runtime();
    let s = DirServer::new(ServerConfig::default()).unwrap();
    let root = Cred::new(0, 0);
    let secret = al(&[("secret", "root only")]);
    let only_root = Acl::Only {
        users: vec![],
        groups: vec![],
    };
    let gid = register_in(&s, root, secret, only_root);
    // The old `mutirao dir serve` without a key: a TCP listener anyway.
    let l = loopback_listener(&rt);
    let addr = l.local_addr().unwrap();
    let handles = {
        let _g = rt.enter();
        s.spawn(None, Some(l)).ok()
    };
    // The attacker proves knowledge of the empty key and claims to be root.
    let mut read_back = None;
    let mut deleted = false;
    if let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        if raw_handshake(&mut c, b"").is_ok() {
            let mut h = Header::new(Kind::PeerQuery);
            (h.uid, h.gid, h.target, h.query_id) = (0, 0, gid, 1);
            read_back = peer_request(&mut c, &Packet::new(h, AttrList::new()))
                .filter(|r| r.header.status == 0);
            let mut h = Header::new(Kind::PeerDelete);
            (h.uid, h.gid, h.target, h.query_id) = (0, 0, gid, 2);
            deleted = peer_request(&mut c, &Packet::new(h, AttrList::new()))
                .is_some_and(|r| r.header.status == 0);
        }
    }
    if let Some(h) = handles {
        h.abort();
    }
    assert!(read_back.is_none(), "the attacker read {read_back:?}");
    assert!(!deleted, "the attacker deleted the entry");
    let still = s.with_directory(|d| d.query(root, Some(gid), &AttrList::new()));
    assert_eq!(still.map(|(g, _)| g), Ok(gid), "the entry is still there");
}

/// How many of `socks` the server has closed (EOF or reset), looking without waiting.
fn closed(socks: &[TcpStream]) -> usize {
    socks
        .iter()
        .filter(|s| {
            let mut b = [0u8; 64];
            match (&**s).read(&mut b) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            }
        })
        .count()
}

#[test]
fn idle_connections_over_the_handshake_cap_are_closed_oldest_first_and_a_real_peer_still_joins() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let la = loopback_listener(&rt);
    let aa: SocketAddr = la.local_addr().unwrap();
    let mk = |node, peers| peer_server(node, b"the cluster key", peers, Duration::from_millis(500));
    let a = mk(1, vec![]);
    let b = mk(2, vec![aa]);
    register_in(&a, Cred::new(1000, 1000), al(&[("x", "1")]), Acl::Public);
    let _g = rt.enter();
    let ha = a.spawn(None, Some(la)).unwrap();
    let sock = dir.path().join("b.sock");
    let hb = b.spawn(Some(sock.clone()), None).unwrap();
    // 200 connections that never say anything.
    const IDLE: usize = 200;
    let idle: Vec<TcpStream> = (0..IDLE)
        .map(|_| {
            let s = TcpStream::connect(aa).unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect();
    // Well before the handshake deadline, the cap has closed all but the newest 64.
    let t = Instant::now();
    let want = IDLE - DEFAULT_MAX_HANDSHAKES;
    let mut n = closed(&idle);
    while n < want && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(20));
        n = closed(&idle);
    }
    assert!(
        n >= want,
        "{n} of {IDLE} idle connections closed after {:?}",
        t.elapsed()
    );
    assert!(
        closed(&idle[..want]) == want,
        "the oldest connections are the ones closed"
    );
    // The newest idle connections still wait: a real peer connects past them.
    let mut c = Client::connect(&sock).unwrap();
    let (_, got) = c.query(None, &al(&[("x", "1")]), Scope::Grid).unwrap();
    assert_eq!(got, al(&[("x", "1")]));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the peer joined within the idle connections' deadline"
    );
    ha.abort();
    hb.abort();
}

#[test]
fn local_clients_over_the_cap_are_closed_at_once_and_admitted_again_below_it() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("d.sock");
    let s = DirServer::new(ServerConfig {
        max_local_conns: 3,
        ..ServerConfig::default()
    })
    .unwrap();
    let h = {
        let _g = rt.enter();
        s.spawn(Some(sock.clone()), None).unwrap()
    };
    let mut served: Vec<Client> = (0..3)
        .map(|_| {
            let mut c = Client::connect(&sock).unwrap();
            c.open_context().unwrap();
            c
        })
        .collect();
    let mut over = Client::connect(&sock).unwrap();
    assert!(
        matches!(over.open_context(), Err(DirError::Io(_))),
        "the fourth client is closed"
    );
    drop(served.pop());
    // The server notices the closed client; then a new one is served.
    let t = Instant::now();
    let admitted = loop {
        let ok = Client::connect(&sock).and_then(|mut c| c.open_context());
        if ok.is_ok() || t.elapsed() > Duration::from_secs(3) {
            break ok;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(admitted.is_ok(), "{admitted:?}");
    for c in &mut served {
        c.open_context().unwrap();
    }
    h.abort();
}

#[test]
fn authenticated_peers_over_the_cap_are_closed_and_the_admitted_one_is_served() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let la = loopback_listener(&rt);
    let aa = la.local_addr().unwrap();
    let key = b"the cluster key";
    let a = DirServer::new(ServerConfig {
        max_peer_conns: 1,
        ..peer_server(1, key, vec![], Duration::from_millis(300))
            .config()
            .clone()
    })
    .unwrap();
    register_in(&a, Cred::new(1000, 1000), al(&[("x", "1")]), Acl::Public);
    let _g = rt.enter();
    let ha = a.spawn(None, Some(la)).unwrap();
    let q = al(&[("x", "1")]);
    let mut found = vec![];
    let mut hs = vec![ha];
    for node in [2, 3] {
        let s = peer_server(node, key, vec![aa], Duration::from_millis(300));
        let sock = dir.path().join(format!("{node}.sock"));
        hs.push(s.spawn(Some(sock.clone()), None).unwrap());
        let mut c = Client::connect(&sock).unwrap();
        found.push(c.query(None, &q, Scope::Grid).is_ok());
    }
    assert_eq!(found, [true, false], "only the first peer is served");
    for h in hs {
        h.abort();
    }
}
