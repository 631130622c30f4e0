//! Shared-memory rings between two processes of one host.
//!
//! A ring is a file in `/dev/shm` mapped by exactly one writer and one reader process. It carries
//! the same byte stream a TCP connection would (frame headers and payloads), so the protocol engine
//! is identical on both transports; only the copy is cheaper and no system call is made on the fast
//! path. Wake-ups of a sleeping peer go through the pair's TCP connection ("doorbell"), which also
//! tells each side when the other dies.
//!
//! Layout: a 4 KiB header page, then `cap` data bytes (a power of two, at least 4 KiB).
//! - `head` (offset 0): where the reader has consumed up to, written only by the reader, and only
//!   now and then (see below);
//! - `reader_sleeping` (offset 256): set by a reader about to block;
//! - `writer_sleeping` (offset 512): set by a writer blocked on a full ring;
//! - `reader_cpu` (offset 768): the CPU the reader last found itself on while waiting, plus one
//!   (0: not known), written only by the reader and only when it changes. Each rank reads its
//!   peer's from the ring it writes: a waiting rank whose awake peer last ran on its own CPU
//!   yields instead of spinning (see `Engine::wait_until`).
//!
//! (Each in its own pair of cache lines, see [`SLOT`].)
//!
//! The data region is a sequence of records, each starting on a 128-byte slot: an 8-byte
//! stamp, then the record's stream bytes, then padding to the next line. The stamp is 0 until the
//! writer publishes the record (release store of `VALID | length` after the bytes), so the reader
//! polls the line the data arrives in, not a separate `tail` word: a small message (header and up
//! to 24 payload bytes) crosses between the cores as one cache line. Stale bytes of the previous
//! lap can never pass for a stamp: before publishing a record, the writer has zeroed the first
//! word of every line up to the one where the next record will start (a kilobyte of lines
//! ahead, inside its free space: one slot of the ring is always left free; done after each
//! publication, so a small record's stores never wait behind it), so the word at the writer's
//! position is always 0. A record may wrap around the
//! end of the data region; a stamp, on a line boundary, never does.
//!
//! The reader publishes `head` only after at least `cap / 8` consumed bytes (or at once when the
//! writer says it waits), so the writer's view of free space costs no shared line per message.
//! A writer that finds no room announces itself with `writer_sleeping` and re-reads `head`; a
//! reader always publishes before the unpublished part reaches a full ring, so a waiting writer
//! is always woken (see [`Ring::consume`]).
//!
//! Positions only grow; the data index is `pos & (cap - 1)`.

use memmap2::MmapMut;
use std::fs::OpenOptions;
use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const HEADER: usize = 4096;
const MAGIC: u64 = 0x4d55_5449_5241_4f32; // "MUTIRAO2": the record layout
/// Records start on 128-byte slots, pairs of cache lines: the adjacent-line prefetcher of x86
/// cores moves lines in such pairs, so records 64 bytes apart made the writer of one and the
/// poller of the next fight over the pair (0 B one-way 0.47 µs against 0.32 µs for 64 B, whose
/// records were 128 bytes apart).
const SLOT: usize = 128;
/// The stamp word at the start of a record.
const STAMP: usize = 8;
/// How far ahead of its position the writer zeroes the stamps of future records, at a time.
const ZERO_AHEAD: u64 = 1024;
/// In the first lap, each end maps the pages ahead of it up to this many bytes at a time
/// (`madvise` populate), instead of taking a page fault per page on the critical path.
const POPULATE: u64 = 256 << 10;
/// The largest record a write makes: a larger message goes as several records, so the
/// reader copies one out while the writer copies the next in. As one record (the record
/// layout's first version), the reader saw nothing of a message until all of it was written,
/// and the two copies ran one after the other (one-way 1 MiB 134 µs against Open MPI's 87).
const RECORD_MAX: usize = 16 << 10;
/// Writes up to this size (a 64 KiB message and its frame header) stay one record.
const ONE_RECORD: usize = (64 << 10) + 64;
/// Set in every published stamp (so a record of 0 bytes is still non-zero); the rest is the length.
const VALID: u64 = 1 << 63;

/// Bytes a record of `n` stream bytes occupies.
#[inline]
fn record_size(n: usize) -> usize {
    (STAMP + n + SLOT - 1) & !(SLOT - 1)
}

/// One end of a ring.
pub struct Ring {
    map: MmapMut,
    cap: usize,
    /// Local copy of the position this end owns: the writer's next record, or the start of the
    /// reader's current record.
    pos: u64,
    /// Writer only: the reader's head as last seen. Re-read only when it shows too little free
    /// space, so a writer does not pull the reader's cache line on every message.
    seen_head: u64,
    /// Writer only: every line that starts in [`pos`, `zeroed`) has a zero first word (the
    /// fresh file is all zero: `cap`).
    zeroed: u64,
    /// How far (stream position, first lap only) this end has populated its mapping.
    populated: u64,
    /// Reader only: stream bytes of the current record (0: its stamp is not read yet).
    rec_len: usize,
    /// Reader only: bytes of the current record consumed (always below `rec_len` when that is
    /// non-zero).
    rec_off: usize,
    /// Reader only: the head as last published.
    published: u64,
    /// Reader only: a stamp that no writer of this protocol writes was found (the length).
    corrupt: Option<u64>,
    path: PathBuf,
}

impl Ring {
    fn with_map(map: MmapMut, cap: usize, path: &Path) -> Ring {
        Ring {
            map,
            cap,
            pos: 0,
            seen_head: 0,
            zeroed: cap as u64,
            populated: 0,
            rec_len: 0,
            rec_off: 0,
            published: 0,
            corrupt: None,
            path: path.to_path_buf(),
        }
    }

    /// Create the ring file (done by the reader) with `cap` data bytes (rounded up to a power of two).
    /// The file is created mode 0600: only this user's processes (the job's ranks) may map it.
    pub fn create(path: &Path, cap: usize) -> std::io::Result<Ring> {
        use std::os::unix::fs::OpenOptionsExt;
        let cap = cap.next_power_of_two().max(4096);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        f.set_len((HEADER + cap) as u64)?;
        // SAFETY: the file was just created by us with this size and is only mapped by the two
        // ends of this ring. The other process accesses the header and the stamps only through
        // atomics, and the rest of the data region only in the byte ranges the record protocol
        // hands to it, so no byte is written by one side while the other reads it (see
        // `write_vectored` / `peek`).
        let map = unsafe { MmapMut::map_mut(&f)? };
        let r = Ring::with_map(map, cap, path);
        r.word(8).store(cap as u64, Ordering::Relaxed);
        r.word(16).store(MAGIC, Ordering::Release);
        Ok(r)
    }

    /// Map an existing ring file (done by the writer).
    pub fn open(path: &Path) -> std::io::Result<Ring> {
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        let len = f.metadata()?.len() as usize;
        if len < HEADER + 4096 {
            return Err(std::io::Error::other(format!(
                "{} is not a mutirão ring (size {len})",
                path.display()
            )));
        }
        // SAFETY: as in `create`: the mapping is shared with exactly one peer that follows the
        // record protocol.
        let map = unsafe { MmapMut::map_mut(&f)? };
        let mut r = Ring::with_map(map, 0, path);
        if r.word(16).load(Ordering::Acquire) != MAGIC {
            return Err(std::io::Error::other(format!(
                "{} is not a mutirão ring of this version (bad magic)",
                path.display()
            )));
        }
        let cap = r.word(8).load(Ordering::Relaxed) as usize;
        if !cap.is_power_of_two() || cap < 4096 || HEADER + cap != len {
            return Err(std::io::Error::other(format!(
                "{} has an inconsistent capacity {cap}",
                path.display()
            )));
        }
        r.cap = cap;
        r.zeroed = cap as u64;
        Ok(r)
    }

    /// Touch every page of the data region once, now, so that no message pays for it later
    /// (`MUTIRAO_SHM_PREFAULT`). A fresh ring file is sparse: the first trip around the ring
    /// allocates a tmpfs page and takes a page fault in both processes for every 4 KiB, so a
    /// 32 KiB message cost 30–80 µs instead of 3–7 µs until the ring had wrapped once.
    /// `writer`: the end that writes (touches by writing each page's byte back; it has written
    /// nothing yet); the reader only reads, so a read fault is all it needs.
    pub fn prefault(&self, writer: bool) {
        // In one call where the kernel can (Linux 5.14+): no page fault per page.
        let advice = if writer {
            memmap2::Advice::PopulateWrite
        } else {
            memmap2::Advice::PopulateRead
        };
        if self.map.advise(advice).is_ok() {
            return;
        }
        let base = self.data();
        for off in (0..self.cap).step_by(4096) {
            // SAFETY: `off < cap`, inside the data region of a live mapping. The reader only
            // reads. The writer is the only process that ever writes the data region, and it
            // calls this before its first write, so it stores back the byte that is there while
            // the reader reads only the first stamp (0, and stored back as 0: nothing published).
            unsafe {
                let p = base.add(off);
                let b = std::ptr::read_volatile(p);
                if writer {
                    std::ptr::write_volatile(p, b);
                }
            }
        }
    }

    /// The file behind the ring (removed by the reader once both ends have mapped it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= HEADER);
        // SAFETY: `off` is 8-aligned within the page-aligned header page of a live mapping that
        // outlives `&self`; any bit pattern is a valid AtomicU64, and every access by either
        // process to these words is atomic.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) }
    }

    fn flag(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off % 4 == 0 && off + 4 <= HEADER);
        // SAFETY: as in `word`, for a 4-aligned AtomicU32.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU32) }
    }

    /// The stamp of the record that starts at stream position `pos` (a multiple of [`SLOT`]).
    #[inline]
    fn stamp(&self, pos: u64) -> &AtomicU64 {
        let idx = (pos as usize) & (self.cap - 1);
        debug_assert!(idx % SLOT == 0);
        // SAFETY: `idx` is a multiple of 64 below `cap`, so the 8 bytes lie in the page-aligned
        // data region of a live mapping; both processes access stamp words only atomically
        // (the writer's payload copies never cover a stamp: they start 8 bytes past one and end
        // before the next record's, see `write_vectored`).
        unsafe { &*(self.data().add(idx) as *const AtomicU64) }
    }

    fn head(&self) -> &AtomicU64 {
        self.word(0)
    }
    fn reader_sleeping(&self) -> &AtomicU32 {
        self.flag(256)
    }
    fn writer_sleeping(&self) -> &AtomicU32 {
        self.flag(512)
    }
    fn reader_cpu(&self) -> &AtomicU32 {
        self.flag(768)
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: HEADER is within the mapping (checked on open, set on create).
        unsafe { self.map.as_ptr().add(HEADER) as *mut u8 }
    }

    /// First lap: map the next bytes of the data region in one call (as many as are mapped
    /// already, between 16 KiB and [`POPULATE`]). Best effort:
    /// where the kernel cannot (before Linux 5.14), the pages fault in one by one as before.
    #[cold]
    fn populate_ahead(&mut self, advice: memmap2::Advice) {
        let from = self.populated as usize;
        // Doubling from 16 KiB: the few frames of start-up and finalize populate little.
        let len = from.clamp(16 << 10, POPULATE as usize).min(self.cap - from);
        let _ = self.map.advise_range(advice, HEADER + from, len);
        self.populated += len as u64;
    }

    // ------------------------------------------------------------ writer side

    /// Stream bytes a record can carry in `free` bytes of ring: its stamp, and one slot kept
    /// free for the next record's zeroed stamp.
    #[inline]
    fn room(free: usize) -> usize {
        free.saturating_sub(SLOT + STAMP)
    }

    /// Copy as much of `bufs` as fits, in records of at most [`RECORD_MAX`] bytes; returns the
    /// number of bytes written (0 = ring full). Returns `needs_wake = true` if the reader was
    /// asleep and must be woken by the doorbell.
    pub fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> (usize, bool) {
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        // Up to [`ONE_RECORD`], one record: the reader's fast path takes a message only whole
        // from one record, and for these sizes that saves more than overlapping the copies.
        let chunk = if want <= ONE_RECORD { want } else { RECORD_MAX };
        let (mut done, mut wake) = (0, false);
        while done < want {
            let (n, w) = self.write_record(bufs, done, (want - done).min(chunk));
            wake |= w;
            if n == 0 {
                break;
            }
            done += n;
        }
        (done, wake)
    }

    /// Copy up to `max` bytes of the concatenation of `bufs`, from byte `skip` on, as one
    /// record; returns the bytes written (0 = ring full) and whether the reader must be woken.
    fn write_record(&mut self, bufs: &[IoSlice<'_>], skip: usize, max: usize) -> (usize, bool) {
        let want = max;
        if want == 0 {
            return (0, false);
        }
        let mut free = self.cap - (self.pos - self.seen_head) as usize;
        if Self::room(free) < want {
            self.seen_head = self.head().load(Ordering::Acquire);
            free = self.cap - (self.pos - self.seen_head) as usize;
        }
        let n = want.min(Self::room(free));
        if n == 0 {
            return (0, false);
        }
        // The next record's stamp must read 0 until that record is published. Normally the
        // previous write zeroed it, after its own stamp (below); a record longer than what is
        // zeroed ahead zeroes the rest here, before its body (ordered before our stamp by its
        // release), so that these (cold) misses are taken before this record's line is.
        let next = self.pos + record_size(n) as u64;
        if next + ZERO_AHEAD > self.populated && self.populated < self.cap as u64 {
            self.populate_ahead(memmap2::Advice::PopulateWrite);
        }
        if next >= self.zeroed {
            self.zero_ahead(next);
        }
        // The bytes past the stamp's cache line first, that line last: the reader polls that
        // line, so its body bytes and the stamp leave the store buffer together and the line
        // moves to the reader once, not once per poll that lands between our stores.
        let head_part = n.min(64 - STAMP);
        self.copy_range(bufs, skip, head_part, n);
        self.copy_range(bufs, skip, 0, head_part);
        self.stamp(self.pos)
            .store(VALID | n as u64, Ordering::SeqCst);
        self.pos = next;
        // Dekker with the reader's `prepare_reader_sleep`: either it sees our stamp, or we see
        // its flag.
        let wake = self.reader_sleeping().load(Ordering::SeqCst) != 0
            && self.reader_sleeping().swap(0, Ordering::SeqCst) != 0;
        // Zero the stamps ahead now, after publishing, while the reader takes the record: the
        // next record then finds its lines zeroed, and its stores are not ordered behind the
        // misses of zeroing (x86 makes stores visible in program order). One-way 512 B
        // 0.634 → 0.556 µs, 0 B 0.19 → 0.17, 4 KiB and up unchanged (interleaved, 4 rounds).
        if self.pos + ZERO_AHEAD > self.zeroed {
            self.zero_ahead(self.zeroed.max(self.pos));
        }
        (n, wake)
    }

    /// Zero the stamp word of every slot from `from` (a slot boundary) up to [`ZERO_AHEAD`]
    /// bytes on, inside the free space (short of the reader's head as last seen, one lap on).
    fn zero_ahead(&mut self, from: u64) {
        let end = (from + ZERO_AHEAD).min(self.seen_head + self.cap as u64);
        let mut line = from;
        while line < end {
            self.stamp(line).store(0, Ordering::Relaxed);
            line += SLOT as u64;
        }
        self.zeroed = self.zeroed.max(end);
    }

    /// Copy bytes [`skip + lo`, `skip + hi`) of the concatenation of `bufs` into the body of
    /// the record at `self.pos`, at body offsets [`lo`, `hi`).
    fn copy_range(&self, bufs: &[IoSlice<'_>], skip: usize, lo: usize, hi: usize) {
        let (lo, hi) = (skip + lo, skip + hi);
        let mut start = 0;
        for b in bufs {
            if start >= hi {
                break;
            }
            let end = start + b.len();
            let (a, z) = (lo.max(start), hi.min(end));
            if a < z {
                self.copy_in(
                    self.pos + (STAMP + a - skip) as u64,
                    &b[a - start..z - start],
                );
            }
            start = end;
        }
    }

    fn copy_in(&self, pos: u64, src: &[u8]) {
        let idx = (pos as usize) & (self.cap - 1);
        let first = src.len().min(self.cap - idx);
        // SAFETY: [pos, pos+len) lies in the body of a record not yet published, inside the
        // free part of the ring (checked by the caller against `head`), which the reader does not
        // touch until it sees the record's stamp; the two copies stay inside the data region
        // because idx < cap and first ≤ cap − idx.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.data().add(idx), first);
            if first < src.len() {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr().add(first),
                    self.data(),
                    src.len() - first,
                );
            }
        }
    }

    /// A writer that found the ring full announces it will wait; returns true if space appeared
    /// meanwhile (then do not sleep).
    pub fn prepare_writer_sleep(&self) -> bool {
        self.writer_sleeping().store(1, Ordering::SeqCst);
        let head = self.head().load(Ordering::SeqCst);
        Self::room(self.cap - (self.pos - head) as usize) > 0
    }

    // ------------------------------------------------------------ reader side

    /// Stream bytes ready to read in the current record (the next record's bytes are counted
    /// once this one is consumed). Reads the writer's stamp only when the current record is
    /// finished.
    #[inline]
    pub fn available(&mut self) -> usize {
        if self.rec_len == 0 {
            let s = self.stamp(self.pos).load(Ordering::Acquire);
            if s == 0 {
                return 0;
            }
            let n = s & !VALID;
            if s & VALID == 0 || n == 0 || n > Self::room(self.cap) as u64 {
                self.corrupt = Some(s);
                return 0;
            }
            self.rec_len = n as usize;
        }
        self.rec_len - self.rec_off
    }

    /// Is anything ready to read? (Without taking it: for the poller's readiness hint.)
    #[inline]
    pub fn has_data(&self) -> bool {
        self.rec_len != 0 || self.stamp(self.pos).load(Ordering::Acquire) != 0
    }

    /// Copy up to `dst.len()` bytes out, across records; returns (bytes read, writer must be
    /// woken), or why the ring cannot be read (a record no writer of this version makes).
    pub fn read(&mut self, dst: &mut [u8]) -> Result<(usize, bool), String> {
        let mut got = 0;
        let mut wake = false;
        while got < dst.len() {
            let avail = self.available();
            if avail == 0 {
                break;
            }
            let n = avail.min(dst.len() - got);
            self.peek(avail, 0, &mut dst[got..got + n]);
            wake |= self.consume(avail, n);
            got += n;
        }
        if let Some(s) = self.corrupt {
            return Err(format!(
                "shared-memory ring corrupt: record stamp {s:#x} at position {} of a {}-byte ring (a process other than the peer rank wrote into {}?)",
                self.pos,
                self.cap,
                self.path.display()
            ));
        }
        Ok((got, wake))
    }

    /// Copy the `dst.len()` bytes that start `off` bytes past the read position, without
    /// consuming them. `avail`: what [`Ring::available`] returned; `off + dst.len()` beyond it
    /// copies nothing.
    pub fn peek(&self, avail: usize, off: usize, dst: &mut [u8]) {
        let n = dst.len();
        if off.checked_add(n).is_none_or(|end| end > avail) || avail > self.rec_len - self.rec_off {
            return;
        }
        let idx = ((self.pos + (STAMP + self.rec_off + off) as u64) as usize) & (self.cap - 1);
        let first = n.min(self.cap - idx);
        // SAFETY: the bytes lie within the current record's body, which the writer published
        // by its release store of the stamp (acquired in `available`; checked just above), and
        // the writer does not reuse them until we publish a `head` past this record; the two
        // copies stay inside the data region because idx < cap and first ≤ cap − idx, and `dst`
        // has n bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data().add(idx), dst.as_mut_ptr(), first);
            if first < n {
                std::ptr::copy_nonoverlapping(self.data(), dst.as_mut_ptr().add(first), n - first);
            }
        }
    }

    /// Give `n` bytes back to the writer (at most `avail`, what [`Ring::available`] returned).
    /// Returns whether the writer must be woken.
    ///
    /// A finished record's space is published (`head`) once `cap / 8` bytes are unpublished or
    /// when the writer has said it waits. A writer waits only when less than a line and a stamp
    /// are free by the head it read, so everything it wrote before waiting spans more than
    /// `cap / 8` past that head: the reader, consuming it, publishes with a sequentially
    /// consistent store and then sees the writer's flag (Dekker with
    /// [`Ring::prepare_writer_sleep`]).
    pub fn consume(&mut self, avail: usize, n: usize) -> bool {
        let n = n.min(avail).min(self.rec_len - self.rec_off);
        self.rec_off += n;
        if self.rec_off < self.rec_len || self.rec_len == 0 {
            return false;
        }
        self.pos += record_size(self.rec_len) as u64;
        self.rec_len = 0;
        self.rec_off = 0;
        if self.pos + POPULATE / 2 > self.populated && self.populated < self.cap as u64 {
            self.populate_ahead(memmap2::Advice::PopulateRead);
        }
        if (self.pos - self.published) as usize >= self.cap / 8
            || self.writer_sleeping().load(Ordering::Relaxed) != 0
        {
            self.published = self.pos;
            self.head().store(self.pos, Ordering::SeqCst);
            return self.writer_sleeping().load(Ordering::SeqCst) != 0
                && self.writer_sleeping().swap(0, Ordering::SeqCst) != 0;
        }
        false
    }

    /// A reader about to block announces it; returns true if data arrived meanwhile.
    pub fn prepare_reader_sleep(&self) -> bool {
        self.reader_sleeping().store(1, Ordering::SeqCst);
        self.rec_len != 0 || self.stamp(self.pos).load(Ordering::SeqCst) != 0
    }

    /// The reader is awake again.
    pub fn clear_reader_sleep(&self) {
        self.reader_sleeping().store(0, Ordering::Relaxed);
    }

    /// Reader: say that this process runs on `cpu` now. Stores only when it changed, so a
    /// rank that stays on its CPU writes the shared line once.
    pub fn publish_reader_cpu(&self, cpu: u32) {
        let v = cpu.saturating_add(1);
        let f = self.reader_cpu();
        if f.load(Ordering::Relaxed) != v {
            f.store(v, Ordering::Relaxed);
        }
    }

    // ------------------------------------------------------------ writer side, about the reader

    /// Writer: the CPU the reader last said it runs on, unless it has announced that it
    /// sleeps (then it competes for no CPU) or never said (an older peer, or not yet).
    pub fn reader_awake_on(&self) -> Option<u32> {
        if self.reader_sleeping().load(Ordering::Relaxed) != 0 {
            return None;
        }
        self.reader_cpu().load(Ordering::Relaxed).checked_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("mutirao-test-{}-{name}", std::process::id()))
    }

    #[test]
    fn stream_through_a_small_ring_in_order() {
        let (mut rx, mut tx) = pair("order", 4096);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut out = Vec::new();
        let mut sent = 0;
        let mut buf = [0u8; 777];
        while out.len() < data.len() {
            if sent < data.len() {
                let end = (sent + 1500).min(data.len());
                let (n, _) = tx.write_vectored(&[IoSlice::new(&data[sent..end])]);
                sent += n;
            }
            let (n, _) = rx.read(&mut buf).unwrap();
            out.extend_from_slice(&buf[..n]);
        }
        assert_eq!(out, data);
    }

    /// Both ends of a fresh ring of `cap` bytes (the file is already unlinked).
    fn pair(name: &str, cap: usize) -> (Ring, Ring) {
        let p = tmp(name);
        let rx = Ring::create(&p, cap).unwrap();
        let tx = Ring::open(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        (rx, tx)
    }

    /// Minor page faults of the calling thread so far.
    fn minor_faults() -> i64 {
        // SAFETY: rusage is a plain C struct of integers and timevals; all-zero is valid.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `u` is a valid, writable rusage; getrusage writes only into it.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
        assert_eq!(rc, 0);
        u.ru_minflt
    }

    /// Write then read 192 KiB through a fresh 256 KiB ring; the minor faults it took.
    fn faults_of_first_trip(name: &str, prefault: bool) -> i64 {
        let (mut rx, mut tx) = pair(name, 256 << 10);
        if prefault {
            rx.prefault(false);
            tx.prefault(true);
        }
        let data = vec![7u8; 32 << 10];
        let mut buf = vec![0u8; 32 << 10];
        let before = minor_faults();
        for _ in 0..6 {
            let (n, _) = tx.write_vectored(&[IoSlice::new(&data)]);
            assert_eq!(n, data.len());
            let (m, _) = rx.read(&mut buf).unwrap();
            assert_eq!(m, data.len());
        }
        let faults = minor_faults() - before;
        assert!(buf.iter().all(|&b| b == 7));
        faults
    }

    #[test]
    fn prefault_takes_the_first_trip_s_page_faults_up_front() {
        // 48 pages written through one mapping and read through the other.
        let cold = faults_of_first_trip("cold", false);
        let warm = faults_of_first_trip("warm", true);
        assert!(cold >= 48, "a sparse ring faults on every page: {cold}");
        assert!(warm <= 4, "a prefaulted ring should not fault: {warm}");
    }

    #[test]
    fn sleeping_reader_is_woken_exactly_once() {
        let (mut rx, mut tx) = pair("wake", 4096);
        assert!(!rx.prepare_reader_sleep());
        let (_, wake) = tx.write_vectored(&[IoSlice::new(b"hi")]);
        assert!(wake);
        let (_, wake) = tx.write_vectored(&[IoSlice::new(b"!")]);
        assert!(!wake, "one doorbell per sleep");
        let mut b = [0u8; 8];
        assert_eq!(
            rx.read(&mut b).unwrap().0,
            3,
            "two records read as one stream"
        );
    }

    #[test]
    fn full_ring_reports_zero_and_wakes_writer_after_read() {
        let (mut rx, mut tx) = pair("full", 4096);
        let big = vec![1u8; 5000];
        let (n, _) = tx.write_vectored(&[IoSlice::new(&big)]);
        assert_eq!(
            n,
            4096 - SLOT - STAMP,
            "a stamp and the next record's slot are kept"
        );
        assert_eq!(tx.write_vectored(&[IoSlice::new(&big)]).0, 0);
        assert!(!tx.prepare_writer_sleep());
        let mut b = vec![0u8; 100];
        let (_, wake) = rx.read(&mut b).unwrap();
        assert!(!wake, "a record frees its space only once read to its end");
        let mut rest = vec![0u8; 5000];
        let (m, wake) = rx.read(&mut rest).unwrap();
        assert_eq!(m, n - 100);
        assert!(wake, "the waiting writer is told at once");
        assert_eq!(tx.write_vectored(&[IoSlice::new(&big)]).0, n);
    }

    #[test]
    fn a_waiting_writer_is_woken_although_head_is_published_lazily() {
        let (mut rx, mut tx) = pair("lazy", 4096);
        // Many small records: the reader publishes its head only every cap / 8 bytes.
        let msg = [5u8; 40];
        let mut sent = 0;
        while tx.write_vectored(&[IoSlice::new(&msg)]).0 == msg.len() {
            sent += 1;
        }
        assert!(sent > 8);
        assert!(!tx.prepare_writer_sleep(), "the ring is full");
        let mut woken = 0;
        let mut b = [0u8; 40];
        for _ in 0..sent {
            let (n, wake) = rx.read(&mut b).unwrap();
            assert_eq!((n, b), (40, msg));
            woken += usize::from(wake);
        }
        assert_eq!(woken, 1, "one doorbell for one wait");
        assert_eq!(rx.read(&mut b).unwrap().0, 0);
        assert_eq!(tx.write_vectored(&[IoSlice::new(&msg)]).0, msg.len());
    }

    #[test]
    fn the_first_lap_maps_ahead_of_both_ends_and_never_past_the_ring() {
        let (mut rx, mut tx) = pair("populate", 1 << 20);
        let msg = vec![3u8; 1000];
        let mut b = vec![0u8; 1000];
        let mut grew = (0, 0);
        for _ in 0..3000 {
            assert_eq!(tx.write_vectored(&[IoSlice::new(&msg)]).0, 1000);
            assert!(tx.populated >= (tx.pos + ZERO_AHEAD).min(tx.cap as u64));
            assert_eq!(rx.read(&mut b).unwrap().0, 1000);
            assert!(rx.populated >= rx.pos.min(rx.cap as u64));
            grew.0 += usize::from(tx.populated > grew.1 as u64);
            grew.1 = tx.populated as usize;
            assert!(tx.populated <= tx.cap as u64 && rx.populated <= rx.cap as u64);
        }
        assert_eq!(tx.populated, 1 << 20, "the whole ring, once");
        assert_eq!(rx.populated, 1 << 20);
        assert!(grew.0 < 12, "a few calls, not one per page: {}", grew.0);
    }

    #[test]
    fn a_small_message_is_one_cache_line() {
        let (_rx, mut tx) = pair("line", 4096);
        let header = [0u8; crate::wire::HEADER_LEN];
        // Stamp, 32-byte header and 24 payload bytes: the first 64-byte line of a slot.
        assert_eq!(STAMP + header.len() + 24, 64);
        tx.write_vectored(&[IoSlice::new(&header), IoSlice::new(&[7u8; 24])]);
        assert_eq!(tx.pos, SLOT as u64, "one slot");
        tx.write_vectored(&[IoSlice::new(&header), IoSlice::new(&[7u8; 88])]);
        assert_eq!(tx.pos, 2 * SLOT as u64, "up to 88 payload bytes: one slot");
        tx.write_vectored(&[IoSlice::new(&header), IoSlice::new(&[7u8; 89])]);
        assert_eq!(tx.pos, 4 * SLOT as u64, "one byte more takes a second slot");
    }

    #[test]
    fn stale_bytes_of_the_last_lap_never_pass_for_a_record() {
        let (mut rx, mut tx) = pair("stale", 4096);
        // Fill a lap with payload that looks exactly like published stamps.
        let fake: Vec<u8> = (VALID | 8).to_le_bytes().repeat(500);
        let mut sink = vec![0u8; 4096];
        for _ in 0..2 {
            let (n, _) = tx.write_vectored(&[IoSlice::new(&fake[..2000])]);
            assert_eq!(n, 2000);
            assert_eq!(rx.read(&mut sink).unwrap().0, 2000);
        }
        // Second lap, small records landing on the old payload: the reader sees each record
        // exactly once and nothing in between.
        for i in 0..200u8 {
            assert_eq!(rx.available(), 0, "record {i}: nothing published yet");
            assert_eq!(tx.write_vectored(&[IoSlice::new(&[i; 3])]).0, 3);
            let mut b = [0u8; 8];
            assert_eq!(rx.read(&mut b).unwrap().0, 3);
            assert_eq!(&b[..3], &[i; 3]);
        }
    }

    #[test]
    fn a_record_no_writer_makes_is_an_error_not_a_crash() {
        let (mut rx, tx) = pair("corrupt", 4096);
        tx.stamp(0).store(VALID | (1 << 40), Ordering::SeqCst);
        let mut b = [0u8; 8];
        let e = rx.read(&mut b).unwrap_err();
        assert!(e.contains("corrupt"), "{e}");
    }

    #[test]
    fn peek_reads_across_the_wrap_without_consuming_and_consume_frees_space() {
        let (mut rx, mut tx) = pair("peek", 4096);
        // Move both ends to the last line of the ring.
        let pad = vec![0u8; 4096 - 2 * SLOT + (SLOT - STAMP)];
        assert_eq!(record_size(pad.len()), 4096 - SLOT);
        assert_eq!(tx.write_vectored(&[IoSlice::new(&pad)]).0, pad.len());
        let mut sink = vec![0u8; 4096];
        assert_eq!(rx.read(&mut sink).unwrap().0, pad.len());
        let msg: Vec<u8> = (0..200u8).collect();
        assert_eq!(tx.write_vectored(&[IoSlice::new(&msg)]).0, 200);
        let avail = rx.available();
        assert_eq!(avail, 200);
        let mut a = [0u8; 32];
        rx.peek(avail, 110, &mut a);
        assert_eq!(
            &a[..],
            &msg[110..142],
            "the record's body wraps at byte 120"
        );
        // Beyond what is available: nothing copied.
        let mut b = [9u8; 8];
        rx.peek(avail, 196, &mut b);
        assert_eq!(b, [9u8; 8]);
        assert_eq!(rx.available(), 200, "peek consumes nothing");
        assert!(!rx.consume(avail, 200));
        assert_eq!(rx.available(), 0);
        // The writer sees the pad's space again; the 200-byte record's two slots are given back
        // with the next publication of the head (lazy: less than cap / 8 consumed since).
        assert_eq!(
            tx.write_vectored(&[IoSlice::new(&vec![1u8; 4096])]).0,
            4096 - 2 * SLOT - SLOT - STAMP
        );
    }

    /// The writer sees the CPU the reader published, but not while the reader sleeps, and
    /// nothing before the reader said anything.
    #[test]
    fn the_writer_sees_the_readers_cpu_while_it_is_awake() {
        let (rx, tx) = pair("cpu", 4096);
        assert_eq!(tx.reader_awake_on(), None, "nothing published yet");
        rx.publish_reader_cpu(0);
        assert_eq!(tx.reader_awake_on(), Some(0));
        rx.publish_reader_cpu(3);
        assert_eq!(tx.reader_awake_on(), Some(3));
        assert!(!rx.prepare_reader_sleep());
        assert_eq!(tx.reader_awake_on(), None, "a sleeping reader holds no CPU");
        rx.clear_reader_sleep();
        assert_eq!(tx.reader_awake_on(), Some(3), "awake again on its last CPU");
    }

    #[test]
    fn a_ring_file_is_readable_and_writable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let p = tmp("mode");
        let r = Ring::create(&p, 4096).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        drop(r);
        std::fs::remove_file(&p).unwrap();
        assert_eq!(mode, 0o600, "ring file mode {mode:o}");
    }

    #[test]
    fn open_rejects_foreign_files() {
        let p = tmp("foreign");
        std::fs::write(&p, vec![0u8; 10000]).unwrap();
        let e = Ring::open(&p).err().unwrap();
        std::fs::remove_file(&p).unwrap();
        assert!(e.to_string().contains("not a mutirão ring"));
    }
}
