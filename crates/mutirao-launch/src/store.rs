//! Where a job's checkpoints go (issue 12 item 3): a directory on the launcher's machine, replicas
//! on the agents of the hostfile (k other hosts than the rank's own), or S3-compatible object
//! storage — the two last through `mutirao_ckpt`'s checksummed repository.

use crate::hostfile::HostEntry;
use crate::job::authenticate;
use crate::proto::{self, Msg};
use anyhow::{bail, Context};
use mutirao_ckpt::remote::{ReadWrite, RemoteStore};
use mutirao_ckpt::replicated::{Peer, Replicated};
use mutirao_ckpt::repo::{parse_rank_key, CheckpointRepo, RepoSink};
use mutirao_ckpt::{BlobStore, S3Config, S3Store};
use std::io::BufReader;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// A `--checkpoint-store` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKind {
    /// A directory of the launcher's machine (`--checkpoint-dir`).
    Dir,
    /// Replicas on `k` agents other than the rank's own host.
    Agents { k: usize },
    /// `s3://BUCKET[/PREFIX]`; endpoint, region and credentials from the `AWS_*` variables.
    S3 { bucket: String, prefix: String },
}

impl std::str::FromStr for StoreKind {
    type Err = String;
    fn from_str(s: &str) -> Result<StoreKind, String> {
        if s == "dir" {
            return Ok(StoreKind::Dir);
        }
        if s == "agents" {
            return Ok(StoreKind::Agents { k: 2 });
        }
        if let Some(k) = s.strip_prefix("agents:") {
            let k: usize = k.parse().map_err(|_| {
                format!("agents:{k}: the number of replicas must be a whole number")
            })?;
            if k == 0 {
                return Err("agents:0: at least one replica is needed".into());
            }
            return Ok(StoreKind::Agents { k });
        }
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err("s3://: no bucket named (s3://BUCKET[/PREFIX])".into());
            }
            return Ok(StoreKind::S3 {
                bucket: bucket.to_string(),
                prefix: prefix.trim_end_matches('/').to_string(),
            });
        }
        Err(format!(
            "{s:?} is not a checkpoint store: use dir, agents, agents:K or s3://BUCKET[/PREFIX]"
        ))
    }
}

/// A blob session with the agent of `host`: connect, authenticate, ask for the store, confined
/// to `scope` ([`proto::checkpoint_scope`]).
pub fn connect_store(
    host: &HostEntry,
    secret: &[u8],
    scope: &str,
) -> std::io::Result<Box<dyn ReadWrite + Send>> {
    let err = |m: String| std::io::Error::other(m);
    let addr = (host.host.as_str(), host.port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| err(format!("host {:?} has no address", host.host)))?;
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_nodelay(true).ok();
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.set_write_timeout(Some(Duration::from_secs(30)))?;
    let r = BufReader::new(s.try_clone()?);
    let sess = authenticate(r, s, secret)
        .map_err(|e| err(format!("agent of {} at {addr}: {e:#}", host.host)))?;
    let (mut r, mut w) = (sess.reader, sess.writer);
    proto::write_msg(
        &mut w,
        &Msg::Store {
            scope: scope.to_string(),
        },
    )?;
    match proto::read_msg(&mut r).map_err(err)? {
        Some(Msg::Ready) => {}
        Some(Msg::Error { msg }) => {
            return Err(err(format!(
                "agent of {} refused to keep checkpoints: {msg}",
                host.host
            )))
        }
        other => {
            return Err(err(format!(
                "agent of {}: unexpected answer to a store request: {other:?}",
                host.host
            )))
        }
    }
    Ok(Box::new(mutirao::seal::SealedStream {
        reader: r,
        writer: w,
    }))
}

pub use crate::hostfile::agent_name;

/// Which agent ([`agent_name`]) holds each rank now (updated at every incarnation), for keeping
/// a rank's replicas off its own host.
pub type RankHosts = Arc<RwLock<Vec<String>>>;

/// The ranks' checkpoints replicated on `k` agents of `hosts` other than the producing rank's,
/// in the scope `scope` of each agent's store ([`proto::checkpoint_scope`] of the job).
pub fn on_agents(
    hosts: &[HostEntry],
    secret: &[u8],
    scope: &str,
    k: usize,
    rank_hosts: RankHosts,
) -> anyhow::Result<Replicated> {
    let mut seen = Vec::new();
    let mut peers: Vec<Peer> = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        let id = (h.host.clone(), h.port);
        if seen.contains(&id) {
            continue;
        }
        seen.push(id);
        let host = h.clone();
        let secret = secret.to_vec();
        let scope = scope.to_string();
        let name = agent_name(hosts, i);
        let store = RemoteStore::new(name.clone(), move || connect_store(&host, &secret, &scope));
        peers.push((name, Arc::new(store) as Arc<dyn BlobStore>));
    }
    if peers.len() <= k {
        bail!(
            "--checkpoint-store agents:{k} needs at least {} distinct agents in the hostfile (one rank's own host never holds its replicas); it has {}: use agents:{} or dir",
            k + 1,
            peers.len(),
            peers.len().saturating_sub(1).max(1)
        );
    }
    // After hosts are lost (recovery leaves them out) fewer than k others may be left: the job
    // goes on checkpointing with as many replicas as there are (at least one, off the
    // producer's host) rather than with none.
    let rep = Replicated::new(peers, k)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_min_replicas(1);
    Ok(rep.with_producer(Arc::new(move |key: &str| {
        let (_, _, rank) = parse_rank_key(key)?;
        rank_hosts.read().ok()?.get(rank as usize).cloned()
    })))
}

/// A checkpoint sink over `store` for job `job` of `n` ranks, its checksums keyed under
/// `key` when given (a store others can write to: agents, object storage).
pub fn repo_sink<S: BlobStore + 'static>(
    store: S,
    job: &str,
    n: usize,
    key: Option<[u8; 32]>,
) -> anyhow::Result<Arc<JobSink<S>>> {
    let mut repo = CheckpointRepo::new(store, job).map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(k) = key {
        repo = repo.with_key(k);
    }
    Ok(Arc::new(JobSink {
        inner: RepoSink::new(repo, n as u32),
        n: n as u32,
    }))
}

/// `mutirao_ckpt`'s repository sink for a job of `n` ranks that also keeps the checkpoints of
/// spawned ranks (world ranks `n` and above, issue 13: they are in the waves once spawned).
/// A commit needs the job's `n` ranks' blobs here; the bootstrap server has already checked
/// the spawned members' (`mutirao::pmi`). Their blobs live under the same epoch as the job's
/// and are collected with it.
pub struct JobSink<S: BlobStore> {
    inner: RepoSink<S>,
    n: u32,
}

impl<S: BlobStore> JobSink<S> {
    /// The repository.
    pub fn repo(&self) -> &CheckpointRepo<S> {
        self.inner.repo()
    }

    /// Seconds from the first blob of a wave to its commit, for every wave committed so far.
    pub fn wave_costs(&self) -> Vec<f64> {
        self.inner.wave_costs()
    }
}

impl<S: BlobStore> mutirao::pmi::CheckpointSink for JobSink<S> {
    fn put(&self, epoch: u64, rank: u32, blob: &[u8]) -> Result<(), String> {
        if rank < self.n {
            return self.inner.put(epoch, rank, blob);
        }
        if rank >= mutirao::pmi::MAX_WORLD_RANK {
            return Err(format!(
                "rank {rank} is not a world rank (at most {})",
                mutirao::pmi::MAX_WORLD_RANK - 1
            ));
        }
        self.inner
            .repo()
            .put_rank(epoch, rank, blob)
            .map_err(|e| e.to_string())
    }

    fn get(&self, epoch: u64, rank: u32) -> Result<Vec<u8>, String> {
        self.inner.get(epoch, rank)
    }

    fn commit(&self, epoch: u64) -> Result<(), String> {
        self.inner.commit(epoch)
    }

    fn last_committed(&self) -> Result<Option<u64>, String> {
        self.inner.last_committed()
    }
}

/// Delete every key of `repo`'s job (its checkpoints and commit record); returns how many.
pub fn forget<S: BlobStore>(repo: &CheckpointRepo<S>) -> Result<usize, String> {
    let prefix = format!("jobs/{}/", repo.job());
    let keys = repo.store().list(&prefix).map_err(|e| e.to_string())?;
    // The commit record first: an interrupted clean-up leaves no record naming a deleted epoch.
    let (commit, rest): (Vec<String>, Vec<String>) =
        keys.into_iter().partition(|k| k == &repo.commit_key());
    for k in commit.iter().chain(&rest) {
        repo.store().delete(k).map_err(|e| e.to_string())?;
    }
    Ok(rest.len() + commit.len())
}

/// An S3 store from `s3://BUCKET/PREFIX` and the `AWS_*` environment.
pub fn s3(bucket: &str, prefix: &str) -> anyhow::Result<S3Store> {
    let mut cfg = S3Config::from_env(bucket);
    if !prefix.is_empty() {
        cfg.prefix = prefix.to_string();
    }
    S3Store::new(&cfg)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("cannot use s3://{bucket}/{prefix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_kinds_parse_with_clear_errors() {
        assert_eq!("dir".parse::<StoreKind>().unwrap(), StoreKind::Dir);
        assert_eq!(
            "agents".parse::<StoreKind>().unwrap(),
            StoreKind::Agents { k: 2 }
        );
        assert_eq!(
            "agents:3".parse::<StoreKind>().unwrap(),
            StoreKind::Agents { k: 3 }
        );
        assert_eq!(
            "s3://ckpts/lab/run1/".parse::<StoreKind>().unwrap(),
            StoreKind::S3 {
                bucket: "ckpts".into(),
                prefix: "lab/run1".into()
            }
        );
        assert!("agents:0".parse::<StoreKind>().is_err());
        assert!("agents:x".parse::<StoreKind>().is_err());
        assert!("s3://".parse::<StoreKind>().is_err());
        let e = "ftp://x".parse::<StoreKind>().unwrap_err();
        assert!(e.contains("dir, agents"), "{e}");
    }

    #[test]
    fn a_repository_sink_keeps_spawned_ranks_checkpoints_and_collects_them_with_their_epoch() {
        use mutirao::pmi::CheckpointSink;
        let d = std::env::temp_dir().join(format!("mutirao-jobsink-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let s = repo_sink(mutirao_ckpt::DirStore::open(&d).unwrap(), "j1", 2, None).unwrap();
        for e in [1, 2] {
            for r in [0, 1, 5] {
                s.put(e, r, format!("{e}/{r}").as_bytes()).unwrap();
            }
        }
        assert!(s.put(1, mutirao::pmi::MAX_WORLD_RANK, b"x").is_err());
        s.commit(1).unwrap();
        assert_eq!(s.get(1, 5).unwrap(), b"1/5");
        s.commit(2).unwrap();
        assert_eq!(s.last_committed().unwrap(), Some(2));
        assert_eq!(s.get(2, 5).unwrap(), b"2/5");
        assert!(
            s.get(1, 5).is_err(),
            "epoch 1's spawned checkpoint collected"
        );
        // The job's own ranks are still required.
        s.put(3, 5, b"3/5").unwrap();
        s.put(3, 0, b"3/0").unwrap();
        assert!(s.commit(3).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn too_few_agents_for_k_replicas_is_refused() {
        let hosts = crate::hostfile::parse("a port=1\nb port=2").unwrap();
        let e = on_agents(
            &hosts,
            b"secret-secret-secret",
            &"0".repeat(64),
            2,
            Arc::default(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("at least 3 distinct agents"), "{e}");
    }
}
