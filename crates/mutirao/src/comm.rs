//! Communicators and point-to-point operations.

use crate::engine::{Buf, Dest, Engine, SendData};
use crate::{Error, Status, ANY_SOURCE, ANY_TAG};
use bytemuck::Pod;
use serde::{de::DeserializeOwned, Serialize};
use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::rc::Rc;

pub(crate) struct CommInner {
    pub(crate) eng: Rc<RefCell<Engine>>,
    /// Context id for point-to-point traffic (even); collectives use `ctx + 1`.
    pub(crate) ctx: u64,
    /// Communicator rank → world rank.
    pub(crate) group: Vec<usize>,
    /// World rank → communicator rank.
    pub(crate) index: std::collections::HashMap<usize, usize>,
    pub(crate) rank: usize,
    /// Number of communicators derived so far (they are created collectively, in the same order
    /// on every member, so this counter agrees across members).
    pub(crate) children: Cell<u64>,
}

/// A restart: the committed epoch the job was restored from, and how many recoveries so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    pub epoch: u64,
    pub incarnation: u64,
}

/// A communicator: a group of ranks and a private message space. Cheap to clone.
#[derive(Clone)]
pub struct Comm {
    pub(crate) inner: Rc<CommInner>,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("ctx", &self.inner.ctx)
            .finish()
    }
}

fn alloc_vec<T: Pod>(len: usize) -> Result<Box<dyn Buf>, Error> {
    let elem = std::mem::size_of::<T>();
    if elem == 0 || len % elem != 0 {
        return Err(Error::ElementSize { bytes: len, elem });
    }
    Ok(Box::new(vec![T::zeroed(); len / elem]))
}

fn check_elems<T>(status: &Status) -> Result<(), Error> {
    let elem = std::mem::size_of::<T>();
    if elem == 0 || status.bytes % elem != 0 {
        return Err(Error::ElementSize {
            bytes: status.bytes,
            elem,
        });
    }
    Ok(())
}

impl Comm {
    pub(crate) fn world(engine: Engine) -> Comm {
        let size = engine.size;
        let rank = engine.rank;
        Comm {
            inner: Rc::new(CommInner {
                eng: Rc::new(RefCell::new(engine)),
                ctx: 0,
                group: (0..size).collect(),
                index: (0..size).map(|i| (i, i)).collect(),
                rank,
                children: Cell::new(0),
            }),
        }
    }

    /// The root communicator of a spawned rank: its spawn group (world ranks, parent first)
    /// under the group's context.
    pub(crate) fn spawned_root(engine: Engine, ctx: u64, group: Vec<usize>) -> Comm {
        let me = engine.rank;
        let eng = Rc::new(RefCell::new(engine));
        Self::make(eng, ctx, group, me)
    }

    /// A communicator over `group` (world ranks) sharing this one's engine.
    pub(crate) fn with_group(&self, ctx: u64, group: Vec<usize>) -> Comm {
        let me = self.inner.eng.borrow().rank;
        Self::make(self.inner.eng.clone(), ctx, group, me)
    }

    fn make(eng: Rc<RefCell<Engine>>, ctx: u64, group: Vec<usize>, me: usize) -> Comm {
        let rank = group.iter().position(|w| *w == me).unwrap_or(0);
        Comm {
            inner: Rc::new(CommInner {
                eng,
                ctx,
                index: group.iter().enumerate().map(|(i, w)| (*w, i)).collect(),
                group,
                rank,
                children: Cell::new(0),
            }),
        }
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks in the communicator.
    pub fn size(&self) -> usize {
        self.inner.group.len()
    }

    /// The world rank of communicator rank `r`.
    pub fn world_rank(&self, r: usize) -> Option<usize> {
        self.inner.group.get(r).copied()
    }

    pub(crate) fn peer(&self, r: usize) -> Result<usize, Error> {
        self.inner.group.get(r).copied().ok_or_else(|| {
            Error::Invalid(format!(
                "rank {r} is not in this communicator of {} ranks",
                self.size()
            ))
        })
    }

    fn src_filter(&self, src: usize) -> Result<Option<usize>, Error> {
        if src == ANY_SOURCE {
            Ok(None)
        } else {
            self.peer(src).map(Some)
        }
    }

    fn tag_filter(tag: i32) -> Result<Option<i32>, Error> {
        match tag {
            ANY_TAG => Ok(None),
            t if t >= 0 => Ok(Some(t)),
            t => Err(Error::Invalid(format!(
                "tag {t}: tags are ≥ 0 (ANY_TAG = -1 only when receiving)"
            ))),
        }
    }

    fn send_tag(tag: i32) -> Result<i32, Error> {
        if tag < 0 {
            return Err(Error::Invalid(format!("tag {tag}: send tags must be ≥ 0")));
        }
        Ok(tag)
    }

    pub(crate) fn to_local(&self, mut s: Status) -> Status {
        // Group members are distinct: a world rank found at its own index is that rank here
        // (always so in the world communicator; saves a SipHash lookup per receive).
        if self.inner.group.get(s.source) == Some(&s.source) {
            return s;
        }
        s.source = self.inner.index.get(&s.source).copied().unwrap_or(s.source);
        s
    }

    // ------------------------------------------------------------ blocking

    /// Send `buf` to rank `dest` with `tag`. Returns when `buf` may be reused.
    pub fn send<T: Pod>(&self, buf: &[T], dest: usize, tag: i32) -> Result<(), Error> {
        let tag = Self::send_tag(tag)?;
        self.raw_send(self.inner.ctx, bytemuck::cast_slice(buf), dest, tag)
    }

    pub(crate) fn raw_send(
        &self,
        ctx: u64,
        bytes: &[u8],
        dest: usize,
        tag: i32,
    ) -> Result<(), Error> {
        let peer = self.peer(dest)?;
        let mut e = self.inner.eng.borrow_mut();
        let Some(id) = e.start_send_blocking(
            peer,
            ctx,
            tag,
            SendData::Borrowed(bytes.as_ptr(), bytes.len()),
        )?
        else {
            return Ok(()); // written or copied: nothing of `bytes` stays in the engine
        };
        // The engine may hold `bytes` until this function returns: wait, then always remove it.
        let res = e.wait_until(|e| e.send_finished(id));
        let res = res.and_then(|_| e.take_send(id).map(|_| ()));
        e.forget_send(id);
        res
    }

    /// Receive into `buf` from `src` (or [`ANY_SOURCE`]) with `tag` (or [`ANY_TAG`]).
    /// The message may be shorter than `buf`; [`Status::bytes`] tells its size.
    pub fn recv<T: Pod>(&self, buf: &mut [T], src: usize, tag: i32) -> Result<Status, Error> {
        let st = self.raw_recv(
            self.inner.ctx,
            bytemuck::cast_slice_mut(buf),
            self.src_filter(src)?,
            Self::tag_filter(tag)?,
        )?;
        check_elems::<T>(&st)?;
        Ok(st)
    }

    pub(crate) fn raw_recv(
        &self,
        ctx: u64,
        buf: &mut [u8],
        src: Option<usize>,
        tag: Option<i32>,
    ) -> Result<Status, Error> {
        let mut e = self.inner.eng.borrow_mut();
        if let Some(st) = e.recv_fast(ctx, src, tag, buf) {
            return Ok(self.to_local(st));
        }
        let id =
            e.post_recv_blocking(ctx, src, tag, Dest::Borrowed(buf.as_mut_ptr(), buf.len()))?;
        let res = e.wait_until(|e| e.recv_finished(id));
        let res = res.and_then(|_| e.take_recv(id).map(|(s, _)| s));
        e.forget_recv(id);
        res.map(|s| self.to_local(s))
    }

    /// Receive a message of any length into a new vector.
    pub fn recv_vec<T: Pod>(&self, src: usize, tag: i32) -> Result<(Vec<T>, Status), Error> {
        let req: Request<T> = self.irecv(src, tag)?;
        let (v, st) = req.wait()?;
        Ok((v, st.expect("receives have a status")))
    }

    /// Send a value of any serde type.
    pub fn send_obj<T: Serialize + ?Sized>(
        &self,
        value: &T,
        dest: usize,
        tag: i32,
    ) -> Result<(), Error> {
        let bytes = bincode::serialize(value).map_err(|e| Error::Codec(e.to_string()))?;
        self.send(&bytes, dest, tag)
    }

    /// Receive a value of any serde type.
    pub fn recv_obj<T: DeserializeOwned>(
        &self,
        src: usize,
        tag: i32,
    ) -> Result<(T, Status), Error> {
        let (bytes, st) = self.recv_vec::<u8>(src, tag)?;
        let v = bincode::deserialize(&bytes).map_err(|e| {
            Error::Codec(format!(
                "message from rank {} (tag {}) is not a {}: {e}",
                st.source,
                st.tag,
                std::any::type_name::<T>()
            ))
        })?;
        Ok((v, st))
    }

    /// Send `send` to `dest` and receive into `recv` from `src` at once (no deadlock whatever the
    /// sizes).
    pub fn sendrecv<S: Pod, R: Pod>(
        &self,
        send: &[S],
        dest: usize,
        send_tag: i32,
        recv: &mut [R],
        src: usize,
        recv_tag: i32,
    ) -> Result<Status, Error> {
        let st = self.raw_exchange(
            self.inner.ctx,
            &[(dest, Self::send_tag(send_tag)?, bytemuck::cast_slice(send))],
            &mut [(
                self.src_filter(src)?,
                Self::tag_filter(recv_tag)?,
                bytemuck::cast_slice_mut(recv),
            )],
        )?;
        let st = st[0];
        check_elems::<R>(&st)?;
        Ok(st)
    }

    /// Post every receive, start every send, wait for all (the building block of collectives).
    /// Sources are world ranks already resolved (`None` = any); destinations are communicator ranks.
    pub(crate) fn raw_exchange(
        &self,
        ctx: u64,
        sends: &[(usize, i32, &[u8])],
        recvs: &mut [(Option<usize>, Option<i32>, &mut [u8])],
    ) -> Result<Vec<Status>, Error> {
        let peers: Vec<usize> = sends
            .iter()
            .map(|(d, _, _)| self.peer(*d))
            .collect::<Result<_, _>>()?;
        let mut e = self.inner.eng.borrow_mut();
        let mut rids = Vec::with_capacity(recvs.len());
        let mut sids = Vec::with_capacity(sends.len());
        let mut res: Result<(), Error> = Ok(());
        for (src, tag, buf) in recvs.iter_mut() {
            match e.post_recv(ctx, *src, *tag, Dest::Borrowed(buf.as_mut_ptr(), buf.len())) {
                Ok(id) => rids.push(id),
                Err(err) => {
                    res = Err(err);
                    break;
                }
            }
        }
        if res.is_ok() {
            for ((_, tag, buf), peer) in sends.iter().zip(&peers) {
                match e.start_send(
                    *peer,
                    ctx,
                    *tag,
                    SendData::Borrowed(buf.as_ptr(), buf.len()),
                ) {
                    Ok(id) => sids.push(id),
                    Err(err) => {
                        res = Err(err);
                        break;
                    }
                }
            }
        }
        let mut statuses = Vec::with_capacity(rids.len());
        if res.is_ok() {
            res = e.wait_until(|e| {
                rids.iter().all(|id| e.recv_finished(*id))
                    && sids.iter().all(|id| e.send_finished(*id))
            });
        }
        if res.is_ok() {
            for id in &rids {
                match e.take_recv(*id) {
                    Ok((s, _)) => statuses.push(self.to_local(s)),
                    Err(err) => {
                        res = Err(err);
                        break;
                    }
                }
            }
        }
        if res.is_ok() {
            for id in &sids {
                if let Err(err) = e.take_send(*id) {
                    res = Err(err);
                    break;
                }
            }
        }
        // Borrowed pointers never outlive this call.
        for id in rids {
            e.forget_recv(id);
        }
        for id in sids {
            e.forget_send(id);
        }
        res.map(|_| statuses)
    }

    // ------------------------------------------------------------ probe

    /// Is a matching message waiting? Never blocks. With a specific source that has failed or
    /// finalized and left nothing to receive, the error a receive would return (an any-source
    /// probe never fails).
    pub fn iprobe(&self, src: usize, tag: i32) -> Result<Option<Status>, Error> {
        let (s, t) = (self.src_filter(src)?, Self::tag_filter(tag)?);
        let mut e = self.inner.eng.borrow_mut();
        if let Some(st) = e.iprobe(self.inner.ctx, s, t) {
            return Ok(Some(self.to_local(st)));
        }
        e.poke()?;
        match e.iprobe(self.inner.ctx, s, t) {
            Some(st) => Ok(Some(self.to_local(st))),
            // Nothing here and nothing can come from that source: say so, as a receive
            // would. (Any source: others may still send; an any-source probe never fails.)
            None => match s.and_then(|src| e.source_gone(Some(src), self.inner.ctx)) {
                Some(err) => Err(err),
                None => Ok(None),
            },
        }
    }

    /// Wait until a matching message is here and describe it (it stays to be received).
    pub fn probe(&self, src: usize, tag: i32) -> Result<Status, Error> {
        let (s, t) = (self.src_filter(src)?, Self::tag_filter(tag)?);
        let ctx = self.inner.ctx;
        let mut e = self.inner.eng.borrow_mut();
        e.wait_until(|e| e.iprobe(ctx, s, t).is_some() || e.source_gone(s, ctx).is_some())?;
        match e.iprobe(ctx, s, t) {
            Some(st) => Ok(self.to_local(st)),
            None => Err(e
                .source_gone(s, ctx)
                .unwrap_or_else(|| Error::Invalid("probe".into()))),
        }
    }

    // ------------------------------------------------------------ nonblocking

    /// Start sending `data`; the buffer comes back from [`Request::wait`].
    pub fn isend<T: Pod>(&self, data: Vec<T>, dest: usize, tag: i32) -> Result<Request<T>, Error> {
        let tag = Self::send_tag(tag)?;
        let peer = self.peer(dest)?;
        let id = self.inner.eng.borrow_mut().start_send(
            peer,
            self.inner.ctx,
            tag,
            SendData::Owned(Box::new(data)),
        )?;
        Ok(Request::new(self.clone(), id, false))
    }

    /// Start receiving a message of any length; [`Request::wait`] returns it.
    pub fn irecv<T: Pod>(&self, src: usize, tag: i32) -> Result<Request<T>, Error> {
        let id = self.inner.eng.borrow_mut().post_recv(
            self.inner.ctx,
            self.src_filter(src)?,
            Self::tag_filter(tag)?,
            Dest::Alloc(alloc_vec::<T>),
        )?;
        Ok(Request::new(self.clone(), id, true))
    }

    /// Start receiving into `buf` (at most `buf.len()` elements); [`Request::wait`] returns the
    /// buffer and the status.
    pub fn irecv_into<T: Pod>(
        &self,
        buf: Vec<T>,
        src: usize,
        tag: i32,
    ) -> Result<Request<T>, Error> {
        let id = self.inner.eng.borrow_mut().post_recv(
            self.inner.ctx,
            self.src_filter(src)?,
            Self::tag_filter(tag)?,
            Dest::Owned(Box::new(buf)),
        )?;
        Ok(Request::new(self.clone(), id, true))
    }

    // ------------------------------------------------------------ checkpoints

    /// A safe point for checkpoint waves (issue 12, `docs/checkpoints.md`): when a wave is
    /// under way, this rank's checkpoint is taken here — `state` (any serde value) plus the
    /// runtime's unmatched messages. Blocking mode waits here until every peer has reached its
    /// own safe point of the wave. Without `MUTIRAO_CKPT_INTERVAL` (or outside a wave) it
    /// returns at once. Call it where no message crosses, e.g. at the end of an iteration,
    /// with no nonblocking request pending (else [`Error::Invalid`]).
    pub fn checkpoint_point<T: Serialize>(&self, state: &T) -> Result<(), Error> {
        use crate::ckpt::{Effects, RankCheckpoint, SafePoint};
        let mut e = self.inner.eng.borrow_mut();
        if e.ckpt.is_none() {
            return Ok(());
        }
        e.quiescent()?;
        // Look at the network once: a rank that does not otherwise communicate must still learn
        // of a wave before it passes the safe point the wave is cut at.
        e.poke()?;
        e.ckpt_tick();
        let Some(c) = e.ckpt.as_mut() else {
            return Ok(());
        };
        let SafePoint::Cut { epoch, send } = c.wave.at_safe_point() else {
            return Ok(());
        };
        e.apply_ckpt(Effects {
            send,
            ..Effects::default()
        });
        e.wait_until(|e| {
            e.ckpt
                .as_ref()
                .is_none_or(|c| c.wave.ready_to_snapshot() || c.wave.active_epoch() != Some(epoch))
                || e.source_gone(None, 0).is_some()
        })?;
        if let Some(err) = e.source_gone(None, 0) {
            return Err(err);
        }
        if !e
            .ckpt
            .as_ref()
            .is_some_and(|c| c.wave.active_epoch() == Some(epoch) && c.wave.ready_to_snapshot())
        {
            return Ok(()); // the wave was aborted meanwhile
        }
        // The snapshot.
        let unexpected = e.saved_unexpected()?;
        let app = bincode::serialize(state)
            .map_err(|err| Error::Codec(format!("checkpoint state: {err}")))?;
        let (rank, size) = (e.rank as u32, e.size as u32);
        let next_ctx = self.inner.children.get();
        let Some(c) = e.ckpt.as_mut() else {
            return Ok(());
        };
        c.pending = Some(RankCheckpoint {
            epoch,
            rank,
            size,
            next_ctx,
            unexpected,
            late: Vec::new(),
            app,
        });
        let fx = c.wave.snapshot_taken();
        e.apply_ckpt(fx);
        // Blocking mode: complete now. Nonblocking: when the last cut comes in (in progress).
        e.ckpt_finish();
        Ok(())
    }

    /// On a restart, the program state saved at the restored epoch (once; `None` on a fresh
    /// start or after the first call).
    pub fn restored<T: DeserializeOwned>(&self) -> Result<Option<T>, Error> {
        let mut e = self.inner.eng.borrow_mut();
        let Some(bytes) = e.ckpt.as_mut().and_then(|c| c.restored_app.take()) else {
            return Ok(None);
        };
        bincode::deserialize(&bytes).map(Some).map_err(|err| {
            Error::Codec(format!(
                "the restored checkpoint's state does not decode as the requested type ({err}): \
                 restart the same program that wrote it"
            ))
        })
    }

    /// Whether this run is a restart, and from which epoch.
    pub fn recovery(&self) -> Option<Recovery> {
        let e = self.inner.eng.borrow();
        e.ckpt
            .as_ref()
            .and_then(|c| c.recovery)
            .map(|(epoch, incarnation)| Recovery { epoch, incarnation })
    }

    /// Epochs this rank has seen committed (rank 0) and aborted, for reports and tests.
    pub fn checkpoint_history(&self) -> (Vec<u64>, Vec<u64>) {
        let e = self.inner.eng.borrow();
        e.ckpt
            .as_ref()
            .map(|c| (c.committed.clone(), c.aborted.clone()))
            .unwrap_or_default()
    }

    /// Finish: a barrier (so no rank leaves while others still talk to it), then goodbye to every
    /// peer. Dropping the last handle of the world communicator does the same, ignoring errors.
    pub fn finalize(self) -> Result<(), Error> {
        self.inner.eng.borrow_mut().ckpt_leave();
        let res = self.barrier();
        let fin = self.inner.eng.borrow_mut().finalize_io();
        res.and(fin)
    }
}

impl Drop for CommInner {
    fn drop(&mut self) {
        // The last handle of the engine says goodbye (the world's, or a spawned rank's merged
        // communicator, or whichever derived one outlives them).
        if Rc::strong_count(&self.eng) == 1 {
            if let Ok(mut e) = self.eng.try_borrow_mut() {
                if !e.finalized {
                    let _ = e.finalize_io();
                }
            }
        }
    }
}

/// What a completed request yields: the data (a receive's message, or a send's buffer back) and,
/// for receives, the status.
pub type Completion<T> = (Vec<T>, Option<Status>);

/// A nonblocking operation in flight. Dropping it lets it finish in the background.
pub struct Request<T: Pod> {
    comm: Comm,
    id: u64,
    is_recv: bool,
    taken: bool,
    _t: PhantomData<T>,
}

impl<T: Pod> Request<T> {
    fn new(comm: Comm, id: u64, is_recv: bool) -> Self {
        Request {
            comm,
            id,
            is_recv,
            taken: false,
            _t: PhantomData,
        }
    }

    fn finished(&self, e: &Engine) -> bool {
        if self.is_recv {
            e.recv_finished(self.id)
        } else {
            e.send_finished(self.id)
        }
    }

    /// Has it completed? Drives progress once; never blocks.
    pub fn test(&mut self) -> Result<bool, Error> {
        let mut e = self.comm.inner.eng.borrow_mut();
        if self.finished(&e) {
            return Ok(true);
        }
        e.poke()?;
        Ok(self.finished(&e))
    }

    fn take(mut self, e: &mut Engine) -> Result<(Vec<T>, Option<Status>), Error> {
        self.taken = true;
        let (buf, st) = if self.is_recv {
            let (st, buf) = e.take_recv(self.id)?;
            check_elems::<T>(&st)?;
            (buf, Some(self.comm.to_local(st)))
        } else {
            (e.take_send(self.id)?, None)
        };
        let v = match buf {
            Some(b) => match b.into_any().downcast::<Vec<T>>() {
                Ok(v) => *v,
                Err(_) => return Err(Error::Invalid("request buffer of another type".into())),
            },
            None => Vec::new(),
        };
        // An irecv_into buffer is returned whole; the status tells how much was filled.
        Ok((v, st))
    }

    /// Wait for completion. A receive returns its data and status; a send returns its buffer.
    pub fn wait(self) -> Result<(Vec<T>, Option<Status>), Error> {
        let comm = self.comm.clone();
        let mut e = comm.inner.eng.borrow_mut();
        e.wait_until(|e| self.finished(e))?;
        self.take(&mut e)
    }
}

impl<T: Pod> Drop for Request<T> {
    fn drop(&mut self) {
        if !self.taken {
            if let Ok(mut e) = self.comm.inner.eng.try_borrow_mut() {
                e.detach(self.id);
            }
        }
    }
}

/// Wait for every request; results in the same order.
pub fn wait_all<T: Pod>(reqs: Vec<Request<T>>) -> Result<Vec<Completion<T>>, Error> {
    reqs.into_iter().map(Request::wait).collect()
}

/// Wait for any one request; removes it from `reqs` and returns its index and result.
pub fn wait_any<T: Pod>(
    reqs: &mut Vec<Request<T>>,
) -> Result<(usize, Vec<T>, Option<Status>), Error> {
    let Some(first) = reqs.first() else {
        return Err(Error::Invalid("wait_any on an empty list".into()));
    };
    let comm = first.comm.clone();
    let idx = {
        let mut e = comm.inner.eng.borrow_mut();
        e.wait_until(|e| reqs.iter().any(|r| r.finished(e)))?;
        reqs.iter()
            .position(|r| r.finished(&e))
            .expect("one finished")
    };
    let r = reqs.remove(idx);
    let mut e = comm.inner.eng.borrow_mut();
    let (v, st) = r.take(&mut e)?;
    Ok((idx, v, st))
}
