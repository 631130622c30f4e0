//! Shared-memory byte rings between two processes of one host.
//!
//! A ring is a file in `/dev/shm` mapped by exactly one writer and one reader process. It carries
//! the same byte stream a TCP connection would (frame headers and payloads), so the protocol engine
//! is identical on both transports; only the copy is cheaper and no system call is made on the fast
//! path. Wake-ups of a sleeping peer go through the pair's TCP connection ("doorbell"), which also
//! tells each side when the other dies.
//!
//! Layout: a 4 KiB header page, then `cap` data bytes (a power of two).
//! - `head` (offset 0): bytes consumed so far, written only by the reader;
//! - `reader_sleeping` (offset 64): set by a reader about to block;
//! - `tail` (offset 128): bytes produced so far, written only by the writer;
//! - `writer_sleeping` (offset 192): set by a writer blocked on a full ring.
//!
//! Positions only grow; the data index is `pos & (cap - 1)`.

use memmap2::MmapMut;
use std::fs::OpenOptions;
use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const HEADER: usize = 4096;
const MAGIC: u64 = 0x4d55_5449_5241_4f31; // "MUTIRAO1"

/// One end of a ring.
pub struct Ring {
    map: MmapMut,
    cap: usize,
    /// Local copy of the position this end owns (head for a reader, tail for a writer).
    pos: u64,
    /// Writer only: the reader's head as last seen. Re-read only when it shows too little free
    /// space, so a writer does not pull the reader's cache line on every message.
    seen_head: u64,
    path: PathBuf,
}

impl Ring {
    /// Create the ring file (done by the reader) with `cap` data bytes (rounded up to a power of two).
    pub fn create(path: &Path, cap: usize) -> std::io::Result<Ring> {
        let cap = cap.next_power_of_two().max(4096);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        f.set_len((HEADER + cap) as u64)?;
        // SAFETY: the file was just created by us with this size and is only mapped by the two
        // ends of this ring. The other process accesses the header only through atomics and the
        // data region only in the byte ranges the head/tail protocol hands to it, so no byte is
        // written by one side while the other reads it (see `write_vectored` / `read`).
        let map = unsafe { MmapMut::map_mut(&f)? };
        let r = Ring {
            map,
            cap,
            pos: 0,
            seen_head: 0,
            path: path.to_path_buf(),
        };
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
        // head/tail protocol.
        let map = unsafe { MmapMut::map_mut(&f)? };
        let mut r = Ring {
            map,
            cap: 0,
            pos: 0,
            seen_head: 0,
            path: path.to_path_buf(),
        };
        if r.word(16).load(Ordering::Acquire) != MAGIC {
            return Err(std::io::Error::other(format!(
                "{} is not a mutirão ring (bad magic)",
                path.display()
            )));
        }
        let cap = r.word(8).load(Ordering::Relaxed) as usize;
        if !cap.is_power_of_two() || HEADER + cap != len {
            return Err(std::io::Error::other(format!(
                "{} has an inconsistent capacity {cap}",
                path.display()
            )));
        }
        r.cap = cap;
        Ok(r)
    }

    /// Touch every page of the data region once, now, so that no message pays for it later
    /// (`MUTIRAO_SHM_PREFAULT`). A fresh ring file is sparse: the first trip around the ring
    /// allocates a tmpfs page and takes a page fault in both processes for every 4 KiB, so a
    /// 32 KiB message cost 30–80 µs instead of 3–7 µs until the ring had wrapped once.
    /// `writer`: the end that writes (touches by writing each page's byte back; it has written
    /// nothing yet); the reader only reads, so a read fault is all it needs.
    pub fn prefault(&self, writer: bool) {
        let base = self.data();
        for off in (0..self.cap).step_by(4096) {
            // SAFETY: `off < cap`, inside the data region of a live mapping. The reader only
            // reads. The writer is the only process that ever writes the data region, and it
            // calls this before its first write, so it stores back the byte that is there while
            // the reader reads no data byte (nothing has been published: head == tail).
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

    fn head(&self) -> &AtomicU64 {
        self.word(0)
    }
    fn tail(&self) -> &AtomicU64 {
        self.word(128)
    }
    fn reader_sleeping(&self) -> &AtomicU32 {
        self.flag(64)
    }
    fn writer_sleeping(&self) -> &AtomicU32 {
        self.flag(192)
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: HEADER is within the mapping (checked on open, set on create).
        unsafe { self.map.as_ptr().add(HEADER) as *mut u8 }
    }

    // ------------------------------------------------------------ writer side

    /// Copy as much of `bufs` as fits; returns the number of bytes written (0 = ring full).
    /// Returns `needs_wake = true` if the reader was asleep and must be woken by the doorbell.
    pub fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> (usize, bool) {
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        let mut free = self.cap - (self.pos - self.seen_head) as usize;
        if free < want {
            self.seen_head = self.head().load(Ordering::Acquire);
            free = self.cap - (self.pos - self.seen_head) as usize;
        }
        let mut written = 0usize;
        for b in bufs {
            if written == free {
                break;
            }
            let n = b.len().min(free - written);
            if n > 0 {
                self.copy_in(self.pos + written as u64, &b[..n]);
                written += n;
            }
        }
        if written == 0 {
            return (0, false);
        }
        self.pos += written as u64;
        self.tail().store(self.pos, Ordering::SeqCst);
        // Dekker with the reader's `prepare_sleep`: either it sees our tail, or we see its flag.
        let wake = self.reader_sleeping().load(Ordering::SeqCst) != 0
            && self.reader_sleeping().swap(0, Ordering::SeqCst) != 0;
        (written, wake)
    }

    fn copy_in(&self, pos: u64, src: &[u8]) {
        let idx = (pos as usize) & (self.cap - 1);
        let first = src.len().min(self.cap - idx);
        // SAFETY: [pos, pos+len) lies in the free part of the ring (checked by the caller against
        // `head`), which the reader does not touch until we publish a larger `tail`; the two
        // copies stay inside the data region because idx < cap and first ≤ cap − idx.
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
        (self.pos - head) as usize != self.cap
    }

    // ------------------------------------------------------------ reader side

    /// Bytes ready to read.
    #[inline]
    pub fn available(&self) -> usize {
        (self.tail().load(Ordering::Acquire) - self.pos) as usize
    }

    /// Copy up to `dst.len()` bytes out; returns (bytes read, writer must be woken).
    pub fn read(&mut self, dst: &mut [u8]) -> (usize, bool) {
        let avail = self.available();
        let n = avail.min(dst.len());
        if n == 0 {
            return (0, false);
        }
        self.peek(avail, 0, &mut dst[..n]);
        (n, self.consume(avail, n))
    }

    /// Copy the `dst.len()` bytes that start `off` bytes past the read position, without
    /// consuming them. `avail`: what [`Ring::available`] returned; `off + dst.len()` beyond it
    /// copies nothing.
    pub fn peek(&self, avail: usize, off: usize, dst: &mut [u8]) {
        let n = dst.len();
        if off.checked_add(n).is_none_or(|end| end > avail) {
            return;
        }
        let idx = ((self.pos + off as u64) as usize) & (self.cap - 1);
        let first = n.min(self.cap - idx);
        // SAFETY: [pos + off, pos + off + n) lies within the `avail` bytes the writer published
        // by its release store of `tail` (acquired in `available`, checked just above), and the
        // writer does not reuse them until we publish a larger `head`; the two copies stay inside
        // the data region because idx < cap and first ≤ cap − idx, and `dst` has n bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data().add(idx), dst.as_mut_ptr(), first);
            if first < n {
                std::ptr::copy_nonoverlapping(self.data(), dst.as_mut_ptr().add(first), n - first);
            }
        }
    }

    /// Give `n` bytes back to the writer (at most `avail`, what [`Ring::available`] returned).
    /// Returns whether the writer must be woken.
    pub fn consume(&mut self, avail: usize, n: usize) -> bool {
        let n = n.min(avail);
        self.pos += n as u64;
        self.head().store(self.pos, Ordering::SeqCst);
        self.writer_sleeping().load(Ordering::SeqCst) != 0
            && self.writer_sleeping().swap(0, Ordering::SeqCst) != 0
    }

    /// A reader about to block announces it; returns true if data arrived meanwhile.
    pub fn prepare_reader_sleep(&self) -> bool {
        self.reader_sleeping().store(1, Ordering::SeqCst);
        self.tail().load(Ordering::SeqCst) != self.pos
    }

    /// The reader is awake again.
    pub fn clear_reader_sleep(&self) {
        self.reader_sleeping().store(0, Ordering::Relaxed);
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
        let p = tmp("order");
        let mut rx = Ring::create(&p, 4096).unwrap();
        let mut tx = Ring::open(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
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
            let (n, _) = rx.read(&mut buf);
            out.extend_from_slice(&buf[..n]);
        }
        assert_eq!(out, data);
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
        let p = tmp(name);
        let mut rx = Ring::create(&p, 256 << 10).unwrap();
        let mut tx = Ring::open(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
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
            let (m, _) = rx.read(&mut buf);
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
        let p = tmp("wake");
        let mut rx = Ring::create(&p, 4096).unwrap();
        let mut tx = Ring::open(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        assert!(!rx.prepare_reader_sleep());
        let (_, wake) = tx.write_vectored(&[IoSlice::new(b"hi")]);
        assert!(wake);
        let (_, wake) = tx.write_vectored(&[IoSlice::new(b"!")]);
        assert!(!wake, "one doorbell per sleep");
        let mut b = [0u8; 8];
        assert_eq!(rx.read(&mut b).0, 3);
    }

    #[test]
    fn full_ring_reports_zero_and_wakes_writer_after_read() {
        let p = tmp("full");
        let mut rx = Ring::create(&p, 4096).unwrap();
        let mut tx = Ring::open(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        let big = vec![1u8; 5000];
        let (n, _) = tx.write_vectored(&[IoSlice::new(&big)]);
        assert_eq!(n, 4096);
        assert_eq!(tx.write_vectored(&[IoSlice::new(&big)]).0, 0);
        assert!(!tx.prepare_writer_sleep());
        let mut b = vec![0u8; 100];
        let (_, wake) = rx.read(&mut b);
        assert!(wake);
    }

    #[test]
    fn peek_reads_across_the_wrap_without_consuming_and_consume_frees_space() {
        let p = tmp("peek");
        let mut rx = Ring::create(&p, 4096).unwrap();
        let mut tx = Ring::open(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        // Move both ends to 10 bytes before the wrap.
        let pad = vec![0u8; 4086];
        assert_eq!(tx.write_vectored(&[IoSlice::new(&pad)]).0, 4086);
        let mut sink = vec![0u8; 4086];
        assert_eq!(rx.read(&mut sink).0, 4086);
        let msg: Vec<u8> = (0..40u8).collect();
        assert_eq!(tx.write_vectored(&[IoSlice::new(&msg)]).0, 40);
        let avail = rx.available();
        assert_eq!(avail, 40);
        let mut a = [0u8; 32];
        rx.peek(avail, 4, &mut a);
        assert_eq!(&a[..], &msg[4..36]);
        // Beyond what is available: nothing copied.
        let mut b = [9u8; 8];
        rx.peek(avail, 36, &mut b);
        assert_eq!(b, [9u8; 8]);
        assert_eq!(rx.available(), 40, "peek consumes nothing");
        assert!(!rx.consume(avail, 40));
        assert_eq!(rx.available(), 0);
        // The writer sees the space again.
        assert_eq!(tx.write_vectored(&[IoSlice::new(&vec![1u8; 4096])]).0, 4096);
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
