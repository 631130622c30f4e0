//! Blobs kept by an agent: [`serve`] answers put/get/delete/list requests on a stream over a local
//! [`BlobStore`]; [`RemoteStore`] is a [`BlobStore`] that sends them.
//!
//! The stream is already authenticated (agents run an HMAC handshake before handing it over), so
//! this protocol only frames requests. Every request is
//! `b'R', version (1), op (u8: P put, G get, D delete, L list), key length (u16 LE), key,
//! body length (u64 LE), body` (the body is the data of a put, empty otherwise); every response is
//! `status (u8: 0 ok, 1 not found, 2 error), body length (u64 LE), body` (the data of a get, the
//! listed keys separated by `\n`, or an error message). Keys are at most [`MAX_KEY`] bytes and
//! bodies at most the configured limit (default [`mutirao::pmi::MAX_BLOB`]); a longer length is
//! answered with an error and the connection is closed, as it can no longer be trusted.
//! Timeouts are the stream's: the connector should set read and write timeouts.

use crate::{check_key, BlobStore, StoreError};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::sync::Mutex;

/// A byte stream both ways (a `TcpStream`, a TLS stream, a Unix socket, …).
pub trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Opens a fresh authenticated connection to the agent.
pub type Connector = Box<dyn Fn() -> io::Result<Box<dyn ReadWrite + Send>> + Send + Sync>;

/// Longest key a request may carry.
pub const MAX_KEY: usize = 4096;
const TAG: u8 = b'R';
const VERSION: u8 = 1;
const OK: u8 = 0;
const NOT_FOUND: u8 = 1;
const ERROR: u8 = 2;

/// Reads exactly `n` bytes, saying what was being read and how far it got when the peer stops.
fn read_full<R: Read + ?Sized>(mut r: &mut R, n: u64, what: &str) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(n.min(1 << 24) as usize);
    let got = Read::take(&mut r, n).read_to_end(&mut buf)? as u64;
    if got < n {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("connection closed after {got} of {n} bytes of the {what}"),
        ));
    }
    Ok(buf)
}

fn u16_le(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

fn u64_le(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn respond(w: &mut impl Write, status: u8, body: &[u8]) -> io::Result<()> {
    let mut head = [0u8; 9];
    head[0] = status;
    head[1..].copy_from_slice(&(body.len() as u64).to_le_bytes());
    w.write_all(&head)?;
    w.write_all(body)?;
    w.flush()
}

/// Serves requests on `stream` from `store` until the peer closes the connection between two
/// requests (→ `Ok(number of requests served)`) or the stream breaks or carries something that is
/// not a request (→ `Err`, after answering an error where possible). Store errors are answered
/// to the client and do not end the connection. Bodies are limited to [`mutirao::pmi::MAX_BLOB`].
pub fn serve(stream: impl Read + Write, store: &dyn BlobStore) -> io::Result<u64> {
    serve_with_limit(stream, store, mutirao::pmi::MAX_BLOB)
}

/// [`serve`] with a body limit of `max_body` bytes.
pub fn serve_with_limit(
    stream: impl Read + Write,
    store: &dyn BlobStore,
    max_body: u64,
) -> io::Result<u64> {
    let mut r = BufReader::new(stream);
    let mut served = 0u64;
    loop {
        let mut first = [0u8; 1];
        match r.read(&mut first) {
            Ok(0) => return Ok(served),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        let head = read_full(&mut r, 4, "request header")?;
        let refuse = |r: &mut BufReader<_>, msg: String| -> io::Error {
            let _ = respond(r.get_mut(), ERROR, msg.as_bytes());
            invalid(msg)
        };
        if first[0] != TAG || head[0] != VERSION {
            return Err(refuse(
                &mut r,
                format!(
                    "not a blob request (tag {:#04x}, version {}); the peer speaks another protocol",
                    first[0], head[0]
                ),
            ));
        }
        let op = head[1];
        let klen = u16_le(&head[2..4]) as usize;
        if klen > MAX_KEY {
            return Err(refuse(
                &mut r,
                format!("key of {klen} bytes, above the {MAX_KEY}-byte limit"),
            ));
        }
        let key = read_full(&mut r, klen as u64, "key")?;
        let key = String::from_utf8(key).map_err(|_| refuse(&mut r, "key is not UTF-8".into()))?;
        let blen = u64_le(&read_full(&mut r, 8, "body length")?);
        if blen > max_body {
            return Err(refuse(
                &mut r,
                format!("body of {blen} bytes, above the {max_body}-byte limit"),
            ));
        }
        if op == b'P' {
            // Streamed into the store (a directory store never holds the whole body); a
            // stream that breaks mid-body ends the session, a store error is answered.
            let mut body = Body {
                r: &mut r,
                len: blen,
                left: blen,
                err: None,
            };
            let put = store.put_from(&key, blen, &mut body);
            let (left, err) = (body.left, body.err.take());
            if let Some(e) = err {
                return Err(e);
            }
            if left > 0 {
                // The store stopped reading early (it failed): skip the rest of the body so the
                // stream stays in step.
                io::copy(&mut Read::take(&mut r, left), &mut io::sink())?;
            }
            let w = r.get_mut();
            match put {
                Ok(()) => respond(w, OK, &[])?,
                Err(e) => respond(w, ERROR, e.to_string().as_bytes())?,
            }
            served += 1;
            continue;
        }
        // Only a put has a body; any other is read and ignored, keeping the stream in step.
        read_full(&mut r, blen, "body")?;
        let w = r.get_mut();
        let answer = match op {
            b'G' => store.get(&key).map(|d| match d {
                Some(d) => (OK, d),
                None => (NOT_FOUND, Vec::new()),
            }),
            b'D' => store.delete(&key).map(|()| (OK, Vec::new())),
            b'L' => store
                .list(&key)
                .map(|keys| (OK, keys.join("\n").into_bytes())),
            other => {
                let msg = format!("unknown operation {other:#04x}");
                let _ = respond(w, ERROR, msg.as_bytes());
                return Err(invalid(msg));
            }
        };
        match answer {
            Ok((status, data)) => respond(w, status, &data)?,
            Err(e) => respond(w, ERROR, e.to_string().as_bytes())?,
        }
        served += 1;
    }
}

/// A put's body as it comes off the stream: counts what is left and keeps the stream's error
/// (the store sees an error either way, [`serve_with_limit`] tells the two apart).
struct Body<'a, R: Read> {
    r: &'a mut R,
    /// The body's length, and what of it is still to come.
    len: u64,
    left: u64,
    err: Option<io::Error>,
}

impl<R: Read> Read for Body<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let n = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        match self.r.read(&mut buf[..n]) {
            Ok(0) => {
                let e = io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed after {} of {} bytes of the body",
                        self.len - self.left,
                        self.len
                    ),
                );
                self.err = Some(io::Error::new(e.kind(), e.to_string()));
                Err(e)
            }
            Ok(k) => {
                self.left -= k as u64;
                Ok(k)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            Err(e) => {
                self.err = Some(io::Error::new(e.kind(), e.to_string()));
                Err(e)
            }
        }
    }
}

/// A [`BlobStore`] on an agent, reached through a connector. One connection is kept open and
/// reused; when it breaks it is dropped, and a request that failed on a reused connection is sent
/// once more on a fresh one (every operation is idempotent).
pub struct RemoteStore {
    name: String,
    connect: Connector,
    conn: Mutex<Option<Box<dyn ReadWrite + Send>>>,
    max_body: u64,
}

impl RemoteStore {
    /// A store named `name` in messages (e.g. `agent host-b`), connecting with `connect`.
    pub fn new(
        name: impl Into<String>,
        connect: impl Fn() -> io::Result<Box<dyn ReadWrite + Send>> + Send + Sync + 'static,
    ) -> RemoteStore {
        RemoteStore {
            name: name.into(),
            connect: Box::new(connect),
            conn: Mutex::new(None),
            max_body: mutirao::pmi::MAX_BLOB,
        }
    }

    /// Answers longer than `max_body` bytes are refused (default [`mutirao::pmi::MAX_BLOB`]).
    pub fn with_max_body(mut self, max_body: u64) -> RemoteStore {
        self.max_body = max_body;
        self
    }

    fn err(&self, op: &'static str, key: &str, detail: String) -> StoreError {
        StoreError::Backend {
            store: self.name.clone(),
            op,
            key: key.to_string(),
            detail,
        }
    }

    fn exchange(
        &self,
        conn: &mut (dyn ReadWrite + Send),
        op: u8,
        key: &str,
        body: &[u8],
    ) -> io::Result<(u8, Vec<u8>)> {
        {
            let mut w = BufWriter::new(&mut *conn);
            w.write_all(&[TAG, VERSION, op])?;
            w.write_all(&(key.len() as u16).to_le_bytes())?;
            w.write_all(key.as_bytes())?;
            w.write_all(&(body.len() as u64).to_le_bytes())?;
            w.write_all(body)?;
            w.flush()?;
        }
        let head = read_full(&mut *conn, 9, "response header")?;
        let status = head[0];
        if status > ERROR {
            return Err(invalid(format!(
                "unknown response status {status}; the peer speaks another protocol"
            )));
        }
        let len = u64_le(&head[1..]);
        if len > self.max_body {
            return Err(invalid(format!(
                "response of {len} bytes, above the {}-byte limit",
                self.max_body
            )));
        }
        Ok((status, read_full(&mut *conn, len, "response body")?))
    }

    fn call(
        &self,
        op_name: &'static str,
        op: u8,
        key: &str,
        body: &[u8],
    ) -> Result<(u8, Vec<u8>), StoreError> {
        if key.len() > MAX_KEY {
            return Err(self.err(op_name, key, format!("key longer than {MAX_KEY} bytes")));
        }
        if body.len() as u64 > self.max_body {
            return Err(self.err(
                op_name,
                key,
                format!(
                    "{} bytes, above the {}-byte limit",
                    body.len(),
                    self.max_body
                ),
            ));
        }
        let mut guard = self
            .conn
            .lock()
            .map_err(|_| self.err(op_name, key, "connection lock poisoned".into()))?;
        for attempt in 0..2 {
            let reused = guard.is_some();
            let mut conn = match guard.take() {
                Some(c) => c,
                None => (self.connect)().map_err(|e| {
                    self.err(
                        op_name,
                        key,
                        format!("cannot connect: {e}; check the agent is running and reachable"),
                    )
                })?,
            };
            match self.exchange(&mut *conn, op, key, body) {
                Ok((status, data)) => {
                    *guard = Some(conn);
                    if status == ERROR {
                        return Err(self.err(
                            op_name,
                            key,
                            format!("the agent answered: {}", String::from_utf8_lossy(&data)),
                        ));
                    }
                    return Ok((status, data));
                }
                Err(e) if reused && attempt == 0 => {
                    tracing::debug!(store = %self.name, error = %e, "stale connection, reconnecting");
                }
                Err(e) => {
                    return Err(self.err(
                        op_name,
                        key,
                        format!("{e}; the agent or the network failed during the transfer"),
                    ))
                }
            }
        }
        Err(self.err(op_name, key, "no answer after reconnecting".into()))
    }
}

impl BlobStore for RemoteStore {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        check_key(key)?;
        self.call("put", b'P', key, bytes).map(|_| ())
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(key)?;
        match self.call("get", b'G', key, &[])? {
            (NOT_FOUND, _) => Ok(None),
            (_, d) => Ok(Some(d)),
        }
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        check_key(key)?;
        self.call("delete", b'D', key, &[]).map(|_| ())
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let (_, d) = self.call("list", b'L', prefix, &[])?;
        let s = String::from_utf8(d)
            .map_err(|_| self.err("list", prefix, "the key list is not UTF-8".into()))?;
        Ok(s.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DirStore;
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;
    use std::time::Duration;

    fn tcp_connector(
        addr: std::net::SocketAddr,
    ) -> impl Fn() -> io::Result<Box<dyn ReadWrite + Send>> {
        move || {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.set_write_timeout(Some(Duration::from_secs(5)))?;
            Ok(Box::new(s) as Box<dyn ReadWrite + Send>)
        }
    }

    /// An agent on a loopback port serving `store`, `conns` connections then it stops.
    fn agent(
        store: Arc<DirStore>,
        conns: usize,
    ) -> (
        std::net::SocketAddr,
        std::thread::JoinHandle<Vec<io::Result<u64>>>,
    ) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            let mut results = Vec::new();
            for _ in 0..conns {
                let (s, _) = l.accept().unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                results.push(serve(s, &*store));
            }
            results
        });
        (addr, h)
    }

    #[test]
    fn remote_store_put_get_list_delete_over_loopback_tcp() {
        let d = tempfile::tempdir().unwrap();
        let local = Arc::new(DirStore::open(d.path()).unwrap());
        let (addr, h) = agent(local.clone(), 1);
        let r = RemoteStore::new("agent test", tcp_connector(addr));
        assert_eq!(r.get("jobs/j/1/0.ckpt").unwrap(), None, "missing key");
        let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        r.put("jobs/j/1/0.ckpt", &big).unwrap();
        r.put("jobs/j/1/1.ckpt", b"").unwrap();
        assert_eq!(r.get("jobs/j/1/0.ckpt").unwrap().as_deref(), Some(&big[..]));
        assert_eq!(r.get("jobs/j/1/1.ckpt").unwrap().as_deref(), Some(&b""[..]));
        assert_eq!(
            local.get("jobs/j/1/0.ckpt").unwrap().as_deref(),
            Some(&big[..])
        );
        assert_eq!(
            r.list("jobs/j/").unwrap(),
            vec!["jobs/j/1/0.ckpt".to_string(), "jobs/j/1/1.ckpt".to_string()]
        );
        assert!(r.list("nothing/").unwrap().is_empty());
        r.delete("jobs/j/1/0.ckpt").unwrap();
        assert_eq!(r.get("jobs/j/1/0.ckpt").unwrap(), None);
        // Bad keys are refused locally and, if sent anyway, by the agent.
        assert!(matches!(
            r.put("../x", b"x"),
            Err(StoreError::InvalidKey { .. })
        ));
        let (st, msg) = r
            .call("put", b'P', "../x", b"x")
            .unwrap_err()
            .to_string()
            .split_once("answered")
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .unwrap();
        assert!(
            st.contains("agent test") && msg.contains("invalid key"),
            "{st} {msg}"
        );
        drop(r);
        let served = h.join().unwrap();
        assert_eq!(served.len(), 1);
        assert!(served[0].as_ref().unwrap() >= &8, "{served:?}");
    }

    #[test]
    fn a_client_dying_mid_put_stores_nothing() {
        let d = tempfile::tempdir().unwrap();
        let local = Arc::new(DirStore::open(d.path()).unwrap());
        let (addr, h) = agent(local.clone(), 1);
        let mut s = TcpStream::connect(addr).unwrap();
        let mut req = vec![TAG, VERSION, b'P'];
        req.extend_from_slice(&3u16.to_le_bytes());
        req.extend_from_slice(b"k/x");
        req.extend_from_slice(&1000u64.to_le_bytes());
        req.extend_from_slice(&[1u8; 10]);
        s.write_all(&req).unwrap();
        drop(s);
        let res = h.join().unwrap().pop().unwrap();
        let e = res.unwrap_err().to_string();
        assert!(e.contains("10 of 1000 bytes of the body"), "{e}");
        assert_eq!(local.get("k/x").unwrap(), None);
    }

    #[test]
    fn an_agent_dying_mid_answer_is_an_error_naming_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            // Two connections (the client reconnects only for a reused connection, so one try
            // each for two calls): read the request, announce 100 bytes, send 10, close.
            for _ in 0..2 {
                let (mut s, _) = l.accept().unwrap();
                let mut buf = [0u8; 64];
                let _ = s.read(&mut buf).unwrap();
                let mut ans = vec![OK];
                ans.extend_from_slice(&100u64.to_le_bytes());
                ans.extend_from_slice(&[0u8; 10]);
                s.write_all(&ans).unwrap();
            }
        });
        let r = RemoteStore::new("agent host-b", tcp_connector(addr));
        for _ in 0..2 {
            let e = r.get("k").unwrap_err().to_string();
            assert!(e.contains("agent host-b"), "{e}");
            assert!(e.contains("10 of 100 bytes of the response body"), "{e}");
        }
        h.join().unwrap();
        // Nothing listens any more: a connection error naming the agent.
        let e = r.get("k").unwrap_err().to_string();
        assert!(
            e.contains("cannot connect") && e.contains("agent host-b"),
            "{e}"
        );
    }

    #[test]
    fn a_stale_connection_is_replaced_once() {
        let d = tempfile::tempdir().unwrap();
        let local = Arc::new(DirStore::open(d.path()).unwrap());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let st = local.clone();
        let h = std::thread::spawn(move || {
            for _ in 0..2 {
                let (s, _) = l.accept().unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                tx.send(s.try_clone().unwrap()).unwrap();
                let _ = serve(s, &*st);
            }
        });
        let r = RemoteStore::new("agent c", tcp_connector(addr));
        r.put("a", b"1").unwrap();
        // The agent drops the first connection between two requests.
        let first = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        first.shutdown(std::net::Shutdown::Both).unwrap();
        // This call fails on the stale connection, then succeeds on a fresh one.
        r.put("b", b"2").unwrap();
        assert_eq!(r.get("a").unwrap().as_deref(), Some(&b"1"[..]));
        drop(r);
        h.join().unwrap();
        assert_eq!(
            local.list("").unwrap(),
            vec!["a".to_string(), "b".to_string()]
        );
    }

    /// A stream reading from one buffer and writing to another.
    struct Duplex<'a>(io::Cursor<Vec<u8>>, &'a mut Vec<u8>);
    impl Read for Duplex<'_> {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            self.0.read(b)
        }
    }
    impl Write for Duplex<'_> {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.1.write(b)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn oversized_and_foreign_requests_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let store = DirStore::open(d.path()).unwrap();
        let mut req = vec![TAG, VERSION, b'P'];
        req.extend_from_slice(&1u16.to_le_bytes());
        req.push(b'k');
        req.extend_from_slice(&(1u64 << 40).to_le_bytes());
        let mut out = Vec::new();
        let e =
            serve_with_limit(Duplex(io::Cursor::new(req), &mut out), &store, 1 << 20).unwrap_err();
        assert!(
            e.to_string().contains("above the 1048576-byte limit"),
            "{e}"
        );
        assert_eq!(out[0], ERROR, "the client is told why");

        let mut out = Vec::new();
        let e = serve(
            Duplex(io::Cursor::new(b"GET / HTTP/1.1\r\n".to_vec()), &mut out),
            &store,
        )
        .unwrap_err();
        assert!(e.to_string().contains("another protocol"), "{e}");

        let mut req = vec![TAG, VERSION, b'Z'];
        req.extend_from_slice(&1u16.to_le_bytes());
        req.push(b'k');
        req.extend_from_slice(&0u64.to_le_bytes());
        let mut out = Vec::new();
        let e = serve(Duplex(io::Cursor::new(req), &mut out), &store).unwrap_err();
        assert!(e.to_string().contains("unknown operation"), "{e}");

        // A clean close between requests is the normal end.
        let mut out = Vec::new();
        assert_eq!(
            serve(Duplex(io::Cursor::new(Vec::new()), &mut out), &store).unwrap(),
            0
        );
    }
}
