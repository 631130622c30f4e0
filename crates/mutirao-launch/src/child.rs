//! Processes that do not outlive the launcher or agent that started them.
//!
//! Linux sends a child its parent-death signal when the *thread* that forked it ends, not the
//! process: a rank started from a short-lived thread (a spawn request's, a session's) would be
//! killed with it. So every child is forked by one thread that lives as long as the process
//! ([`spawn`]), and asks for SIGKILL when that thread — that is, the process — goes away. A
//! launcher killed with SIGKILL therefore takes its ranks with it at once.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

type Request = (Command, Sender<io::Result<Child>>);

fn forker() -> &'static Mutex<Sender<Request>> {
    static FORKER: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();
    FORKER.get_or_init(|| {
        let (tx, rx) = channel::<Request>();
        // The thread never ends: the receiver is never dropped (the sender lives in a static).
        let started = std::thread::Builder::new()
            .name("mutirao-forker".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            });
        if let Err(e) = started {
            // Without the thread every request fails with this error (below).
            tracing::error!("cannot start the thread that starts ranks: {e}");
        }
        Mutex::new(tx)
    })
}

/// Start `cmd` so that it is killed (SIGKILL) when this process ends, however it ends.
pub fn spawn(mut cmd: Command) -> io::Result<Child> {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec; prctl(2) and getppid(2) are
    // plain system calls, async-signal-safe, and touch no memory shared with the parent.
    // std runs pre_exec closures after it has changed the child's uid and gid, so the
    // death signal (which a change of credentials clears) is set after that change.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // The parent may have died between fork and prctl: then no signal would come.
            if rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(parent) {
                return Err(io::Error::other("the launcher ended while starting a rank"));
            }
            Ok(())
        });
    }
    let (tx, rx) = channel();
    forker()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, tx))
        .map_err(|_| io::Error::other("the thread that starts ranks is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("the thread that starts ranks is gone"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_started_from_a_thread_that_ends_outlives_the_thread() {
        let child = std::thread::spawn(|| {
            let mut c = Command::new("sleep");
            c.arg("5");
            spawn(c).unwrap()
        })
        .join()
        .unwrap();
        // The thread that asked has ended; the child must still be running.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut child = child;
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child died with the thread"
        );
        child.kill().unwrap();
        let _ = child.wait();
    }

    #[test]
    fn a_program_that_cannot_start_is_an_error() {
        let e = spawn(Command::new("/nonexistent/program")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }
}
