//! The bootstrap server's accept loop: every connection that has not yet proved the job token
//! is served by this one thread (poll, non-blocking sockets), so nothing a stranger sends
//! costs a thread, more than [`MAX_HELLO`] bytes of memory, or more than [`HELLO_TIMEOUT`].
//!
//! - Every accepted connection gets a challenge line with a fresh nonce; its hello must carry
//!   its own nonce and an HMAC of both under the job token (the token never crosses the wire,
//!   and a proof seen on one connection is worth nothing on another).
//! - A connection must send its whole hello line within [`HELLO_TIMEOUT`] of being accepted
//!   (one deadline for the whole line, not per read), at most [`MAX_HELLO`] bytes, and nothing
//!   after it before the answer.
//! - At most [`MAX_UNAUTH`] connections wait for their hello at once. A new one over the cap
//!   closes the one that has waited longest: idle connections cannot hold the server, while a
//!   real rank, which says hello as soon as it connects, is through long before.
//! - A hello with a good proof leaves this loop for a thread of its own (one per rank,
//!   bounded by the job's ranks: each rank is admitted once), which answers with the server's
//!   own proof and seals the rest of the session (`crate::seal`).
//!
//! Refusals get an error line on the connection (best effort) and one on standard error; the
//! cap reached is logged once per burst, and other refusals at most [`LOG_BURST`] per
//! [`LOG_WINDOW`].

use super::{Msg, Shared};
use crate::wire::constant_time_eq;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Time a connection has to send its whole hello line.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest hello line (with its newline): the most bytes read before the token is proved.
pub const MAX_HELLO: usize = 4096;
/// Most connections waiting for their hello at once.
pub const MAX_UNAUTH: usize = 64;

/// Refusals logged one by one per [`LOG_WINDOW`]; the rest are counted.
const LOG_BURST: u32 = 10;
const LOG_WINDOW: Duration = Duration::from_secs(10);
/// Pause before accepting again after `accept` failed (out of descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

const LISTENER: Token = Token(usize::MAX);

/// A hello that proved the job token: what the connection's thread needs to go on.
pub(super) struct Hello {
    pub rank: u32,
    pub server_nonce: String,
    pub client_nonce: String,
}

/// A connection that has not said hello yet.
struct Waiting {
    s: TcpStream,
    from: SocketAddr,
    /// The nonce of the challenge it was sent.
    nonce: String,
    buf: Box<[u8; MAX_HELLO]>,
    len: usize,
    deadline: Instant,
}

/// What reading a waiting connection came to.
enum Read1 {
    /// No whole line yet; the socket is drained.
    More,
    /// The hello line (without its newline).
    Line(Vec<u8>),
    /// Refused, with the reason (for the peer and the log).
    Refuse(String),
    /// The peer closed before a whole line.
    Gone,
}

impl Waiting {
    fn read(&mut self) -> Read1 {
        loop {
            if self.len == MAX_HELLO {
                return Read1::Refuse(format!("no hello line within the first {MAX_HELLO} bytes"));
            }
            match self.s.read(&mut self.buf[self.len..]) {
                Ok(0) => return Read1::Gone,
                Ok(n) => {
                    let from = self.len;
                    self.len += n;
                    if let Some(i) = self.buf[from..self.len].iter().position(|&b| b == b'\n') {
                        let end = from + i;
                        if end + 1 != self.len {
                            return Read1::Refuse(
                                "sent more than its hello before the answer".into(),
                            );
                        }
                        return Read1::Line(self.buf[..end].to_vec());
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Read1::More,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Read1::Gone,
            }
        }
    }
}

/// Logs refusals, at most [`LOG_BURST`] per [`LOG_WINDOW`] (the loop's thread only).
struct Log {
    window: Instant,
    lines: u32,
    quiet: u64,
    /// Connections closed over the cap in the current burst (logged when it starts and ends).
    evicted: u64,
}

impl Log {
    fn refused(&mut self, from: SocketAddr, why: &str) {
        self.line(&format!("refused a connection from {from}: {why}"));
    }

    fn line(&mut self, msg: &str) {
        let now = Instant::now();
        if now.duration_since(self.window) >= LOG_WINDOW {
            if self.quiet > 0 {
                eprintln!(
                    "mutirao bootstrap: {} more refusals in the last {:?} were not logged",
                    self.quiet,
                    now.duration_since(self.window)
                );
            }
            (self.window, self.lines, self.quiet) = (now, 0, 0);
        }
        if self.lines < LOG_BURST {
            self.lines += 1;
            eprintln!("mutirao bootstrap: {msg}");
        } else {
            self.quiet += 1;
        }
    }
}

/// Sends `why` as an error line (best effort: the socket is non-blocking and about to close).
fn refuse(mut s: &TcpStream, why: &str) {
    let mut line = serde_json::to_vec(&Msg::Error { msg: why.into() }).unwrap_or_default();
    line.push(b'\n');
    let _ = s.write(&line);
}

/// Serves `listener` forever: takes hellos, hands each authenticated connection to
/// `admitted(stream, hello)` (on this thread: it must return quickly).
pub(super) fn accept_loop(
    listener: TcpListener,
    st: Arc<Shared>,
    mut admitted: impl FnMut(TcpStream, Hello),
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut poll = Poll::new()?;
    let lfd = listener.as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&lfd), LISTENER, Interest::READABLE)?;
    let mut events = Events::with_capacity(128);
    // By arrival: the first entry has waited longest.
    let mut waiting: BTreeMap<usize, Waiting> = BTreeMap::new();
    let mut next = 0usize;
    let mut log = Log {
        window: Instant::now(),
        lines: 0,
        quiet: 0,
        evicted: 0,
    };
    let mut accept_again = false;
    loop {
        let now = Instant::now();
        let mut timeout = waiting
            .values()
            .next()
            .map(|w| w.deadline.saturating_duration_since(now));
        if accept_again {
            timeout = Some(timeout.map_or(ACCEPT_BACKOFF, |t| t.min(ACCEPT_BACKOFF)));
        }
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != ErrorKind::Interrupted {
                return Err(e);
            }
        }
        let mut ready: Vec<usize> = Vec::new();
        for ev in events.iter() {
            if ev.token() == LISTENER {
                accept_again = true;
            } else {
                ready.push(ev.token().0);
            }
        }
        if accept_again {
            accept_again = false;
            loop {
                let (s, from) = match listener.accept() {
                    Ok(x) => x,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        // Out of descriptors, most likely: try again shortly (the listener's
                        // readiness is edge-triggered, so no new event would come for the
                        // connections already queued).
                        log.line(&format!("accepting a connection failed: {e}"));
                        accept_again = true;
                        break;
                    }
                };
                if s.set_nonblocking(true).is_err() {
                    continue;
                }
                if waiting.len() >= MAX_UNAUTH {
                    if let Some((_, old)) = waiting.pop_first() {
                        let _ = poll
                            .registry()
                            .deregister(&mut SourceFd(&old.s.as_raw_fd()));
                        refuse(&old.s, "too many connections are waiting to say hello");
                        if log.evicted == 0 {
                            eprintln!(
                                "mutirao bootstrap: {MAX_UNAUTH} connections are waiting to say \
                                 hello (the cap): closing the oldest for each new one (logged \
                                 once until none waits)"
                            );
                        }
                        log.evicted += 1;
                    }
                }
                let nonce = match crate::seal::nonce_hex() {
                    Ok(n) => n,
                    Err(e) => {
                        log.line(&format!("no nonce for a new connection: {e}"));
                        continue;
                    }
                };
                // A fresh socket's buffer takes these ~90 bytes at once; one that does not is
                // not worth waiting for.
                let mut line = serde_json::to_vec(&Msg::Challenge {
                    nonce: nonce.clone(),
                })
                .unwrap_or_default();
                line.push(b'\n');
                if !matches!((&s).write(&line), Ok(n) if n == line.len()) {
                    continue;
                }
                let id = next;
                // Ids never reach the listener's token.
                next = (next + 1) % LISTENER.0;
                if poll
                    .registry()
                    .register(&mut SourceFd(&s.as_raw_fd()), Token(id), Interest::READABLE)
                    .is_err()
                {
                    continue;
                }
                waiting.insert(
                    id,
                    Waiting {
                        s,
                        from,
                        nonce,
                        buf: Box::new([0; MAX_HELLO]),
                        len: 0,
                        deadline: Instant::now() + HELLO_TIMEOUT,
                    },
                );
                // A hello that came with the connection is read when its event comes.
            }
        }
        for id in ready {
            let Some(w) = waiting.get_mut(&id) else {
                continue;
            };
            let outcome = w.read();
            #[cfg(test)]
            st.note_preauth(w.len);
            if let Read1::More = outcome {
                continue;
            }
            let Some(w) = waiting.remove(&id) else {
                continue;
            };
            let _ = poll.registry().deregister(&mut SourceFd(&w.s.as_raw_fd()));
            match outcome {
                Read1::More | Read1::Gone => {}
                Read1::Refuse(why) => {
                    refuse(&w.s, &why);
                    log.refused(w.from, &why);
                }
                Read1::Line(line) => match check_hello(&line, &st.token, &w.nonce) {
                    Ok((rank, client_nonce)) => admitted(
                        w.s,
                        Hello {
                            rank,
                            server_nonce: w.nonce,
                            client_nonce,
                        },
                    ),
                    Err(why) => {
                        refuse(&w.s, &why);
                        log.refused(w.from, &why);
                    }
                },
            }
        }
        let now = Instant::now();
        while waiting.values().next().is_some_and(|w| w.deadline <= now) {
            if let Some((_, w)) = waiting.pop_first() {
                let _ = poll.registry().deregister(&mut SourceFd(&w.s.as_raw_fd()));
                let why = format!("no hello within {HELLO_TIMEOUT:?}");
                refuse(&w.s, &why);
                log.refused(w.from, &why);
            }
        }
        if waiting.is_empty() && log.evicted > 0 {
            eprintln!(
                "mutirao bootstrap: no connection waits to say hello any more; {} were closed \
                 over the cap",
                log.evicted
            );
            log.evicted = 0;
        }
    }
}

/// The rank and nonce of a hello whose proof of the job token answers the challenge
/// `server_nonce`.
fn check_hello(line: &[u8], token: &[u8; 32], server_nonce: &str) -> Result<(u32, String), String> {
    match serde_json::from_slice::<Msg>(line) {
        Ok(Msg::Hello { rank, nonce, mac }) => {
            // A nonce of our own length and alphabet: a peer cannot choose one that makes
            // two different proofs' inputs alike (the parts are length-prefixed anyway).
            if nonce.len() != 64 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err("the hello's nonce is not 64 hex digits".into());
            }
            if nonce == server_nonce {
                return Err("the hello's nonce is the server's own".into());
            }
            let want = super::hello_mac(token, server_nonce, &nonce, rank);
            if constant_time_eq(want.as_bytes(), mac.as_bytes()) {
                Ok((rank, nonce))
            } else {
                Err("wrong job token: the hello's proof does not match this job's token".into())
            }
        }
        Ok(_) => Err("the first message must be a hello".into()),
        Err(e) => Err(format!("malformed hello: {e}")),
    }
}
