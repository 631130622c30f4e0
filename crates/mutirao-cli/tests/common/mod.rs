//! Helpers shared by the recovery tests (`recover`, `recover_testbed`, `recover_s3`): the
//! jacobi example's path and checksum, finding a rank's process, the checkpoint blobs under a
//! directory. Each test binary uses some of them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The runtime's jacobi example, built by `cargo test`/`nextest` for the workspace.
pub fn jacobi() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_BIN_EXE_mutirao"))
        .parent()?
        .join("examples")
        .join("jacobi");
    p.is_file().then_some(p)
}

/// The `checksum=…` word of jacobi's output.
pub fn checksum(out: &str) -> Option<String> {
    out.split_whitespace()
        .find(|w| w.starts_with("checksum="))
        .map(str::to_string)
}

/// The child of `parent` whose environment says `MUTIRAO_RANK=rank`.
pub fn rank_pid(parent: u32, rank: usize) -> Option<i32> {
    for ent in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = ent.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // pid (comm) state ppid …
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let want = format!("MUTIRAO_RANK={rank}");
        if env.split(|b| *b == 0).any(|kv| kv == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// Relative paths of the checkpoint blobs under `dir` (`jobs/<job>/<epoch>/<rank>.ckpt`).
pub fn ckpt_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "ckpt") {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out
}
