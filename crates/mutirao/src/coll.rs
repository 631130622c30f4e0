//! Collective operations, with the algorithms MPICH uses:
//!
//! | operation | algorithm |
//! |---|---|
//! | barrier | dissemination (⌈log₂ n⌉ rounds) |
//! | bcast | binomial tree; scatter + ring allgather (van de Geijn) from 512 KiB on ≥ 8 ranks when they span hosts (as MPICH) |
//! | reduce | binomial tree (rank order kept for non-commutative operators) |
//! | allreduce | recursive doubling with folding for non-powers of two; for commutative operators from 64 KiB, recursive halving + doubling (Rabenseifner, folding as well; not on 3 ranks) up to 1 MiB on shared memory or while half the vector is eager over TCP, ring reduce-scatter + allgather above |
//! | gather / scatter | binomial tree |
//! | gatherv / scatterv | direct (as MPICH), one message per rank |
//! | allgather | recursive doubling for powers of two below 64 KiB, ring otherwise |
//! | alltoall | all blocks at once up to 32 KiB per block, pairwise exchange above; with ranks outnumbering the cores of one host, all at once by single copy above |
//!
//! Collective traffic travels in a context of its own, so it never matches user receives. Ring
//! phases post all their receives before the first send ([`Comm::raw_ring`]), so no block
//! arrives unexpected and is copied twice.

use crate::comm::Comm;
use crate::op::Op;
use crate::Error;
use bytemuck::Pod;
use std::ops::Range;

const T_BARRIER: i32 = 1;
const T_BCAST: i32 = 2;
const T_REDUCE: i32 = 3;
const T_ALLREDUCE: i32 = 4;
const T_GATHER: i32 = 5;
const T_SCATTER: i32 = 6;
const T_ALLGATHER: i32 = 7;
const T_ALLTOALL: i32 = 8;

/// Messages at or above this size use the bandwidth-optimal algorithms.
pub const LARGE_BCAST: usize = 512 * 1024;
/// Bcast uses scatter + allgather only from this many ranks on (MPICH's
/// `MPIR_CVAR_BCAST_MIN_PROCS`): below it the binomial tree's ⌈log₂ n⌉ whole-message steps
/// beat the scatter's and the allgather's n − 1 + ⌈log₂ n⌉ dependent ones. And only when some
/// ranks are on other hosts: on one host every copy shares one memory bus, and scatter +
/// allgather copies about (n − 1 + ½·log₂ n)/n·len per rank, more than the tree's len per
/// receiver. 8 ranks on the 2-core VM, interleaved, 3 rounds: 1 MiB 796–876 µs against 545–639
/// by the tree, 4 MiB 2562–3006 against 2058–2272 (loopback TCP 1 MiB 2352–2383 against
/// 1078–1417; Open MPI on shared memory 518–583).
pub const BCAST_MIN_PROCS: usize = 8;
/// Alltoall blocks up to this size go all at once (MPICH's `ALLTOALL_MEDIUM_MSG`); larger
/// ones pairwise, one exchange at a time — except when ranks outnumber the cores of their one
/// host: then larger blocks go all at once too, each by a single cross-memory copy. Two copies
/// through a ring need two cores' time, and pairwise steps wait for their partner to be
/// scheduled. Interleaved `collbench`, 3 rounds, 2 cores (µs): 3 ranks 60 000 B 30–31 → 23.5–23.8
/// (Open MPI 22.7–23.2); 4 ranks 40 000 B 38–50 → 27–29 (Open MPI 27–28), 1 MiB 953–976 →
/// 837–1052 (Open MPI 822–987).
pub const ALLTOALL_MEDIUM: usize = 32 * 1024;
/// Allreduce/allgather switch to ring algorithms at this size.
pub const LARGE_REDUCE: usize = 64 * 1024;

/// Split `buf` into a shared range and a disjoint mutable range.
fn split2(buf: &mut [u8], a: Range<usize>, b: Range<usize>) -> (&[u8], &mut [u8]) {
    debug_assert!(a.end <= b.start || b.end <= a.start || a.is_empty() || b.is_empty());
    if a.is_empty() {
        return (&[], &mut buf[b]);
    }
    if b.is_empty() {
        return (&buf[a], &mut []);
    }
    if a.end <= b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.end - b.start])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.end - a.start], &mut lo[b])
    }
}

thread_local! {
    /// The receive block of [`Comm::allreduce`]'s ring, kept between calls: a fresh buffer of
    /// a megabyte is a fresh mapping, and receiving into it paid a page fault per 4 KiB on every
    /// call. 16-byte units, so that any element type of alignment up to 16 fits.
    static SCRATCH: std::cell::RefCell<Vec<u128>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Scratch buffers above this size are given back after the call instead of kept.
const SCRATCH_KEEP: usize = 64 << 20;

/// A large allreduce below this size uses recursive halving and doubling
/// ([`Comm::allreduce_halving`]: 2·⌊log₂ n⌋ steps, two more when n is not a power of two) when
/// every rank is reached through shared memory; from it on, the ring (2(n − 1) steps that each
/// move less). Interleaved `collbench`, 3 rounds on the 2-core VM (µs): 4 ranks 64 KiB 62–65 →
/// 36–45, 256 KiB 195–262 → 122–186, 1 MiB the same, 4 MiB 2517–2758 → 2860–4148; 8 ranks
/// 64 KiB 198–278 → 93–120; 2 ranks 4 MiB 1130 → 1280. Without a power of two (folding):
/// 6 ranks 64 KiB 107–158 → 71–89, 100 000 B 154–163 → 116–121, 256 KiB 329–412 → 278–327;
/// 5 ranks 100 000 B 119–125 → 84–94; 7 ranks 256 KiB 554–559 → 378–415; 1 MiB the same.
/// Over TCP the cut is lower (see [`Comm::agreed`]).
const HALVING_BELOW: usize = 1 << 20;

/// A collective step whose messages are all at most this size (and eager) sends each at once
/// and then receives each in turn ([`Comm::step`]); larger ones post every receive first, so the
/// data lands in place. 64 KiB rather than 16: interleaved `collbench`, 3 ranks on 2 cores,
/// alltoall 20 000 B per pair 15.4 → 10.7 µs, 60 000 B 46 → 30 µs; 4 ranks, allreduce 32 KiB
/// 35 → 26 µs; over TCP the same (2026-11-27).
const SMALL_STEP: usize = 64 * 1024;

/// What every rank of a communicator agreed on, to choose the same collective algorithms.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Agreed {
    /// Every rank runs on one host, where the copies of a collective share one memory bus
    /// (whatever the transport: shared memory, or TCP when asked for).
    pub one_host: bool,
    /// A large allreduce below this size takes recursive halving (see [`HALVING_BELOW`]).
    pub halving_below: usize,
}

fn check_step_len(source: usize, got: usize, want: usize) -> Result<(), Error> {
    if got != want {
        return Err(Error::Invalid(format!(
            "collective mismatch: rank {source} sent {got} bytes where {want} were expected (do all ranks pass the same count and root?)"
        )));
    }
    Ok(())
}

/// Run `f` on a scratch slice of `len` elements of `T` (contents unspecified), reusing the
/// thread's buffer when it is free and `T`'s alignment allows.
fn with_scratch<T: Pod, R>(
    len: usize,
    f: impl FnOnce(&mut [T]) -> Result<R, Error>,
) -> Result<R, Error> {
    let bytes = len * std::mem::size_of::<T>();
    let reuse = std::mem::align_of::<T>() <= std::mem::align_of::<u128>();
    let taken = if reuse {
        SCRATCH.with(|s| s.try_borrow_mut().ok().map(|mut v| std::mem::take(&mut *v)))
    } else {
        None
    };
    let Some(mut buf) = taken else {
        let mut own = vec![T::zeroed(); len];
        return f(&mut own);
    };
    let units = bytes.div_ceil(std::mem::size_of::<u128>());
    if buf.len() < units {
        buf.resize(units, 0);
    }
    let as_bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf[..units]);
    let res = f(bytemuck::cast_slice_mut(&mut as_bytes[..bytes]));
    if buf.len() * std::mem::size_of::<u128>() <= SCRATCH_KEEP {
        SCRATCH.with(|s| {
            if let Ok(mut v) = s.try_borrow_mut() {
                if v.len() < buf.len() {
                    *v = buf;
                }
            }
        });
    }
    res
}

impl Comm {
    fn cctx(&self) -> u64 {
        self.inner.ctx + 1
    }

    /// One collective step: sends to and receives from communicator ranks.
    fn step(
        &self,
        tag: i32,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
    ) -> Result<(), Error> {
        if self.small_step(sends, recvs)? {
            // Every message small and eager: send each (complete at once, written or queued),
            // then receive each with the blocking receive, whose fast path takes a message
            // straight from a shared-memory ring. No request, no allocation: with 4 ranks on 2
            // cores a step's CPU time is its latency (see docs/runtime.md, "small steps").
            for (d, b) in sends {
                self.raw_send(self.cctx(), b, *d, tag)?;
            }
            for (src, buf) in recvs.iter_mut() {
                let want = buf.len();
                let got = self.raw_recv(self.cctx(), buf, Some(self.peer(*src)?), Some(tag))?;
                check_step_len(got.source, got.bytes, want)?;
            }
            return Ok(());
        }
        self.exchange(tag, sends, recvs, usize::MAX)
    }

    /// A step with every receive posted before the sends; sends above `eager_cap` bytes go by
    /// rendezvous whatever the eager limit.
    fn exchange(
        &self,
        tag: i32,
        sends: &[(usize, &[u8])],
        recvs: &mut [(usize, &mut [u8])],
        eager_cap: usize,
    ) -> Result<(), Error> {
        let s: Vec<(usize, i32, &[u8])> = sends.iter().map(|(d, b)| (*d, tag, *b)).collect();
        let mut r: Vec<(Option<usize>, Option<i32>, &mut [u8])> = Vec::with_capacity(recvs.len());
        for (src, buf) in recvs.iter_mut() {
            r.push((Some(self.peer(*src)?), Some(tag), &mut **buf));
        }
        let st = self.raw_exchange_capped(self.cctx(), &s, &mut r, eager_cap)?;
        for (got, (_, _, buf)) in st.iter().zip(r.iter()) {
            check_step_len(got.source, got.bytes, buf.len())?;
        }
        Ok(())
    }

    /// Whether every message of a step is at most [`SMALL_STEP`] bytes and eager with its
    /// peer, so its sends complete without the receivers and the step needs no requests.
    fn small_step(
        &self,
        sends: &[(usize, &[u8])],
        recvs: &[(usize, &mut [u8])],
    ) -> Result<bool, Error> {
        let eng = self.inner.eng.borrow();
        for (r, len) in sends
            .iter()
            .map(|(d, b)| (*d, b.len()))
            .chain(recvs.iter().map(|(s, b)| (*s, b.len())))
        {
            if len > SMALL_STEP || !eng.eager_with(self.peer(r)?, len) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn check_root(&self, root: usize) -> Result<(), Error> {
        if root >= self.size() {
            return Err(Error::Invalid(format!(
                "root {root} is not a rank of this communicator of {} ranks",
                self.size()
            )));
        }
        Ok(())
    }

    /// The barrier of `finalize`: [`Comm::barrier`]'s messages (so it meets a barrier the
    /// other ranks call, as it always has), but a peer that failed or finalized counts as
    /// arrived (ULFM's rule: a survivor's finalize is not an error because a peer died
    /// before). Without failures it is exactly the barrier; with them every survivor still gets
    /// through, though one whose news of another came only through the dead rank may leave
    /// before that other arrives.
    pub(crate) fn survivors_barrier(&self) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        let gone = |e: &Error| matches!(e, Error::PeerFailed { .. } | Error::PeerFinalized(_));
        let mut k = 1;
        while k < n {
            match self.raw_send(self.cctx(), &[], (r + k) % n, T_BARRIER) {
                Err(e) if !gone(&e) => return Err(e),
                _ => {}
            }
            let from = Some(self.peer((r + n - k) % n)?);
            match self.raw_recv(self.cctx(), &mut [], from, Some(T_BARRIER)) {
                Err(e) if !gone(&e) => return Err(e),
                _ => {}
            }
            k *= 2;
        }
        Ok(())
    }

    /// Block until every rank of the communicator has entered the barrier.
    pub fn barrier(&self) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        let mut k = 1;
        while k < n {
            self.step(
                T_BARRIER,
                &[((r + k) % n, &[])],
                &mut [((r + n - k) % n, &mut [])],
            )?;
            k *= 2;
        }
        Ok(())
    }

    /// Broadcast `buf` from `root` to every rank (every rank passes a buffer of the same length).
    pub fn bcast<T: Pod>(&self, buf: &mut [T], root: usize) -> Result<(), Error> {
        self.check_root(root)?;
        let n = self.size();
        if n == 1 {
            return Ok(());
        }
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        if bytes.len() >= LARGE_BCAST && n >= BCAST_MIN_PROCS && !self.agreed()?.one_host {
            self.bcast_scatter_allgather(bytes, root)
        } else {
            self.bcast_binomial(bytes, root)
        }
    }

    fn bcast_binomial(&self, bytes: &mut [u8], root: usize) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        let vr = (r + n - root) % n;
        let real = |v: usize| (v + root) % n;
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                self.step(T_BCAST, &[], &mut [(real(vr - mask), &mut *bytes)])?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        let mut sends = Vec::new();
        while mask > 0 {
            if vr + mask < n {
                sends.push((real(vr + mask), &*bytes));
            }
            mask >>= 1;
        }
        self.step(T_BCAST, &sends, &mut [])
    }

    fn bcast_scatter_allgather(&self, bytes: &mut [u8], root: usize) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        let len = bytes.len();
        let cs = len.div_ceil(n);
        let chunks = |a: usize, b: usize| (a * cs).min(len)..(b * cs).min(len);
        let vr = (r + n - root) % n;
        let real = |v: usize| (v + root) % n;
        // Binomial scatter: vr receives chunks [vr, vr + lowbit(vr)) from its parent.
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                let range = chunks(vr, (vr + mask).min(n));
                self.step(T_BCAST, &[], &mut [(real(vr - mask), &mut bytes[range])])?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if vr + mask < n {
                let range = chunks(vr + mask, (vr + 2 * mask).min(n));
                self.step(T_BCAST, &[(real(vr + mask), &bytes[range])], &mut [])?;
            }
            mask >>= 1;
        }
        // Ring allgather of the chunks, in vr space: step s sends chunk vr−s and receives
        // chunk vr−s−1, every receive posted first (see `Comm::raw_ring`).
        let base = bytes.as_mut_ptr();
        let recvs: Vec<(*mut u8, usize)> = (0..n - 1)
            .map(|s| {
                let c = chunks((vr + 2 * n - s - 1) % n, (vr + 2 * n - s - 1) % n + 1);
                (base.wrapping_add(c.start), c.len())
            })
            .collect();
        self.raw_ring(
            self.cctx(),
            T_BCAST,
            (real((vr + n - 1) % n), real((vr + 1) % n)),
            &recvs,
            |s| {
                let c = chunks((vr + n - s) % n, (vr + n - s) % n + 1);
                (base.wrapping_add(c.start).cast_const(), c.len())
            },
            |_| Ok(()),
        )
    }

    /// Combine every rank's `send` with `op`; the result lands in `recv` on `root` (ignored
    /// elsewhere).
    pub fn reduce<T: Pod, O: Op<T>>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: &O,
        root: usize,
    ) -> Result<(), Error> {
        self.check_root(root)?;
        let (n, r) = (self.size(), self.rank());
        if r == root && recv.len() != send.len() {
            return Err(Error::Invalid(format!(
                "reduce: receive buffer has {} elements, send buffer {}",
                recv.len(),
                send.len()
            )));
        }
        // Non-commutative operators: reduce at rank 0 in rank order, then move to the root.
        let tree_root = if op.commutative() { root } else { 0 };
        let vr = (r + n - tree_root) % n;
        let real = |v: usize| (v + tree_root) % n;
        let mut acc = send.to_vec();
        let mut tmp = send.to_vec();
        let mut mask = 1;
        while mask < n {
            if vr & mask == 0 {
                let child = vr | mask;
                if child < n {
                    self.step(
                        T_REDUCE,
                        &[],
                        &mut [(real(child), bytemuck::cast_slice_mut(&mut tmp))],
                    )?;
                    // acc holds lower ranks than tmp.
                    op.combine(&acc, &mut tmp);
                    std::mem::swap(&mut acc, &mut tmp);
                }
            } else {
                self.step(
                    T_REDUCE,
                    &[(real(vr & !mask), bytemuck::cast_slice(&acc))],
                    &mut [],
                )?;
                break;
            }
            mask <<= 1;
        }
        if tree_root != root {
            if r == tree_root {
                self.step(T_REDUCE, &[(root, bytemuck::cast_slice(&acc))], &mut [])?;
            } else if r == root {
                self.step(
                    T_REDUCE,
                    &[],
                    &mut [(tree_root, bytemuck::cast_slice_mut(recv))],
                )?;
                return Ok(());
            }
        }
        if r == root {
            recv.copy_from_slice(&acc);
        }
        Ok(())
    }

    /// Combine every rank's `send` with `op`; every rank gets the result in `recv`.
    pub fn allreduce<T: Pod, O: Op<T>>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: &O,
    ) -> Result<(), Error> {
        if recv.len() != send.len() {
            return Err(Error::Invalid(format!(
                "allreduce: receive buffer has {} elements, send buffer {}",
                recv.len(),
                send.len()
            )));
        }
        recv.copy_from_slice(send);
        let n = self.size();
        if n == 1 {
            return Ok(());
        }
        if std::mem::size_of_val(send) >= LARGE_REDUCE && op.commutative() && send.len() >= n {
            // Three ranks fold to two, whose halving is one exchange: the ring's four steps
            // measured the same or better (256 KiB 122–126 against 139–146 µs).
            if (n.is_power_of_two() || n >= 5)
                && std::mem::size_of_val(send) < self.agreed()?.halving_below
            {
                return self.allreduce_halving(recv, op);
            }
            self.allreduce_ring(recv, op)
        } else {
            self.allreduce_rd(recv, op)
        }
    }

    /// What the ranks agree on to choose algorithms, asked for once per communicator (an
    /// allreduce of two words, on the first collective that needs it). Every rank must choose
    /// the same algorithm, and each one's view could differ: a rank whose shared-memory ring to
    /// one peer failed, or whose `MUTIRAO_EAGER_LIMIT` differs, would otherwise pick another.
    fn agreed(&self) -> Result<Agreed, Error> {
        if let Some(a) = self.inner.agreed.get() {
            return Ok(a);
        }
        let (tcp, one_host) = {
            let eng = self.inner.eng.borrow();
            (
                eng.tcp_eager_limit_among(&self.inner.group),
                eng.all_on_this_host(&self.inner.group),
            )
        };
        // Over TCP, halving only while its first step (half the vector) is eager: a
        // rendezvous exchange waits a round trip for its handshake, while the ring's blocks
        // (1/n of the vector) still go eagerly. 6 ranks over loopback TCP, 256 KiB 402–517 µs
        // by the ring against 585–772 by halving, 8 ranks 608–972 against 1020–1221
        // (interleaved, 4 rounds); at 128 KiB halving won or tied (4 ranks 121–156 against
        // 156–223).
        let cut = match tcp {
            None => HALVING_BELOW,
            Some(eager) => HALVING_BELOW.min(eager.saturating_mul(2).saturating_add(1)),
        };
        let mut words = [u64::from(one_host), cut as u64];
        self.allreduce_rd(&mut words, &crate::op::Min)?;
        let a = Agreed {
            one_host: words[0] == 1,
            halving_below: usize::try_from(words[1]).unwrap_or(HALVING_BELOW),
        };
        self.inner.agreed.set(Some(a));
        Ok(a)
    }

    fn allreduce_rd<T: Pod, O: Op<T>>(&self, acc: &mut [T], op: &O) -> Result<(), Error> {
        with_scratch::<T, _>(acc.len(), |tmp| self.allreduce_rd_in(acc, tmp, op))
    }

    /// [`Comm::allreduce_rd`] with `tmp` (as long as `acc`) for the partners' halves.
    fn allreduce_rd_in<T: Pod, O: Op<T>>(
        &self,
        acc: &mut [T],
        tmp: &mut [T],
        op: &O,
    ) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        let pof2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let rem = n - pof2;
        let newrank = if r < 2 * rem {
            if r % 2 == 0 {
                self.step(T_ALLREDUCE, &[(r + 1, bytemuck::cast_slice(acc))], &mut [])?;
                None
            } else {
                self.step(
                    T_ALLREDUCE,
                    &[],
                    &mut [(r - 1, bytemuck::cast_slice_mut(tmp))],
                )?;
                op.combine(tmp, acc);
                Some(r / 2)
            }
        } else {
            Some(r - rem)
        };
        if let Some(nr) = newrank {
            let mut mask = 1;
            while mask < pof2 {
                let pn = nr ^ mask;
                let partner = if pn < rem { pn * 2 + 1 } else { pn + rem };
                self.step(
                    T_ALLREDUCE,
                    &[(partner, bytemuck::cast_slice(acc))],
                    &mut [(partner, bytemuck::cast_slice_mut(tmp))],
                )?;
                if partner < r {
                    op.combine(tmp, acc);
                } else {
                    op.combine(acc, tmp);
                    acc.copy_from_slice(tmp);
                }
                mask <<= 1;
            }
        }
        if r < 2 * rem {
            if r % 2 == 1 {
                self.step(T_ALLREDUCE, &[(r - 1, bytemuck::cast_slice(acc))], &mut [])?;
            } else {
                self.step(
                    T_ALLREDUCE,
                    &[],
                    &mut [(r + 1, bytemuck::cast_slice_mut(acc))],
                )?;
            }
        }
        Ok(())
    }

    /// Recursive halving (reduce-scatter) then recursive doubling (allgather), for a
    /// commutative op (Rabenseifner's algorithm, as MPICH): 2·log₂ p dependent steps, p the
    /// largest power of two ≤ n, instead of the ring's 2(n − 1), moving the same bytes. With
    /// n − p = e > 0 extra ranks, the first 2e ranks fold in pairs first (the even one hands its
    /// vector to the odd one and sits out) and get the result back at the end: two more
    /// whole-vector steps. Each element's result is computed by one rank and copied to the
    /// others, so every rank gets the same bits.
    fn allreduce_halving<T: Pod, O: Op<T>>(&self, acc: &mut [T], op: &O) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        let count = acc.len();
        let pof2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let rem = n - pof2;
        let scratch = if rem > 0 { count } else { count.div_ceil(2) };
        with_scratch::<T, _>(scratch, |tmp| {
            if r < 2 * rem && r % 2 == 0 {
                self.step(T_ALLREDUCE, &[(r + 1, bytemuck::cast_slice(acc))], &mut [])?;
                return self.step(
                    T_ALLREDUCE,
                    &[],
                    &mut [(r + 1, bytemuck::cast_slice_mut(acc))],
                );
            }
            if r < 2 * rem {
                let got = &mut tmp[..count];
                self.step(
                    T_ALLREDUCE,
                    &[],
                    &mut [(r - 1, bytemuck::cast_slice_mut(got))],
                )?;
                op.combine(got, acc);
            }
            // Rank among the p that take part, and back.
            let nr = if r < 2 * rem { r / 2 } else { r - rem };
            let real = |v: usize| if v < rem { v * 2 + 1 } else { v + rem };
            // Per level: the range split, its midpoint, and whether this rank kept the lower half.
            let mut levels: Vec<(usize, usize, usize, bool)> = Vec::new();
            let (mut lo, mut hi) = (0, count);
            let mut mask = pof2 / 2;
            while mask >= 1 {
                let partner = real(nr ^ mask);
                let mid = lo + (hi - lo) / 2;
                let lower = nr & mask == 0;
                let (keep, give) = if lower {
                    (lo..mid, mid..hi)
                } else {
                    (mid..hi, lo..mid)
                };
                let got = &mut tmp[..keep.len()];
                self.step(
                    T_ALLREDUCE,
                    &[(partner, bytemuck::cast_slice(&acc[give]))],
                    &mut [(partner, bytemuck::cast_slice_mut(got))],
                )?;
                if partner < r {
                    op.combine(got, &mut acc[keep.clone()]);
                } else {
                    op.combine(&acc[keep.clone()], got);
                    acc[keep.clone()].copy_from_slice(got);
                }
                levels.push((lo, hi, mid, lower));
                (lo, hi) = (keep.start, keep.end);
                mask /= 2;
            }
            mask = 1;
            while let Some((plo, phi, mid, lower)) = levels.pop() {
                let partner = real(nr ^ mask);
                let (low, high) = acc[plo..phi].split_at_mut(mid - plo);
                let (mine, theirs) = if lower { (low, high) } else { (high, low) };
                self.step(
                    T_ALLREDUCE,
                    &[(partner, bytemuck::cast_slice(mine))],
                    &mut [(partner, bytemuck::cast_slice_mut(theirs))],
                )?;
                mask *= 2;
            }
            if r < 2 * rem {
                self.step(T_ALLREDUCE, &[(r - 1, bytemuck::cast_slice(acc))], &mut [])?;
            }
            Ok(())
        })
    }

    /// Ring reduce-scatter then ring allgather, as one pipeline of 2(n−1) steps whose
    /// receives are all posted first ([`Comm::raw_ring`]): every block is copied once, from
    /// the ring into its place. Step s < n−1 sends block r−s and receives block r−s−1 into
    /// scratch, then adds it into `acc`; step n−1+s sends block r+1−s and receives block r−s
    /// straight into `acc`.
    fn allreduce_ring<T: Pod, O: Op<T>>(&self, acc: &mut [T], op: &O) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        let count = acc.len();
        let bs = count.div_ceil(n);
        let block = |i: usize| (i * bs).min(count)..((i + 1) * bs).min(count);
        let elem = std::mem::size_of::<T>();
        let steps = n - 1;
        let rs_recv = |s: usize| block((r + 2 * n - s - 1) % n);
        let sent = |i: usize| {
            if i < steps {
                block((r + n - i) % n)
            } else {
                block((r + 1 + n - (i - steps)) % n)
            }
        };
        with_scratch::<T, _>(steps * bs, |tmp| {
            // Every access below goes through these two pointers: the engine holds the posted
            // receive blocks while this rank reads and adds into other blocks.
            let acc_p = acc.as_mut_ptr();
            let tmp_p = tmp.as_mut_ptr();
            let mut recvs = Vec::with_capacity(2 * steps);
            for s in 0..steps {
                recvs.push((
                    tmp_p.wrapping_add(s * bs).cast::<u8>(),
                    rs_recv(s).len() * elem,
                ));
            }
            for s in 0..steps {
                let b = block((r + n - s) % n);
                recvs.push((acc_p.wrapping_add(b.start).cast::<u8>(), b.len() * elem));
            }
            self.raw_ring(
                self.cctx(),
                T_ALLREDUCE,
                ((r + n - 1) % n, (r + 1) % n),
                &recvs,
                |i| {
                    let b = sent(i);
                    (
                        acc_p.wrapping_add(b.start).cast::<u8>().cast_const(),
                        b.len() * elem,
                    )
                },
                |i| {
                    if i < steps {
                        let b = rs_recv(i);
                        // SAFETY: scratch block i (received, no longer the engine's) and
                        // block b of `acc` are disjoint and in bounds. The engine holds an
                        // allgather receive on b too, but its data is the sum of every
                        // rank's b, which needs this rank's b after this addition: it cannot
                        // arrive before step i + 1 has sent b.
                        let (got, into) = unsafe {
                            (
                                std::slice::from_raw_parts(tmp_p.add(i * bs), b.len()),
                                std::slice::from_raw_parts_mut(acc_p.add(b.start), b.len()),
                            )
                        };
                        op.combine(got, into);
                    }
                    Ok(())
                },
            )
        })
    }

    /// Gather equal-size blocks at `root`: `recv` (root only) gets rank i's `send` at
    /// `[i·len, (i+1)·len)`.
    pub fn gather<T: Pod>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<(), Error> {
        self.check_root(root)?;
        let (n, r) = (self.size(), self.rank());
        let len = std::mem::size_of_val(send);
        if r == root && std::mem::size_of_val(recv) != n * len {
            return Err(Error::Invalid(format!(
                "gather: root's receive buffer must hold {n} × {} elements",
                send.len()
            )));
        }
        let vr = (r + n - root) % n;
        let real = |v: usize| (v + root) % n;
        let span = if vr == 0 {
            n
        } else {
            (vr & vr.wrapping_neg()).min(n - vr)
        };
        let mut tmp = vec![0u8; span * len];
        tmp[..len].copy_from_slice(bytemuck::cast_slice(send));
        let mut have = 1;
        let mut mask = 1;
        while mask < n {
            if vr & mask == 0 {
                let child = vr + mask;
                if child < n {
                    let cnt = mask.min(n - child);
                    self.step(
                        T_GATHER,
                        &[],
                        &mut [(real(child), &mut tmp[mask * len..(mask + cnt) * len])],
                    )?;
                    have = mask + cnt;
                }
            } else {
                self.step(T_GATHER, &[(real(vr - mask), &tmp[..have * len])], &mut [])?;
                break;
            }
            mask <<= 1;
        }
        if r == root {
            let out: &mut [u8] = bytemuck::cast_slice_mut(recv);
            for v in 0..n {
                let rr = real(v);
                out[rr * len..(rr + 1) * len].copy_from_slice(&tmp[v * len..(v + 1) * len]);
            }
        }
        Ok(())
    }

    /// Gather blocks of different sizes at `root`: rank i sends `counts[i]` elements, stored
    /// contiguously in rank order in `recv` (root only; `counts` is read at the root).
    pub fn gatherv<T: Pod>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        root: usize,
    ) -> Result<(), Error> {
        self.check_root(root)?;
        let (n, r) = (self.size(), self.rank());
        if r != root {
            return self.step(T_GATHER, &[(root, bytemuck::cast_slice(send))], &mut []);
        }
        if counts.len() != n
            || counts.iter().sum::<usize>() != recv.len()
            || counts[r] != send.len()
        {
            return Err(Error::Invalid(format!(
                "gatherv: counts must have {n} entries summing to the receive buffer length, and counts[root] must equal the send length"
            )));
        }
        let mut rest: &mut [T] = recv;
        let mut parts: Vec<(usize, &mut [u8])> = Vec::with_capacity(n);
        for (i, c) in counts.iter().enumerate() {
            let (head, tail) = rest.split_at_mut(*c);
            rest = tail;
            if i == r {
                head.copy_from_slice(send);
            } else {
                parts.push((i, bytemuck::cast_slice_mut(head)));
            }
        }
        self.step(T_GATHER, &[], &mut parts)
    }

    /// Scatter equal-size blocks from `root`: rank i gets `send[i·len, (i+1)·len)` in `recv`.
    pub fn scatter<T: Pod>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<(), Error> {
        self.check_root(root)?;
        let (n, r) = (self.size(), self.rank());
        let len = std::mem::size_of_val(recv);
        if r == root && std::mem::size_of_val(send) != n * len {
            return Err(Error::Invalid(format!(
                "scatter: root's send buffer must hold {n} × {} elements",
                recv.len()
            )));
        }
        let vr = (r + n - root) % n;
        let real = |v: usize| (v + root) % n;
        let span = if vr == 0 {
            n
        } else {
            (vr & vr.wrapping_neg()).min(n - vr)
        };
        let mut tmp = vec![0u8; span * len];
        if r == root {
            let src: &[u8] = bytemuck::cast_slice(send);
            for v in 0..n {
                let rr = real(v);
                tmp[v * len..(v + 1) * len].copy_from_slice(&src[rr * len..(rr + 1) * len]);
            }
        }
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                self.step(T_SCATTER, &[], &mut [(real(vr - mask), &mut tmp[..])])?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if vr + mask < n {
                let cnt = mask.min(n - vr - mask);
                self.step(
                    T_SCATTER,
                    &[(real(vr + mask), &tmp[mask * len..(mask + cnt) * len])],
                    &mut [],
                )?;
            }
            mask >>= 1;
        }
        bytemuck::cast_slice_mut::<T, u8>(recv).copy_from_slice(&tmp[..len]);
        Ok(())
    }

    /// Scatter blocks of different sizes from `root`: rank i gets `counts[i]` elements, taken
    /// contiguously in rank order from `send` (root only).
    pub fn scatterv<T: Pod>(
        &self,
        send: &[T],
        counts: &[usize],
        recv: &mut [T],
        root: usize,
    ) -> Result<(), Error> {
        self.check_root(root)?;
        let (n, r) = (self.size(), self.rank());
        if r != root {
            return self.step(
                T_SCATTER,
                &[],
                &mut [(root, bytemuck::cast_slice_mut(recv))],
            );
        }
        if counts.len() != n
            || counts.iter().sum::<usize>() != send.len()
            || counts[r] != recv.len()
        {
            return Err(Error::Invalid(format!(
                "scatterv: counts must have {n} entries summing to the send buffer length, and counts[root] must equal the receive length"
            )));
        }
        let mut sends = Vec::with_capacity(n);
        let mut off = 0;
        for (i, c) in counts.iter().enumerate() {
            let part = &send[off..off + c];
            if i == r {
                recv.copy_from_slice(part);
            } else {
                sends.push((i, bytemuck::cast_slice(part)));
            }
            off += c;
        }
        self.step(T_SCATTER, &sends, &mut [])
    }

    /// Every rank gets every rank's block: `recv[i·len, (i+1)·len)` = rank i's `send`.
    pub fn allgather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        let len = std::mem::size_of_val(send);
        if std::mem::size_of_val(recv) != n * len {
            return Err(Error::Invalid(format!(
                "allgather: receive buffer must hold {n} × {} elements",
                send.len()
            )));
        }
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(recv);
        bytes[r * len..(r + 1) * len].copy_from_slice(bytemuck::cast_slice(send));
        if n == 1 {
            return Ok(());
        }
        if n.is_power_of_two() && n * len < LARGE_REDUCE {
            let mut mask = 1;
            while mask < n {
                let partner = r ^ mask;
                let mine = (r & !(mask - 1)) * len;
                let theirs = (partner & !(mask - 1)) * len;
                let (sb, rb) = split2(bytes, mine..mine + mask * len, theirs..theirs + mask * len);
                self.step(T_ALLGATHER, &[(partner, sb)], &mut [(partner, rb)])?;
                mask <<= 1;
            }
        } else {
            let right = (r + 1) % n;
            let left = (r + n - 1) % n;
            for s in 0..n - 1 {
                let sc = (r + n - s) % n;
                let rc = (r + 2 * n - s - 1) % n;
                let (sb, rb) = split2(bytes, sc * len..(sc + 1) * len, rc * len..(rc + 1) * len);
                self.step(T_ALLGATHER, &[(right, sb)], &mut [(left, rb)])?;
            }
        }
        Ok(())
    }

    /// Personalised exchange: block j of `send` goes to rank j, landing as block `rank` of its
    /// `recv`.
    pub fn alltoall<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<(), Error> {
        let (n, r) = (self.size(), self.rank());
        if send.len() != recv.len() || send.len() % n != 0 {
            return Err(Error::Invalid(format!(
                "alltoall: send and receive buffers must have the same length, a multiple of {n}"
            )));
        }
        let len = std::mem::size_of_val(send) / n;
        let sb: &[u8] = bytemuck::cast_slice(send);
        let rb: &mut [u8] = bytemuck::cast_slice_mut(recv);
        rb[r * len..(r + 1) * len].copy_from_slice(&sb[r * len..(r + 1) * len]);
        // Ranks outnumbering the cores of one host: large blocks all at once, each by a single
        // cross-memory copy (see [`ALLTOALL_MEDIUM`]).
        let single_copy = len > ALLTOALL_MEDIUM && {
            let eng = self.inner.eng.borrow();
            eng.prefers_single_copy() && eng.tcp_eager_limit_among(&self.inner.group).is_none()
        };
        if len > 0 && (len <= ALLTOALL_MEDIUM || single_copy) {
            // Every block at once, in pairwise order: one wait instead of n − 1 dependent ones.
            let mut blocks: Vec<Option<&mut [u8]>> = rb.chunks_mut(len).map(Some).collect();
            let mut recvs = Vec::with_capacity(n - 1);
            let mut sends = Vec::with_capacity(n - 1);
            for k in 1..n {
                let (to, from) = ((r + k) % n, (r + n - k) % n);
                sends.push((to, &sb[to * len..(to + 1) * len]));
                if let Some(b) = blocks[from].take() {
                    recvs.push((from, b));
                }
            }
            if !single_copy {
                return self.step(T_ALLTOALL, &sends, &mut recvs);
            }
            return self.exchange(T_ALLTOALL, &sends, &mut recvs, ALLTOALL_MEDIUM);
        }
        for k in 1..n {
            let to = (r + k) % n;
            let from = (r + n - k) % n;
            self.step(
                T_ALLTOALL,
                &[(to, &sb[to * len..(to + 1) * len])],
                &mut [(from, &mut rb[from * len..(from + 1) * len])],
            )?;
        }
        Ok(())
    }

    /// The context of this communicator's `seq`-th derived one with `color`.
    fn child_ctx(parent: u64, seq: u64, color: u64) -> u64 {
        // splitmix64 of (parent, seq, color): distinct communicators get distinct contexts with
        // overwhelming probability; even, and never the world's 0.
        let mut z = parent
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(seq.wrapping_mul(0xBF58_476D_1CE4_E5B9))
            .wrapping_add(color.wrapping_mul(0x94D0_49BB_1331_11EB));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z & !1).max(2)
    }

    /// Record the derivation in the communicator table (which, after a restore, checks it
    /// against the saved one and gives back its context) and make the communicator.
    /// Derivations are collective, in the same order on every member, so the counts agree.
    fn derive(
        &self,
        how: crate::ckpt::Derivation,
        group: Option<Vec<usize>>,
    ) -> Result<Option<Comm>, Error> {
        let parent = self.inner.ctx;
        let color = match &how {
            crate::ckpt::Derivation::Split { color, .. } => color.map_or(u64::MAX - 1, u64::from),
            crate::ckpt::Derivation::Dup => u64::MAX,
        };
        let d = {
            let mut e = self.inner.eng.borrow_mut();
            // A spawn communicator (and what derives from it) is not checkpointed: scoped.
            let spawned = e.scoped(parent);
            let d = e
                .comms
                .derive(
                    parent,
                    how,
                    group
                        .as_ref()
                        .map(|g| g.iter().map(|w| *w as u32).collect()),
                    !spawned,
                    |seq| Self::child_ctx(parent, seq, color),
                )
                .map_err(Error::Invalid)?;
            if let (true, Some(ctx), Some(g)) = (spawned, d.ctx, &group) {
                e.scope(ctx, g.clone());
            }
            d
        };
        let (Some(ctx), Some(group)) = (d.ctx, group) else {
            return Ok(None);
        };
        let me = self.inner.group[self.rank()];
        Ok(Some(Comm::make(self.inner.eng.clone(), ctx, group, me)))
    }

    /// A copy of this communicator with its own message space (collective).
    pub fn dup(&self) -> Result<Comm, Error> {
        self.barrier()?;
        self.derive(crate::ckpt::Derivation::Dup, Some(self.inner.group.clone()))?
            .ok_or_else(|| Error::Invalid("dup gave no communicator".into()))
    }

    /// Partition the ranks by `color` (collective). Ranks with the same colour form a new
    /// communicator ordered by (`key`, old rank); `None` leaves the rank out (returns `None`).
    /// After a restart, a split made again must agree with the checkpoint's (see
    /// [`Comm::restored_comms`]).
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Comm>, Error> {
        let n = self.size();
        let mine = [color.map_or(-1, i64::from), i64::from(key)];
        let mut all = vec![0i64; 2 * n];
        self.allgather(&mine, &mut all)?;
        let how = crate::ckpt::Derivation::Split { color, key };
        let Some(c) = color else {
            // Counted all the same: keeps the sequence in step with the members.
            return self.derive(how, None);
        };
        let mut members: Vec<(i64, usize)> = (0..n)
            .filter(|i| all[2 * i] == i64::from(c))
            .map(|i| (all[2 * i + 1], i))
            .collect();
        members.sort();
        let group = members.iter().map(|(_, i)| self.inner.group[*i]).collect();
        self.derive(how, Some(group))
    }
}
