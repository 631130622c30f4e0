//! Is the machine oversubscribed right now? A waiting rank spins only while spinning is free:
//! when more threads are runnable than the machine has CPUs, a spinning rank holds a core that
//! someone is queued for — often the very rank it waits for, which the kernel woke on our core
//! (a synchronous wake-up is placed beside its waker). Then the spin only delays the reply, and
//! `Engine::wait_until` yields the core instead for the rest of its spin (then sleeps as
//! before): a rank queued on our core runs at once, one on the other core is still polled for
//! between the yields. The kernel keeps that count cheap to read: the fourth field of
//! `/proc/loadavg` ("running/total") is the number of runnable threads this instant, the reader
//! included.
//!
//! Measured before this existed (`bench/compare_mpi.sh`, `LOAD=1`, one busy loop beside a
//! ping-pong pair on 2 cores): TCP 0 B one-way 34.7 µs against 4.2 quiet, shared memory 1 MiB
//! 511 µs against 86: the pair on one core, each waiting out the other's whole spin.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// An answer is reused this long. A read costs about 1.2 µs on the 2-core VM, as much as a
/// quarter of a small TCP round trip, so a ping-pong that waits a few µs each time reads it once
/// every dozen waits; a busy machine (a build, a busy loop) stays busy far longer than this.
const FRESH: Duration = Duration::from_micros(100);

/// Reads the system's runnable-thread count. `None` inside: `/proc/loadavg` cannot be read (no
/// procfs), and the machine then always counts as not busy (spinning as before).
pub(crate) struct BusyProbe {
    file: Option<File>,
    cpus: usize,
    /// The last answer and when it was read.
    last: Option<(Instant, bool)>,
}

impl BusyProbe {
    pub(crate) fn new() -> BusyProbe {
        // SAFETY: sysconf has no memory-safety preconditions.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        BusyProbe {
            file: File::open("/proc/loadavg").ok(),
            cpus: usize::try_from(online).ok().filter(|&n| n > 0).unwrap_or(1),
            last: None,
        }
    }

    /// A probe that compares the runnable count with `cpus` instead of the online CPUs (tests:
    /// 0 makes every readable machine busy, `usize::MAX` none). `None` without procfs.
    #[cfg(test)]
    pub(crate) fn with_cpus(cpus: usize) -> Option<BusyProbe> {
        let p = BusyProbe::new();
        p.file.as_ref()?;
        Some(BusyProbe { cpus, ..p })
    }

    /// More threads are runnable than there are online CPUs (the caller, running, included),
    /// as read at most [`FRESH`] ago. System-wide: in a cpuset smaller than the machine this
    /// undercounts the contention on our own CPUs, and then the rank spins as it did without
    /// the probe.
    pub(crate) fn oversubscribed(&mut self) -> bool {
        let now = Instant::now();
        if let Some((at, busy)) = self.last {
            if now.duration_since(at) < FRESH {
                return busy;
            }
        }
        let busy = self.read_now();
        self.last = Some((now, busy));
        busy
    }

    /// The last answer, however old, without reading again (false before the first read).
    pub(crate) fn last_answer(&self) -> bool {
        self.last.is_some_and(|(_, busy)| busy)
    }

    fn read_now(&self) -> bool {
        let Some(f) = &self.file else {
            return false;
        };
        let mut buf = [0u8; 128];
        match f.read_at(&mut buf, 0) {
            Ok(n) => runnable(&buf[..n]).is_some_and(|r| r > self.cpus),
            Err(_) => false,
        }
    }
}

/// The runnable-thread count of a `/proc/loadavg` line ("0.98 1.74 2.01 3/345 12345").
fn runnable(line: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(line).ok()?;
    let field = s.split_ascii_whitespace().nth(3)?;
    field.split_once('/')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runnable_count_is_the_numerator_of_the_fourth_field() {
        assert_eq!(runnable(b"0.98 1.74 2.01 3/345 12345\n"), Some(3));
        assert_eq!(runnable(b"12.00 9.10 8.00 17/1024 99\n"), Some(17));
    }

    /// Within [`FRESH`] of a read the probe answers from memory; after it, from the file.
    #[test]
    fn an_answer_is_reused_while_fresh_then_read_again() {
        let mut p = BusyProbe::new();
        p.cpus = usize::MAX; // no count exceeds it: a fresh read always says "not busy"
        p.last = Some((Instant::now(), true));
        assert!(p.oversubscribed(), "a fresh answer is reused");
        let stale = Instant::now().checked_sub(FRESH + Duration::from_millis(1));
        let Some(stale) = stale else {
            return; // the clock started less than FRESH ago: nothing can be stale yet
        };
        p.last = Some((stale, true));
        // Read again (from the file, or without procfs "not busy" too), and remembered.
        assert!(!p.oversubscribed(), "a stale answer is not reused");
        assert!(matches!(p.last, Some((_, false))));
    }

    #[test]
    fn a_malformed_line_gives_no_count() {
        assert_eq!(runnable(b""), None);
        assert_eq!(runnable(b"0.98 1.74 2.01"), None);
        assert_eq!(runnable(b"0.98 1.74 2.01 345 12345"), None);
        assert_eq!(runnable(b"0.98 1.74 2.01 x/345 12345"), None);
        assert_eq!(runnable(&[0xff, 0xfe, b' ', b'1']), None);
    }

    /// The probe keeps one open file and reads it again from the start on every call: each
    /// read gives a fresh, whole line that counts at least the reader.
    #[test]
    fn the_kept_file_reads_a_whole_line_again_and_again() {
        let p = BusyProbe::new();
        assert!(p.cpus >= 1);
        let Some(f) = &p.file else {
            return; // no procfs here: the probe says "not busy", checked by the parse tests
        };
        for _ in 0..3 {
            let mut buf = [0u8; 128];
            let n = f.read_at(&mut buf, 0).unwrap();
            let r = runnable(&buf[..n]).expect("a /proc/loadavg line");
            assert!(r >= 1, "the reader itself is running: {r}");
        }
    }
}
