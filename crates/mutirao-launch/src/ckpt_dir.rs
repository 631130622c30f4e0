//! The launcher's checkpoint store on one machine's file system: `mutirao run
//! --checkpoint-interval` keeps every rank's checkpoint under `DIR/epoch-E/rank-R.ckpt`, written
//! atomically (write, fsync, rename), and the last committed epoch in `DIR/COMMITTED`, replaced
//! atomically once every rank's blob of that epoch is on disk; older epochs are then removed.
//! A crash at any point leaves the previous committed epoch readable. The blobs carry their own
//! checksum (`mutirao::ckpt::RankCheckpoint`): a damaged file (header, length, checksum) is
//! refused when it is read, with an error naming it, and nothing is restored from it. A job
//! given a directory that already holds a committed epoch resumes from it (`mutirao run
//! --checkpoint-dir` of a job that was given up, the coordinator's re-queued jobs); made with
//! [`DirSink::for_program`], the directory records the command in `DIR/PROGRAM`, and another
//! program's committed checkpoints are refused before anything starts.

use crate::fsutil::write_atomic;
use mutirao::pmi::CheckpointSink;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

/// When each epoch's first blob arrived, and the measured cost of each committed wave (s).
type Timing = (Vec<(u64, Instant)>, Vec<f64>);

/// Checkpoints in a directory.
pub struct DirSink {
    dir: PathBuf,
    ranks: u32,
    /// When each epoch's first blob arrived, and the measured cost of committed waves (s).
    timing: Mutex<Timing>,
}

impl DirSink {
    /// A store for `ranks` ranks in `dir` (created if missing).
    pub fn new(dir: &Path, ranks: u32) -> anyhow::Result<DirSink> {
        std::fs::create_dir_all(dir).map_err(|e| {
            anyhow::anyhow!(
                "cannot create the checkpoint directory {}: {e}",
                dir.display()
            )
        })?;
        Ok(DirSink {
            dir: dir.to_path_buf(),
            ranks,
            timing: Mutex::new((Vec::new(), Vec::new())),
        })
    }

    /// [`DirSink::new`] for the job running `command` (program and arguments), which the
    /// directory records in `DIR/PROGRAM`. A directory holding a committed epoch of another
    /// command is refused, naming both: its checkpoints are another program's (or the same
    /// program's with other arguments), and restoring them would hand this program a foreign
    /// state. The same command resumes from the committed epoch, as with `new`.
    pub fn for_program(dir: &Path, ranks: u32, command: &[String]) -> anyhow::Result<DirSink> {
        let sink = DirSink::new(dir, ranks)?;
        let record = dir.join("PROGRAM");
        let mine = serde_json::to_string(command)?;
        match std::fs::read_to_string(&record) {
            Ok(theirs) if theirs.trim_end() == mine => return Ok(sink),
            Ok(theirs) if sink.last_committed().is_ok_and(|e| e.is_some()) => {
                anyhow::bail!(
                    "the checkpoint directory {} holds the committed checkpoints of another \
                     command ({} says {}), not of {mine}: nothing is restored from it; give \
                     another --checkpoint-dir, or remove that one",
                    dir.display(),
                    record.display(),
                    theirs.trim_end()
                )
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => anyhow::bail!("cannot read {}: {e}", record.display()),
        }
        write_atomic(&record, format!("{mine}\n"))?;
        Ok(sink)
    }

    fn epoch_dir(&self, epoch: u64) -> PathBuf {
        self.dir.join(format!("epoch-{epoch}"))
    }

    fn blob(&self, epoch: u64, rank: u32) -> PathBuf {
        self.epoch_dir(epoch).join(format!("rank-{rank}.ckpt"))
    }

    /// Seconds from the first blob of a wave to its commit, for every wave committed so far.
    pub fn wave_costs(&self) -> Vec<f64> {
        self.timing.lock().map(|t| t.1.clone()).unwrap_or_default()
    }
}

impl CheckpointSink for DirSink {
    fn put(&self, epoch: u64, rank: u32, blob: &[u8]) -> Result<(), String> {
        // Spawned ranks (world ranks above the job's) store checkpoints too when their waves
        // include them; the bootstrap server counts them before a commit (issue 13).
        if rank >= mutirao::pmi::MAX_WORLD_RANK {
            return Err(format!(
                "rank {rank} is not a world rank (at most {})",
                mutirao::pmi::MAX_WORLD_RANK - 1
            ));
        }
        if let Ok(mut t) = self.timing.lock() {
            if !t.0.iter().any(|(e, _)| *e == epoch) {
                t.0.push((epoch, Instant::now()));
            }
        }
        let d = self.epoch_dir(epoch);
        std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        write_atomic(&self.blob(epoch, rank), blob).map_err(|e| format!("{e:#}"))
    }

    fn get(&self, epoch: u64, rank: u32) -> Result<Vec<u8>, String> {
        let p = self.blob(epoch, rank);
        let b = std::fs::read(&p).map_err(|e| format!("checkpoint {}: {e}", p.display()))?;
        mutirao::ckpt::check_blob(&b).map_err(|e| {
            format!(
                "checkpoint {} {e}; nothing was restored from it (remove it, or restore its \
                 epoch from a good copy)",
                p.display()
            )
        })?;
        Ok(b)
    }

    fn commit(&self, epoch: u64) -> Result<(), String> {
        for r in 0..self.ranks {
            if !self.blob(epoch, r).is_file() {
                return Err(format!(
                    "epoch {epoch} cannot be committed: rank {r}'s checkpoint is missing"
                ));
            }
        }
        write_atomic(&self.dir.join("COMMITTED"), format!("{epoch}\n"))
            .map_err(|e| format!("{e:#}"))?;
        if let Ok(mut t) = self.timing.lock() {
            if let Some(i) = t.0.iter().position(|(e, _)| *e == epoch) {
                let (_, at) = t.0.remove(i);
                t.1.push(at.elapsed().as_secs_f64());
            }
        }
        // Older epochs are no longer needed.
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for ent in rd.flatten() {
                let name = ent.file_name();
                let Some(e) = name
                    .to_str()
                    .and_then(|n| n.strip_prefix("epoch-"))
                    .and_then(|n| n.parse::<u64>().ok())
                else {
                    continue;
                };
                if e < epoch {
                    let _ = std::fs::remove_dir_all(ent.path());
                }
            }
        }
        Ok(())
    }

    fn last_committed(&self) -> Result<Option<u64>, String> {
        let p = self.dir.join("COMMITTED");
        match std::fs::read_to_string(&p) {
            Ok(s) => s
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| format!("{} does not hold an epoch number: {s:?}", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", p.display())),
        }
    }
}

/// Young's interval `sqrt(2·C·M)` and Daly's refinement for a checkpoint cost `c` and a mean
/// time between failures `m` (seconds): Daly (2006), for `c < 2m`,
/// `sqrt(2cm)·(1 + sqrt(c/(2m))/3 + c/(18m)) − c`, else `m`.
pub fn young_daly(c: f64, m: f64) -> (f64, f64) {
    let young = (2.0 * c * m).sqrt();
    let daly = if c < 2.0 * m {
        young * (1.0 + (c / (2.0 * m)).sqrt() / 3.0 + c / (18.0 * m)) - c
    } else {
        m
    };
    (young, daly)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank `rank`'s checkpoint of `epoch` (of `size` ranks) holding `app`, as a rank writes it.
    fn blob(epoch: u64, rank: u32, size: u32, app: &[u8]) -> Vec<u8> {
        mutirao::ckpt::RankCheckpoint {
            epoch,
            rank,
            size,
            comms: vec![],
            requests: vec![],
            unexpected: vec![],
            late: vec![],
            app: app.to_vec(),
            spawns: vec![],
            resent: vec![],
        }
        .encode()
        .unwrap()
    }

    /// A fresh directory under the temporary one, removed when dropped.
    struct Tmp(PathBuf);
    impl Tmp {
        fn new(tag: &str) -> Tmp {
            let d =
                std::env::temp_dir().join(format!("mutirao-ckptdir-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            Tmp(d)
        }
    }
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn commit_needs_every_rank_and_collects_older_epochs() {
        let d = Tmp::new("commit");
        let s = DirSink::new(&d.0, 2).unwrap();
        assert_eq!(s.last_committed().unwrap(), None);
        s.put(1, 0, &blob(1, 0, 2, b"a")).unwrap();
        assert!(s
            .commit(1)
            .unwrap_err()
            .contains("rank 1's checkpoint is missing"));
        s.put(1, 1, &blob(1, 1, 2, b"b")).unwrap();
        s.commit(1).unwrap();
        s.put(2, 0, &blob(2, 0, 2, b"c")).unwrap();
        s.put(2, 1, &blob(2, 1, 2, b"d")).unwrap();
        // Not committed yet: epoch 1 is still the one to restore.
        assert_eq!(s.last_committed().unwrap(), Some(1));
        assert_eq!(s.get(1, 1).unwrap(), blob(1, 1, 2, b"b"));
        s.commit(2).unwrap();
        assert_eq!(s.last_committed().unwrap(), Some(2));
        assert!(s.get(1, 1).is_err(), "epoch 1 collected");
        assert!(s.put(0, mutirao::pmi::MAX_WORLD_RANK, b"x").is_err());
        // A spawned rank's checkpoint (world rank above the job's).
        s.put(3, 5, &blob(3, 5, 6, b"x")).unwrap();
        assert_eq!(s.get(3, 5).unwrap(), blob(3, 5, 6, b"x"));
        assert_eq!(s.wave_costs().len(), 2);
    }

    #[test]
    fn a_damaged_blob_is_refused_naming_its_file() {
        let d = Tmp::new("bad");
        let s = DirSink::new(&d.0, 1).unwrap();
        let good = blob(4, 0, 1, &[7; 64]);
        let file = d.0.join("epoch-4").join("rank-0.ckpt");
        let check = |bytes: &[u8], want: &str| {
            s.put(4, 0, bytes).unwrap();
            let e = s.get(4, 0).unwrap_err();
            assert!(
                e.contains(&file.display().to_string()) && e.contains(want),
                "{want}: {e}"
            );
            assert!(e.contains("nothing was restored"), "{e}");
        };
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        check(&flipped, "checksum mismatch");
        check(&good[..good.len() - 5], "truncated");
        check(&good[..10], "bad header");
        check(b"some other file that is no checkpoint", "bad header");
        let mut future = good.clone();
        future[8..12].copy_from_slice(&99u32.to_le_bytes());
        check(&future, "layout version 99");
        // The good blob reads back whole.
        s.put(4, 0, &good).unwrap();
        assert_eq!(s.get(4, 0).unwrap(), good);
    }

    #[test]
    fn another_commands_committed_checkpoints_are_refused_and_the_same_command_resumes() {
        let d = Tmp::new("program");
        let cmd = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = cmd(&["/bin/jacobi", "--n", "64"]);
        {
            let s = DirSink::for_program(&d.0, 1, &a).unwrap();
            s.put(3, 0, &blob(3, 0, 1, b"a")).unwrap();
            s.commit(3).unwrap();
        }
        // The same command resumes from epoch 3.
        let s = DirSink::for_program(&d.0, 1, &a).unwrap();
        assert_eq!(s.last_committed().unwrap(), Some(3));
        // Another program, or other arguments: refused, naming the directory and both.
        for other in [cmd(&["/bin/ring"]), cmd(&["/bin/jacobi", "--n", "128"])] {
            let e = DirSink::for_program(&d.0, 1, &other)
                .err()
                .expect("refused")
                .to_string();
            assert!(
                e.contains(&d.0.display().to_string())
                    && e.contains("/bin/jacobi")
                    && e.contains(&serde_json::to_string(&other).unwrap())
                    && e.contains("nothing is restored"),
                "{e}"
            );
        }
        // The record was left alone: the first command still resumes.
        assert_eq!(
            DirSink::for_program(&d.0, 1, &a)
                .unwrap()
                .last_committed()
                .unwrap(),
            Some(3)
        );
        // Without a committed epoch, another command takes the directory over.
        let d2 = Tmp::new("program2");
        drop(DirSink::for_program(&d2.0, 1, &a).unwrap());
        let b = cmd(&["/bin/ring"]);
        let s = DirSink::for_program(&d2.0, 1, &b).unwrap();
        assert_eq!(s.last_committed().unwrap(), None);
        assert!(DirSink::for_program(&d2.0, 1, &b).is_ok());
    }

    #[test]
    fn young_and_daly_intervals() {
        // C = 10 s, M = 1 day: Young sqrt(2·10·86400) = 1314.5 s; Daly slightly shorter.
        let (y, d) = young_daly(10.0, 86_400.0);
        assert!((y - 1314.53).abs() < 0.1, "{y}");
        assert!(d < y && d > 1300.0, "{d}");
        assert_eq!(young_daly(100.0, 10.0).1, 10.0);
    }
}
