//! Spawn (issue 13, the `MPI_Comm_spawn` MPICH-IG could not do — digest 004 §15.2.1): one
//! running rank asks the launcher for N more ranks; they start, and the caller and the new
//! ranks get one merged communicator (the caller is rank 0, the children 1..=N). The job's
//! other ranks are not involved and do not pause. See docs/spawn.md.
//!
//! ```no_run
//! use mutirao::{SpawnSpec, op};
//! use std::time::Duration;
//!
//! let world = mutirao::init()?;
//! if world.is_spawned() {
//!     // A child: `world` is the merged communicator (rank 1..=n; the parent is rank 0).
//!     world.send(&[world.rank() as u64], 0, 1)?;
//! } else if world.rank() == 0 {
//!     let s = world.spawn(&SpawnSpec::new(4).timeout(Duration::from_secs(10)))?;
//!     for r in 1..s.comm.size() {
//!         let mut b = [0u64];
//!         s.comm.recv(&mut b, r, 1)?;
//!     }
//!     println!("spawned in {:?}, per host {:?}", s.elapsed, s.latency);
//!     s.comm.barrier()?; // matches the children's finalize
//! }
//! world.finalize()?;
//! # Ok::<(), mutirao::Error>(())
//! ```

use crate::config::Config;
use crate::engine::Engine;
use crate::init::{build_channels, unlink_all, Link, Mesh};
use crate::pmi::{Kvs, PmiClient, MAX_SPAWN, MAX_SPAWN_TIMEOUT};
use crate::{Comm, Error};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What a spawn needs from the launcher's environment, kept by the engine from start-up.
#[derive(Clone, Debug)]
pub(crate) struct Launch {
    pub bind: IpAddr,
    pub token: [u8; 32],
    pub job_id: String,
    /// This process's host identity (same-host peers share memory).
    pub host: String,
    pub cfg: Config,
}

/// What to spawn ([`Comm::spawn`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnSpec {
    /// The program to start; `None`: this program (its own executable).
    pub program: Option<PathBuf>,
    /// Its arguments.
    pub args: Vec<String>,
    /// How many ranks to start.
    pub n: usize,
    /// Placement hints for the launcher (hostfile names or addresses, one per child or fewer,
    /// cycled); empty: the launcher decides.
    pub hosts: Vec<String>,
    /// How long the children may take to start and connect; past it the spawn fails, the
    /// launcher stops what it started, and the job goes on.
    pub timeout: Duration,
    /// With checkpoints on, the children take part in the waves (the default; they must then
    /// reach checkpoint points in step with the parent). `false`: they stay out (their
    /// checkpoint points do nothing, no checkpoint holds them, a restart does not re-create
    /// them) — for children that never reach checkpoint points.
    pub in_waves: bool,
}

impl SpawnSpec {
    /// `n` more ranks of this program, no arguments, placed by the launcher, a 30 s timeout.
    pub fn new(n: usize) -> SpawnSpec {
        SpawnSpec {
            program: None,
            args: Vec::new(),
            n,
            hosts: Vec::new(),
            timeout: Duration::from_secs(30),
            in_waves: true,
        }
    }

    /// Keep the children out of checkpoint waves (see [`SpawnSpec::in_waves`]).
    pub fn outside_waves(mut self) -> Self {
        self.in_waves = false;
        self
    }

    /// Start `program` instead of this program.
    pub fn program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = Some(program.into());
        self
    }

    /// Arguments for the children.
    pub fn args<S: Into<String>>(mut self, a: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(a.into_iter().map(Into::into));
        self
    }

    /// Placement hints.
    pub fn hosts<S: Into<String>>(mut self, h: impl IntoIterator<Item = S>) -> Self {
        self.hosts.extend(h.into_iter().map(Into::into));
        self
    }

    /// How long the spawn may take.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    fn check(&self) -> Result<(), Error> {
        if self.n == 0 || self.n > MAX_SPAWN as usize {
            return Err(Error::Invalid(format!(
                "cannot spawn {} ranks: ask for 1 to {MAX_SPAWN}",
                self.n
            )));
        }
        if self.timeout.is_zero() || self.timeout > MAX_SPAWN_TIMEOUT {
            return Err(Error::Invalid(format!(
                "spawn timeout {:?}: give one above zero and at most {MAX_SPAWN_TIMEOUT:?}",
                self.timeout
            )));
        }
        Ok(())
    }
}

/// A finished spawn.
#[derive(Debug)]
pub struct Spawned {
    /// The merged communicator: this rank is 0, the children 1..=n in the order started.
    pub comm: Comm,
    /// The children's world ranks (child `i` is `comm` rank `i + 1`).
    pub ranks: Vec<usize>,
    /// Per host (in the order the launcher placed children), from the request to the moment
    /// the host's last child had connected to this rank.
    pub latency: Vec<(String, Duration)>,
    /// From the request until the merged communicator was ready.
    pub elapsed: Duration,
    /// The spawn group id (as the launcher knows it).
    pub group: u64,
}

/// The context of a spawn group's merged communicator: agreed by parent and children from the
/// group id alone (splitmix64 under a salt of its own; even, never the world's 0).
pub(crate) fn spawn_ctx(group: u64) -> u64 {
    let mut z = group
        .wrapping_mul(0xD6E8_FEB8_6659_FD93)
        .wrapping_add(0x5350_4157_4E5F_4354); // "SPAWN_CT"
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z & !1).max(2)
}

/// Per host, the latest connection among its children, in order of first appearance.
fn per_host(hosts: &[String], took: &[Duration]) -> Vec<(String, Duration)> {
    let mut out: Vec<(String, Duration)> = Vec::new();
    for (h, t) in hosts.iter().zip(took) {
        match out.iter_mut().find(|(x, _)| x == h) {
            Some((_, d)) => *d = (*d).max(*t),
            None => out.push((h.clone(), *t)),
        }
    }
    out
}

type Joined = (u64, Vec<usize>, Vec<(usize, Link)>, Vec<(String, Duration)>);

/// The parent's half: ask, exchange addresses with the children, connect, barrier.
fn run_spawn(
    pmi: &mut PmiClient,
    launch: &Launch,
    me: usize,
    spec: &SpawnSpec,
    t0: Instant,
    ckpt: Option<String>,
) -> Result<Joined, Error> {
    let program = match &spec.program {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|e| {
            Error::Spawn(format!(
                "cannot find this program's executable to start it again ({e}); name it in SpawnSpec::program"
            ))
        })?,
    };
    let listener = TcpListener::bind(SocketAddr::new(launch.bind, 0))
        .map_err(|e| Error::Spawn(format!("cannot listen on {}: {e}", launch.bind)))?;
    let (group, ranks, hosts) = pmi
        .spawn(
            &program,
            &spec.args,
            spec.n as u32,
            &spec.hosts,
            spec.timeout,
            &launch.job_id,
        )
        .map_err(Error::Spawn)?;
    let res = join_group(
        pmi, launch, me, spec, t0, group, &ranks, &hosts, &listener, ckpt,
    );
    if let Err(err) = &res {
        // Stop the children now rather than at their own timeouts; a launcher that is gone
        // changes nothing (the children then fail on their own).
        let _ = pmi.spawn_cancel(group, &err.to_string(), Duration::from_secs(2));
    }
    res
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn join_group(
    pmi: &mut PmiClient,
    launch: &Launch,
    me: usize,
    spec: &SpawnSpec,
    t0: Instant,
    group: u64,
    ranks: &[u32],
    hosts: &[String],
    listener: &TcpListener,
    ckpt: Option<String>,
) -> Result<Joined, Error> {
    let deadline = t0 + spec.timeout;
    let mut kvs = Kvs::new();
    kvs.insert("addr".into(), listener.local_addr()?.to_string());
    kvs.insert("host".into(), launch.host.clone());
    if let Some(c) = ckpt {
        // The children join this rank's checkpoint waves (see `ckpt_basis`).
        kvs.insert(CKPT_KEY.into(), c);
    }
    let answer_within = spec.timeout + Duration::from_secs(2);
    let all = pmi
        .group_fence(group, kvs, answer_within)
        .map_err(|e| Error::Spawn(format!("the spawned ranks did not all arrive: {e}")))?;
    let mut members = vec![me];
    members.extend(ranks.iter().map(|r| *r as usize));
    if all.len() != members.len() {
        return Err(Error::Spawn(format!(
            "the launcher returned {} addresses for a spawn group of {}",
            all.len(),
            members.len()
        )));
    }
    let ch = build_channels(
        &Mesh {
            me: 0,
            members: &members,
            all: &all,
            token: launch.token,
            job_id: &launch.job_id,
            host: &launch.host,
        },
        &launch.cfg,
        listener,
        deadline,
    )
    .map_err(|e| Error::Spawn(format!("connecting to the spawned ranks: {e}")))?;
    let fenced = pmi.group_fence(group, Kvs::new(), answer_within);
    unlink_all(&ch.created);
    fenced.map_err(|e| Error::Spawn(format!("connection barrier of the spawn: {e}")))?;
    let took: Vec<Duration> = ch.connected_at[1..]
        .iter()
        .map(|t| t.map_or(t0.elapsed(), |t| t.saturating_duration_since(t0)))
        .collect();
    let latency = per_host(hosts, &took);
    let chans = members
        .iter()
        .zip(ch.io)
        .skip(1)
        .filter_map(|(w, io)| io.map(|io| (*w, io)))
        .collect::<Vec<_>>();
    if chans.len() != ranks.len() {
        return Err(Error::Spawn(format!(
            "connected to {} of {} spawned ranks",
            chans.len(),
            ranks.len()
        )));
    }
    Ok((group, members, chans, latency))
}

impl Comm {
    /// Start `spec.n` more ranks and join them (issue 13). Called by ONE rank (not
    /// collective): that rank is the parent, rank 0 of the returned communicator; the
    /// children are ranks 1..=n, and in each child [`crate::init`] returns the same merged
    /// communicator ([`Comm::is_spawned`] is true there). The job's other ranks take no part
    /// and do not pause; this rank keeps progressing its messages with them while it waits
    /// (except with checkpoints on, see docs/spawn.md).
    ///
    /// Errors ([`Error::Spawn`]): the launcher cannot spawn or could not start the program, or
    /// a child did not start and connect within `spec.timeout`; the launcher then stops the
    /// children it started, and the job goes on unchanged.
    pub fn spawn(&self, spec: &SpawnSpec) -> Result<Spawned, Error> {
        spec.check()?;
        let t0 = Instant::now();
        let mut e = self.inner.eng.borrow_mut();
        let launch = e.launch.clone().ok_or_else(|| {
            Error::Spawn(
                "this process was not started by a launcher (`mutirao run` or a LocalJob): \
                 there is nobody to start ranks"
                    .into(),
            )
        })?;
        let mut pmi = e._pmi.take().ok_or_else(no_launcher_connection)?;
        let res = if e.ckpt.is_some() {
            // Checkpoint waves need the launcher connection the spawn is using: do not
            // progress meanwhile (a wave waits for this rank at most the spawn's duration).
            let basis = ckpt_basis(&e).filter(|_| spec.in_waves);
            run_spawn(&mut pmi, &launch, e.rank, spec, t0, basis)
        } else {
            let (p, res) = spawn_progressing(&mut e, pmi, launch, spec, t0)?;
            pmi = p;
            res
        };
        e._pmi = Some(pmi);
        let (group, members, chans, latency) = res?;
        add(&mut e, chans)?;
        let ctx = spawn_ctx(group);
        e.scope(ctx, members.clone());
        if spec.in_waves {
            e.ckpt_add_children(group, &members, program_of(spec), spec.args.clone());
        }
        drop(e);
        let ranks = members[1..].to_vec();
        let comm = self.with_group(ctx, members);
        Ok(Spawned {
            comm,
            ranks,
            latency,
            elapsed: t0.elapsed(),
            group,
        })
    }

    /// Start a spawn and return at once (issue 13: the running ranks do not pause, not even
    /// the parent): the launcher talk and the children's connections run on a helper thread
    /// while this rank goes on with its work; [`PendingSpawn::test`] or
    /// [`PendingSpawn::wait`] completes it. Errors are those of [`Comm::spawn`], reported by
    /// `test`/`wait`. While it is pending this rank cannot spawn again.
    ///
    /// With checkpoints on, the spawn needs the launcher connection the waves use: it runs to
    /// completion here (as [`Comm::spawn`] does) and `test` returns its result at once.
    ///
    /// ```no_run
    /// # let world = mutirao::init()?;
    /// let mut pending = world.spawn_nonblocking(&mutirao::SpawnSpec::new(2))?;
    /// let spawned = loop {
    ///     if let Some(s) = pending.test()? {
    ///         break s;
    ///     }
    ///     // … hand out work, receive results …
    /// };
    /// spawned.comm.barrier()?; // the children's finalize
    /// # Ok::<(), mutirao::Error>(())
    /// ```
    pub fn spawn_nonblocking(&self, spec: &SpawnSpec) -> Result<PendingSpawn, Error> {
        spec.check()?;
        let t0 = Instant::now();
        let mut e = self.inner.eng.borrow_mut();
        let launch = e.launch.clone().ok_or_else(|| {
            Error::Spawn(
                "this process was not started by a launcher (`mutirao run` or a LocalJob): \
                 there is nobody to start ranks"
                    .into(),
            )
        })?;
        let mut pmi = e._pmi.take().ok_or_else(no_launcher_connection)?;
        if e.ckpt.is_some() {
            let basis = ckpt_basis(&e).filter(|_| spec.in_waves);
            let res = run_spawn(&mut pmi, &launch, e.rank, spec, t0, basis);
            drop(e);
            return Ok(PendingSpawn {
                comm: self.clone(),
                t0,
                state: Some(Pending::Done(Box::new(pmi), res)),
                program: program_of(spec),
                args: spec.args.clone(),
                in_waves: spec.in_waves,
            });
        }
        drop(e);
        let (tx, rx) = std::sync::mpsc::channel();
        let (me, spec2) = (self.inner.eng.borrow().rank, spec.clone());
        let helper = std::thread::Builder::new()
            .name("mutirao-spawn".into())
            .spawn(move || {
                let res = run_spawn(&mut pmi, &launch, me, &spec2, t0, None);
                let _ = tx.send(());
                (pmi, res)
            });
        match helper {
            Ok(helper) => Ok(PendingSpawn {
                comm: self.clone(),
                t0,
                state: Some(Pending::Running { rx, helper }),
                program: program_of(spec),
                args: spec.args.clone(),
                in_waves: spec.in_waves,
            }),
            Err(err) => Err(Error::Spawn(format!(
                "cannot start the spawn's helper thread: {err}; the launcher connection is lost \
                 for spawns of this rank"
            ))),
        }
    }

    /// On a restart from an epoch whose waves included ranks this rank had spawned (issue 13):
    /// those spawn groups, re-created before [`crate::init`] returned — the children were
    /// started again by the launcher with the same program and arguments, restored their own
    /// checkpoints, and the merged communicators are back with their saved contexts (messages
    /// saved in the checkpoints are received on them). In the order the groups were spawned;
    /// `latency` is empty and `elapsed` is the time to re-create the group. Returned once
    /// (later calls: empty); empty on a fresh start and when the restored epoch had no
    /// spawned members (a spawn after the last committed epoch is not restored: the program
    /// spawns again).
    pub fn respawned(&self) -> Vec<Spawned> {
        let groups = self.inner.eng.borrow_mut().respawned.take();
        groups
            .unwrap_or_default()
            .into_iter()
            .map(|(group, members, elapsed)| Spawned {
                comm: self.with_group(spawn_ctx(group), members.clone()),
                ranks: members[1..].to_vec(),
                latency: Vec::new(),
                elapsed,
                group,
            })
            .collect()
    }

    /// Whether this process was started by a spawn (then [`crate::init`] returned the merged
    /// communicator of its spawn group, where the parent is rank 0).
    pub fn is_spawned(&self) -> bool {
        self.inner.eng.borrow().spawned_in.is_some()
    }
}

/// The program a spawn starts, as saved in checkpoints (this program's path when the spec
/// names none).
fn program_of(spec: &SpawnSpec) -> String {
    spec.program
        .clone()
        .or_else(|| std::env::current_exe().ok())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn no_launcher_connection() -> Error {
    Error::Spawn(
        "this rank has no connection to the launcher (a nonblocking spawn of this rank may still \
         be pending: complete it with PendingSpawn::test or wait first)"
            .into(),
    )
}

type HelperResult = (PmiClient, Result<Joined, Error>);

enum Pending {
    Running {
        rx: std::sync::mpsc::Receiver<()>,
        helper: std::thread::JoinHandle<HelperResult>,
    },
    Done(Box<PmiClient>, Result<Joined, Error>),
}

/// A spawn in progress ([`Comm::spawn_nonblocking`]). Dropped unfinished, it is completed
/// first (the children join this rank's engine and end with it).
pub struct PendingSpawn {
    comm: Comm,
    t0: Instant,
    state: Option<Pending>,
    /// What was spawned (saved with checkpoints: a restart starts it again).
    program: String,
    args: Vec<String>,
    in_waves: bool,
}

impl std::fmt::Debug for PendingSpawn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingSpawn")
            .field("since", &self.t0.elapsed())
            .field(
                "finished",
                &!matches!(self.state, Some(Pending::Running { .. })),
            )
            .finish()
    }
}

impl PendingSpawn {
    /// `Ok(None)` while the children are still starting; then the spawn's result, once.
    /// Called again after that: an `Invalid` error.
    pub fn test(&mut self) -> Result<Option<Spawned>, Error> {
        match &self.state {
            None => Err(Error::Invalid(
                "this spawn was already completed (test or wait returned its result)".into(),
            )),
            Some(Pending::Running { rx, .. }) => match rx.try_recv() {
                Err(std::sync::mpsc::TryRecvError::Empty) => Ok(None),
                _ => self.finish().map(Some),
            },
            Some(Pending::Done(..)) => self.finish().map(Some),
        }
    }

    /// Block until the spawn completes; its result.
    pub fn wait(mut self) -> Result<Spawned, Error> {
        self.finish()
    }

    /// How long since the request.
    pub fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    fn finish(&mut self) -> Result<Spawned, Error> {
        let (pmi, res) = match self.state.take() {
            None => {
                return Err(Error::Invalid(
                    "this spawn was already completed (test or wait returned its result)".into(),
                ))
            }
            Some(Pending::Done(pmi, res)) => (*pmi, res),
            Some(Pending::Running { helper, .. }) => match helper.join() {
                Ok(r) => r,
                Err(_) => {
                    return Err(Error::Spawn(
                        "the spawn's helper thread panicked; this rank lost its launcher \
                         connection"
                            .into(),
                    ))
                }
            },
        };
        let mut e = self.comm.inner.eng.borrow_mut();
        e._pmi = Some(pmi);
        let (group, members, chans, latency) = res?;
        add(&mut e, chans)?;
        let ctx = spawn_ctx(group);
        e.scope(ctx, members.clone());
        if self.in_waves {
            e.ckpt_add_children(group, &members, self.program.clone(), self.args.clone());
        }
        drop(e);
        let ranks = members[1..].to_vec();
        let comm = self.comm.with_group(ctx, members);
        Ok(Spawned {
            comm,
            ranks,
            latency,
            elapsed: self.t0.elapsed(),
            group,
        })
    }
}

impl Drop for PendingSpawn {
    fn drop(&mut self) {
        if self.state.is_some() {
            // Give the launcher connection back and take the children in, so that they are
            // not left waiting; errors here have nobody to go to.
            let _ = self.finish();
        }
    }
}

/// Run the spawn's launcher talk and connections on a helper thread while this thread keeps
/// the engine progressing (messages to and from the job's other ranks keep flowing).
fn spawn_progressing(
    e: &mut Engine,
    mut pmi: PmiClient,
    launch: Launch,
    spec: &SpawnSpec,
    t0: Instant,
) -> Result<(PmiClient, Result<Joined, Error>), Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (me, spec2) = (e.rank, spec.clone());
    let helper = std::thread::Builder::new()
        .name("mutirao-spawn".into())
        .spawn(move || {
            let res = run_spawn(&mut pmi, &launch, me, &spec2, t0, None);
            let _ = tx.send(());
            (pmi, res)
        })
        .map_err(|err| Error::Spawn(format!("cannot start the spawn's helper thread: {err}")))?;
    loop {
        // Progress errors resurface on the next operation that meets them.
        let _ = e.poke();
        match rx.recv_timeout(Duration::from_micros(200)) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    helper.join().map_err(|_| {
        Error::Spawn(
            "the spawn's helper thread panicked; this rank lost its launcher connection".into(),
        )
    })
}

/// The group-fence key under which a parent with checkpoints on tells its children how to
/// join its waves.
pub(crate) const CKPT_KEY: &str = "ckpt";

/// With checkpoints on, what the children need to join this rank's waves (issue 13):
/// `"MODE POINTS AFTER PMI_TIMEOUT_MS"` — the snapshot mode, this rank's checkpoint point
/// count (children count from their own start; markers are translated by it), the epoch the
/// children consider closed (they join the next one; a wave this rank has not cut yet brings
/// them in), how long a checkpoint's PMI operation may take.
fn ckpt_basis(e: &Engine) -> Option<String> {
    let c = e.ckpt.as_ref()?;
    let (points, after) = c.wave.spawn_basis();
    Some(format!(
        "{} {points} {after} {} -",
        c.wave.mode().as_str(),
        c.pmi_timeout.as_millis()
    ))
}

/// [`ckpt_basis`] for a spawn group a restart re-creates from `epoch`: every member counts
/// checkpoint points from the restore (offset 0), the children restore their checkpoints of
/// `epoch` and join the waves after it.
pub(crate) fn restore_basis(mode: crate::ckpt::Mode, epoch: u64, pmi_timeout: Duration) -> String {
    format!(
        "{} 0 {epoch} {} {epoch}",
        mode.as_str(),
        pmi_timeout.as_millis()
    )
}

/// A child's reading of [`ckpt_basis`] / [`restore_basis`].
pub(crate) struct Basis {
    pub mode: crate::ckpt::Mode,
    pub parent_points: u64,
    pub after: u64,
    pub pmi_timeout: Duration,
    /// The epoch to restore this child from (a restart re-creating its group).
    pub restore: Option<u64>,
}

pub(crate) fn parse_ckpt_basis(s: &str) -> Result<Basis, String> {
    let f: Vec<&str> = s.split(' ').collect();
    let bad =
        || format!("the parent's checkpoint settings {s:?} do not parse: mixed mutirão versions?");
    if f.len() != 5 {
        return Err(bad());
    }
    let mode = crate::ckpt::Mode::parse(f[0])?;
    let num = |x: &str| x.parse::<u64>().map_err(|_| bad());
    Ok(Basis {
        mode,
        parent_points: num(f[1])?,
        after: num(f[2])?,
        pmi_timeout: Duration::from_millis(num(f[3])?),
        restore: match f[4] {
            "-" => None,
            x => Some(num(x)?),
        },
    })
}

pub(crate) fn add(e: &mut Engine, chans: Vec<(usize, Link)>) -> Result<(), Error> {
    let chans = chans
        .into_iter()
        .map(|(w, l)| (w, l.into_transport()))
        .collect();
    e.add_peers(chans)
        .map_err(|err| Error::Spawn(format!("adding the spawned ranks: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_contexts_are_even_distinct_and_not_the_worlds() {
        let mut seen = std::collections::HashSet::new();
        for g in 0..10_000u64 {
            let c = spawn_ctx(g);
            assert!(c % 2 == 0 && c >= 2, "{c}");
            assert!(seen.insert(c), "group {g} repeats a context");
        }
    }

    #[test]
    fn latency_per_host_is_the_slowest_child_there_in_placement_order() {
        let ms = Duration::from_millis;
        let hosts = ["b", "a", "b", "c"].map(String::from);
        let got = per_host(&hosts, &[ms(5), ms(7), ms(9), ms(1)]);
        assert_eq!(
            got,
            vec![
                ("b".to_string(), ms(9)),
                ("a".to_string(), ms(7)),
                ("c".to_string(), ms(1))
            ]
        );
    }

    #[test]
    fn bad_specs_are_refused_before_asking_anyone() {
        assert!(SpawnSpec::new(0).check().is_err());
        assert!(SpawnSpec::new(1).timeout(Duration::ZERO).check().is_err());
        assert!(SpawnSpec::new(MAX_SPAWN as usize + 1).check().is_err());
        let s = SpawnSpec::new(2)
            .program("/bin/x")
            .args(["a"])
            .hosts(["h1"])
            .timeout(Duration::from_secs(1));
        assert!(s.check().is_ok());
        assert_eq!(s.program, Some(PathBuf::from("/bin/x")));
    }

    #[test]
    fn a_single_rank_without_launcher_cannot_spawn() {
        let w = crate::init::init_alone().unwrap();
        let e = w.spawn(&SpawnSpec::new(1)).unwrap_err();
        assert!(e.to_string().contains("not started by a launcher"), "{e}");
        assert!(!w.is_spawned());
    }
}
