//! An agent's cache of programs fetched from the coordinator's application repository
//! (InteGrade's LRM downloading the binary from the AR and checking it, digest 004 §15.1).
//!
//! A launch that names its program by digest is resolved here: the cached copy
//! `DIR/sha256-<hex>` is used when its content still has that digest; a missing one is
//! downloaded from the repository (authenticated as the agent; [`Client::download`] checks the
//! bytes), written atomically (write, fsync, rename) with mode 0755, and checked again from the
//! file. A cached copy whose content no longer matches was altered on this host: it is removed
//! and the launch is refused (the next launch fetches a fresh copy). Every file is checked
//! right before the agent runs it, so an agent never runs bytes other than the ones named.

use crate::client::Client;
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How a program was found.
#[derive(Debug, Clone, PartialEq)]
pub enum Fetched {
    /// Already cached, and checked again: how long reading and hashing the copy took.
    Cached {
        /// The check.
        took: Duration,
    },
    /// Downloaded from the repository now: its size and how long it took.
    Downloaded {
        /// Bytes.
        bytes: u64,
        /// Download, checks and the atomic write.
        took: Duration,
    },
}

/// Programs by digest, cached in a directory.
pub struct ProgramCache {
    dir: PathBuf,
    client: Client,
    max: u64,
    /// One download at a time (ranks of one job asking together fetch once).
    lock: Mutex<()>,
}

/// The cache file name of a digest (`sha256-<hex>`; a rank running from it that spawns itself
/// names this path, which agents resolve by the digest again).
pub fn cache_name(digest: &str) -> Result<String> {
    crate::repo::check_digest(digest)?;
    Ok(digest.replacen(':', "-", 1))
}

/// The digest a cache file name stands for (`sha256-<64 hex>` → `sha256:<64 hex>`), if it is one.
pub fn digest_of_name(path: &str) -> Option<String> {
    let name = Path::new(path).file_name()?.to_str()?;
    let d = name.replacen('-', ":", 1);
    crate::repo::check_digest(&d).ok().map(|_| d)
}

impl ProgramCache {
    /// A cache in `dir` (created, mode 0700) fetching from `client`'s coordinator, refusing
    /// programs larger than `max` bytes.
    pub fn open(dir: &Path, client: Client, max: u64) -> Result<ProgramCache> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| {
                Error::Io(format!(
                    "cannot create the program cache {}: {e}",
                    dir.display()
                ))
            })?;
        // An existing directory keeps its mode: make sure nobody else may write programs in.
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        Ok(ProgramCache {
            dir: dir.to_path_buf(),
            client,
            max,
            lock: Mutex::new(()),
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The local, checked file of the program named `digest`: cached, or downloaded now.
    pub fn resolve(&self, digest: &str) -> Result<(PathBuf, Fetched)> {
        let path = self.dir.join(cache_name(digest)?);
        let _one = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let t0 = Instant::now();
        if path.exists() {
            check_file(&path, digest).inspect_err(|_| {
                // Altered here: never run it, and fetch a fresh copy next time.
                let _ = std::fs::remove_file(&path);
            })?;
            return Ok((path, Fetched::Cached { took: t0.elapsed() }));
        }
        let bytes = self.client.download(digest, self.max)?;
        crate::exec::write_atomic(&path, &bytes, true)
            .map_err(|e| Error::Io(format!("cannot write {}: {e}", path.display())))?;
        check_file(&path, digest)?;
        Ok((
            path,
            Fetched::Downloaded {
                bytes: bytes.len() as u64,
                took: t0.elapsed(),
            },
        ))
    }
}

/// Check that the file at `path` has digest `digest` (the error says what happened and what to
/// do).
pub fn check_file(path: &Path, digest: &str) -> Result<()> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
    crate::repo::verify(digest, &bytes).map_err(|e| match e {
        Error::Tampered { actual, .. } => Error::Invalid(format!(
            "the cached program {} has digest {actual}, not {digest}: it was altered on this host; removed it and refused to run it (the next launch fetches it again from the repository)",
            path.display()
        )),
        e => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_names_and_digests_map_both_ways() {
        let d = crate::repo::digest_of(b"abc");
        let n = cache_name(&d).unwrap();
        assert!(n.starts_with("sha256-") && n.len() == 7 + 64, "{n}");
        assert_eq!(digest_of_name(&format!("/x/y/{n}")), Some(d.clone()));
        assert_eq!(digest_of_name("/x/y/program"), None);
        assert_eq!(digest_of_name("sha256-abc"), None);
        assert!(cache_name("sha256:xyz").is_err());
    }

    #[test]
    fn a_cached_copy_is_checked_again_and_used_without_a_download() {
        let dir = std::env::temp_dir().join(format!("mutirao-fetch-c-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // A coordinator nobody listens at: a download would fail.
        let client = Client::new("http://127.0.0.1:9", "no-coordinator-token").unwrap();
        let cache = ProgramCache::open(&dir, client, 1 << 20).unwrap();
        let d = crate::repo::digest_of(b"#!/bin/sh\ntrue\n");
        let p = dir.join(cache_name(&d).unwrap());
        std::fs::write(&p, b"#!/bin/sh\ntrue\n").unwrap();
        let (got, how) = cache.resolve(&d).unwrap();
        assert_eq!(got, p);
        assert!(matches!(how, Fetched::Cached { .. }), "{how:?}");
        // Altered: refused and removed; then a download is needed (and fails here).
        std::fs::write(&p, b"other").unwrap();
        let e = cache.resolve(&d).unwrap_err().to_string();
        assert!(e.contains("altered on this host"), "{e}");
        assert!(!p.exists());
        assert!(cache.resolve(&d).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_altered_file_is_refused_and_the_message_says_so() {
        let dir = std::env::temp_dir().join(format!("mutirao-fetch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = crate::repo::digest_of(b"right");
        let p = dir.join(cache_name(&d).unwrap());
        std::fs::write(&p, b"right").unwrap();
        check_file(&p, &d).unwrap();
        std::fs::write(&p, b"wrong").unwrap();
        let e = check_file(&p, &d).unwrap_err().to_string();
        assert!(e.contains("altered on this host") && e.contains(&d), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
