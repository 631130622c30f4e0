//! A blocking client for a directory server's Unix socket.
//!
//! ```no_run
//! use mutirao_dir::client::Client;
//! use mutirao_dir::{Acl, AttrList, Attr, Scope};
//! let mut c = Client::connect("/tmp/mutirao-dir.sock").unwrap();
//! let ctx = c.open_context().unwrap();
//! let attrs = AttrList::from_pairs([("type", "mailbox"), ("app", "sire")]).unwrap();
//! let gid = c.register(ctx, &attrs, &Acl::Public, false).unwrap().gid;
//! let q = AttrList::from_attrs([Attr::full("app", "sire")]).unwrap();
//! let (found, _attrs) = c.query(None, &q, Scope::Grid).unwrap();
//! assert_eq!(found, gid);
//! c.heartbeat(ctx).unwrap(); // at least every heartbeat_timeout / 3
//! ```

use crate::attr::{Attr, AttrList};
use crate::directory::{Acl, Registered, ACL_ATTR};
use crate::error::DirError;
use crate::gid::Gid;
use crate::net::{FrameReader, SpinGate, DEFAULT_SPIN};
use crate::server::error_from_packet;
use crate::wire::{Header, Kind, Packet, Scope, FLAG_CREATED, FLAG_MORE, FLAG_UNIQUE};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// One query's outcome: the gid found and the answer attributes.
pub type QueryResult = Result<(Gid, AttrList), DirError>;

/// A connection to a local directory server.
///
/// Each request is written with one syscall and each reply read with one; while waiting for
/// a reply the client polls the socket for up to [`DEFAULT_SPIN`] (yielding the CPU between
/// polls) before sleeping, unless recent replies took longer than that (see
/// [`crate::net::SpinPolicy`]). [`Client::set_spin`] changes the budget.
pub struct Client {
    s: UnixStream,
    r: FrameReader,
    out: Vec<u8>,
    next_id: u64,
}

impl Client {
    /// Connects to the server's socket.
    pub fn connect(path: impl AsRef<Path>) -> Result<Self, DirError> {
        let path = path.as_ref();
        let s = UnixStream::connect(path).map_err(|e| {
            DirError::Io(format!(
                "cannot connect to the directory at {}: {e} (is `mutirao dir serve` or the agent running?)",
                path.display()
            ))
        })?;
        Ok(Client {
            s,
            r: FrameReader::new(DEFAULT_SPIN).with_gate(SpinGate::process_clients()),
            out: Vec::with_capacity(4096),
            next_id: 1,
        })
    }

    /// Sets how long a wait for a reply polls before sleeping (zero: sleep at once, which
    /// uses the least CPU but adds the kernel's wake-up latency to every request).
    pub fn set_spin(&mut self, spin: Duration) {
        self.r.set_spin(spin);
    }

    fn send(&mut self, mut p: Packet) -> Result<(), DirError> {
        p.header.query_id = if p.header.query_id == 0 {
            self.next_id += 1;
            self.next_id
        } else {
            p.header.query_id
        };
        crate::net::frame_into(&p, &mut self.out);
        Ok(())
    }

    /// Writes every queued request with one syscall.
    fn flush(&mut self) -> Result<(), DirError> {
        let res = (&self.s).write_all(&self.out);
        self.out.clear();
        res.map_err(|e| DirError::Io(format!("cannot send to the directory server: {e}")))
    }

    fn recv(&mut self) -> Result<Packet, DirError> {
        match self.r.next_frame(&self.s)? {
            Some(frame) => Packet::decode(frame),
            None => Err(DirError::Io(
                "the directory server closed the connection (did it stop?)".into(),
            )),
        }
    }

    /// Sends one request and waits for its reply; a non-zero status becomes the error.
    pub fn call(&mut self, p: Packet) -> Result<Packet, DirError> {
        self.send(p)?;
        self.flush()?;
        let r = self.recv()?;
        if r.header.status != 0 {
            return Err(error_from_packet(&r));
        }
        Ok(r)
    }

    /// Opens a context for this process; send [`Client::heartbeat`] regularly or its
    /// resources are purged.
    pub fn open_context(&mut self) -> Result<Gid, DirError> {
        Ok(self
            .call(Packet::new(Header::new(Kind::OpenContext), AttrList::new()))?
            .header
            .target)
    }

    /// Heartbeat for `ctx`.
    pub fn heartbeat(&mut self, ctx: Gid) -> Result<(), DirError> {
        let mut h = Header::new(Kind::Heartbeat);
        h.target = ctx;
        self.call(Packet::new(h, AttrList::new())).map(|_| ())
    }

    /// Closes `ctx`, deleting its resources.
    pub fn close_context(&mut self, ctx: Gid) -> Result<(), DirError> {
        let mut h = Header::new(Kind::CloseContext);
        h.target = ctx;
        self.call(Packet::new(h, AttrList::new())).map(|_| ())
    }

    /// Registers a resource bound to `ctx` (`Gid::NONE`: the server's own context, which
    /// never expires). With `unique`, an equal resource's gid is returned if one exists.
    pub fn register(
        &mut self,
        ctx: Gid,
        attrs: &AttrList,
        acl: &Acl,
        unique: bool,
    ) -> Result<Registered, DirError> {
        let mut h = Header::new(Kind::Register);
        h.target = ctx;
        if unique {
            h.flags |= FLAG_UNIQUE;
        }
        if let Some(x) = attrs.iter().find(|x| x.is_system()) {
            return Err(DirError::SystemNamespace(x.name.clone()));
        }
        let mut a = attrs.clone();
        if *acl != Acl::Public {
            a.insert(Attr::full(ACL_ATTR, acl.encode()))?;
        }
        let r = self.call(Packet::new(h, a))?;
        Ok(Registered {
            gid: r.header.target,
            created: r.header.flags & FLAG_CREATED != 0,
        })
    }

    /// Single-answer query by gid and/or attributes in `scope`.
    pub fn query(
        &mut self,
        gid: Option<Gid>,
        q: &AttrList,
        scope: Scope,
    ) -> Result<(Gid, AttrList), DirError> {
        let r = self.call(query_packet(gid, q, scope))?;
        Ok((r.header.target, r.attrs))
    }

    /// Sends all queries before reading any reply (pipelining), one result per query.
    pub fn query_pipelined(
        &mut self,
        qs: &[(Option<Gid>, AttrList)],
        scope: Scope,
    ) -> Result<Vec<QueryResult>, DirError> {
        for (g, q) in qs {
            self.send(query_packet(*g, q, scope))?;
        }
        self.flush()?;
        let mut out = Vec::with_capacity(qs.len());
        for _ in qs {
            let r = self.recv()?;
            out.push(if r.header.status != 0 {
                Err(error_from_packet(&r))
            } else {
                Ok((r.header.target, r.attrs))
            });
        }
        Ok(out)
    }

    /// Multi-answer query: an iterator over every match in `scope`, fetched one at a time.
    /// Dropping the iterator before the end stops the query on the server.
    pub fn query_iter(&mut self, q: &AttrList, scope: Scope) -> Result<QueryIter<'_>, DirError> {
        let mut h = Header::new(Kind::QueryStart);
        h.scope = scope.to_u8();
        self.send(Packet::new(h, q.clone()))?;
        self.flush()?;
        let r = self.recv()?;
        let id = r.header.query_id;
        let first = match r.header.status {
            0 => Some((r.header.target, r.attrs)),
            2 => None,
            _ => return Err(error_from_packet(&r)),
        };
        let open = first.is_some() && r.header.flags & FLAG_MORE != 0;
        Ok(QueryIter {
            c: self,
            id,
            first,
            open,
        })
    }

    /// Deletes a resource (or closes a context).
    pub fn delete(&mut self, gid: Gid) -> Result<(), DirError> {
        let mut h = Header::new(Kind::Delete);
        h.target = gid;
        self.call(Packet::new(h, AttrList::new())).map(|_| ())
    }
}

fn query_packet(gid: Option<Gid>, q: &AttrList, scope: Scope) -> Packet {
    let mut h = Header::new(Kind::Query);
    h.scope = scope.to_u8();
    h.target = gid.unwrap_or(Gid::NONE);
    Packet::new(h, q.clone())
}

/// Iterator returned by [`Client::query_iter`].
pub struct QueryIter<'a> {
    c: &'a mut Client,
    id: u64,
    first: Option<(Gid, AttrList)>,
    open: bool,
}

impl QueryIter<'_> {
    /// The server-side query id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Stops the query now, freeing the server's state.
    pub fn stop(mut self) -> Result<(), DirError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), DirError> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        let mut h = Header::new(Kind::QueryStop);
        h.query_id = self.id;
        self.c.call(Packet::new(h, AttrList::new())).map(|_| ())
    }
}

impl Iterator for QueryIter<'_> {
    type Item = Result<(Gid, AttrList), DirError>;
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(x) = self.first.take() {
            return Some(Ok(x));
        }
        if !self.open {
            return None;
        }
        let mut h = Header::new(Kind::QueryNext);
        h.query_id = self.id;
        match self.c.call(Packet::new(h, AttrList::new())) {
            Ok(r) => Some(Ok((r.header.target, r.attrs))),
            Err(DirError::NoMatch) => {
                self.open = false;
                None
            }
            Err(e) => {
                self.open = false;
                Some(Err(e))
            }
        }
    }
}

impl Drop for QueryIter<'_> {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}
