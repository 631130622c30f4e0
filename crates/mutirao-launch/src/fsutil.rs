//! File writing shared by every subcommand: atomic (temporary file in the same directory, fsync,
//! rename, fsync of the directory), so a crash or a bad input never leaves a half-written file.

use anyhow::Context;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Write `data` to `path` atomically, mode 0644.
pub fn write_atomic(path: &Path, data: impl AsRef<[u8]>) -> anyhow::Result<()> {
    write_atomic_mode(path, data, 0o644)
}

/// Write `data` to `path` atomically with the given permission bits (e.g. 0o600 for secrets).
pub fn write_atomic_mode(path: &Path, data: impl AsRef<[u8]>, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .with_context(|| format!("{} is not a file path", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let res = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data.as_ref())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_files_and_reports_bad_paths() {
        let dir = std::env::temp_dir().join(format!("mutirao-fsutil-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f.txt");
        write_atomic(&p, "one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        write_atomic_mode(&p, "secret", 0o600).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let e = write_atomic(&dir.join("no/such/f.txt"), "x").unwrap_err();
        assert!(format!("{e:#}").contains("cannot write"), "{e:#}");
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
