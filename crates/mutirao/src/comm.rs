//! Communicators and point-to-point operations.

use crate::engine::{Buf, Dest, Engine, SendData};
use crate::{Error, Status, ANY_SOURCE, ANY_TAG};
use bytemuck::Pod;
use serde::{de::DeserializeOwned, Serialize};
use std::cell::RefCell;
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
    /// What every rank of this communicator agreed on for choosing collective algorithms, on
    /// the first call that needed it (see `Comm::agreed`).
    pub(crate) agreed: std::cell::Cell<Option<crate::coll::Agreed>>,
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

pub(crate) fn alloc_vec<T: Pod>(len: usize) -> Result<Box<dyn Buf>, Error> {
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
                agreed: std::cell::Cell::new(None),
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

    pub(crate) fn make(eng: Rc<RefCell<Engine>>, ctx: u64, group: Vec<usize>, me: usize) -> Comm {
        let rank = group.iter().position(|w| *w == me).unwrap_or(0);
        let c = Comm {
            inner: Rc::new(CommInner {
                eng,
                ctx,
                index: group.iter().enumerate().map(|(i, w)| (*w, i)).collect(),
                group,
                rank,
                agreed: std::cell::Cell::new(None),
            }),
        };
        // Whether the program still holds it decides if a checkpoint hands it back.
        if ctx != 0 {
            if let Ok(mut e) = c.inner.eng.try_borrow_mut() {
                let hs = e.comm_handles.entry(ctx).or_default();
                hs.retain(|w| w.strong_count() > 0);
                hs.push(Rc::downgrade(&c.inner));
            }
        }
        c
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks in the communicator.
    pub fn size(&self) -> usize {
        self.inner.group.len()
    }

    /// How long this process's start-up ([`crate::init`]) took, phase by phase: registering
    /// with the launcher, the address exchange, the mesh connect and the connection barrier
    /// (see [`crate::InitTimings`]). `None` for a process started without a launcher (a job
    /// of one rank). The same on every communicator of the process.
    pub fn init_timings(&self) -> Option<crate::InitTimings> {
        self.inner.eng.borrow().init_timings
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
        self.raw_exchange_capped(ctx, sends, recvs, usize::MAX)
    }

    /// [`Comm::raw_exchange`] whose sends above `eager_cap` bytes go by rendezvous, whatever
    /// the eager limit (see [`Engine::start_send_capped`]).
    pub(crate) fn raw_exchange_capped(
        &self,
        ctx: u64,
        sends: &[(usize, i32, &[u8])],
        recvs: &mut [(Option<usize>, Option<i32>, &mut [u8])],
        eager_cap: usize,
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
                match e.start_send_capped(
                    *peer,
                    ctx,
                    *tag,
                    SendData::Borrowed(buf.as_ptr(), buf.len()),
                    eager_cap,
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

    /// A ring pipeline (the building block of ring collectives): every receive from `left`
    /// is posted first, in step order, so each step's message matches on arrival and is
    /// copied once, straight into its place (posted one step at a time, a message that came
    /// while its receiver was still in the step before was buffered and copied twice); then
    /// step `i` sends `send_of(i)` to `right`, waits for that send and receive `i`, checks
    /// the receive's length and calls `got(i)`. `left` and `right` are communicator ranks.
    ///
    /// `recvs[i]` and the buffers `send_of` returns are raw (pointer, length) pairs because
    /// the engine holds the receive buffers across steps while the caller reads and writes
    /// other parts of the same memory. The caller guarantees that every `recvs[i]` stays valid
    /// and untouched by it until step `i`'s `got` (or the call's return), and that a send
    /// buffer stays valid and unwritten during its step. No pointer outlives this call.
    pub(crate) fn raw_ring(
        &self,
        ctx: u64,
        tag: i32,
        (left, right): (usize, usize),
        recvs: &[(*mut u8, usize)],
        mut send_of: impl FnMut(usize) -> (*const u8, usize),
        mut got: impl FnMut(usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let (left, right) = (self.peer(left)?, self.peer(right)?);
        let mut rids = Vec::with_capacity(recvs.len());
        let res = (|| {
            for &(p, n) in recvs {
                let id = self.inner.eng.borrow_mut().post_recv(
                    ctx,
                    Some(left),
                    Some(tag),
                    Dest::Borrowed(p, n),
                )?;
                rids.push(id);
            }
            for (i, &rid) in rids.iter().enumerate() {
                let (p, n) = send_of(i);
                let mut e = self.inner.eng.borrow_mut();
                let sid = e.start_send(right, ctx, tag, SendData::Borrowed(p, n))?;
                let done = e
                    .wait_until(|e| e.recv_finished(rid) && e.send_finished(sid))
                    .and_then(|()| e.take_recv(rid))
                    .and_then(|(st, _)| e.take_send(sid).map(|_| st));
                e.forget_send(sid);
                drop(e);
                let st = done?;
                if st.bytes != recvs[i].1 {
                    return Err(Error::Invalid(format!(
                        "collective mismatch: rank {} sent {} bytes where {} were expected (do all ranks pass the same count and root?)",
                        self.to_local(st).source,
                        st.bytes,
                        recvs[i].1
                    )));
                }
                got(i)?;
            }
            Ok(())
        })();
        // Borrowed pointers never outlive this call.
        let mut e = self.inner.eng.borrow_mut();
        for id in rids {
            e.forget_recv(id);
        }
        res
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
        let mut e = self.inner.eng.borrow_mut();
        let id = e.start_send(peer, self.inner.ctx, tag, SendData::Owned(Box::new(data)))?;
        e.set_send_elem(id, std::mem::size_of::<T>());
        drop(e);
        Ok(Request::new(self.clone(), id, false))
    }

    /// Start receiving a message of any length; [`Request::wait`] returns it.
    pub fn irecv<T: Pod>(&self, src: usize, tag: i32) -> Result<Request<T>, Error> {
        let (s, t) = (self.src_filter(src)?, Self::tag_filter(tag)?);
        let mut e = self.inner.eng.borrow_mut();
        let id = e.post_recv(self.inner.ctx, s, t, Dest::Alloc(alloc_vec::<T>))?;
        e.set_recv_elem(id, std::mem::size_of::<T>());
        drop(e);
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
        let (s, t) = (self.src_filter(src)?, Self::tag_filter(tag)?);
        let mut e = self.inner.eng.borrow_mut();
        let id = e.post_recv(self.inner.ctx, s, t, Dest::Owned(Box::new(buf)))?;
        e.set_recv_elem(id, std::mem::size_of::<T>());
        drop(e);
        Ok(Request::new(self.clone(), id, true))
    }

    // ------------------------------------------------------------ checkpoints

    /// A safe point for checkpoint waves (issue 12, `docs/checkpoints.md`): when a wave is
    /// under way, this rank's checkpoint is taken here — `state` (any serde value) plus the
    /// runtime's: unmatched messages, the communicator table and the nonblocking requests in
    /// flight. Blocking mode waits here until every peer has reached its own safe point of the
    /// wave. Without `MUTIRAO_CKPT_INTERVAL` (or outside a wave) it returns at once. Call it
    /// where no message crosses, e.g. at the end of an iteration. Receives may be pending
    /// (they are re-posted on a restore, see [`Comm::restored_requests`]) and sends finished
    /// or not: a large one its receiver has not matched is held in the checkpoint and sent
    /// again, once, on a restore. A failed request is [`Error::Invalid`].
    pub fn checkpoint_point<T: Serialize>(&self, state: &T) -> Result<(), Error> {
        use crate::ckpt::{Effects, RankCheckpoint, SafePoint};
        let mut e = self.inner.eng.borrow_mut();
        if e.ckpt.is_none() {
            return Ok(());
        }
        e.check_requests()?;
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
        // A large message arriving into a pending receive finishes first (its sender finishes
        // it before its own cut, so this needs only progress): it is then in the snapshot.
        e.wait_until(|e| {
            e.ckpt.as_ref().is_none_or(|c| {
                (c.wave.ready_to_snapshot() && !e.receiving(epoch))
                    || c.wave.active_epoch() != Some(epoch)
            }) || e.source_gone(None, 0).is_some()
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
        let rt = e.snapshot_runtime(epoch)?;
        let comms = e.comms.snapshot(|ctx| {
            e.comm_handles
                .get(&ctx)
                .is_some_and(|hs| hs.iter().any(|w| w.strong_count() > 0))
        });
        let app = bincode::serialize(state)
            .map_err(|err| Error::Codec(format!("checkpoint state: {err}")))?;
        let spawns = e.saved_spawns(epoch);
        let (rank, size) = (e.rank as u32, e.size as u32);
        let Some(c) = e.ckpt.as_mut() else {
            return Ok(());
        };
        c.pending = Some(RankCheckpoint {
            epoch,
            rank,
            size,
            comms,
            requests: rt.requests,
            unexpected: rt.unexpected,
            late: Vec::new(),
            app,
            spawns,
            resent: rt.resent,
        });
        c.tentative = rt.tentative;
        // Held sends the program already waited for are in this snapshot (older ones are
        // of waves that ended).
        c.gone_held.clear();
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

    /// On a restart, the communicators derived with [`Comm::split`]/[`Comm::dup`] that the
    /// program held at the restored checkpoint, in the order they were made (on every rank of
    /// the job; a rank a split left out has none of that one). They have their saved context
    /// ids, so restored messages addressed to them are received there. Communicators derived
    /// afterwards get new contexts. Empty on a fresh start, or when the checkpoint was written
    /// by a runtime that did not save communicators (layout version 1). The program may instead
    /// make its communicators again in the same order with the same arguments (on every rank:
    /// `split`/`dup` are collective, this call is local): each one then gets its saved context,
    /// and one that disagrees with the checkpoint is an error naming it.
    /// Calling this after some were made again hands those out again (the same contexts).
    pub fn restored_comms(&self) -> Vec<Comm> {
        let eng = self.inner.eng.clone();
        let (saved, me) = {
            let mut e = eng.borrow_mut();
            if e.ckpt.as_ref().is_none_or(|c| c.recovery.is_none()) {
                return Vec::new();
            }
            (e.comms.claim_all(), e.rank)
        };
        saved
            .into_iter()
            .filter_map(|s| {
                let ctx = s.ctx?;
                let group = s.group.iter().map(|w| *w as usize).collect();
                Some(Comm::make(eng.clone(), ctx, group, me))
            })
            .collect()
    }

    /// The restored communicator the program named `name` ([`Comm::set_name`]), as
    /// [`Comm::restored_comms`] gives it (which this calls).
    pub fn restored_comm(&self, name: &str) -> Option<Comm> {
        self.restored_comms()
            .into_iter()
            .find(|c| c.name().as_deref() == Some(name))
    }

    /// Name this communicator (local to the rank, like `MPI_Comm_set_name`). The name is kept
    /// in checkpoints, for [`Comm::restored_comm`] and for error messages. Only communicators
    /// made with `split`/`dup` from the world (or from those) can be named.
    pub fn set_name(&self, name: &str) -> Result<(), Error> {
        if self
            .inner
            .eng
            .borrow_mut()
            .comms
            .set_name(self.inner.ctx, name)
        {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "cannot name this communicator {name:?}: only communicators derived with \
                 split/dup from the world are in the communicator table"
            )))
        }
    }

    /// The name given with [`Comm::set_name`] (restored with the communicator).
    pub fn name(&self) -> Option<String> {
        let e = self.inner.eng.borrow();
        e.comms.entry(self.inner.ctx).and_then(|s| s.name.clone())
    }

    /// On a restart, the nonblocking requests the program had in flight at the restored
    /// checkpoint, in the order it made them (once; empty on a fresh start or after the first
    /// call). A receive that was pending has been posted again before any message came, and a
    /// message that arrives for it completes it; a receive that had completed, or a send whose
    /// message was before the cut (not sent again), is complete; a large send its receiver
    /// had not matched before its cut was held and has been sent again, once: it completes
    /// as a send does. Turn each into a
    /// [`Request`] of its element type with [`RestoredRequest::into_request`]. Dropping a
    /// restored request untaken is dropping a [`Request`] (a posted receive is withdrawn);
    /// requests never asked for stay as they were (a posted receive may take a message).
    pub fn restored_requests(&self) -> Vec<RestoredRequest> {
        let eng = self.inner.eng.clone();
        let (reqs, me) = {
            let mut e = eng.borrow_mut();
            let reqs = e
                .ckpt
                .as_mut()
                .and_then(|c| c.restored_reqs.take())
                .unwrap_or_default();
            let me = e.rank;
            let size = e.size;
            let reqs: Vec<_> = reqs
                .into_iter()
                .map(|q| {
                    let group: Vec<usize> = if q.ctx == 0 {
                        (0..size).collect()
                    } else {
                        e.comms
                            .entry(q.ctx)
                            .map(|s| s.group.iter().map(|w| *w as usize).collect())
                            .unwrap_or_default()
                    };
                    (q, group)
                })
                .collect();
            (reqs, me)
        };
        reqs.into_iter()
            .map(|(q, group)| RestoredRequest {
                comm: Comm::make(eng.clone(), q.ctx, group, me),
                q,
                taken: false,
            })
            .collect()
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
    /// peer. Ranks that failed earlier do not count in the barrier: among survivors
    /// (`--continue-on-failure`) finalize succeeds. Dropping the last handle of the world
    /// communicator says goodbye without the barrier, ignoring errors.
    pub fn finalize(self) -> Result<(), Error> {
        self.inner.eng.borrow_mut().ckpt_leave();
        let res = self.survivors_barrier();
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

/// A nonblocking request re-created from a checkpoint ([`Comm::restored_requests`]), waiting
/// for the program to name its element type.
pub struct RestoredRequest {
    comm: Comm,
    q: crate::engine::RestoredReq,
    taken: bool,
}

impl std::fmt::Debug for RestoredRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoredRequest")
            .field("is_recv", &self.q.is_recv)
            .field("peer", &self.peer())
            .field("tag", &self.q.tag)
            .field("elem", &self.q.elem)
            .finish()
    }
}

impl RestoredRequest {
    /// The communicator it was made on (its handle; the same context).
    pub fn comm(&self) -> &Comm {
        &self.comm
    }

    /// A receive (else a send).
    pub fn is_recv(&self) -> bool {
        self.q.is_recv
    }

    /// The receive's source or the send's destination, as a rank of [`RestoredRequest::comm`]
    /// (`None`: a receive from any source).
    pub fn peer(&self) -> Option<usize> {
        self.q.peer.map(|w| {
            self.comm
                .inner
                .index
                .get(&(w as usize))
                .copied()
                .unwrap_or(w as usize)
        })
    }

    /// Its tag (`None`: a receive of any tag).
    pub fn tag(&self) -> Option<i32> {
        self.q.tag
    }

    /// The request with element type `T`, which must have the size of the original's (else
    /// [`Error::Invalid`], and the request stays as it was).
    pub fn into_request<T: Pod>(mut self) -> Result<Request<T>, Error> {
        let elem = std::mem::size_of::<T>();
        if elem != self.q.elem as usize {
            return Err(Error::Invalid(format!(
                "restored {} (peer {:?}, tag {:?}) had {}-byte elements; asked as {} ({elem} bytes)",
                if self.q.is_recv { "receive" } else { "send" },
                self.peer(),
                self.q.tag,
                self.q.elem,
                std::any::type_name::<T>()
            )));
        }
        self.comm
            .inner
            .eng
            .borrow_mut()
            .retype::<T>(self.q.id, self.q.is_recv)?;
        self.taken = true;
        Ok(Request::new(self.comm.clone(), self.q.id, self.q.is_recv))
    }
}

impl Drop for RestoredRequest {
    fn drop(&mut self) {
        // Not taken: as a dropped request, it finishes in the background.
        if !self.taken {
            if let Ok(mut e) = self.comm.inner.eng.try_borrow_mut() {
                e.detach(self.q.id);
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
