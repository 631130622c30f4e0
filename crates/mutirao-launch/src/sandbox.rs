//! Who an agent's ranks run as, where, and with what environment.
//!
//! A rank started by an agent gets nothing of the agent's: a clean environment (what the launch
//! names, plus `PATH`, `HOME` and `TMPDIR`), a private directory (mode 0700, owned by the
//! account it runs as), and — when the agent runs as root — an account that cannot read the
//! agent's files: by default a uid of its own per job ([`RunAs::PerJob`]), so that two users'
//! jobs on one host cannot read each other's environment or memory either; or one named account
//! for every job ([`RunAs::User`], `--run-as USER`).
//!
//! A job is the pair (job id, job token) of its ranks' environment: every session of the same
//! job on this agent (its ranks, the ranks it spawns later) shares one [`Lease`] — one uid, one
//! directory — so shared memory and single-copy transfers between them keep working; a launch
//! naming another job's id without its token gets a lease of its own. When the last session of
//! a job ends, every process left with its uid is killed and its directory removed.

use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};

/// The default range of per-job uids (`--job-uids`): above the ranges Debian gives to users
/// and system accounts, below `nobody` (65534) and systemd's dynamic users (61184–65519 are
/// avoided too).
pub const DEFAULT_JOB_UIDS: (u32, u32) = (60_000, 60_999);

/// What went wrong setting up where and as whom a rank runs.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// `--run-as` names no account.
    #[error("no user {0:?} on this host: create it (`useradd --system --no-create-home {0}`) or name another with --run-as")]
    NoUser(String),
    /// The account database could not be read.
    #[error("cannot look up user {0:?}: {1}")]
    Lookup(String, String),
    /// Running ranks as another account needs root.
    #[error("running jobs as {0} needs the agent to run as root (it runs as uid {1}); without --run-as its jobs run as the agent's own user")]
    NotRoot(String, u32),
    /// Every per-job uid is taken.
    #[error("every job uid of {0}..={1} is in use by a running job here: wait for one to end, or give a wider --job-uids")]
    NoFreeUid(u32, u32),
    /// A range that is empty or includes root or real accounts' low uids.
    #[error("--job-uids {0}-{1}: give FIRST-LAST with 1000 <= FIRST <= LAST < 65534")]
    BadRange(u32, u32),
    /// A directory exists but someone else could change or read it.
    #[error("{path} exists but is {why}: it is not safe to keep {what} there; remove it (or fix its owner and mode: chown {uid} {path} && chmod {mode:o} {path}), or name another with {flag}", path = path.display())]
    UnsafeDir {
        /// What it was for.
        what: String,
        /// Where.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
        /// The uid it must belong to.
        uid: u32,
        /// The mode it must have.
        mode: u32,
        /// The flag that names another.
        flag: String,
    },
    /// A file operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SandboxError + 'a {
    move |source| SandboxError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// An account ranks can run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Its name (for messages).
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
}

impl Account {
    /// Look up `name` in the account database.
    pub fn lookup(name: &str) -> Result<Account, SandboxError> {
        match nix::unistd::User::from_name(name) {
            Ok(Some(u)) => Ok(Account {
                name: name.to_string(),
                uid: u.uid.as_raw(),
                gid: u.gid.as_raw(),
            }),
            Ok(None) => Err(SandboxError::NoUser(name.to_string())),
            Err(e) => Err(SandboxError::Lookup(name.to_string(), e.to_string())),
        }
    }
}

/// Who ranks run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunAs {
    /// The agent's own account.
    Agent,
    /// One account for every job.
    User(Account),
    /// A uid of its own per job (gid the same number), taken from `first..=last`; the uids in
    /// use are locked in files under `locks` (shared by every agent of this machine).
    PerJob {
        /// First uid of the range.
        first: u32,
        /// Last uid of the range.
        last: u32,
        /// Where the locks of the uids in use are.
        locks: PathBuf,
    },
}

/// The uid this process runs as.
pub fn my_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

impl RunAs {
    /// What an agent started with `run_as` (`--run-as`: a user name) and `uids` (`--job-uids`)
    /// runs its ranks as: the named account; else, when it runs as root, a uid per job; else
    /// its own account.
    pub fn choose(run_as: Option<&str>, uids: (u32, u32)) -> Result<RunAs, SandboxError> {
        let me = my_uid();
        match run_as {
            Some(name) => {
                let a = Account::lookup(name)?;
                if a.uid == me {
                    Ok(RunAs::Agent)
                } else if me != 0 {
                    Err(SandboxError::NotRoot(name.to_string(), me))
                } else {
                    Ok(RunAs::User(a))
                }
            }
            None if me == 0 => {
                let (first, last) = uids;
                if first < 1000 || first > last || last >= 65_534 {
                    return Err(SandboxError::BadRange(first, last));
                }
                Ok(RunAs::PerJob {
                    first,
                    last,
                    locks: PathBuf::from("/run/mutirao/job-uids"),
                })
            }
            None => Ok(RunAs::Agent),
        }
    }

    /// One line for the agent's log: who its ranks run as, and what that means.
    pub fn describe(&self) -> String {
        match self {
            RunAs::Agent if my_uid() == 0 => "jobs run as root, the agent's own user: every launcher holding the token is root on this host, and jobs can read the agent's files and tokens".into(),
            RunAs::Agent => format!(
                "jobs run as uid {}, the agent's own user: they can read the agent's files (its token file, state and checkpoint replicas); start the agent as root to run each job as a uid of its own",
                my_uid()
            ),
            RunAs::User(a) => format!(
                "jobs run as {} (uid {}): they cannot read the agent's files, but jobs of different users can read each other's (drop --run-as for a uid per job)",
                a.name, a.uid
            ),
            RunAs::PerJob { first, last, .. } => format!(
                "each job runs as a uid of its own from {first}..={last}: jobs cannot read the agent's files or each other's"
            ),
        }
    }
}

/// Create `dir` (and its parents) if missing, owned by this process with `mode`; if it exists,
/// refuse it unless it belongs to this process's user and no one else may write to it (and,
/// when `mode` has no bits for group and others, read it): a directory another user made first
/// in a shared place such as `/tmp` could be read or filled by them.
pub fn private_dir(dir: &Path, mode: u32, what: &str, flag: &str) -> Result<(), SandboxError> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(dir)
                .map_err(io("cannot create", dir))?;
            // The umask may have taken bits `mode` asked for; never more than asked.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
                .map_err(io("cannot set the mode of", dir))?;
            Ok(())
        }
        Err(e) => Err(io("cannot inspect", dir)(e)),
        Ok(m) => {
            let me = my_uid();
            let have = m.mode() & 0o7777;
            let why = if !m.file_type().is_dir() {
                Some("not a directory (a symbolic link or a file)".to_string())
            } else if m.uid() != me {
                Some(format!(
                    "owned by uid {}, not by this agent (uid {me})",
                    m.uid()
                ))
            } else if have & 0o022 != 0 {
                Some(format!("mode {have:o}: others may write to it"))
            } else if mode & 0o077 == 0 && have & 0o077 != 0 {
                Some(format!("mode {have:o}: others may read it"))
            } else {
                None
            };
            match why {
                None => Ok(()),
                Some(why) => Err(SandboxError::UnsafeDir {
                    what: what.to_string(),
                    path: dir.to_path_buf(),
                    why,
                    uid: me,
                    mode,
                    flag: flag.to_string(),
                }),
            }
        }
    }
}

/// The job a launch belongs to: a digest of its ranks' job id and job token (absent: a job of
/// its own).
pub fn job_key(env: Option<&BTreeMap<String, String>>) -> [u8; 32] {
    let mut h = Sha256::new();
    match env.and_then(|e| Some((e.get("MUTIRAO_JOB_ID")?, e.get("MUTIRAO_JOB_TOKEN")?))) {
        Some((id, token)) => {
            h.update(b"mutirao-job-key-v1\0");
            h.update(id.as_bytes());
            h.update(b"\0");
            h.update(token.as_bytes());
        }
        None => {
            h.update(b"mutirao-job-key-anonymous\0");
            h.update(mutirao::pmi::new_token().unwrap_or([0; 32]));
            h.update(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos()
                    .to_le_bytes(),
            );
        }
    }
    h.finalize().into()
}

/// Where and as whom the ranks of one job run on this agent; shared by all its sessions here.
/// Dropping the last one ends every process left with a per-job uid and removes the directory.
#[derive(Debug)]
pub struct Lease {
    /// uid and gid the ranks run as (`None`: the agent's own).
    pub account: Option<(u32, u32)>,
    /// The job's private directory (its ranks' `HOME` and `TMPDIR`).
    pub dir: PathBuf,
    /// The uid is this job's alone (processes left with it are killed at the end).
    own_uid: bool,
    /// The lock on the uid (held while the lease lives).
    _lock: Option<std::fs::File>,
}

impl Lease {
    /// Make `cmd` run as this lease's account, in a clean environment: `env` (the launch's),
    /// plus `PATH` (unless `env` names one), `HOME` and `TMPDIR` (the job's directory).
    pub fn prepare(&self, cmd: &mut Command, env: &BTreeMap<String, String>) {
        cmd.env_clear();
        cmd.env("PATH", "/usr/local/bin:/usr/bin:/bin");
        cmd.env("HOME", &self.dir).env("TMPDIR", &self.dir);
        cmd.envs(env);
        if let Some((uid, gid)) = self.account {
            cmd.uid(uid).gid(gid);
        }
    }

    /// Copy `program` into the job's directory (readable and runnable by its account only) and
    /// return the copy's path: a file the agent can read (its program cache) that the job's
    /// account cannot.
    pub fn install_program(&self, program: &Path) -> Result<PathBuf, SandboxError> {
        let name = program
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_else(|| "program".into());
        let dest = self.dir.join(name);
        if dest.exists() {
            // Another session of this job installed it (same digest-named file).
            return Ok(dest);
        }
        let tmp = self.dir.join(format!(".install.{}", std::process::id()));
        std::fs::copy(program, &tmp).map_err(io("cannot copy the program to", &tmp))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o500))
            .map_err(io("cannot set the mode of", &tmp))?;
        if let Some((uid, gid)) = self.account {
            std::os::unix::fs::chown(&tmp, Some(uid), Some(gid))
                .map_err(io("cannot give the program to the job's user:", &tmp))?;
        }
        std::fs::rename(&tmp, &dest).map_err(io("cannot install the program as", &dest))?;
        Ok(dest)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let (true, Some((uid, gid))) = (self.own_uid, self.account) {
            kill_uid(uid, gid);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// End every process running as `uid`: a helper process that becomes `uid` and signals every
/// process it may (kill(-1)), which is exactly that uid's, itself excepted.
fn kill_uid(uid: u32, gid: u32) {
    let mut cmd = Command::new("/bin/true");
    cmd.uid(uid).gid(gid).env_clear();
    // SAFETY: the closure runs in the forked child before exec and calls only kill(2), which
    // is async-signal-safe and touches no memory of the parent. By then the child has become
    // `uid` (std sets the ids before running pre_exec closures), so kill(-1) reaches that
    // uid's processes and no others.
    unsafe {
        cmd.pre_exec(|| {
            libc::kill(-1, libc::SIGKILL);
            Ok(())
        });
    }
    if let Ok(mut c) = cmd.spawn() {
        let _ = c.wait();
    }
}

/// The jobs of one agent: who they run as, under which directory, and their leases.
#[derive(Debug)]
pub struct Sandbox {
    run_as: RunAs,
    /// Parent of the jobs' directories (mode 0711: jobs reach their own directory, list none).
    root: PathBuf,
    leases: Mutex<HashMap<[u8; 32], Weak<Lease>>>,
}

impl Sandbox {
    /// Jobs run as `run_as`, each in a directory under `root` (created mode 0711, or refused if
    /// it exists and is not this agent's).
    pub fn new(run_as: RunAs, root: &Path) -> Result<Sandbox, SandboxError> {
        private_dir(root, 0o711, "job directories", "--jobs-dir")?;
        if let RunAs::PerJob { locks, .. } = &run_as {
            private_dir(locks, 0o700, "the job uids' locks", "--job-uids")?;
        }
        Ok(Sandbox {
            run_as,
            root: root.to_path_buf(),
            leases: Mutex::new(HashMap::new()),
        })
    }

    /// Who the ranks run as.
    pub fn run_as(&self) -> &RunAs {
        &self.run_as
    }

    /// The lease of the job `key` ([`job_key`]): the one its other sessions here hold, or a new
    /// one (a uid of its own, a fresh directory).
    pub fn lease(&self, key: [u8; 32]) -> Result<Arc<Lease>, SandboxError> {
        let mut leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        leases.retain(|_, w| w.strong_count() > 0);
        if let Some(l) = leases.get(&key).and_then(Weak::upgrade) {
            return Ok(l);
        }
        let hex = mutirao::pmi::hex(&key[..8]);
        let (account, own_uid, lock) = match &self.run_as {
            RunAs::Agent => (None, false, None),
            RunAs::User(a) => (Some((a.uid, a.gid)), false, None),
            RunAs::PerJob { first, last, locks } => {
                let (uid, lock) = take_uid(*first, *last, locks)?;
                // Whatever a crashed agent's job left running with this uid ends now.
                kill_uid(uid, uid);
                (Some((uid, uid)), true, Some(lock))
            }
        };
        let dir = self.root.join(format!("job-{hex}"));
        if std::fs::symlink_metadata(&dir).is_ok() {
            // A directory a previous agent left behind: not this job's (leases are per agent).
            let _ = std::fs::remove_dir_all(&dir);
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io("cannot create the job directory", &dir))?;
        if let Some((uid, gid)) = account {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(io("cannot give the job directory to its user:", &dir))?;
        }
        let lease = Arc::new(Lease {
            account,
            dir,
            own_uid,
            _lock: lock,
        });
        leases.insert(key, Arc::downgrade(&lease));
        Ok(lease)
    }
}

/// Take the first uid of `first..=last` that is no account's and whose lock no agent holds.
fn take_uid(first: u32, last: u32, locks: &Path) -> Result<(u32, std::fs::File), SandboxError> {
    use rustix::fs::{flock, FlockOperation};
    use std::os::unix::fs::OpenOptionsExt;
    for uid in first..=last {
        if matches!(
            nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)),
            Ok(Some(_))
        ) {
            continue;
        }
        let p = locks.join(format!("{uid}.lock"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&p)
            .map_err(io("cannot open the uid lock", &p))?;
        if flock(&f, FlockOperation::NonBlockingLockExclusive).is_ok() {
            return Ok((uid, f));
        }
    }
    Err(SandboxError::NoFreeUid(first, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mutirao-sandbox-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_directory_someone_else_could_write_is_refused() {
        let d = scratch("dirs");
        private_dir(&d, 0o700, "test state", "--state-dir").unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        // Again: it is ours, 0700.
        private_dir(&d, 0o700, "test state", "--state-dir").unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(&d, 0o700, "test state", "--state-dir")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("others may write") && e.contains("--state-dir"),
            "{e}"
        );
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = private_dir(&d, 0o700, "test state", "--state-dir")
            .unwrap_err()
            .to_string();
        assert!(e.contains("others may read"), "{e}");
        // 0711 asks only that no one else writes.
        private_dir(&d, 0o711, "jobs", "--jobs-dir").unwrap();
        let link = scratch("dirs-link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let e = private_dir(&link, 0o700, "test state", "--state-dir")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a directory"), "{e}");
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_owned_by_another_user_is_refused() {
        if my_uid() != 0 {
            println!("skipped: needs root to make a directory owned by another user");
            return;
        }
        let d = scratch("foreign");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
        let e = private_dir(&d, 0o700, "checkpoint replicas", "--store-dir")
            .unwrap_err()
            .to_string();
        assert!(e.contains("owned by uid 65534"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_sessions_of_one_job_share_a_lease_and_other_jobs_do_not() {
        let root = scratch("leases");
        let sb = Sandbox::new(RunAs::Agent, &root).unwrap();
        let env = |id: &str, tok: &str| {
            let mut e = BTreeMap::new();
            e.insert("MUTIRAO_JOB_ID".to_string(), id.to_string());
            e.insert("MUTIRAO_JOB_TOKEN".to_string(), tok.to_string());
            e
        };
        let a = sb.lease(job_key(Some(&env("j1", "t1")))).unwrap();
        let a2 = sb.lease(job_key(Some(&env("j1", "t1")))).unwrap();
        assert!(Arc::ptr_eq(&a, &a2));
        // The same id without the token is another job.
        let b = sb.lease(job_key(Some(&env("j1", "forged")))).unwrap();
        assert_ne!(a.dir, b.dir);
        assert_eq!(std::fs::metadata(&a.dir).unwrap().mode() & 0o777, 0o700);
        let anon1 = sb.lease(job_key(None)).unwrap();
        let anon2 = sb.lease(job_key(None)).unwrap();
        assert_ne!(anon1.dir, anon2.dir);
        let dir = a.dir.clone();
        drop(a);
        assert!(dir.exists(), "a session of the job still holds it");
        drop(a2);
        assert!(
            !dir.exists(),
            "the last session's end removes the job's directory"
        );
        drop((b, anon1, anon2));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_clean_environment_has_only_what_the_launch_names() {
        let root = scratch("env");
        let sb = Sandbox::new(RunAs::Agent, &root).unwrap();
        let lease = sb.lease(job_key(None)).unwrap();
        let mut env = BTreeMap::new();
        env.insert("FROM_LAUNCH".to_string(), "1".to_string());
        let mut cmd = Command::new("/usr/bin/env");
        lease.prepare(&mut cmd, &env);
        let out = cmd
            .env_remove("NOTHING")
            .output()
            .expect("runs /usr/bin/env");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut names: Vec<&str> = text.lines().filter_map(|l| l.split('=').next()).collect();
        names.sort();
        assert_eq!(names, ["FROM_LAUNCH", "HOME", "PATH", "TMPDIR"], "{text}");
        drop(lease);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_job_of_its_own_uid_cannot_read_the_agent_s_files_and_leaves_no_process() {
        if my_uid() != 0 {
            println!("skipped: needs root to run a job as a uid of its own");
            return;
        }
        let root = scratch("perjob");
        let locks = scratch("perjob-locks");
        let run_as = RunAs::PerJob {
            first: 60_900,
            last: 60_999,
            locks: locks.clone(),
        };
        let sb = Sandbox::new(run_as, &root).unwrap();
        let secret = scratch("perjob-secret");
        std::fs::write(&secret, "agent-secret").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let lease = sb.lease(job_key(None)).unwrap();
        let (uid, _) = lease.account.expect("a uid of its own");
        assert!((60_900..=60_999).contains(&uid));
        // A second job gets another uid.
        let other = sb.lease(job_key(None)).unwrap();
        assert_ne!(other.account.map(|a| a.0), Some(uid));
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg("id -u; cat \"$1\"; echo written > \"$HOME/f\" && echo wrote; sleep 30 >/dev/null 2>&1 & echo $!")
            .arg("sh")
            .arg(&secret);
        lease.prepare(&mut cmd, &BTreeMap::new());
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.first(), Some(&uid.to_string().as_str()), "{text}");
        assert!(!text.contains("agent-secret"), "{text}");
        assert!(
            lines.contains(&"wrote"),
            "the job writes in its own directory: {text}"
        );
        let left: i32 = lines.last().unwrap().parse().unwrap();
        assert!(Path::new(&format!("/proc/{left}")).exists());
        drop(lease);
        // Its process left in the background ended with the job.
        let t0 = std::time::Instant::now();
        while Path::new(&format!("/proc/{left}/status")).exists()
            && std::fs::read_to_string(format!("/proc/{left}/status"))
                .map(|s| !s.contains("State:\tZ"))
                .unwrap_or(false)
            && t0.elapsed() < std::time::Duration::from_secs(5)
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let alive = std::fs::read_to_string(format!("/proc/{left}/status"))
            .map(|s| !s.contains("State:\tZ"))
            .unwrap_or(false);
        assert!(!alive, "a process the job left behind outlived it");
        drop(other);
        let _ = std::fs::remove_file(&secret);
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&locks);
    }
}
