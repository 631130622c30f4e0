//! Transports: how bytes reach one peer. The engine sees every peer as a byte stream behind the
//! [`Transport`] trait and chooses the implementation per peer at start-up (timely-dataflow's
//! allocator pattern): [`TcpTransport`] between hosts, [`ShmTransport`] between processes of one
//! host. A third one (a real MPI library, RDMA) is another implementation of the same trait.

use crate::shm::Ring;
use crate::wire::{Header, Kind, HEADER_LEN};
use mio::net::TcpStream;
use std::io::{IoSlice, Read, Write};

/// One peer's byte stream.
pub(crate) trait Transport {
    /// Short name for messages: "tcp", "shm".
    fn kind(&self) -> &'static str;
    /// Read stream bytes into `buf`. `Ok(0)`: nothing now. `Err`: the link is broken (why).
    fn read(&mut self, buf: &mut [u8]) -> Result<usize, String>;
    /// Write as much of `bufs` as fits now; `Ok(0)`: nothing fits now.
    fn write(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize, String>;
    /// Bytes are known to be waiting, found without a system call (shared memory).
    fn ready_hint(&self) -> bool {
        false
    }
    /// The socket the poller watches: the data stream itself for TCP, wake-ups and liveness for
    /// shared memory. `None` once closed.
    fn socket(&mut self) -> Option<&mut TcpStream>;
    /// Forget the socket (after the poller deregistered it).
    fn close_socket(&mut self);
    /// Does the socket carry the data stream (TCP) or only wake-ups (shared memory)?
    fn socket_is_stream(&self) -> bool;
    /// The poller saw the socket readable; `closed`: it also reported the peer's end closed
    /// (`EPOLLRDHUP`/`EPOLLHUP`) or an error, so the stream must be read until its end.
    /// `Err`: the peer is gone (EOF or error on the socket).
    fn on_readable(&mut self, closed: bool) -> Result<(), String>;
    /// The poller saw the socket writable.
    fn on_writable(&mut self);
    /// The next `read` asks the socket itself, whatever the poller last said (a direct read:
    /// see `Engine::progress_direct`). Streams only; a no-op elsewhere.
    fn arm_read(&mut self) {}
    /// About to block in the poller: arrange to be woken; true if data arrived meanwhile.
    fn prepare_sleep(&self, _want_write: bool) -> bool {
        false
    }
    /// Awake again.
    fn end_sleep(&self) {}
    /// The shared-memory transport behind this stream, for the blocking receive's fast path.
    fn as_shm(&mut self) -> Option<&mut ShmTransport> {
        None
    }
}

/// What [`ShmTransport::recv_eager`] found.
pub(crate) enum Fast {
    /// A whole eager message was taken: (tag, bytes).
    Took(i32, usize),
    /// The ring is empty.
    Empty,
    /// Something else is next (another kind of frame, another message, a frame not yet
    /// complete, a corrupt header): left in the ring for the general path.
    Other,
}

/// What an I/O error means for a non-blocking stream.
enum Outcome {
    /// Nothing now (the kernel said would-block).
    Drained,
    /// A signal interrupted the call: try again later, readiness unchanged.
    Retry,
    /// The connection is broken.
    Broken(String),
}

fn io_err(e: std::io::Error) -> Outcome {
    match e.kind() {
        std::io::ErrorKind::WouldBlock => Outcome::Drained,
        std::io::ErrorKind::Interrupted => Outcome::Retry,
        _ => Outcome::Broken(format!("connection error: {e}")),
    }
}

/// TCP (`TCP_NODELAY`, non-blocking, edge-triggered readiness).
///
/// A read that returns fewer bytes than asked for drained the socket's receive queue, so the
/// transport stops reading until the poller reports it readable again: a message costs one
/// `recvfrom`, not one plus a second that only says `EAGAIN`. Edge-triggered `epoll` reports
/// every later arrival, data or the peer's FIN. The one case where that is not enough is a FIN
/// that arrived with the last data before the poller looked: then no new event will come, so
/// the poller's "peer closed" flag (`EPOLLRDHUP`) makes the transport read on until the
/// zero-length read that says end of stream.
pub(crate) struct TcpTransport {
    sock: Option<TcpStream>,
    readable: bool,
    writable: bool,
    /// The poller reported the peer's end closed: read until EOF, never stop at a short read.
    peer_closed: bool,
}

impl TcpTransport {
    pub(crate) fn new(sock: TcpStream) -> Self {
        TcpTransport {
            sock: Some(sock),
            readable: true,
            writable: true,
            peer_closed: false,
        }
    }
}

impl Transport for TcpTransport {
    fn kind(&self) -> &'static str {
        "tcp"
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize, String> {
        let Some(sock) = self.sock.as_mut() else {
            return Err("connection closed".into());
        };
        if !self.readable || buf.is_empty() {
            return Ok(0);
        }
        match sock.read(buf) {
            Ok(0) => Err("connection closed".into()),
            Ok(n) => {
                if n < buf.len() && !self.peer_closed {
                    // Drained: the next arrival (or the FIN) raises a new edge.
                    self.readable = false;
                }
                Ok(n)
            }
            Err(e) => match io_err(e) {
                Outcome::Drained => {
                    self.readable = false;
                    Ok(0)
                }
                Outcome::Retry => Ok(0),
                Outcome::Broken(why) => Err(why),
            },
        }
    }

    fn write(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize, String> {
        let Some(sock) = self.sock.as_mut() else {
            return Err("connection closed".into());
        };
        if !self.writable {
            return Ok(0);
        }
        match sock.write_vectored(bufs) {
            Ok(n) => Ok(n),
            Err(e) => match io_err(e) {
                Outcome::Drained => {
                    self.writable = false;
                    Ok(0)
                }
                Outcome::Retry => Ok(0),
                Outcome::Broken(why) => Err(why),
            },
        }
    }

    fn socket(&mut self) -> Option<&mut TcpStream> {
        self.sock.as_mut()
    }

    fn close_socket(&mut self) {
        self.sock = None;
    }

    fn socket_is_stream(&self) -> bool {
        true
    }

    fn on_readable(&mut self, closed: bool) -> Result<(), String> {
        self.readable = true;
        self.peer_closed |= closed;
        Ok(())
    }

    fn on_writable(&mut self) {
        self.writable = true;
    }

    fn arm_read(&mut self) {
        self.readable = true;
    }
}

/// Shared-memory rings (one per direction) plus the TCP connection as doorbell and liveness
/// signal: its EOF means the peer is gone.
pub(crate) struct ShmTransport {
    tx: Ring,
    rx: Ring,
    bell: Option<TcpStream>,
}

impl ShmTransport {
    pub(crate) fn new(tx: Ring, rx: Ring, bell: TcpStream) -> Self {
        ShmTransport {
            tx,
            rx,
            bell: Some(bell),
        }
    }

    /// The blocking receive's fast path: if the next frame in the ring is a whole eager message
    /// of `ctx` (and `tag`, if given) that fits in `buf`, copy its payload straight into `buf`
    /// and consume the frame — no staging copy, one look at the writer's tail. Anything else is
    /// left untouched.
    pub(crate) fn recv_eager(&mut self, ctx: u64, tag: Option<i32>, buf: &mut [u8]) -> Fast {
        let avail = self.rx.available();
        if avail == 0 {
            return Fast::Empty;
        }
        if avail < HEADER_LEN {
            return Fast::Other;
        }
        let mut h = [0u8; HEADER_LEN];
        self.rx.peek(avail, 0, &mut h);
        let Ok(hdr) = Header::decode(&h) else {
            return Fast::Other;
        };
        if hdr.kind != Kind::Eager || hdr.ctx != ctx || tag.is_some_and(|t| t != hdr.tag) {
            return Fast::Other;
        }
        let len = match usize::try_from(hdr.len) {
            Ok(len) if len <= buf.len() && len <= avail - HEADER_LEN => len,
            _ => return Fast::Other,
        };
        self.rx.peek(avail, HEADER_LEN, &mut buf[..len]);
        if self.rx.consume(avail, HEADER_LEN + len) {
            self.ring_bell();
        }
        Fast::Took(hdr.tag, len)
    }

    /// Publish that this rank runs on `cpu` (to the peer, in the ring it writes to us), and
    /// tell whether the peer, awake, last said it runs on that CPU too: then it can only be
    /// queued behind us (or have moved since), and spinning on the CPU delays it.
    pub(crate) fn peer_on_cpu(&self, cpu: u32) -> bool {
        self.rx.publish_reader_cpu(cpu);
        self.tx.reader_awake_on() == Some(cpu)
    }

    fn ring_bell(&mut self) {
        if let Some(s) = self.bell.as_mut() {
            // WouldBlock: wake-up bytes are already pending, the peer will wake anyway.
            let _ = s.write(&[1u8]);
        }
    }
}

impl Transport for ShmTransport {
    fn kind(&self) -> &'static str {
        "shm"
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize, String> {
        let (n, wake) = self.rx.read(buf)?;
        if wake {
            self.ring_bell();
        }
        Ok(n)
    }

    fn write(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize, String> {
        if self.bell.is_none() {
            return Err("connection closed".into());
        }
        let (n, wake) = self.tx.write_vectored(bufs);
        if wake {
            self.ring_bell();
        }
        Ok(n)
    }

    fn ready_hint(&self) -> bool {
        self.rx.has_data()
    }

    fn socket(&mut self) -> Option<&mut TcpStream> {
        self.bell.as_mut()
    }

    fn close_socket(&mut self) {
        self.bell = None;
    }

    fn socket_is_stream(&self) -> bool {
        false
    }

    fn on_readable(&mut self, closed: bool) -> Result<(), String> {
        let Some(s) = self.bell.as_mut() else {
            return Err("connection closed".into());
        };
        let mut buf = [0u8; 256];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return Err("connection closed".into()),
                // A short read drained the wake-up bytes (see `TcpTransport`); read on to the
                // EOF only when the poller said the peer closed its end.
                Ok(n) if n < buf.len() && !closed => return Ok(()),
                Ok(_) => continue,
                Err(e) => match io_err(e) {
                    Outcome::Drained => return Ok(()),
                    Outcome::Retry => continue,
                    Outcome::Broken(why) => return Err(why),
                },
            }
        }
    }

    fn on_writable(&mut self) {}

    fn prepare_sleep(&self, want_write: bool) -> bool {
        let mut woke = self.rx.prepare_reader_sleep();
        if want_write {
            woke |= self.tx.prepare_writer_sleep();
        }
        woke
    }

    fn end_sleep(&self) {
        self.rx.clear_reader_sleep();
    }

    fn as_shm(&mut self) -> Option<&mut ShmTransport> {
        Some(self)
    }
}
