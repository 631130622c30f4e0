//! Start-up: read the launcher's environment, exchange addresses through the PMI fence, build the
//! mesh of connections (shared memory to ranks of this host, TCP to the others).

use crate::ckpt::Mode;
use crate::config::Config;
use crate::engine::{Engine, Peer, Tuning};
use crate::pmi::{unhex_token, Kvs, PmiClient};
use crate::shm::Ring;
use crate::transport::{ShmTransport, TcpTransport, Transport};
use crate::wire::{Hello, HELLO_LEN, PROTOCOL_VERSION};
use crate::{Comm, Error};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// What the launcher tells a rank through its environment.
#[derive(Clone)]
pub struct JobEnv {
    /// `MUTIRAO_RANK`
    pub rank: usize,
    /// `MUTIRAO_SIZE`
    pub size: usize,
    /// `MUTIRAO_PMI_ADDR`: the launcher's bootstrap server.
    pub pmi_addr: String,
    /// `MUTIRAO_JOB_TOKEN`: 64 hex digits shared by the ranks of one job.
    pub token: [u8; 32],
    /// `MUTIRAO_JOB_ID`: names the job's shared-memory files.
    pub job_id: String,
    /// `MUTIRAO_BIND`: address this rank listens on (default 127.0.0.1).
    pub bind: IpAddr,
    /// `MUTIRAO_LOCAL_RANKS`: ranks on this host (tunes spinning).
    pub local_ranks: usize,
    /// `MUTIRAO_LOCAL_RANK`: this rank's index among its host's ranks (default 0).
    pub local_rank: usize,
    /// `MUTIRAO_BIND_TO=core` (`mutirao run --bind-to core`): pin this rank to one core.
    pub bind_to_core: bool,
    /// `MUTIRAO_CKPT_INTERVAL`: seconds between checkpoint waves; `None` (absent or 0) = none.
    pub ckpt_interval: Option<Duration>,
    /// `MUTIRAO_CKPT_MODE`: `blocking` (default) or `nonblocking`.
    pub ckpt_mode: Mode,
    /// `MUTIRAO_CKPT_TIMEOUT`: seconds before rank 0 aborts a wave; `None` = the default,
    /// max(60 s, 10 × interval) (see [`JobEnv::ckpt_timeout`]).
    pub ckpt_timeout: Option<Duration>,
    /// `MUTIRAO_RESTART_EPOCH`: the committed epoch to restore; `None` = a fresh start.
    pub restart_epoch: Option<u64>,
    /// `MUTIRAO_INCARNATION`: 0 on the first start, +1 at every recovery.
    pub incarnation: u64,
    /// `MUTIRAO_SPAWN_GROUP` and `MUTIRAO_SPAWN_MEMBERS`: this rank was started by a spawn
    /// (issue 13); `None` for the job's original ranks.
    pub spawn: Option<SpawnEnv>,
    /// `MUTIRAO_LOST_POLL_MS`: while a wait lasts, ask the launcher this often which ranks it
    /// has declared lost (their host vanished), and fail the operations on them; `None` (absent
    /// or 0): never ask (the launcher sets it for ranks on agents, from the heartbeat).
    pub lost_poll: Option<Duration>,
}

/// How long each phase of this rank's start-up took, on the monotonic clock
/// ([`crate::Comm::init_timings`]). The phases run one after the other; `total` also counts
/// what lies between and around them (reading the configuration, a restart's checkpoint and
/// re-created spawn groups), so the phases add up to at most `total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InitTimings {
    /// Connecting to the launcher's bootstrap (PMI) server and registering with the job token.
    pub register: Duration,
    /// The address-exchange fence: publishing this rank's address and waiting for every
    /// rank's. It lasts until the last rank of the job (or spawn group) has started and
    /// registered, so it holds the ranks' start-up skew.
    pub exchange: Duration,
    /// Building the mesh: shared-memory rings for ranks of this host, TCP connections to the
    /// others, authenticated hellos both ways.
    pub connect: Duration,
    /// The connection barrier: the fence after the mesh, once every rank is connected.
    pub barrier: Duration,
    /// From the start of [`init_with`] to the end of the connection barrier.
    pub total: Duration,
}

impl InitTimings {
    /// The three phases a rank reports to the launcher (all but the barrier, which is still
    /// running when it reports).
    pub fn phases(&self) -> crate::pmi::InitPhases {
        crate::pmi::InitPhases {
            register: self.register,
            exchange: self.exchange,
            connect: self.connect,
        }
    }
}

/// How a spawned rank finds its group (set by the launcher from the PMI server's
/// [`crate::pmi::SpawnRequest::env`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnEnv {
    /// `MUTIRAO_SPAWN_GROUP`: the spawn group id.
    pub group: u64,
    /// `MUTIRAO_SPAWN_MEMBERS`: world ranks of the group, comma-separated, the parent first.
    pub members: Vec<usize>,
}

impl std::fmt::Debug for JobEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobEnv")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("pmi_addr", &self.pmi_addr)
            .field("job_id", &self.job_id)
            .field("bind", &self.bind)
            .finish_non_exhaustive()
    }
}

impl JobEnv {
    /// Read the environment. `Ok(None)`: no launcher (run as a single rank).
    pub fn from_env() -> Result<Option<JobEnv>, Error> {
        Self::from_vars(&|k| std::env::var(k).ok())
    }

    /// [`JobEnv::from_env`] over any variable lookup (`vars(name)`: its value, `None` if unset).
    pub fn from_vars(vars: &dyn Fn(&str) -> Option<String>) -> Result<Option<JobEnv>, Error> {
        let var = |k: &str| vars(k).ok_or(());
        let Ok(rank) = var("MUTIRAO_RANK") else {
            return Ok(None);
        };
        let get = |k: &str| {
            var(k).map_err(|_| {
                Error::Init(format!(
                    "MUTIRAO_RANK is set but {k} is not: start the program with `mutirao run`"
                ))
            })
        };
        let num = |k: &str, v: String| {
            v.parse::<usize>()
                .map_err(|_| Error::Init(format!("{k}={v:?} is not a number")))
        };
        let rank = num("MUTIRAO_RANK", rank)?;
        let size = num("MUTIRAO_SIZE", get("MUTIRAO_SIZE")?)?;
        let spawn = match var("MUTIRAO_SPAWN_GROUP") {
            Err(()) => None,
            Ok(g) => {
                let group = g.trim().parse::<u64>().map_err(|_| {
                    Error::Init(format!("MUTIRAO_SPAWN_GROUP={g:?} is not a number"))
                })?;
                let m = get("MUTIRAO_SPAWN_MEMBERS")?;
                let members = m
                    .split(',')
                    .map(|x| x.trim().parse::<usize>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| {
                        Error::Init(format!(
                            "MUTIRAO_SPAWN_MEMBERS={m:?} is not a comma-separated list of ranks"
                        ))
                    })?;
                let distinct: std::collections::BTreeSet<_> = members.iter().collect();
                if members.len() < 2
                    || distinct.len() != members.len()
                    || !members[1..].contains(&rank)
                    || members
                        .iter()
                        .any(|r| *r >= crate::pmi::MAX_WORLD_RANK as usize)
                {
                    return Err(Error::Init(format!(
                        "MUTIRAO_SPAWN_MEMBERS={m:?} must be distinct ranks, the parent first, \
                         with this rank ({rank}) among the others"
                    )));
                }
                Some(SpawnEnv { group, members })
            }
        };
        if size == 0 || (rank >= size && spawn.is_none()) {
            return Err(Error::Init(format!(
                "MUTIRAO_RANK={rank} is not below MUTIRAO_SIZE={size}"
            )));
        }
        let token = unhex_token(&get("MUTIRAO_JOB_TOKEN")?)
            .ok_or_else(|| Error::Init("MUTIRAO_JOB_TOKEN is not 64 hex digits".into()))?;
        let job_id = get("MUTIRAO_JOB_ID")?;
        if job_id.is_empty()
            || !job_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(Error::Init(format!(
                "MUTIRAO_JOB_ID={job_id:?} must be non-empty letters, digits, - or _"
            )));
        }
        let bind = match var("MUTIRAO_BIND") {
            Ok(b) => b
                .parse()
                .map_err(|_| Error::Init(format!("MUTIRAO_BIND={b:?} is not an IP address")))?,
            Err(_) => IpAddr::from([127, 0, 0, 1]),
        };
        let local_ranks = match var("MUTIRAO_LOCAL_RANKS") {
            Ok(v) => num("MUTIRAO_LOCAL_RANKS", v)?,
            Err(_) => 1,
        };
        let local_rank = match var("MUTIRAO_LOCAL_RANK") {
            Ok(v) => num("MUTIRAO_LOCAL_RANK", v)?,
            Err(_) => 0,
        };
        let bind_to_core = match var("MUTIRAO_BIND_TO").as_deref() {
            Ok("core") => true,
            Ok("none") | Ok("") | Err(_) => false,
            Ok(other) => {
                return Err(Error::Init(format!(
                    "MUTIRAO_BIND_TO={other:?} is not `core` or `none`"
                )))
            }
        };
        let secs = |k: &str| -> Result<Option<Duration>, Error> {
            match var(k) {
                Ok(v) => {
                    let x: f64 = v.trim().parse().map_err(|_| {
                        Error::Init(format!("{k}={v:?} is not a number of seconds"))
                    })?;
                    if !x.is_finite() || !(0.0..=1e9).contains(&x) {
                        return Err(Error::Init(format!(
                            "{k}={v:?} must be between 0 and 1e9 seconds"
                        )));
                    }
                    Ok((x > 0.0).then(|| Duration::from_secs_f64(x)))
                }
                Err(_) => Ok(None),
            }
        };
        let int =
            |k: &str| -> Result<Option<u64>, Error> {
                match var(k) {
                    Ok(v) => v.trim().parse::<u64>().map(Some).map_err(|_| {
                        Error::Init(format!("{k}={v:?} is not a non-negative integer"))
                    }),
                    Err(_) => Ok(None),
                }
            };
        let ckpt_mode =
            Mode::parse(&var("MUTIRAO_CKPT_MODE").unwrap_or_default()).map_err(Error::Init)?;
        Ok(Some(JobEnv {
            rank,
            size,
            pmi_addr: get("MUTIRAO_PMI_ADDR")?,
            token,
            job_id,
            bind,
            local_ranks,
            local_rank,
            bind_to_core,
            ckpt_interval: secs("MUTIRAO_CKPT_INTERVAL")?,
            ckpt_mode,
            ckpt_timeout: secs("MUTIRAO_CKPT_TIMEOUT")?,
            restart_epoch: int("MUTIRAO_RESTART_EPOCH")?,
            incarnation: int("MUTIRAO_INCARNATION")?.unwrap_or(0),
            spawn,
            lost_poll: int("MUTIRAO_LOST_POLL_MS")?
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis),
        }))
    }

    /// The environment that [`JobEnv::from_env`] reads back as `self` (the launcher sets these
    /// on every rank it starts). Optional settings at their default are left out.
    pub fn to_env(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = vec![
            ("MUTIRAO_RANK".into(), self.rank.to_string()),
            ("MUTIRAO_SIZE".into(), self.size.to_string()),
            ("MUTIRAO_PMI_ADDR".into(), self.pmi_addr.clone()),
            ("MUTIRAO_JOB_TOKEN".into(), crate::pmi::hex(&self.token)),
            ("MUTIRAO_JOB_ID".into(), self.job_id.clone()),
            ("MUTIRAO_BIND".into(), self.bind.to_string()),
            ("MUTIRAO_LOCAL_RANKS".into(), self.local_ranks.to_string()),
            ("MUTIRAO_LOCAL_RANK".into(), self.local_rank.to_string()),
            (
                "MUTIRAO_BIND_TO".into(),
                if self.bind_to_core { "core" } else { "none" }.into(),
            ),
            ("MUTIRAO_CKPT_MODE".into(), self.ckpt_mode.as_str().into()),
            ("MUTIRAO_INCARNATION".into(), self.incarnation.to_string()),
        ];
        if let Some(i) = self.ckpt_interval {
            v.push(("MUTIRAO_CKPT_INTERVAL".into(), i.as_secs_f64().to_string()));
        }
        if let Some(t) = self.ckpt_timeout {
            v.push(("MUTIRAO_CKPT_TIMEOUT".into(), t.as_secs_f64().to_string()));
        }
        if let Some(e) = self.restart_epoch {
            v.push(("MUTIRAO_RESTART_EPOCH".into(), e.to_string()));
        }
        if let Some(p) = self.lost_poll {
            v.push(("MUTIRAO_LOST_POLL_MS".into(), p.as_millis().to_string()));
        }
        if let Some(sp) = &self.spawn {
            v.push(("MUTIRAO_SPAWN_GROUP".into(), sp.group.to_string()));
            let m: Vec<String> = sp.members.iter().map(|r| r.to_string()).collect();
            v.push(("MUTIRAO_SPAWN_MEMBERS".into(), m.join(",")));
        }
        v
    }

    /// How long rank 0 lets a wave run before aborting it: `MUTIRAO_CKPT_TIMEOUT`, else
    /// max(60 s, 10 × interval).
    pub fn ckpt_timeout(&self) -> Duration {
        self.ckpt_timeout.unwrap_or_else(|| {
            Duration::from_secs(60).max(self.ckpt_interval.unwrap_or_default() * 10)
        })
    }
}

/// The core that rank `local_rank` of a host's `local_ranks` gets with `--bind-to core`: the
/// cores this process may use (`allowed`, in order) are filled in blocks, so consecutive ranks
/// share a core when ranks outnumber cores and are spread out when they do not.
pub(crate) fn core_for(allowed: &[usize], local_rank: usize, local_ranks: usize) -> Option<usize> {
    if allowed.is_empty() || local_ranks == 0 {
        return None;
    }
    let i = local_rank.min(local_ranks - 1) * allowed.len() / local_ranks;
    allowed.get(i).copied()
}

/// Pins the calling thread (and the threads it starts later) to this rank's core.
fn bind_to_core(local_rank: usize, local_ranks: usize) -> Result<(), Error> {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
    let set = sched_getaffinity(None)
        .map_err(|e| Error::Init(format!("--bind-to core: cannot read the CPU affinity: {e}")))?;
    let allowed: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect();
    let Some(core) = core_for(&allowed, local_rank, local_ranks) else {
        return Ok(());
    };
    let mut one = CpuSet::new();
    one.set(core);
    sched_setaffinity(None, &one).map_err(|e| {
        Error::Init(format!(
            "--bind-to core: cannot pin local rank {local_rank} to core {core}: {e}; run without --bind-to"
        ))
    })
}

/// Start the library: under `mutirao run` join the job, otherwise run as a single rank.
/// Returns the world communicator.
pub fn init() -> Result<Comm, Error> {
    match JobEnv::from_env()? {
        Some(env) => init_with(&env),
        None => init_alone(),
    }
}

/// A job of one rank, without a launcher.
pub(crate) fn init_alone() -> Result<Comm, Error> {
    let cfg = Config::from_env(1).map_err(Error::Init)?;
    let engine = Engine::new(0, 1, vec![Peer::new(None)], tuning(&cfg))?;
    Ok(Comm::world(engine))
}

/// An identity that is equal exactly for processes that can share memory *and* are meant to be
/// on the same host: same kernel boot, same network namespace (testbed hosts differ), same name,
/// same user (an agent running as root gives each job's ranks a uid of their own there, and
/// processes of two users can open neither each other's rings nor each other's memory).
/// `MUTIRAO_HOST_ID`, when set, is appended: it can split one machine into several "hosts" (ranks
/// with different values talk TCP), never join processes that cannot share memory.
pub(crate) fn host_identity() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let uid = rustix::process::geteuid().as_raw();
    let extra = std::env::var("MUTIRAO_HOST_ID").unwrap_or_default();
    format!("{}|{}|{}|{uid}|{}", boot.trim(), netns, host.trim(), extra)
}

fn ring_path(job: &str, src: usize, dst: usize) -> PathBuf {
    PathBuf::from(format!("/dev/shm/mutirao-{job}-{src}-{dst}"))
}

pub(crate) fn tuning(cfg: &Config) -> Tuning {
    Tuning {
        eager_limit: cfg.eager_limit,
        shm_eager_limit: cfg.shm_eager_limit,
        spin: cfg.spin,
        spin_shm: cfg.spin_shm,
        yield_for: cfg.yield_for,
        polite_yield: cfg.polite_yield,
        cma: cfg.cma,
        outnumbered: cfg.outnumbered,
    }
}

/// Remove ring files (after the barrier that follows the mesh, or on failure).
pub(crate) fn unlink_all(paths: &[PathBuf]) {
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

/// One member's view of a group that builds its channels: the job's ranks at start-up, or a
/// spawn group (parent and children).
pub(crate) struct Mesh<'a> {
    /// This process's index in `members`.
    pub me: usize,
    /// World ranks, in group order.
    pub members: &'a [usize],
    /// Each member's published `{addr, host}`, in group order.
    pub all: &'a [Kvs],
    pub token: [u8; 32],
    pub job_id: &'a str,
    /// This process's host identity ([`host_identity`]).
    pub host: &'a str,
}

/// A channel to one member, before it becomes a transport (it can cross threads).
pub(crate) enum Link {
    Tcp(mio::net::TcpStream),
    /// Outbound ring, inbound ring, and the socket for wake-ups and liveness.
    Shm(Box<Ring>, Box<Ring>, mio::net::TcpStream),
}

impl Link {
    pub(crate) fn into_transport(self) -> Box<dyn Transport> {
        match self {
            Link::Tcp(s) => Box::new(TcpTransport::new(s)),
            Link::Shm(tx, rx, s) => Box::new(ShmTransport::new(*tx, *rx, s)),
        }
    }
}

/// The channels [`build_channels`] made.
pub(crate) struct Channels {
    /// Per member (group order): its channel; `None` for this process.
    pub io: Vec<Option<Link>>,
    /// Ring files to unlink once every member has mapped (after the next barrier).
    pub created: Vec<PathBuf>,
    /// Per member, when its connection was authenticated (`None` for this process).
    pub connected_at: Vec<Option<Instant>>,
    /// Per member: it gave this process's host identity (false for this process itself).
    pub same_host: Vec<bool>,
}

/// Create inbound rings for same-host members, connect to every lower member and accept every
/// higher one (authenticated hello both ways), map the outbound rings. The caller fences and
/// then unlinks `created`.
pub(crate) fn build_channels(
    m: &Mesh<'_>,
    cfg: &Config,
    listener: &TcpListener,
    deadline: Instant,
) -> Result<Channels, Error> {
    let n = m.members.len();
    let my_world = m.members[m.me];
    let same_host: Vec<bool> = m
        .all
        .iter()
        .enumerate()
        .map(|(i, k)| i != m.me && k.get("host").map(String::as_str) == Some(m.host))
        .collect();
    let local: Vec<bool> = same_host.iter().map(|&h| h && cfg.shm).collect();

    // Inbound rings from local peers exist before anyone connects to us.
    let mut inbound: Vec<Option<Ring>> = (0..n).map(|_| None).collect();
    let mut created = Vec::new();
    for (i, is_local) in local.iter().enumerate() {
        if *is_local {
            let p = ring_path(m.job_id, m.members[i], my_world);
            let _ = std::fs::remove_file(&p);
            match Ring::create(&p, cfg.shm_ring) {
                Ok(r) => {
                    if cfg.shm_prefault {
                        r.prefault(false);
                    }
                    created.push(p);
                    inbound[i] = Some(r);
                }
                Err(e) => {
                    unlink_all(&created);
                    return Err(Error::Init(format!(
                        "cannot create shared-memory ring {}: {e} (set MUTIRAO_TRANSPORT=tcp to avoid shared memory)",
                        p.display()
                    )));
                }
            }
        }
    }

    let (mut socks, connected_at) = match connect_mesh(m, listener, deadline) {
        Ok(s) => s,
        Err(e) => {
            unlink_all(&created);
            return Err(e);
        }
    };
    // Every peer has created its inbound rings before it spoke to us: map our outbound ones.
    let mut io = Vec::with_capacity(n);
    for i in 0..n {
        let sock = match socks[i].take() {
            Some(s) => {
                if let Err(e) = s.set_nonblocking(true) {
                    unlink_all(&created);
                    return Err(e.into());
                }
                Some(mio::net::TcpStream::from_std(s))
            }
            None => None,
        };
        let t: Option<Link> = match (sock, inbound[i].take()) {
            (Some(sock), Some(rx)) => {
                let w = m.members[i];
                let tx = Ring::open(&ring_path(m.job_id, my_world, w)).map_err(|e| {
                    unlink_all(&created);
                    Error::Init(format!("cannot open the ring to rank {w}: {e}"))
                })?;
                if cfg.shm_prefault {
                    tx.prefault(true);
                }
                Some(Link::Shm(Box::new(tx), Box::new(rx), sock))
            }
            (Some(sock), None) => Some(Link::Tcp(sock)),
            (None, _) => None,
        };
        io.push(t);
    }
    Ok(Channels {
        io,
        created,
        connected_at,
        same_host,
    })
}

/// Join the job described by `env`.
pub fn init_with(env: &JobEnv) -> Result<Comm, Error> {
    if env.bind_to_core {
        bind_to_core(env.local_rank, env.local_ranks)?;
    }
    let t_init = Instant::now();
    let cfg = Config::from_env(env.local_ranks).map_err(Error::Init)?;
    let deadline = Instant::now() + cfg.connect_timeout;
    let t_register = Instant::now();
    let mut pmi = PmiClient::connect(
        &env.pmi_addr,
        env.rank as u32,
        &env.token,
        cfg.connect_timeout,
    )
    .map_err(Error::Init)?;
    let register = t_register.elapsed();

    // A restart: this rank's checkpoint first, and the spawn groups it saved asked for again
    // now, before the job's first fence, so that no new spawn (only possible once every rank
    // passed that fence) takes their world ranks meanwhile (issue 13).
    let pmi_timeout = cfg.connect_timeout.max(env.ckpt_timeout());
    let mut restored: Option<crate::ckpt::RankCheckpoint> = None;
    let mut respawns: Vec<(crate::ckpt::SavedSpawn, Vec<String>)> = Vec::new();
    if let (None, Some(epoch)) = (&env.spawn, env.restart_epoch) {
        let blob = pmi
            .ckpt_get(epoch, pmi_timeout)
            .map_err(|e| Error::Init(format!("restart from epoch {epoch}: {e}")))?;
        let c = crate::ckpt::RankCheckpoint::decode(&blob, epoch, env.rank as u32, env.size as u32)
            .map_err(|e| Error::Init(format!("restart: {e}")))?;
        for sp in &c.spawns {
            let hosts = respawn(&mut pmi, env, epoch, sp)?;
            respawns.push((sp.clone(), hosts));
        }
        restored = Some(c);
    }

    let listener = TcpListener::bind(SocketAddr::new(env.bind, 0))
        .map_err(|e| Error::Init(format!("cannot listen on {}: {e}", env.bind)))?;
    let my_addr = listener.local_addr()?;
    let me = host_identity();
    let mut kvs = Kvs::new();
    kvs.insert("addr".into(), my_addr.to_string());
    kvs.insert("host".into(), me.clone());
    // The job's ranks fence with every rank; a spawned rank with its spawn group only.
    let group_timeout = cfg.connect_timeout + Duration::from_secs(2);
    let members: Vec<usize> = match &env.spawn {
        None => (0..env.size).collect(),
        Some(sp) => sp.members.clone(),
    };
    let my_index = members
        .iter()
        .position(|r| *r == env.rank)
        .ok_or_else(|| Error::Init(format!("rank {} is not in its group", env.rank)))?;
    let fence = |pmi: &mut PmiClient, kvs: Kvs| match &env.spawn {
        None => pmi.fence(kvs, cfg.connect_timeout),
        Some(sp) => pmi.group_fence(sp.group, kvs, group_timeout),
    };
    let t_exchange = Instant::now();
    let all = fence(&mut pmi, kvs).map_err(|e| Error::Init(format!("address exchange: {e}")))?;
    let exchange = t_exchange.elapsed();
    if all.len() != members.len() {
        return Err(Error::Init(format!(
            "the launcher returned {} addresses for {} ranks",
            all.len(),
            members.len()
        )));
    }
    let t_connect = Instant::now();
    let ch = build_channels(
        &Mesh {
            me: my_index,
            members: &members,
            all: &all,
            token: env.token,
            job_id: &env.job_id,
            host: &me,
        },
        &cfg,
        &listener,
        deadline,
    )?;
    let width = members.iter().copied().max().unwrap_or(0) + 1;
    let mut peers: Vec<Peer> = (0..width).map(|_| Peer::unconnected()).collect();
    for ((w, io), same_host) in members.iter().zip(ch.io).zip(ch.same_host) {
        peers[*w] = Peer::new(io.map(Link::into_transport));
        peers[*w].same_host = same_host;
    }
    let connect = t_connect.elapsed();
    let mut timings = InitTimings {
        register,
        exchange,
        connect,
        ..InitTimings::default()
    };
    // When everyone has mapped, the files can go: nothing is left in /dev/shm if a rank dies.
    // The launcher learns this rank's start-up phases here.
    let mut done = Kvs::new();
    done.insert(crate::pmi::INIT_KEY.into(), timings.phases().encode());
    let t_barrier = Instant::now();
    let fenced = fence(&mut pmi, done);
    timings.barrier = t_barrier.elapsed();
    unlink_all(&ch.created);
    fenced.map_err(|e| Error::Init(format!("connection barrier: {e}")))?;
    timings.total = t_init.elapsed();

    let mut engine = Engine::new(env.rank, width, peers, tuning(&cfg))?;
    engine.init_timings = Some(timings);
    if let Some(c) = &restored {
        // Peers send the large messages they held first: keep them for the restore below.
        engine.expect_resent(c.epoch, &c.resent)?;
    }
    engine.launch = Some(crate::spawn::Launch {
        bind: env.bind,
        token: env.token,
        job_id: env.job_id.clone(),
        host: me,
        cfg: cfg.clone(),
    });
    if let Some(sp) = &env.spawn {
        // A parent with checkpoints on brings its children into its waves (docs/spawn.md):
        // they count checkpoint points from their own start, store their checkpoints, and
        // send DONE to the parent. A spawned rank is never restored from MUTIRAO_RESTART_EPOCH
        // (the launcher's environment may carry it): spawn groups are not re-created.
        if let Some(basis) = all.first().and_then(|k| k.get(crate::spawn::CKPT_KEY)) {
            let b = crate::spawn::parse_ckpt_basis(basis).map_err(Error::Init)?;
            let mut restored = None;
            if let Some(epoch) = b.restore {
                // The parent's restart re-created this rank's group: restore its checkpoint.
                let blob = pmi
                    .ckpt_get(epoch, b.pmi_timeout)
                    .map_err(|e| Error::Init(format!("restart from epoch {epoch}: {e}")))?;
                let c = crate::ckpt::RankCheckpoint::decode(
                    &blob,
                    epoch,
                    env.rank as u32,
                    width as u32,
                )
                .map_err(|e| Error::Init(format!("restart: {e}")))?;
                if let Some(g) = c.spawns.first() {
                    return Err(Error::Init(format!(
                        "restart from epoch {epoch}: spawned rank {} had itself spawned group {} \
                         (ranks {:?}) and re-creating a spawned rank's own spawn groups is not \
                         supported; restart from an epoch before that spawn, or spawn from the \
                         job's ranks only",
                        env.rank, g.group, g.members
                    )));
                }
                restored = Some(c);
            }
            engine.ckpt = Some(crate::engine::CkptRt::new(
                crate::ckpt::Wave::spawned(
                    env.rank,
                    members[0],
                    &members[1..],
                    b.parent_points,
                    b.mode,
                    b.after,
                ),
                b.pmi_timeout,
                b.restore.map(|e| (e, env.incarnation)),
            ));
            if let Some(c) = restored {
                restore_into(&mut engine, c, b.pmi_timeout)?;
            }
        }
        engine.spawned_in = Some(sp.group);
        engine._pmi = Some(pmi);
        engine.lost_poll = env.lost_poll.map(|p| (p, Instant::now()));
        let ctx = crate::spawn::spawn_ctx(sp.group);
        engine.scope(ctx, members.clone());
        return Ok(Comm::spawned_root(engine, ctx, members));
    }
    // Re-created spawn groups are connected before the restore, so that saved messages and
    // pending receives of their merged communicators find their channels.
    let mut back = Vec::new();
    if let Some(epoch) = env.restart_epoch {
        for (sp, hosts) in respawns {
            let basis = crate::spawn::restore_basis(env.ckpt_mode, epoch, pmi_timeout);
            back.push(rejoin(
                &mut engine,
                &mut pmi,
                env,
                epoch,
                sp,
                &hosts,
                basis,
            )?);
        }
    }
    if env.ckpt_interval.is_some() || env.restart_epoch.is_some() {
        engine.ckpt = Some(crate::engine::CkptRt::new(
            crate::ckpt::Wave::new(
                env.rank,
                env.size,
                env.ckpt_mode,
                env.restart_epoch.unwrap_or(0),
                env.ckpt_interval.unwrap_or_default(),
                env.ckpt_timeout(),
                Duration::ZERO,
            ),
            pmi_timeout,
            env.restart_epoch.map(|e| (e, env.incarnation)),
        ));
        if let Some(c) = restored {
            restore_into(&mut engine, c, pmi_timeout)?;
        }
    }
    if env.restart_epoch.is_some() {
        let mut groups = Vec::new();
        for (sp, elapsed) in back {
            let members: Vec<usize> = sp.members.iter().map(|m| *m as usize).collect();
            groups.push((sp.group, members.clone(), elapsed));
            engine.ckpt_add_children(sp.group, &members, sp.program, sp.args);
        }
        engine.respawned = Some(groups);
    }
    engine._pmi = Some(pmi);
    engine.lost_poll = env.lost_poll.map(|p| (p, Instant::now()));
    Ok(Comm::world(engine))
}

/// Restore checkpoint `c` into `engine` (its waves already set up, so that markers arriving
/// meanwhile are understood; see `Engine::restore` for the order) and keep the program's
/// state and requests for `Comm::restored` and `Comm::restored_requests`.
fn restore_into(
    engine: &mut Engine,
    c: crate::ckpt::RankCheckpoint,
    timeout: Duration,
) -> Result<(), Error> {
    let (app, reqs) = engine.restore(c, timeout)?;
    if let Some(ck) = engine.ckpt.as_mut() {
        ck.restored_app = Some(app);
        ck.restored_reqs = Some(reqs);
    }
    Ok(())
}

/// How long a restart waits for a re-created spawn group (as a spawn's default timeout).
const RESPAWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Ask the launcher to start the children of saved spawn group `sp` again (their world ranks
/// and group id as saved); returns the hosts it started them on.
fn respawn(
    pmi: &mut PmiClient,
    env: &JobEnv,
    epoch: u64,
    sp: &crate::ckpt::SavedSpawn,
) -> Result<Vec<String>, Error> {
    if sp.members.first() != Some(&(env.rank as u32)) || sp.members.len() < 2 {
        return Err(Error::Init(format!(
            "restart from epoch {epoch}: rank {}'s checkpoint names spawn group {} with members \
             {:?}, whose parent is not this rank: a checkpoint of another job?",
            env.rank, sp.group, sp.members
        )));
    }
    let (_, _, hosts) = pmi
        .respawn(
            std::path::Path::new(&sp.program),
            &sp.args,
            sp.group,
            &sp.members[1..],
            RESPAWN_TIMEOUT,
            &env.job_id,
        )
        .map_err(|e| {
            Error::Init(format!(
                "restart from epoch {epoch}: its waves included spawn group {} (ranks {:?} of {}), \
                 which could not be started again: {e}",
                sp.group,
                &sp.members[1..],
                sp.program
            ))
        })?;
    Ok(hosts)
}

/// Connect to the re-created children of `sp` (they restore their own checkpoints of `epoch`);
/// returns the group and how long it took.
fn rejoin(
    engine: &mut Engine,
    pmi: &mut PmiClient,
    env: &JobEnv,
    epoch: u64,
    sp: crate::ckpt::SavedSpawn,
    hosts: &[String],
    basis: String,
) -> Result<(crate::ckpt::SavedSpawn, Duration), Error> {
    let t0 = Instant::now();
    let launch = engine
        .launch
        .clone()
        .ok_or_else(|| Error::Init("no launcher settings to re-create spawn groups".into()))?;
    let ranks: Vec<u32> = sp.members[1..].to_vec();
    let fail = |e: Error| {
        Error::Init(format!(
            "restart from epoch {epoch}: re-creating spawn group {} (ranks {ranks:?}): {e}",
            sp.group
        ))
    };
    let listener = TcpListener::bind(SocketAddr::new(env.bind, 0))
        .map_err(|e| fail(Error::Spawn(format!("cannot listen on {}: {e}", env.bind))))?;
    let spec = crate::spawn::SpawnSpec::new(ranks.len()).timeout(RESPAWN_TIMEOUT);
    let joined = crate::spawn::join_group(
        pmi,
        &launch,
        env.rank,
        &spec,
        t0,
        sp.group,
        &ranks,
        hosts,
        &listener,
        Some(basis),
    );
    let (group, _, chans, _) = match joined {
        Ok(j) => j,
        Err(err) => {
            let _ = pmi.spawn_cancel(sp.group, &err.to_string(), Duration::from_secs(2));
            return Err(fail(err));
        }
    };
    crate::spawn::add(engine, chans).map_err(fail)?;
    let ctx = crate::spawn::spawn_ctx(group);
    engine.scope(ctx, sp.members.iter().map(|m| *m as usize).collect());
    Ok((sp, t0.elapsed()))
}

/// Connect to every lower member, accept every higher one; authenticate both ways. Returns the
/// sockets and when each was authenticated, per member.
#[allow(clippy::type_complexity)]
fn connect_mesh(
    m: &Mesh<'_>,
    listener: &TcpListener,
    deadline: Instant,
) -> Result<(Vec<Option<TcpStream>>, Vec<Option<Instant>>), Error> {
    let n = m.members.len();
    let my_world = m.members[m.me];
    let hello = Hello {
        version: PROTOCOL_VERSION,
        rank: my_world as u32,
        token: m.token,
    }
    .encode();
    // Ranks that may appear in a hello: below the largest member.
    let bound = (m.members.iter().copied().max().unwrap_or(0) as u32).saturating_add(1);
    let index_of = |w: u32| m.members.iter().position(|r| *r == w as usize);
    let mut socks: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let mut when: Vec<Option<Instant>> = vec![None; n];
    let remaining = |d: Instant| {
        d.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    // 1. Connect down and say hello (completes in the peer's accept backlog).
    for (j, kv) in m.all.iter().enumerate().take(m.me) {
        let w = m.members[j];
        let addr: SocketAddr = kv
            .get("addr")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| Error::Init(format!("rank {w} published no valid address")))?;
        let mut s = loop {
            match TcpStream::connect_timeout(&addr, remaining(deadline)) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    return Err(Error::Init(format!(
                        "cannot connect to rank {w} at {addr}: {e}"
                    )))
                }
            }
        };
        s.set_nodelay(true)?;
        same_host_congestion(&s);
        s.write_all(&hello)
            .map_err(|e| Error::Init(format!("handshake with rank {w}: {e}")))?;
        socks[j] = Some(s);
    }
    // 2. Accept up, check their hello, answer.
    listener.set_nonblocking(true)?;
    let mut expected = n - m.me - 1;
    while expected > 0 {
        match listener.accept() {
            Ok((mut s, from)) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(remaining(deadline).min(Duration::from_secs(10))))?;
                let mut buf = [0u8; HELLO_LEN];
                let theirs = s
                    .read_exact(&mut buf)
                    .map_err(|e| e.to_string())
                    .and_then(|_| {
                        Hello::decode_checked(&buf, &m.token, bound).map_err(|e| e.to_string())
                    });
                match theirs.map(|h| (h.rank, index_of(h.rank))) {
                    Ok((_, Some(i))) if i > m.me && socks[i].is_none() => {
                        s.set_nodelay(true)?;
                        same_host_congestion(&s);
                        s.write_all(&hello).map_err(|e| {
                            Error::Init(format!("handshake with rank {}: {e}", m.members[i]))
                        })?;
                        s.set_read_timeout(None)?;
                        socks[i] = Some(s);
                        when[i] = Some(Instant::now());
                        expected -= 1;
                    }
                    Ok((r, _)) => {
                        eprintln!(
                            "mutirao: rank {my_world}: refused a duplicate or misdirected connection claiming rank {r} from {from}"
                        );
                    }
                    Err(e) => {
                        // Not one of ours: refuse and go on waiting for the real peers.
                        eprintln!(
                            "mutirao: rank {my_world}: refused a connection from {from}: {e}"
                        );
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<usize> = (m.me + 1..n)
                        .filter(|i| socks[*i].is_none())
                        .map(|i| m.members[i])
                        .collect();
                    return Err(Error::Init(format!(
                        "timed out waiting for ranks {missing:?} to connect"
                    )));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => return Err(Error::Init(format!("accept failed: {e}"))),
        }
    }
    // 3. Read the answers of the lower members.
    for (j, s) in socks.iter_mut().enumerate().take(m.me) {
        let w = m.members[j];
        let s = s.as_mut().expect("connected in step 1");
        s.set_read_timeout(Some(remaining(deadline)))?;
        let mut buf = [0u8; HELLO_LEN];
        s.read_exact(&mut buf)
            .map_err(|e| Error::Init(format!("handshake with rank {w}: no answer: {e}")))?;
        let h = Hello::decode_checked(&buf, &m.token, bound)
            .map_err(|e| Error::Init(format!("handshake with rank {w}: {e}")))?;
        if h.rank as usize != w {
            return Err(Error::Init(format!(
                "the address of rank {w} answered as rank {}",
                h.rank
            )));
        }
        s.set_read_timeout(None)?;
        when[j] = Some(Instant::now());
    }
    Ok((socks, when))
}

/// The congestion control a TCP connection between two ranks of one host uses: the kernel's
/// default may pace its sends (BBR), and on loopback there is no network to be fair to, so the
/// pacing only delays: with BBR, a one-way 4 MiB message took 890–960 µs, with CUBIC 520–580
/// (Open MPI, sharing the default: 640–680 and 510–550; 2026-11-27).
const SAME_HOST_CONGESTION: [&str; 2] = ["cubic", "reno"];

/// Whether a connection joins two ends of one host (a loopback peer, or our own address).
fn same_host(s: &TcpStream) -> bool {
    match (s.peer_addr(), s.local_addr()) {
        (Ok(p), Ok(l)) => p.ip().is_loopback() || p.ip() == l.ip(),
        _ => false,
    }
}

/// Give a same-host rank connection [`SAME_HOST_CONGESTION`] (the first the kernel allows);
/// connections between hosts keep the administrator's choice. Best effort: without either,
/// the connection keeps the default.
fn same_host_congestion(s: &TcpStream) {
    if !same_host(s) {
        return;
    }
    for cc in SAME_HOST_CONGESTION {
        if rustix::net::sockopt::set_tcp_congestion(s, cc).is_ok() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{core_for, JobEnv, Mode};

    /// A loopback connection between two ranks is a same-host one and leaves the kernel's
    /// default congestion control (BBR here) for CUBIC, or Reno, which every kernel has.
    #[test]
    fn a_same_host_rank_connection_gives_up_pacing() {
        use rustix::net::sockopt::tcp_congestion;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        assert!(super::same_host(&a) && super::same_host(&b));
        for s in [&a, &b] {
            super::same_host_congestion(s);
            let cc = tcp_congestion(s).unwrap();
            assert!(
                super::SAME_HOST_CONGESTION.contains(&cc.as_str()),
                "congestion control {cc:?}"
            );
        }
    }
    use std::collections::HashMap;
    use std::time::Duration;

    fn parse(vars: &[(String, String)]) -> Result<Option<JobEnv>, crate::Error> {
        let m: HashMap<String, String> = vars.iter().cloned().collect();
        JobEnv::from_vars(&|k| m.get(k).cloned())
    }

    #[test]
    fn to_env_reads_back_as_the_same_job_env() {
        let base = [
            ("MUTIRAO_RANK", "2"),
            ("MUTIRAO_SIZE", "4"),
            ("MUTIRAO_PMI_ADDR", "127.0.0.1:9"),
            ("MUTIRAO_JOB_TOKEN", &"ab".repeat(32)),
            ("MUTIRAO_JOB_ID", "j-1"),
            ("MUTIRAO_CKPT_INTERVAL", "0.05"),
            ("MUTIRAO_CKPT_MODE", "nonblocking"),
            ("MUTIRAO_RESTART_EPOCH", "7"),
            ("MUTIRAO_INCARNATION", "2"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let e = parse(&base).unwrap().unwrap();
        assert_eq!(e.ckpt_interval, Some(Duration::from_millis(50)));
        assert_eq!(e.ckpt_mode, Mode::Nonblocking);
        assert_eq!(e.restart_epoch, Some(7));
        assert_eq!(e.incarnation, 2);
        assert_eq!(e.ckpt_timeout(), Duration::from_secs(60));
        let back = parse(&e.to_env()).unwrap().unwrap();
        assert_eq!(back.to_env(), e.to_env());
        assert_eq!(back.restart_epoch, Some(7));
        assert_eq!(back.ckpt_interval, e.ckpt_interval);
        assert_eq!(back.token, e.token);
        // A fresh start without checkpoints leaves the optional variables out.
        let plain: Vec<_> = base[..5].to_vec();
        let p = parse(&plain).unwrap().unwrap();
        assert_eq!(
            (p.ckpt_interval, p.restart_epoch, p.incarnation),
            (None, None, 0)
        );
        assert!(!p.to_env().iter().any(|(k, _)| k == "MUTIRAO_RESTART_EPOCH"));
        let mut bad = plain.clone();
        bad.push(("MUTIRAO_CKPT_MODE".into(), "sometimes".into()));
        assert!(parse(&bad)
            .unwrap_err()
            .to_string()
            .contains("MUTIRAO_CKPT_MODE"));
        let mut bad = plain;
        bad.push(("MUTIRAO_CKPT_INTERVAL".into(), "-1".into()));
        assert!(parse(&bad)
            .unwrap_err()
            .to_string()
            .contains("MUTIRAO_CKPT_INTERVAL"));
    }

    #[test]
    fn spawned_rank_env_reads_back_and_bad_groups_are_refused() {
        let base: Vec<(String, String)> = [
            ("MUTIRAO_RANK", "5"),
            ("MUTIRAO_SIZE", "4"),
            ("MUTIRAO_PMI_ADDR", "127.0.0.1:9"),
            ("MUTIRAO_JOB_TOKEN", &"ab".repeat(32)),
            ("MUTIRAO_JOB_ID", "j-1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .to_vec();
        // A rank above the job's size is an error unless it was spawned.
        let e = parse(&base).unwrap_err().to_string();
        assert!(e.contains("not below MUTIRAO_SIZE"), "{e}");
        let with = |members: &str| {
            let mut v = base.clone();
            v.push(("MUTIRAO_SPAWN_GROUP".into(), "3".into()));
            v.push(("MUTIRAO_SPAWN_MEMBERS".into(), members.into()));
            parse(&v)
        };
        let env = with("1,4,5").unwrap().unwrap();
        assert_eq!(
            env.spawn,
            Some(super::SpawnEnv {
                group: 3,
                members: vec![1, 4, 5]
            })
        );
        let back = parse(&env.to_env()).unwrap().unwrap();
        assert_eq!(back.spawn, env.spawn);
        for bad in ["5,4", "1,4", "1,5,5", "1,x,5", "", "1,5,99999999"] {
            let e = with(bad).unwrap_err().to_string();
            assert!(e.contains("MUTIRAO_SPAWN_MEMBERS"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_process_without_a_launcher_has_no_init_timings() {
        let w = super::init_alone().unwrap();
        assert_eq!(w.init_timings(), None);
    }

    #[test]
    fn bind_to_core_fills_the_allowed_cores_in_blocks() {
        let on = |allowed: &[usize], n: usize| -> Vec<Option<usize>> {
            (0..n).map(|r| core_for(allowed, r, n)).collect()
        };
        // More ranks than cores: consecutive ranks share a core.
        let two = [0, 1];
        assert_eq!(on(&two, 8), [0, 0, 0, 0, 1, 1, 1, 1].map(Some).to_vec());
        // Fewer ranks than cores: spread out.
        assert_eq!(on(&[0, 1, 2, 3], 2), vec![Some(0), Some(2)]);
        // Only the cores this process may use (a cpuset), in order.
        assert_eq!(on(&[3, 5], 4), [3, 3, 5, 5].map(Some).to_vec());
        // Nothing to pin to; a local rank past the count takes the last core.
        assert_eq!(core_for(&[], 0, 1), None);
        assert_eq!(core_for(&[0, 1], 0, 0), None);
        assert_eq!(core_for(&[0, 1], 9, 2), Some(1));
    }
}
