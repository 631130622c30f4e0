//! Checkpoint storage for mutirão: a [`BlobStore`] trait (a durable key → bytes store) with
//! [`DirStore`] (a local directory), `S3Store` (S3-compatible object storage, cargo feature `s3`),
//! [`replicated::Replicated`] (k replicas on peers other than the producer) and
//! [`remote::RemoteStore`] (a store served by an agent over an authenticated stream); above them
//! [`repo::CheckpointRepo`], the checksummed `jobs/<job>/<epoch>/<rank>.ckpt` layout with commit
//! records, and [`repo::RepoSink`], the launcher's `mutirao::pmi::CheckpointSink`.
//! See docs/checkpoint-storage.md.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod remote;
pub mod replicated;
pub mod repo;
#[cfg(feature = "s3")]
pub mod s3;
#[cfg(feature = "s3")]
pub use s3::{S3Config, S3Store};

/// What went wrong in a store, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The key is not a valid relative path of `/`-separated plain segments.
    #[error("invalid key {key:?}: {why}; use '/'-separated segments of letters, digits, '.', '_', '-' (not '.' or '..')")]
    InvalidKey { key: String, why: &'static str },
    /// An I/O operation failed.
    #[error(
        "{op} {path}: {source}; check the directory exists, is writable and the disk is not full"
    )]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A remote store (S3, an agent) failed or answered something unexpected.
    #[error("{op} {key:?} on {store}: {detail}")]
    Backend {
        /// Which store, e.g. `s3://bucket` or `agent host-b`.
        store: String,
        op: &'static str,
        key: String,
        /// What went wrong and what to do about it.
        detail: String,
    },
    /// Fewer replicas than required could be written, or none could be read.
    #[error("{op} {key:?}: {detail}")]
    Replicas {
        op: &'static str,
        key: String,
        detail: String,
    },
}

/// A durable key → bytes store. `put` is atomic: a reader sees the old or the new value, never a mix.
pub trait BlobStore: Send + Sync {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError>;
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Deleting a missing key is not an error.
    fn delete(&self, key: &str) -> Result<(), StoreError>;
    /// All keys starting with `prefix`, sorted.
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError>;
    /// `put` of the `len` bytes read from `body`: stores that can stream them (a directory)
    /// never hold them all in memory; the others read them first. Fewer than `len` bytes, or a
    /// read error, is an error and stores nothing.
    fn put_from(&self, key: &str, len: u64, body: &mut dyn Read) -> Result<(), StoreError> {
        let mut buf = Vec::with_capacity(len.min(1 << 24) as usize);
        let got = body
            .take(len)
            .read_to_end(&mut buf)
            .map_err(io("read the body of", Path::new(key)))?;
        if got as u64 != len {
            return Err(short_body(key, got as u64, len));
        }
        self.put(key, &buf)
    }
}

fn short_body(key: &str, got: u64, len: u64) -> StoreError {
    StoreError::Io {
        op: "read the body of",
        path: PathBuf::from(key),
        source: std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("the body ended after {got} of {len} bytes; nothing was stored"),
        ),
    }
}

/// The keys of another store under `scopes/<scope>/`, seen as a store of their own: every key
/// is confined to the scope and `list` shows nothing outside it. An agent gives each job's
/// checkpoint session the scope the job's key names, so a session of one job can neither see,
/// read, replace nor delete another job's blobs.
pub struct Scoped<S: BlobStore> {
    inner: S,
    prefix: String,
}

impl<S: BlobStore> Scoped<S> {
    /// `inner`'s keys under `scopes/<scope>/`; `scope` is one key segment.
    pub fn new(inner: S, scope: &str) -> Result<Scoped<S>, StoreError> {
        if scope.contains('/') {
            return Err(StoreError::InvalidKey {
                key: scope.to_string(),
                why: "a scope is one segment",
            });
        }
        check_key(scope)?;
        Ok(Scoped {
            inner,
            prefix: format!("scopes/{scope}/"),
        })
    }

    fn key(&self, key: &str) -> Result<String, StoreError> {
        check_key(key)?;
        Ok(format!("{}{key}", self.prefix))
    }
}

impl<S: BlobStore> BlobStore for Scoped<S> {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.inner.put(&self.key(key)?, bytes)
    }
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(&self.key(key)?)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(&self.key(key)?)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let keys = self.inner.list(&format!("{}{prefix}", self.prefix))?;
        Ok(keys
            .into_iter()
            .filter_map(|k| k.strip_prefix(&self.prefix).map(str::to_string))
            .collect())
    }
    fn put_from(&self, key: &str, len: u64, body: &mut dyn Read) -> Result<(), StoreError> {
        self.inner.put_from(&self.key(key)?, len, body)
    }
}

impl<T: BlobStore + ?Sized> BlobStore for Arc<T> {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        (**self).put(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).get(key)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        (**self).delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        (**self).list(prefix)
    }
    fn put_from(&self, key: &str, len: u64, body: &mut dyn Read) -> Result<(), StoreError> {
        (**self).put_from(key, len, body)
    }
}

impl<T: BlobStore + ?Sized> BlobStore for &T {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        (**self).put(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).get(key)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        (**self).delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        (**self).list(prefix)
    }
    fn put_from(&self, key: &str, len: u64, body: &mut dyn Read) -> Result<(), StoreError> {
        (**self).put_from(key, len, body)
    }
}

impl<T: BlobStore + ?Sized> BlobStore for Box<T> {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        (**self).put(key, bytes)
    }
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).get(key)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        (**self).delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        (**self).list(prefix)
    }
    fn put_from(&self, key: &str, len: u64, body: &mut dyn Read) -> Result<(), StoreError> {
        (**self).put_from(key, len, body)
    }
}

/// Checks a key: non-empty `/`-separated segments of `[A-Za-z0-9._-]`, no `.`/`..`, no `.tmp-` prefix.
pub fn check_key(key: &str) -> Result<(), StoreError> {
    let bad = |why| {
        Err(StoreError::InvalidKey {
            key: key.to_string(),
            why,
        })
    };
    if key.is_empty() {
        return bad("empty");
    }
    for seg in key.split('/') {
        if seg.is_empty() {
            return bad("empty segment");
        }
        if seg == "." || seg == ".." {
            return bad("'.' or '..' segment");
        }
        if seg.starts_with(".tmp-") {
            return bad("segment starts with reserved '.tmp-'");
        }
        if !seg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return bad("character outside [A-Za-z0-9._-]");
        }
    }
    Ok(())
}

/// A store in a local directory: a key is a relative path; put writes a temporary file, fsyncs it,
/// renames it over the key and fsyncs the directory.
pub struct DirStore {
    root: PathBuf,
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io { op, path, source }
}

impl DirStore {
    /// Opens (creating if needed) a store rooted at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(io("create directory", &root))?;
        Ok(DirStore { root })
    }

    fn walk(&self, dir: &Path, rel: &str, out: &mut Vec<String>) -> Result<(), StoreError> {
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io("read directory", dir)(e)),
        };
        for ent in rd {
            let ent = ent.map_err(io("read directory", dir))?;
            let name = ent.file_name().to_string_lossy().into_owned();
            if name.starts_with(".tmp-") {
                continue;
            }
            let key = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let ft = ent.file_type().map_err(io("stat", &ent.path()))?;
            if ft.is_dir() {
                self.walk(&ent.path(), &key, out)?;
            } else if ft.is_file() {
                out.push(key);
            }
        }
        Ok(())
    }
}

impl DirStore {
    /// Writes a temporary file with `fill`, fsyncs it, renames it over `key` and fsyncs the
    /// directory; a failed `fill` removes the temporary file and stores nothing.
    fn put_with(
        &self,
        key: &str,
        fill: impl FnOnce(&mut fs::File, &Path) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        check_key(key)?;
        let path = self.root.join(key);
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        fs::create_dir_all(&dir).map_err(io("create directory", &dir))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Unique per process and per call, so concurrent puts of one key never share a file.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".tmp-{}-{seq}-{name}", std::process::id()));
        let mut f = fs::File::create(&tmp).map_err(io("create", &tmp))?;
        let written = fill(&mut f, &tmp).and_then(|()| f.sync_all().map_err(io("fsync", &tmp)));
        drop(f);
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        fs::rename(&tmp, &path).map_err(io("rename into", &path))?;
        fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync directory", &dir))?;
        Ok(())
    }
}

impl BlobStore for DirStore {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.put_with(key, |f, tmp| f.write_all(bytes).map_err(io("write", tmp)))
    }

    fn put_from(&self, key: &str, len: u64, body: &mut dyn Read) -> Result<(), StoreError> {
        self.put_with(key, |f, tmp| {
            let got = std::io::copy(&mut body.take(len), f).map_err(io("write", tmp))?;
            if got != len {
                return Err(short_body(key, got, len));
            }
            Ok(())
        })
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(key)?;
        let path = self.root.join(key);
        match fs::read(&path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read", &path)(e)),
        }
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        check_key(key)?;
        let path = self.root.join(key);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("delete", &path)(e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        // Only the directory the prefix names (a scope's, a job's), not the whole store.
        match prefix.rsplit_once('/') {
            Some((dir, _)) if check_key(dir).is_ok() => {
                self.walk(&self.root.join(dir), dir, &mut out)?
            }
            _ => self.walk(&self.root, "", &mut out)?,
        }
        out.retain(|k| k.starts_with(prefix));
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_store_put_get_delete_list() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(d.path()).unwrap();
        assert_eq!(s.get("jobs/a/1/0.ckpt").unwrap(), None);
        s.put("jobs/a/1/0.ckpt", b"one").unwrap();
        s.put("jobs/a/1/0.ckpt", b"two").unwrap();
        s.put("jobs/b/1/0.ckpt", b"x").unwrap();
        assert_eq!(
            s.get("jobs/a/1/0.ckpt").unwrap().as_deref(),
            Some(&b"two"[..])
        );
        assert_eq!(
            s.list("jobs/a/").unwrap(),
            vec!["jobs/a/1/0.ckpt".to_string()]
        );
        assert_eq!(s.list("").unwrap().len(), 2);
        s.delete("jobs/a/1/0.ckpt").unwrap();
        s.delete("jobs/a/1/0.ckpt").unwrap();
        assert_eq!(s.get("jobs/a/1/0.ckpt").unwrap(), None);
    }

    #[test]
    fn a_streamed_put_stores_all_or_nothing() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(d.path()).unwrap();
        let body = vec![7u8; 300_000];
        s.put_from("a/b", body.len() as u64, &mut &body[..])
            .unwrap();
        assert_eq!(s.get("a/b").unwrap().unwrap(), body);
        // A body that ends early (a peer gone mid-put): an error, the old value stays, and no
        // temporary file is left behind.
        let e = s.put_from("a/b", 500_000, &mut &[1u8; 10][..]).unwrap_err();
        assert!(e.to_string().contains("after 10 of 500000 bytes"), "{e}");
        assert_eq!(s.get("a/b").unwrap().unwrap(), body);
        let names: Vec<_> = fs::read_dir(d.path().join("a")).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // The default (in memory) behaves the same.
        let sc = Scoped::new(&s, "x").unwrap();
        let e = BlobStore::put_from(&sc, "k", 5, &mut &b"ab"[..]).unwrap_err();
        assert!(e.to_string().contains("after 2 of 5"), "{e}");
        assert_eq!(sc.get("k").unwrap(), None);
    }

    #[test]
    fn scopes_see_nothing_of_each_other() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(d.path()).unwrap();
        let (a, b) = (
            Scoped::new(&s, "aaaa").unwrap(),
            Scoped::new(&s, "bbbb").unwrap(),
        );
        a.put("jobs/j/1/0.ckpt", b"a's").unwrap();
        b.put("jobs/j/1/0.ckpt", b"b's").unwrap();
        assert_eq!(a.get("jobs/j/1/0.ckpt").unwrap().unwrap(), b"a's");
        assert_eq!(b.list("").unwrap(), vec!["jobs/j/1/0.ckpt".to_string()]);
        b.delete("jobs/j/1/0.ckpt").unwrap();
        assert_eq!(a.get("jobs/j/1/0.ckpt").unwrap().unwrap(), b"a's");
        assert!(b.list("").unwrap().is_empty());
        // No key escapes its scope, and a scope is one plain segment.
        for k in ["../bbbb/x", "..", "/x"] {
            assert!(b.get(k).is_err(), "{k}");
        }
        for sc in ["a/b", "..", "", "a b"] {
            assert!(Scoped::new(&s, sc).is_err(), "{sc:?}");
        }
        assert_eq!(s.list("scopes/aaaa/").unwrap().len(), 1);
    }

    #[test]
    fn leftover_tmp_files_are_invisible_and_keys_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let s = DirStore::open(d.path()).unwrap();
        fs::write(d.path().join(".tmp-9-k"), b"partial").unwrap();
        assert!(s.list("").unwrap().is_empty());
        for k in ["", "../x", "a//b", "a/./b", ".tmp-1", "a b"] {
            assert!(
                matches!(s.put(k, b"x"), Err(StoreError::InvalidKey { .. })),
                "{k:?}"
            );
        }
    }
}
