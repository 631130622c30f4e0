//! One thread serving every local client of a server through epoll ([`LocalMode::EventLoop`],
//! the default).
//!
//! Why one thread: on two cores with sixteen clients, a thread per client costs two wake-ups
//! per lookup (the server thread woken by the request, the client woken by the reply), and
//! each wake-up of a sleeping thread is the dearest part of a local lookup. A single loop
//! that finds several requests ready in one `epoll_wait` stays awake while clients keep it
//! busy, so a request wakes nobody and only the reply wakes its client.
//!
//! Invariants:
//! - one request per connection is in progress at a time, and replies go out in request
//!   order: a request that needs the runtime (peers, unique registration, paged queries) is
//!   handed to a tokio task and the connection is not read until its reply is back;
//! - the loop never blocks on a client: sockets are non-blocking, a reply the socket cannot
//!   take yet waits in the connection's output buffer, and a connection with more than
//!   [`MAX_OUT`] bytes of unsent replies is not read until the client reads them;
//! - dropping the [`LoopHandle`] (the accept task ending) stops the loop and closes every
//!   connection it serves.

use super::{error_packet, ok_packet, Cork, DirServer, Slot};
use crate::directory::Cred;
use crate::error::DirError;
use crate::net::{frame_into, FrameReader, TryFrame};
use crate::wire::{Header, Kind, Packet};
use rustix::event::{epoll, EventfdFlags};
use rustix::io::Errno;
use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Epoll data of the wake-up eventfd (connection ids count up from 0).
const WAKE: u64 = u64::MAX;
/// Unsent reply bytes past which a connection is not read until its client catches up.
const MAX_OUT: usize = 256 * 1024;
/// While a fan-out is out, the loop polls this many times its polling budget.
const FANOUT_SPIN: u32 = 4;
/// Requests served from one connection before the loop turns to the others.
const TURN: usize = 256;

/// State shared by the loop and whoever hands it work.
struct Shared {
    wake: OwnedFd,
    stop: AtomicBool,
}

impl Shared {
    fn wake(&self) {
        // A full counter (2^64 − 2 wake-ups pending) still wakes the loop: ignore EAGAIN.
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

/// Who is at the other end of a connection.
pub(super) enum Party {
    /// A local client, with the credentials the kernel reports for it.
    Client(Cred),
    /// A peer server that passed the handshake; its requests carry their own uid/gid. Its
    /// paged queries: the requester's start request id -> our cursor.
    Peer(Mutex<HashMap<u64, u64>>),
}

enum Msg {
    /// A new connection (already non-blocking) and its place among the server's connections.
    Conn(OwnedFd, Party, Slot),
    /// The reply to a connection's request that went to the runtime.
    Reply(u64, Packet),
}

/// Where the first positive reply to a connection's fan-out goes (see
/// `DirServer::start_loop_fanout`).
pub(super) struct LoopWaiter {
    conn: u64,
    request: Header,
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
}

impl LoopWaiter {
    /// Hands a peer's positive reply to the loop as the answer to the request.
    pub(super) fn deliver(self, p: Packet) {
        let reply = ok_packet(&self.request, p.header.target, p.attrs);
        if self.tx.send(Msg::Reply(self.conn, reply)).is_ok() {
            self.shared.wake();
        }
    }
}

/// A fan-out in flight: (deadline, connection, fan-out id, request header).
type Deadline = (Instant, u64, u64, Header);

/// Hands connections to a running loop; dropping it stops the loop.
pub(super) struct LoopHandle {
    sender: LoopSender,
}

/// Hands connections to a running loop (without owning it).
#[derive(Clone)]
pub(super) struct LoopSender {
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
}

impl LoopSender {
    /// Hands a non-blocking connection to the loop, which holds `slot` as long as it serves
    /// it; gives both back if the loop has ended.
    pub(super) fn add(&self, s: OwnedFd, party: Party, slot: Slot) -> Result<(), (OwnedFd, Slot)> {
        if self.shared.stop.load(Ordering::Acquire) {
            return Err((s, slot));
        }
        match self.tx.send(Msg::Conn(s, party, slot)) {
            Ok(()) => {
                self.shared.wake();
                Ok(())
            }
            Err(mpsc::SendError(Msg::Conn(s, _, slot))) => Err((s, slot)),
            Err(_) => Ok(()),
        }
    }
}

impl LoopHandle {
    /// Starts the loop thread for `server`; requests that need the runtime run on `rt`.
    pub(super) fn start(
        server: DirServer,
        rt: tokio::runtime::Handle,
        spin: Duration,
    ) -> Result<LoopHandle, DirError> {
        let io = |what: &str, e: Errno| {
            DirError::Io(format!(
                "cannot start the local-client loop: {what}: {}",
                std::io::Error::from(e)
            ))
        };
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| io("epoll_create", e))?;
        let wake = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| io("eventfd", e))?;
        epoll::add(
            &ep,
            &wake,
            epoll::EventData::new_u64(WAKE),
            epoll::EventFlags::IN,
        )
        .map_err(|e| io("epoll_ctl", e))?;
        let shared = Arc::new(Shared {
            wake,
            stop: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel();
        let lp = EventLoop {
            server,
            rt,
            spin,
            ep,
            rx,
            tx: tx.clone(),
            shared: shared.clone(),
            conns: HashMap::new(),
            next_id: 0,
            again: Vec::new(),
            deadlines: VecDeque::new(),
            cork: Cork::default(),
        };
        std::thread::Builder::new()
            .name("mdir-loop".into())
            .spawn(move || lp.run())
            .map_err(|e| DirError::Io(format!("cannot start the local-client loop: {e}")))?;
        Ok(LoopHandle {
            sender: LoopSender { tx, shared },
        })
    }

    /// A sender for connections that does not keep the loop running.
    pub(super) fn sender(&self) -> &LoopSender {
        &self.sender
    }
}

impl Drop for LoopHandle {
    fn drop(&mut self) {
        self.sender.shared.stop.store(true, Ordering::Release);
        self.sender.shared.wake();
    }
}

struct Conn {
    s: OwnedFd,
    party: Party,
    /// Given back to the server's count when the connection is dropped.
    _slot: Slot,
    reader: FrameReader,
    out: Vec<u8>,
    sent: usize,
    /// A request of this connection is on the runtime.
    busy: bool,
    /// The readiness registered with epoll.
    flags: epoll::EventFlags,
}

impl Conn {
    /// Reply bytes the socket has not taken yet.
    fn unsent(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Writes what the socket takes now.
    fn flush(&mut self) -> Result<(), DirError> {
        while self.sent < self.out.len() {
            match rustix::net::send(
                &self.s,
                &self.out[self.sent..],
                rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL,
            ) {
                Ok(n) => self.sent += n,
                Err(Errno::AGAIN) => return Ok(()),
                Err(Errno::INTR) => {}
                Err(e) => return Err(std::io::Error::from(e).into()),
            }
        }
        self.out.clear();
        self.sent = 0;
        Ok(())
    }

    /// The readiness to wait for: requests unless one is on the runtime or too many
    /// replies are unsent, and room to write while replies are unsent.
    fn wanted(&self) -> epoll::EventFlags {
        let unsent = self.unsent();
        let mut f = epoll::EventFlags::empty();
        if !self.busy && unsent <= MAX_OUT {
            f |= epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        }
        if unsent > 0 {
            f |= epoll::EventFlags::OUT;
        }
        f
    }
}

/// What serving a connection's turn left to do.
enum Turn {
    /// Nothing more now.
    Done,
    /// Requests are still buffered (the turn's quota ran out): serve again soon.
    Again,
    /// The connection ended (closed by the client, or broken).
    Closed,
}

/// What a connection's turn needs of the loop.
#[derive(Clone, Copy)]
struct Env<'a> {
    server: &'a DirServer,
    rt: &'a tokio::runtime::Handle,
    tx: &'a mpsc::Sender<Msg>,
    shared: &'a Arc<Shared>,
}

struct EventLoop {
    server: DirServer,
    rt: tokio::runtime::Handle,
    spin: Duration,
    ep: OwnedFd,
    rx: mpsc::Receiver<Msg>,
    tx: mpsc::Sender<Msg>,
    shared: Arc<Shared>,
    conns: HashMap<u64, Conn>,
    next_id: u64,
    /// Connections whose turn ended with requests still buffered.
    again: Vec<u64>,
    /// Fan-outs in flight, oldest first (all wait the same `peer_timeout`).
    deadlines: VecDeque<Deadline>,
    /// Fan-out frames of this pass, sent at its end.
    cork: Cork,
}

impl EventLoop {
    fn run(mut self) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
        let mut last_work: Option<Instant> = None;
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        while !self.shared.stop.load(Ordering::Acquire) {
            // The fan-outs started in the last pass: one send per peer, before any wait.
            self.cork.flush();
            events.clear();
            // Poll (yielding between polls) while requests came recently: a sleeping loop
            // costs the next client a wake-up.
            // Peers answer a fan-out in ~100 µs on loopback: poll longer while one is out.
            let budget = if self.deadlines.is_empty() {
                self.spin
            } else {
                self.spin * FANOUT_SPIN
            };
            let polling = !self.again.is_empty()
                || last_work.is_some_and(|t| !self.spin.is_zero() && t.elapsed() < budget);
            let until_deadline = self.deadlines.front().map(|d| {
                let left = d.0.saturating_duration_since(Instant::now());
                rustix::event::Timespec {
                    tv_sec: left.as_secs() as _,
                    tv_nsec: left.subsec_nanos() as _,
                }
            });
            let timeout = if polling {
                Some(&zero)
            } else {
                until_deadline.as_ref()
            };
            match epoll::wait(
                &self.ep,
                rustix::buffer::spare_capacity(&mut events),
                timeout,
            ) {
                Ok(_) | Err(Errno::INTR) => {}
                // Only a broken epoll fd gets here; end, closing every connection.
                Err(_) => break,
            }
            self.expire_fanouts();
            let again = std::mem::take(&mut self.again);
            if events.is_empty() && again.is_empty() {
                if polling {
                    std::thread::yield_now();
                }
                continue;
            }
            last_work = Some(Instant::now());
            for id in again {
                self.serve(id);
            }
            for ev in &events {
                // Copied out: the kernel's event struct is packed.
                let (data, flags) = (ev.data, ev.flags);
                match data.u64() {
                    WAKE => self.take_messages(),
                    // The client is gone while a reply is on the runtime (that reply will
                    // find no connection). When idle, serving reads up to the end.
                    id if flags.intersects(epoll::EventFlags::HUP | epoll::EventFlags::ERR)
                        && self.conns.get(&id).is_some_and(|c| c.busy) =>
                    {
                        self.close(id)
                    }
                    id => self.serve(id),
                }
            }
        }
        // Dropping the connections closes them.
    }

    /// Answers "not found" to fan-outs that no peer answered within `peer_timeout`.
    fn expire_fanouts(&mut self) {
        let now = Instant::now();
        while self.deadlines.front().is_some_and(|d| d.0 <= now) {
            let Some((_, id, fanout, request)) = self.deadlines.pop_front() else {
                break;
            };
            // A reply that won the race has taken the fan-out out of the table already.
            if self.server.end_fanout(fanout) {
                self.answer(id, &error_packet(&request, &DirError::NoMatch));
            }
        }
    }

    /// Sends the answer to a connection's request that was in flight, and goes on with it.
    fn answer(&mut self, id: u64, reply: &Packet) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.busy = false;
            frame_into(reply, &mut c.out);
            self.serve(id);
        }
    }

    fn take_messages(&mut self) {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(&self.shared.wake, &mut counter);
        while let Ok(m) = self.rx.try_recv() {
            match m {
                Msg::Conn(s, party, slot) => self.register(s, party, slot),
                Msg::Reply(id, reply) => self.answer(id, &reply),
            }
        }
    }

    fn register(&mut self, s: OwnedFd, party: Party, slot: Slot) {
        let id = self.next_id;
        self.next_id += 1;
        let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
        if epoll::add(&self.ep, &s, epoll::EventData::new_u64(id), flags).is_err() {
            return; // dropping `s` closes it: the client sees the connection end
        }
        let reader = FrameReader::new(Duration::ZERO);
        let conn = Conn {
            s,
            party,
            _slot: slot,
            reader,
            out: Vec::with_capacity(4096),
            sent: 0,
            busy: false,
            flags: epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
        };
        self.conns.insert(id, conn);
        // Requests may have arrived before the registration.
        self.serve(id);
    }

    fn serve(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let env = Env {
            server: &self.server,
            rt: &self.rt,
            tx: &self.tx,
            shared: &self.shared,
        };
        let turn = Self::turn(env, &mut self.deadlines, &mut self.cork, id, c);
        let turn = turn.and_then(|t| {
            let want = c.wanted();
            if want != c.flags {
                epoll::modify(&self.ep, &c.s, epoll::EventData::new_u64(id), want)
                    .map_err(|e| DirError::Io(std::io::Error::from(e).to_string()))?;
                c.flags = want;
            }
            Ok(t)
        });
        match turn {
            Ok(Turn::Done) => {}
            Ok(Turn::Again) => self.again.push(id),
            Ok(Turn::Closed) | Err(_) => self.close(id),
        }
    }

    fn close(&mut self, id: u64) {
        if let Some(c) = self.conns.remove(&id) {
            let _ = epoll::delete(&self.ep, &c.s);
            if let Party::Peer(cursors) = &c.party {
                self.server.stop_peer_cursors(cursors);
            }
        }
    }

    /// Serves buffered and arrived requests of one connection (at most [`TURN`]), answering
    /// here what needs no runtime, then writes the replies with one `send`.
    ///
    /// A turn stops only where something will call it again: a request on the runtime (its
    /// reply message), unsent replies past [`MAX_OUT`] (EPOLLOUT), the quota ([`Turn::Again`])
    /// or an empty socket with no whole request buffered (EPOLLIN).
    fn turn(
        env: Env<'_>,
        deadlines: &mut VecDeque<Deadline>,
        cork: &mut Cork,
        id: u64,
        c: &mut Conn,
    ) -> Result<Turn, DirError> {
        let server = env.server;
        let mut served = 0;
        let mut turn = Turn::Done;
        c.reader.rearm();
        while !c.busy {
            if c.unsent() > MAX_OUT {
                // Stop reading until the client takes its replies (then EPOLLOUT says so).
                c.flush()?;
                if c.unsent() > MAX_OUT {
                    break;
                }
            }
            if served == TURN {
                turn = Turn::Again;
                break;
            }
            let p = match c.reader.try_next_frame(&c.s)? {
                TryFrame::Frame(f) => Packet::decode(f),
                TryFrame::Pending => break,
                TryFrame::Closed => {
                    turn = Turn::Closed;
                    break;
                }
            };
            served += 1;
            let cred = match &c.party {
                Party::Client(cred) => *cred,
                Party::Peer(cursors) => {
                    // Peer requests never wait on anything; a malformed one ends the
                    // connection (the stream cannot be trusted after it).
                    if let Some(reply) = server.handle_peer(p?, cursors) {
                        frame_into(&reply, &mut c.out);
                    }
                    continue;
                }
            };
            let reply = match p {
                Ok(p) => match server.try_handle_here(cred, p) {
                    Ok(reply) => reply,
                    Err(p) => match Self::hand_off(env, deadlines, cork, id, cred, p) {
                        Some(reply) => reply,
                        None => {
                            c.busy = true;
                            break;
                        }
                    },
                },
                Err(e) => error_packet(&Header::new(Kind::Reply), &e),
            };
            frame_into(&reply, &mut c.out);
        }
        c.flush()?;
        Ok(turn)
    }

    /// A request that [`DirServer::try_handle_here`] gave back. A query to fan out is sent
    /// from here and answered by the first positive peer through the loop's messages, or timed
    /// out by the loop; anything else runs on the runtime, whose reply comes back the same
    /// way. `Some`: the answer now (no peer to ask); `None`: the connection waits for it.
    fn hand_off(
        env: Env<'_>,
        deadlines: &mut VecDeque<Deadline>,
        cork: &mut Cork,
        id: u64,
        cred: Cred,
        p: Packet,
    ) -> Option<Packet> {
        let Env {
            server,
            rt,
            tx,
            shared,
        } = env;
        let request = p.header.clone();
        let waiter = LoopWaiter {
            conn: id,
            request: request.clone(),
            tx: tx.clone(),
            shared: shared.clone(),
        };
        let p = match server.start_loop_fanout(cred, p, waiter, cork) {
            Ok(Some(fanout)) => {
                let at = Instant::now() + server.inner.cfg.peer_timeout;
                deadlines.push_back((at, id, fanout, request));
                return None;
            }
            Ok(None) => return Some(error_packet(&request, &DirError::NoMatch)),
            Err(p) => p,
        };
        let (srv, tx, shared) = (server.clone(), tx.clone(), shared.clone());
        rt.spawn(async move {
            let reply = srv.handle_slow(cred, p).await;
            if tx.send(Msg::Reply(id, reply)).is_ok() {
                shared.wake();
            }
        });
        None
    }
}
