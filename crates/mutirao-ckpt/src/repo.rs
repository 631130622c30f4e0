//! [`CheckpointRepo`]: a job's checkpoints in any [`BlobStore`], and [`RepoSink`], the launcher's
//! `mutirao::pmi::CheckpointSink` over it.
//!
//! Layout: `jobs/<job>/<epoch>/<rank>.ckpt` holds rank `rank`'s checkpoint of `epoch`, a
//! [`Header`] (magic, format version, job id, epoch, rank, length, checksum) followed by
//! the data; `jobs/<job>/COMMITTED` is the commit record (magic, version, job id, epoch, number of
//! ranks, checksum of the record).
//!
//! Checksums: format version 1 (a repository without a key) holds the SHA-256 of the data (of
//! the record); version 2 (a repository [`CheckpointRepo::with_key`], as every launcher opens
//! one for a store others can reach) holds an HMAC-SHA256 under the job's checkpoint key over
//! the header and the data (over the record). Whoever can write to the store but does not hold
//! the key cannot make a blob or a commit record that a keyed repository accepts: a forged,
//! moved or unkeyed blob is an error, never restored. Every store's `put` is atomic, so the record names either the old
//! or the new epoch; rank blobs of an epoch are only written while it is newer than the committed
//! one, and only epochs older than the committed one are collected. A crash at any point therefore
//! leaves the last committed epoch readable.

use crate::{check_key, BlobStore, StoreError};
use mutirao::pmi::CheckpointSink;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Instant;

const BLOB_MAGIC: &[u8; 4] = b"MCKP";
const COMMIT_MAGIC: &[u8; 4] = b"MCKC";
/// Format version of blob headers and commit records without a key (SHA-256 checksums).
pub const FORMAT_VERSION: u16 = 1;
/// Format version of blob headers and commit records under a job key (HMAC-SHA256).
pub const KEYED_FORMAT_VERSION: u16 = 2;
const BLOB_LABEL: &str = "mutirao-ckpt-blob-v2";
const COMMIT_LABEL: &str = "mutirao-ckpt-commit-v2";
/// Longest job id (bytes).
pub const MAX_JOB_LEN: usize = 200;

/// What a checkpoint blob says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub job: String,
    pub epoch: u64,
    pub rank: u32,
    /// Length of the data after the header.
    pub len: u64,
    /// [`FORMAT_VERSION`] or [`KEYED_FORMAT_VERSION`].
    pub version: u16,
    /// SHA-256 of the data (version 1), or HMAC-SHA256 of the header and the data under the
    /// job key (version 2).
    pub sum: [u8; 32],
}

/// A little-endian reader that reports what it could not read instead of panicking.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        match self.at.checked_add(n) {
            Some(end) if end <= self.b.len() => {
                let s = &self.b[self.at..end];
                self.at = end;
                Ok(s)
            }
            _ => Err(format!(
                "truncated: {} bytes end inside the {what} field",
                self.b.len()
            )),
        }
    }
    fn u16(&mut self, what: &str) -> Result<u16, String> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(a))
    }
    fn magic_version(&mut self, magic: &[u8; 4], kind: &str) -> Result<u16, String> {
        let m = self.take(4, "magic")?;
        if m != magic {
            return Err(format!("not a {kind} (bad magic {m:02x?})"));
        }
        let v = self.u16("version")?;
        if v != FORMAT_VERSION && v != KEYED_FORMAT_VERSION {
            return Err(format!(
                "{kind} format version {v}, this build reads versions {FORMAT_VERSION} and \
                 {KEYED_FORMAT_VERSION}"
            ));
        }
        Ok(v)
    }
    fn job(&mut self) -> Result<String, String> {
        let n = self.u16("job id length")? as usize;
        if n > MAX_JOB_LEN {
            return Err(format!(
                "job id of {n} bytes, above the {MAX_JOB_LEN}-byte limit"
            ));
        }
        let s = self.take(n, "job id")?;
        String::from_utf8(s.to_vec()).map_err(|_| "job id is not UTF-8".to_string())
    }
}

fn put_job(out: &mut Vec<u8>, job: &str) {
    // Job ids are checked at CheckpointRepo::new, so they fit in MAX_JOB_LEN.
    let b = &job.as_bytes()[..job.len().min(MAX_JOB_LEN)];
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

impl Header {
    /// The unkeyed (version 1) header for `data`.
    pub fn for_data(job: &str, epoch: u64, rank: u32, data: &[u8]) -> Header {
        Header {
            job: job.to_string(),
            epoch,
            rank,
            len: data.len() as u64,
            version: FORMAT_VERSION,
            sum: Sha256::digest(data).into(),
        }
    }

    /// The header for `data` under the job key `key` (version 2): its checksum is an HMAC of
    /// the header's fields and the data.
    pub fn sealed(key: &[u8; 32], job: &str, epoch: u64, rank: u32, data: &[u8]) -> Header {
        let mut h = Header {
            version: KEYED_FORMAT_VERSION,
            ..Header::for_data(job, epoch, rank, &[])
        };
        h.len = data.len() as u64;
        h.sum = h.keyed_sum(key, data);
        h
    }

    /// What the checksum of a version-2 header of these fields over `data` must be.
    fn keyed_sum(&self, key: &[u8; 32], data: &[u8]) -> [u8; 32] {
        mutirao::seal::mac(key, BLOB_LABEL, &[&self.prefix(), data])
    }

    /// Everything but the checksum.
    fn prefix(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.job.len());
        out.extend_from_slice(BLOB_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        put_job(&mut out, &self.job);
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.rank.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out
    }

    /// The header's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.prefix();
        out.extend_from_slice(&self.sum);
        out
    }

    /// Reads a header from the start of `bytes`; returns it and its length in bytes.
    pub fn decode(bytes: &[u8]) -> Result<(Header, usize), String> {
        let mut c = Cursor { b: bytes, at: 0 };
        let version = c.magic_version(BLOB_MAGIC, "mutirão checkpoint")?;
        let job = c.job()?;
        let epoch = c.u64("epoch")?;
        let rank = c.u32("rank")?;
        let len = c.u64("length")?;
        let mut sum = [0u8; 32];
        sum.copy_from_slice(c.take(32, "checksum")?);
        Ok((
            Header {
                job,
                epoch,
                rank,
                len,
                version,
                sum,
            },
            c.at,
        ))
    }
}

/// Why a blob or a record of version `have` is not one a repository keyed as `key` takes.
fn version_problem(have: u16, key: Option<&[u8; 32]>) -> Option<String> {
    match (have, key) {
        (FORMAT_VERSION, Some(_)) => Some(
            "it carries no key (format version 1) while this job's checkpoints are keyed: \
             anyone who can write to the store could have made it, so it is not trusted"
                .into(),
        ),
        (KEYED_FORMAT_VERSION, None) => Some(
            "it is keyed (format version 2) and this repository was opened without the job's \
             checkpoint key"
                .into(),
        ),
        _ => None,
    }
}

/// Encodes a commit record (keyed when `key` is given).
fn encode_commit(key: Option<&[u8; 32]>, job: &str, epoch: u64, nranks: u32) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(COMMIT_MAGIC);
    let version = if key.is_some() {
        KEYED_FORMAT_VERSION
    } else {
        FORMAT_VERSION
    };
    out.extend_from_slice(&version.to_le_bytes());
    put_job(&mut out, job);
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&nranks.to_le_bytes());
    let sum = commit_sum(key, &out);
    out.extend_from_slice(&sum);
    out
}

fn commit_sum(key: Option<&[u8; 32]>, body: &[u8]) -> [u8; 32] {
    match key {
        Some(k) => mutirao::seal::mac(k, COMMIT_LABEL, &[body]),
        None => Sha256::digest(body).into(),
    }
}

/// Decodes a commit record: (job, epoch, nranks), checking its checksum as `key` says.
fn decode_commit(key: Option<&[u8; 32]>, bytes: &[u8]) -> Result<(String, u64, u32), String> {
    let mut c = Cursor { b: bytes, at: 0 };
    let version = c.magic_version(COMMIT_MAGIC, "commit record")?;
    let job = c.job()?;
    let epoch = c.u64("epoch")?;
    let nranks = c.u32("number of ranks")?;
    let body = c.at;
    let sum = c.take(32, "checksum")?;
    if let Some(p) = version_problem(version, key) {
        return Err(p);
    }
    if !mutirao::wire::constant_time_eq(&commit_sum(key, &bytes[..body]), sum) {
        return Err(if key.is_some() {
            "checksum mismatch: the commit record is corrupt or was not written with this \
             job's key"
                .into()
        } else {
            "checksum mismatch: the commit record is corrupt".into()
        });
    }
    if c.at != bytes.len() {
        return Err(format!(
            "{} unexpected bytes after the record",
            bytes.len() - c.at
        ));
    }
    Ok((job, epoch, nranks))
}

/// What went wrong with a job's checkpoints, naming the key and what to do.
#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("checkpoint {key} is missing; the epoch cannot be restored from this store")]
    Missing { key: String },
    #[error("checkpoint {key} is unusable: {problem}; nothing was restored from it")]
    Bad { key: String, problem: String },
    #[error("cannot commit epoch {epoch} of job {job}: {why}")]
    Commit {
        job: String,
        epoch: u64,
        why: String,
    },
    #[error("cannot write {key}: {why}")]
    Refused { key: String, why: String },
    #[error("invalid job id {job:?}: {why}")]
    InvalidJob { job: String, why: String },
}

/// One job's checkpoints in a store.
pub struct CheckpointRepo<S: BlobStore> {
    store: S,
    job: String,
    /// The job's checkpoint key: checksums are HMACs under it (format version 2).
    key: Option<[u8; 32]>,
}

impl<S: BlobStore> CheckpointRepo<S> {
    /// The checkpoints of `job` (one key segment: letters, digits, `.`, `_`, `-`) in `store`.
    pub fn new(store: S, job: &str) -> Result<CheckpointRepo<S>, RepoError> {
        let invalid = |why: String| RepoError::InvalidJob {
            job: job.to_string(),
            why,
        };
        if job.contains('/') {
            return Err(invalid("contains '/'".into()));
        }
        if job.len() > MAX_JOB_LEN {
            return Err(invalid(format!("longer than {MAX_JOB_LEN} bytes")));
        }
        check_key(job).map_err(|e| invalid(e.to_string()))?;
        Ok(CheckpointRepo {
            store,
            job: job.to_string(),
            key: None,
        })
    }

    /// The same repository with checksums keyed under `key` (HMAC-SHA256, format version 2):
    /// it writes only keyed blobs and commit records, and reads back only those made under the
    /// same key. A launcher makes a fresh key per job for stores others can write to (agents,
    /// object storage).
    pub fn with_key(mut self, key: [u8; 32]) -> CheckpointRepo<S> {
        self.key = Some(key);
        self
    }

    /// The job id.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The underlying store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The key of `rank`'s checkpoint of `epoch`.
    pub fn rank_key(&self, epoch: u64, rank: u32) -> String {
        format!("jobs/{}/{epoch}/{rank}.ckpt", self.job)
    }

    /// The key of the commit record.
    pub fn commit_key(&self) -> String {
        format!("jobs/{}/COMMITTED", self.job)
    }

    /// Stores `rank`'s checkpoint of `epoch` (atomically, with its header). Refused for an epoch
    /// not newer than the committed one, which must stay intact.
    pub fn put_rank(&self, epoch: u64, rank: u32, data: &[u8]) -> Result<(), RepoError> {
        let key = self.rank_key(epoch, rank);
        if let Some(c) = self.last_committed()? {
            if epoch <= c {
                return Err(RepoError::Refused {
                    key,
                    why: format!(
                        "epoch {epoch} is not newer than the committed epoch {c}; a new wave \
                         needs a higher epoch"
                    ),
                });
            }
        }
        let header = match &self.key {
            Some(k) => Header::sealed(k, &self.job, epoch, rank, data),
            None => Header::for_data(&self.job, epoch, rank, data),
        };
        let mut blob = header.encode();
        blob.extend_from_slice(data);
        self.store.put(&key, &blob)?;
        Ok(())
    }

    /// Reads `rank`'s checkpoint of `epoch`, verifying its header (job, epoch, rank, length) and
    /// checksum.
    pub fn get_rank(&self, epoch: u64, rank: u32) -> Result<Vec<u8>, RepoError> {
        let key = self.rank_key(epoch, rank);
        let blob = self
            .store
            .get(&key)?
            .ok_or_else(|| RepoError::Missing { key: key.clone() })?;
        let bad = |problem: String| RepoError::Bad {
            key: key.clone(),
            problem,
        };
        let (h, hlen) = Header::decode(&blob).map_err(bad)?;
        if h.job != self.job {
            return Err(bad(format!(
                "it belongs to job {:?}, not {:?}",
                h.job, self.job
            )));
        }
        if h.epoch != epoch || h.rank != rank {
            return Err(bad(format!(
                "it holds epoch {} rank {}, not epoch {epoch} rank {rank}",
                h.epoch, h.rank
            )));
        }
        let data = &blob[hlen..];
        let have = data.len() as u64;
        if have < h.len {
            return Err(bad(format!("truncated: {have} of {} data bytes", h.len)));
        }
        if have > h.len {
            return Err(bad(format!(
                "{} bytes more than the {} its header announces",
                have - h.len,
                h.len
            )));
        }
        if let Some(p) = version_problem(h.version, self.key.as_ref()) {
            return Err(bad(p));
        }
        let sum_ok = match &self.key {
            Some(k) => mutirao::wire::constant_time_eq(&h.keyed_sum(k, data), &h.sum),
            None => Sha256::digest(data).as_slice() == h.sum,
        };
        if !sum_ok {
            return Err(bad(if self.key.is_some() {
                "checksum mismatch: the data is corrupt or was not written with this job's key"
                    .into()
            } else {
                "checksum mismatch: the data is corrupt".into()
            }));
        }
        Ok(data.to_vec())
    }

    /// Marks `epoch` committed once every rank `0..nranks` has a valid checkpoint of it (each is
    /// read back and verified), by replacing the commit record atomically. Committing the
    /// committed epoch again is a no-op; an older epoch is refused.
    pub fn commit(&self, epoch: u64, nranks: u32) -> Result<(), RepoError> {
        let fail = |why: String| RepoError::Commit {
            job: self.job.clone(),
            epoch,
            why,
        };
        if nranks == 0 {
            return Err(fail("a job has at least one rank".into()));
        }
        if let Some(c) = self.last_committed()? {
            if epoch == c {
                return Ok(());
            }
            if epoch < c {
                return Err(fail(format!(
                    "epoch {c} is already committed; commits never move back to an older epoch"
                )));
            }
        }
        for r in 0..nranks {
            match self.get_rank(epoch, r) {
                Ok(_) => {}
                Err(RepoError::Missing { key }) => {
                    return Err(fail(format!("rank {r}'s checkpoint {key} is missing")))
                }
                Err(RepoError::Bad { key, problem }) => {
                    return Err(fail(format!(
                        "rank {r}'s checkpoint {key} is unusable: {problem}"
                    )))
                }
                Err(e) => return Err(e),
            }
        }
        self.store.put(
            &self.commit_key(),
            &encode_commit(self.key.as_ref(), &self.job, epoch, nranks),
        )?;
        Ok(())
    }

    /// The newest committed epoch, or `None` before the first commit.
    pub fn last_committed(&self) -> Result<Option<u64>, RepoError> {
        Ok(self.committed()?.map(|(e, _)| e))
    }

    /// The newest committed epoch and its number of ranks.
    pub fn committed(&self) -> Result<Option<(u64, u32)>, RepoError> {
        let key = self.commit_key();
        let Some(rec) = self.store.get(&key)? else {
            return Ok(None);
        };
        let (job, epoch, nranks) =
            decode_commit(self.key.as_ref(), &rec).map_err(|problem| RepoError::Bad {
                key: key.clone(),
                problem,
            })?;
        if job != self.job {
            return Err(RepoError::Bad {
                key,
                problem: format!("it belongs to job {job:?}, not {:?}", self.job),
            });
        }
        Ok(Some((epoch, nranks)))
    }

    /// The epochs that have at least one rank checkpoint in the store.
    pub fn epochs(&self) -> Result<BTreeSet<u64>, RepoError> {
        let prefix = format!("jobs/{}/", self.job);
        Ok(self
            .store
            .list(&prefix)?
            .iter()
            .filter_map(|k| epoch_of(&k[prefix.len()..]))
            .collect())
    }

    /// Deletes the checkpoints of epochs older than `keep_from`, never those of the committed
    /// epoch; returns how many blobs were deleted.
    pub fn gc(&self, keep_from: u64) -> Result<usize, RepoError> {
        let committed = self.last_committed()?;
        let prefix = format!("jobs/{}/", self.job);
        let mut n = 0;
        for key in self.store.list(&prefix)? {
            let Some(e) = epoch_of(&key[prefix.len()..]) else {
                continue;
            };
            if e < keep_from && Some(e) != committed {
                self.store.delete(&key)?;
                n += 1;
            }
        }
        Ok(n)
    }
}

/// Splits a rank checkpoint key `jobs/<job>/<epoch>/<rank>.ckpt` into (job, epoch, rank); `None`
/// for any other key (the commit record, foreign keys). A launcher uses it to tell
/// [`crate::replicated::Replicated::with_producer`] which host made a key's blob.
pub fn parse_rank_key(key: &str) -> Option<(&str, u64, u32)> {
    let rest = key.strip_prefix("jobs/")?;
    let (job, rest) = rest.split_once('/')?;
    let (e, file) = rest.split_once('/')?;
    let r = file.strip_suffix(".ckpt")?.parse().ok()?;
    Some((job, e.parse().ok()?, r))
}

/// `<epoch>/<rank>.ckpt` → epoch.
fn epoch_of(rest: &str) -> Option<u64> {
    let (e, file) = rest.split_once('/')?;
    let r = file.strip_suffix(".ckpt")?;
    if r.parse::<u32>().is_err() {
        return None;
    }
    e.parse().ok()
}

/// When each epoch's first blob arrived, and the measured cost of each committed wave (s).
type Timing = (Vec<(u64, Instant)>, Vec<f64>);

/// The launcher's checkpoint sink over a [`CheckpointRepo`]: commits collect older epochs.
pub struct RepoSink<S: BlobStore> {
    repo: CheckpointRepo<S>,
    nranks: u32,
    timing: Mutex<Timing>,
}

impl<S: BlobStore> RepoSink<S> {
    /// A sink for a job of `nranks` ranks.
    pub fn new(repo: CheckpointRepo<S>, nranks: u32) -> RepoSink<S> {
        RepoSink {
            repo,
            nranks,
            timing: Mutex::new((Vec::new(), Vec::new())),
        }
    }

    /// The repository.
    pub fn repo(&self) -> &CheckpointRepo<S> {
        &self.repo
    }

    /// Seconds from the first blob of a wave to its commit, for every wave committed so far.
    pub fn wave_costs(&self) -> Vec<f64> {
        self.timing.lock().map(|t| t.1.clone()).unwrap_or_default()
    }
}

impl<S: BlobStore> CheckpointSink for RepoSink<S> {
    fn put(&self, epoch: u64, rank: u32, blob: &[u8]) -> Result<(), String> {
        if rank >= self.nranks {
            return Err(format!(
                "rank {rank} is not below the job's {} ranks",
                self.nranks
            ));
        }
        if let Ok(mut t) = self.timing.lock() {
            if !t.0.iter().any(|(e, _)| *e == epoch) {
                t.0.push((epoch, Instant::now()));
            }
        }
        self.repo
            .put_rank(epoch, rank, blob)
            .map_err(|e| e.to_string())
    }

    fn get(&self, epoch: u64, rank: u32) -> Result<Vec<u8>, String> {
        self.repo.get_rank(epoch, rank).map_err(|e| e.to_string())
    }

    fn commit(&self, epoch: u64) -> Result<(), String> {
        self.repo
            .commit(epoch, self.nranks)
            .map_err(|e| e.to_string())?;
        if let Ok(mut t) = self.timing.lock() {
            if let Some(i) = t.0.iter().position(|(e, _)| *e == epoch) {
                let (_, at) = t.0.remove(i);
                t.1.push(at.elapsed().as_secs_f64());
            }
            t.0.retain(|(e, _)| *e > epoch);
        }
        // The commit is durable; a failed collection only leaves old blobs behind.
        if let Err(e) = self.repo.gc(epoch) {
            tracing::warn!(job = %self.repo.job, epoch, error = %e, "older checkpoints not collected");
        }
        Ok(())
    }

    fn last_committed(&self) -> Result<Option<u64>, String> {
        self.repo.last_committed().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DirStore;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An in-memory store (atomic puts).
    #[derive(Default)]
    struct Mem(Mutex<BTreeMap<String, Vec<u8>>>);
    impl BlobStore for Mem {
        fn put(&self, k: &str, b: &[u8]) -> Result<(), StoreError> {
            check_key(k)?;
            self.0.lock().unwrap().insert(k.into(), b.to_vec());
            Ok(())
        }
        fn get(&self, k: &str) -> Result<Option<Vec<u8>>, StoreError> {
            Ok(self.0.lock().unwrap().get(k).cloned())
        }
        fn delete(&self, k: &str) -> Result<(), StoreError> {
            self.0.lock().unwrap().remove(k);
            Ok(())
        }
        fn list(&self, p: &str) -> Result<Vec<String>, StoreError> {
            Ok(self
                .0
                .lock()
                .unwrap()
                .keys()
                .filter(|k| k.starts_with(p))
                .cloned()
                .collect())
        }
    }

    /// A store that "crashes" (fails every call) after a number of mutating calls.
    struct Crashing<'a> {
        inner: &'a Mem,
        left: AtomicUsize,
    }
    impl Crashing<'_> {
        fn tick(&self, k: &str) -> Result<(), StoreError> {
            let ok = self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if ok {
                Ok(())
            } else {
                Err(StoreError::Backend {
                    store: "crashing".into(),
                    op: "put",
                    key: k.into(),
                    detail: "crashed".into(),
                })
            }
        }
    }
    impl BlobStore for Crashing<'_> {
        fn put(&self, k: &str, b: &[u8]) -> Result<(), StoreError> {
            self.tick(k)?;
            self.inner.put(k, b)
        }
        fn get(&self, k: &str) -> Result<Option<Vec<u8>>, StoreError> {
            self.inner.get(k)
        }
        fn delete(&self, k: &str) -> Result<(), StoreError> {
            self.tick(k)?;
            self.inner.delete(k)
        }
        fn list(&self, p: &str) -> Result<Vec<String>, StoreError> {
            self.inner.list(p)
        }
    }

    fn data(epoch: u64, rank: u32) -> Vec<u8> {
        format!("state of rank {rank} at epoch {epoch}").into_bytes()
    }

    /// One full wave: every rank's put, the commit, the collection.
    fn wave<S: BlobStore>(repo: &CheckpointRepo<S>, epoch: u64, n: u32) -> Result<(), RepoError> {
        for r in 0..n {
            repo.put_rank(epoch, r, &data(epoch, r))?;
        }
        repo.commit(epoch, n)?;
        repo.gc(epoch)?;
        Ok(())
    }

    #[test]
    fn put_get_commit_gc() {
        let d = tempfile::tempdir().unwrap();
        let repo = CheckpointRepo::new(DirStore::open(d.path()).unwrap(), "job-1").unwrap();
        assert_eq!(repo.last_committed().unwrap(), None);
        repo.put_rank(1, 0, b"a").unwrap();
        let e = repo.commit(1, 2).unwrap_err().to_string();
        assert!(
            e.contains("rank 1's checkpoint jobs/job-1/1/1.ckpt is missing"),
            "{e}"
        );
        repo.put_rank(1, 1, b"b").unwrap();
        repo.commit(1, 2).unwrap();
        assert_eq!(repo.committed().unwrap(), Some((1, 2)));
        repo.commit(1, 2).unwrap();
        repo.put_rank(2, 0, b"c").unwrap();
        repo.put_rank(2, 1, b"d").unwrap();
        assert_eq!(
            repo.last_committed().unwrap(),
            Some(1),
            "2 not committed yet"
        );
        assert_eq!(repo.get_rank(1, 1).unwrap(), b"b");
        // gc never removes the committed epoch, whatever keep_from says.
        assert_eq!(
            repo.gc(5).unwrap(),
            2,
            "epoch 2 (uncommitted, older than 5) collected"
        );
        assert_eq!(repo.get_rank(1, 0).unwrap(), b"a");
        wave(&repo, 3, 2).unwrap();
        assert_eq!(repo.last_committed().unwrap(), Some(3));
        assert_eq!(
            repo.epochs().unwrap().into_iter().collect::<Vec<_>>(),
            vec![3]
        );
        assert!(matches!(
            repo.get_rank(1, 0),
            Err(RepoError::Missing { .. })
        ));
        // Never backwards, and never overwriting the committed epoch.
        assert!(repo
            .commit(2, 2)
            .unwrap_err()
            .to_string()
            .contains("never move back"));
        assert!(matches!(
            repo.put_rank(3, 0, b"x"),
            Err(RepoError::Refused { .. })
        ));
        assert!(matches!(
            repo.put_rank(1, 0, b"x"),
            Err(RepoError::Refused { .. })
        ));
        assert!(repo.commit(4, 0).is_err());
        for bad in ["", "a/b", "..", "x y"] {
            assert!(CheckpointRepo::new(Mem::default(), bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bad_checkpoints_are_errors_naming_the_key() {
        let mem = Mem::default();
        let repo = CheckpointRepo::new(&mem, "job").unwrap();
        repo.put_rank(4, 0, b"rank 0").unwrap();
        repo.put_rank(4, 1, b"0123456789").unwrap();
        let key = repo.rank_key(4, 1);
        let good = mem.get(&key).unwrap().unwrap();
        let check = |blob: &[u8], want: &str| {
            mem.put(&key, blob).unwrap();
            let e = repo.get_rank(4, 1).unwrap_err().to_string();
            assert!(e.contains(&key) && e.contains(want), "{want}: {e}");
            assert!(repo.commit(4, 2).unwrap_err().to_string().contains(want));
        };
        check(&good[..good.len() - 3], "truncated: 7 of 10");
        check(&good[..20], "truncated");
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 0x40;
        check(&flipped, "checksum mismatch");
        let mut longer = good.clone();
        longer.push(0);
        check(&longer, "1 bytes more");
        check(b"garbage that is no checkpoint at all", "bad magic");
        // Another job's blob, and another epoch's or rank's blob, under this key.
        let other = CheckpointRepo::new(Mem::default(), "other").unwrap();
        other.put_rank(4, 1, b"0123456789").unwrap();
        let foreign = other.store().get(&other.rank_key(4, 1)).unwrap().unwrap();
        check(&foreign, "belongs to job \"other\"");
        let mut moved = Header::for_data("job", 3, 1, b"0123456789").encode();
        moved.extend_from_slice(b"0123456789");
        check(&moved, "holds epoch 3 rank 1");
        // A corrupt commit record is named, not taken as "no checkpoint".
        mem.put(&repo.commit_key(), b"MCKC junk").unwrap();
        let e = repo.last_committed().unwrap_err().to_string();
        assert!(e.contains("jobs/job/COMMITTED"), "{e}");
    }

    #[test]
    fn a_keyed_repository_restores_only_blobs_made_under_its_key() {
        let mem = Mem::default();
        let key = [0x5a; 32];
        let repo = CheckpointRepo::new(&mem, "job").unwrap().with_key(key);
        repo.put_rank(4, 0, b"rank 0").unwrap();
        repo.put_rank(4, 1, b"0123456789").unwrap();
        repo.commit(4, 2).unwrap();
        assert_eq!(repo.get_rank(4, 1).unwrap(), b"0123456789");
        let key1 = repo.rank_key(4, 1);
        let good = mem.get(&key1).unwrap().unwrap();
        let committed = mem.get(&repo.commit_key()).unwrap().unwrap();
        // A forger with write access to the store but not the key: an unkeyed blob with a
        // correct SHA-256, and a blob made under another key, in place of rank 1's.
        let mut unkeyed = Header::for_data("job", 4, 1, b"FORGED!!!!").encode();
        unkeyed.extend_from_slice(b"FORGED!!!!");
        let other = CheckpointRepo::new(Mem::default(), "job")
            .unwrap()
            .with_key([0xa5; 32]);
        other.put_rank(4, 1, b"FORGED!!!!").unwrap();
        let other_key = other.store().get(&other.rank_key(4, 1)).unwrap().unwrap();
        // The real blob with its data changed and its header's length kept.
        let mut altered = good.clone();
        let n = altered.len();
        altered[n - 10..].copy_from_slice(b"FORGED!!!!");
        for (forged, want) in [
            (&unkeyed, "carries no key"),
            (&other_key, "not written with this job's key"),
            (&altered, "not written with this job's key"),
        ] {
            mem.put(&key1, forged).unwrap();
            let e = repo.get_rank(4, 1).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
        mem.put(&key1, &good).unwrap();
        assert_eq!(repo.get_rank(4, 1).unwrap(), b"0123456789");
        // A forged commit record: unkeyed, or keyed otherwise.
        let plain = encode_commit(None, "job", 9, 2);
        let foreign = encode_commit(Some(&[1; 32]), "job", 9, 2);
        for rec in [plain, foreign] {
            mem.put(&repo.commit_key(), &rec).unwrap();
            assert!(repo.last_committed().is_err());
        }
        mem.put(&repo.commit_key(), &committed).unwrap();
        assert_eq!(repo.last_committed().unwrap(), Some(4));
        // A repository opened without the key does not take keyed blobs as good either.
        let unkeyed_repo = CheckpointRepo::new(&mem, "job").unwrap();
        let e = unkeyed_repo.get_rank(4, 1).unwrap_err().to_string();
        assert!(e.contains("without the job's checkpoint key"), "{e}");
    }

    #[test]
    fn leftovers_of_a_crash_leave_the_committed_epoch_readable() {
        let d = tempfile::tempdir().unwrap();
        {
            let repo = CheckpointRepo::new(DirStore::open(d.path()).unwrap(), "j").unwrap();
            wave(&repo, 1, 3).unwrap();
            // The next wave crashes: rank 0 written, rank 1 half-written (a temporary file),
            // rank 2 a torn blob at its final name, a half-written commit record.
            repo.put_rank(2, 0, &data(2, 0)).unwrap();
        }
        let e2 = d.path().join("jobs/j/2");
        std::fs::write(e2.join(".tmp-77-1.ckpt"), b"MCKP partial").unwrap();
        std::fs::write(e2.join("2.ckpt"), b"MCKP\x01\x00torn").unwrap();
        std::fs::write(d.path().join("jobs/j/.tmp-77-COMMITTED"), b"MCKC").unwrap();
        // Restart: epoch 1 is what is restored; epoch 2 cannot be committed.
        let repo = CheckpointRepo::new(DirStore::open(d.path()).unwrap(), "j").unwrap();
        assert_eq!(repo.last_committed().unwrap(), Some(1));
        for r in 0..3 {
            assert_eq!(repo.get_rank(1, r).unwrap(), data(1, r));
        }
        let e = repo.commit(2, 3).unwrap_err().to_string();
        assert!(e.contains("jobs/j/2/1.ckpt is missing"), "{e}");
        // The recovered job raises the epoch and goes on; the debris is collected.
        wave(&repo, 3, 3).unwrap();
        assert_eq!(repo.last_committed().unwrap(), Some(3));
        assert_eq!(
            repo.epochs().unwrap().into_iter().collect::<Vec<_>>(),
            vec![3]
        );
    }

    #[test]
    fn a_crash_at_every_step_of_a_wave_leaves_old_or_new_committed() {
        let n = 3;
        // Mutating calls of a whole wave: n puts, 1 commit record, n deletes of the old epoch.
        let steps = 2 * n as usize + 1;
        for crash_after in 0..=steps {
            let mem = Mem::default();
            wave(&CheckpointRepo::new(&mem, "j").unwrap(), 1, n).unwrap();
            let crashing = Crashing {
                inner: &mem,
                left: AtomicUsize::new(crash_after),
            };
            let res = wave(&CheckpointRepo::new(&crashing, "j").unwrap(), 2, n);
            assert_eq!(
                res.is_ok(),
                crash_after == steps,
                "crash after {crash_after}"
            );
            let repo = CheckpointRepo::new(&mem, "j").unwrap();
            let c = repo.last_committed().unwrap().unwrap();
            let want = if crash_after > n as usize { 2 } else { 1 };
            assert_eq!(c, want, "crash after {crash_after}");
            for r in 0..n {
                assert_eq!(
                    repo.get_rank(c, r).unwrap(),
                    data(c, r),
                    "crash after {crash_after}"
                );
            }
        }
    }

    #[test]
    fn rank_keys_parse_back() {
        let repo = CheckpointRepo::new(Mem::default(), "j-1").unwrap();
        assert_eq!(parse_rank_key(&repo.rank_key(7, 3)), Some(("j-1", 7, 3)));
        assert_eq!(parse_rank_key(&repo.commit_key()), None);
        assert_eq!(parse_rank_key("jobs/j/x/1.ckpt"), None);
        assert_eq!(parse_rank_key("jobs/j/1/1.bin"), None);
        assert_eq!(parse_rank_key("other/j/1/1.ckpt"), None);
    }

    #[test]
    fn repo_sink_is_a_checkpoint_sink() {
        let d = tempfile::tempdir().unwrap();
        let repo = CheckpointRepo::new(DirStore::open(d.path()).unwrap(), "j").unwrap();
        let s = RepoSink::new(repo, 2);
        let sink: &dyn CheckpointSink = &s;
        assert_eq!(sink.last_committed().unwrap(), None);
        sink.put(1, 0, b"a").unwrap();
        assert!(sink.commit(1).unwrap_err().contains("rank 1"));
        sink.put(1, 1, b"b").unwrap();
        sink.commit(1).unwrap();
        sink.put(2, 0, b"c").unwrap();
        sink.put(2, 1, b"d").unwrap();
        assert_eq!(sink.last_committed().unwrap(), Some(1));
        assert_eq!(sink.get(1, 1).unwrap(), b"b");
        sink.commit(2).unwrap();
        assert_eq!(sink.last_committed().unwrap(), Some(2));
        assert!(sink
            .get(1, 1)
            .unwrap_err()
            .contains("jobs/j/1/1.ckpt is missing"));
        assert!(sink.put(3, 5, b"x").unwrap_err().contains("rank 5"));
        let costs = s.wave_costs();
        assert_eq!(costs.len(), 2);
        assert!(costs.iter().all(|c| *c >= 0.0 && *c < 60.0), "{costs:?}");
    }

    proptest! {
        #[test]
        fn header_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Header::decode(&bytes);
            let _ = decode_commit(None, &bytes);
            let _ = decode_commit(Some(&[7; 32]), &bytes);
        }

        #[test]
        fn header_round_trips(job in "[A-Za-z0-9._-]{1,40}", epoch: u64, rank: u32,
                              data in proptest::collection::vec(any::<u8>(), 0..100)) {
            let h = Header::for_data(&job, epoch, rank, &data);
            let mut enc = h.encode();
            let hlen = enc.len();
            enc.extend_from_slice(&data);
            let (d, n) = Header::decode(&enc).unwrap();
            prop_assert_eq!(&d, &h);
            prop_assert_eq!(n, hlen);
            // Every truncation of the header is an error, never a panic or a wrong header.
            for cut in 0..hlen {
                prop_assert!(Header::decode(&enc[..cut]).is_err());
            }
            let rec = encode_commit(None, &job, epoch, rank);
            prop_assert_eq!(decode_commit(None, &rec).unwrap(), (job.clone(), epoch, rank));
            let key = [epoch as u8; 32];
            let rec = encode_commit(Some(&key), &job, epoch, rank);
            prop_assert_eq!(decode_commit(Some(&key), &rec).unwrap(), (job.clone(), epoch, rank));
            prop_assert!(decode_commit(Some(&[!(epoch as u8); 32]), &rec).is_err());
            prop_assert!(decode_commit(None, &rec).is_err());
        }

        /// Random puts, commits and collections: the committed epoch never goes back, a commit
        /// succeeds exactly when every rank of a newer epoch is there, and the committed epoch
        /// stays fully readable.
        #[test]
        fn commit_and_gc_rules(ops in proptest::collection::vec((0u8..3, 1u64..8, 0u32..3), 1..60)) {
            let n = 3u32;
            let repo = CheckpointRepo::new(Mem::default(), "p").unwrap();
            let mut present: BTreeSet<(u64, u32)> = BTreeSet::new();
            let mut committed: Option<u64> = None;
            for (op, epoch, rank) in ops {
                match op {
                    0 => {
                        let r = repo.put_rank(epoch, rank, &data(epoch, rank));
                        let allowed = committed.is_none_or(|c| epoch > c);
                        prop_assert_eq!(r.is_ok(), allowed);
                        if allowed { present.insert((epoch, rank)); }
                    }
                    1 => {
                        let r = repo.commit(epoch, n);
                        let complete = (0..n).all(|r| present.contains(&(epoch, r)));
                        let ok = match committed {
                            Some(c) if epoch == c => true,
                            Some(c) if epoch < c => false,
                            _ => complete,
                        };
                        prop_assert_eq!(r.is_ok(), ok, "commit {} {:?}", epoch, committed);
                        if ok { committed = Some(epoch); }
                    }
                    _ => {
                        repo.gc(epoch).unwrap();
                        present.retain(|(e, _)| *e >= epoch || Some(*e) == committed);
                    }
                }
                prop_assert_eq!(repo.last_committed().unwrap(), committed);
                if let Some(c) = committed {
                    for r in 0..n {
                        prop_assert_eq!(repo.get_rank(c, r).unwrap(), data(c, r));
                    }
                }
                let have: BTreeSet<u64> = present.iter().map(|(e, _)| *e).collect();
                prop_assert_eq!(repo.epochs().unwrap(), have);
            }
        }
    }
}
