//! The launcher's checkpoint store on one machine's file system: `mutirao run
//! --checkpoint-interval` keeps every rank's checkpoint under `DIR/epoch-E/rank-R.ckpt`, written
//! atomically (write, fsync, rename), and the last committed epoch in `DIR/COMMITTED`, replaced
//! atomically once every rank's blob of that epoch is on disk; older epochs are then removed.
//! A crash at any point leaves the previous committed epoch readable. The blobs carry their own
//! checksum (`mutirao::ckpt::RankCheckpoint`): a corrupt file is refused by the rank that reads it.

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
        std::fs::read(&p).map_err(|e| format!("checkpoint {}: {e}", p.display()))
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

    #[test]
    fn commit_needs_every_rank_and_collects_older_epochs() {
        let d = std::env::temp_dir().join(format!("mutirao-ckptdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let s = DirSink::new(&d, 2).unwrap();
        assert_eq!(s.last_committed().unwrap(), None);
        s.put(1, 0, b"a").unwrap();
        assert!(s
            .commit(1)
            .unwrap_err()
            .contains("rank 1's checkpoint is missing"));
        s.put(1, 1, b"b").unwrap();
        s.commit(1).unwrap();
        s.put(2, 0, b"c").unwrap();
        s.put(2, 1, b"d").unwrap();
        // Not committed yet: epoch 1 is still the one to restore.
        assert_eq!(s.last_committed().unwrap(), Some(1));
        assert_eq!(s.get(1, 1).unwrap(), b"b");
        s.commit(2).unwrap();
        assert_eq!(s.last_committed().unwrap(), Some(2));
        assert!(s.get(1, 1).is_err(), "epoch 1 collected");
        assert!(s.put(0, mutirao::pmi::MAX_WORLD_RANK, b"x").is_err());
        // A spawned rank's checkpoint (world rank above the job's).
        s.put(3, 5, b"x").unwrap();
        assert_eq!(s.get(3, 5).unwrap(), b"x");
        assert_eq!(s.wave_costs().len(), 2);
        let _ = std::fs::remove_dir_all(&d);
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
