//! The content-addressed application repository (InteGrade's ASCT/AR roles): programs and
//! inputs stored under their SHA-256 digest (`sha256:<64 hex>`), written atomically (a temporary
//! file, fsync, rename, fsync of the directory), read back only after their digest is checked
//! again. Whoever receives content checks it with [`verify`] before using it.

use crate::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The prefix of every digest.
pub const PREFIX: &str = "sha256:";

/// The digest naming `bytes`: `sha256:` and 64 lower-case hex digits.
pub fn digest_of(bytes: &[u8]) -> String {
    hex_digest(&Sha256::digest(bytes))
}

/// The digest of a SHA-256 hash: `sha256:` and its 64 lower-case hex digits.
pub fn hex_digest(hash: &[u8]) -> String {
    let mut s = String::with_capacity(PREFIX.len() + 64);
    s.push_str(PREFIX);
    for b in hash {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Check that `digest` is well formed: `sha256:` and 64 lower-case hex digits.
pub fn check_digest(digest: &str) -> Result<()> {
    let hex = digest.strip_prefix(PREFIX).ok_or_else(|| {
        Error::Invalid(format!(
            "{digest:?} is not a content digest (expected sha256:<64 hex digits>)"
        ))
    })?;
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(Error::Invalid(format!(
            "{digest:?} is not a content digest (expected sha256: and 64 lower-case hex digits)"
        )));
    }
    Ok(())
}

/// Check that `bytes` are the content named `digest`; [`Error::Tampered`] if they are not.
/// Run this before using anything received from the repository or a peer.
pub fn verify(digest: &str, bytes: &[u8]) -> Result<()> {
    check_digest(digest)?;
    let actual = digest_of(bytes);
    // Not secret: both digests are public names; an ordinary compare is fine.
    if actual != digest {
        return Err(Error::Tampered {
            expected: digest.to_string(),
            actual,
        });
    }
    Ok(())
}

/// The repository: a directory of files named by digest.
#[derive(Debug, Clone)]
pub struct Repo {
    dir: PathBuf,
    max_bytes: u64,
}

impl Repo {
    /// Open (creating it if needed) the repository in `dir`, accepting content of at most
    /// `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Repo> {
        crate::private_dir(dir, "the application repository")?;
        Ok(Repo {
            dir: dir.to_path_buf(),
            max_bytes,
        })
    }

    /// The largest content accepted, bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    fn path(&self, digest: &str) -> Result<PathBuf> {
        check_digest(digest)?;
        Ok(self.dir.join(&digest[PREFIX.len()..]))
    }

    /// The file holding the content named `digest` (not checked: [`Repo::get`] checks). Files
    /// are never changed once stored, only replaced whole by the same content.
    pub fn file(&self, digest: &str) -> Result<PathBuf> {
        self.path(digest)
    }

    /// Store `bytes`; returns their digest. Storing the same content twice is harmless.
    pub fn put(&self, bytes: &[u8]) -> Result<String> {
        if bytes.len() as u64 > self.max_bytes {
            return Err(Error::TooLarge {
                size: bytes.len() as u64,
                max: self.max_bytes,
            });
        }
        let digest = digest_of(bytes);
        let dst = self.path(&digest)?;
        if dst.exists() {
            return Ok(digest);
        }
        let io = |what: &str, e: std::io::Error| {
            Error::Io(format!("repository {}: {what}: {e}", self.dir.display()))
        };
        let mut tmp = tempfile_in(&self.dir).map_err(|e| io("cannot create a file", e))?;
        tmp.1
            .write_all(bytes)
            .and_then(|_| tmp.1.sync_all())
            .map_err(|e| io("cannot write", e))?;
        std::fs::rename(&tmp.0, &dst).map_err(|e| io("cannot rename", e))?;
        tmp.0 = PathBuf::new(); // renamed: nothing to remove
        if let Ok(d) = std::fs::File::open(&self.dir) {
            d.sync_all()
                .map_err(|e| io("cannot sync the directory", e))?;
        }
        Ok(digest)
    }

    /// The content named `digest`, checked against it ([`Error::Tampered`] if the stored file
    /// was altered, [`Error::NoBlob`] if absent).
    pub fn get(&self, digest: &str) -> Result<Vec<u8>> {
        let p = self.path(digest)?;
        let bytes = match std::fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NoBlob(digest.to_string()))
            }
            Err(e) => return Err(Error::Io(format!("cannot read {}: {e}", p.display()))),
        };
        verify(digest, &bytes)?;
        Ok(bytes)
    }

    /// Whether content named `digest` is stored (a malformed digest is an error).
    pub fn contains(&self, digest: &str) -> Result<bool> {
        Ok(self.path(digest)?.is_file())
    }
}

/// A temporary file in `dir`, removed on drop unless its path was cleared.
struct TempFile(PathBuf, std::fs::File);

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

fn tempfile_in(dir: &Path) -> std::io::Result<TempFile> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    for _ in 0..100 {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = dir.join(format!(".upload-{}-{n}", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
        {
            Ok(f) => return Ok(TempFile(p, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(
        "100 temporary names in a row were taken",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mutirao-repo-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn content_is_stored_under_its_digest_and_tampering_is_refused() {
        let d = scratch("tamper");
        let r = Repo::open(&d, 1000).unwrap();
        let dg = r.put(b"#!/bin/sh\necho hi\n").unwrap();
        assert_eq!(dg, digest_of(b"#!/bin/sh\necho hi\n"));
        assert_eq!(r.put(b"#!/bin/sh\necho hi\n").unwrap(), dg);
        assert_eq!(r.get(&dg).unwrap(), b"#!/bin/sh\necho hi\n");
        assert!(r.contains(&dg).unwrap());
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        // Someone edits the stored file: the repository refuses to hand it out.
        std::fs::write(d.join(&dg[PREFIX.len()..]), b"#!/bin/sh\nrm -rf ~\n").unwrap();
        let e = r.get(&dg).unwrap_err();
        assert!(matches!(e, Error::Tampered { .. }), "{e}");
        assert!(e.to_string().contains("altered or corrupted"), "{e}");
        // A consumer checks what it received.
        assert!(verify(&dg, b"#!/bin/sh\necho hi\n").is_ok());
        assert!(matches!(
            verify(&dg, b"#!/bin/sh\necho HI\n"),
            Err(Error::Tampered { .. })
        ));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn limits_and_malformed_digests_are_errors() {
        let d = scratch("limits");
        let r = Repo::open(&d, 4).unwrap();
        assert!(matches!(
            r.put(b"12345"),
            Err(Error::TooLarge { size: 5, max: 4 })
        ));
        for bad in [
            "",
            "sha256:",
            "md5:00",
            "sha256:../../etc/passwd",
            &format!("sha256:{}", "A".repeat(64)),
        ] {
            assert!(matches!(r.get(bad), Err(Error::Invalid(_))), "{bad}");
            assert!(matches!(verify(bad, b""), Err(Error::Invalid(_))), "{bad}");
        }
        let absent = digest_of(b"never stored");
        assert!(matches!(r.get(&absent), Err(Error::NoBlob(_))));
        let _ = std::fs::remove_dir_all(&d);
    }
}
