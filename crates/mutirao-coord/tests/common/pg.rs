//! A throw-away PostgreSQL server for tests: `initdb` into a temporary directory, `pg_ctl
//! start` listening only on a unix socket in that directory, stopped and removed on drop. As
//! root, the server runs as the `postgres` user (or `nobody`), which owns the directory.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct PgServer {
    dir: PathBuf,
    bin: PathBuf,
    user: Option<String>,
    next_db: std::sync::atomic::AtomicU32,
}

fn find_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|d| d.join("pg_ctl").is_file() && d.join("initdb").is_file())
        .collect();
    dirs.sort();
    if let Some(d) = dirs.pop() {
        return Some(d);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find(|d| d.join("pg_ctl").is_file() && d.join("initdb").is_file())
}

fn uid_of(user: &str) -> Option<(u32, u32)> {
    let id = |flag: &str| -> Option<u32> {
        let o = Command::new("id").args([flag, user]).output().ok()?;
        if !o.status.success() {
            return None;
        }
        String::from_utf8_lossy(&o.stdout).trim().parse().ok()
    };
    Some((id("-u")?, id("-g")?))
}

impl PgServer {
    /// Start a server, or say why it cannot be started here.
    pub fn start(tag: &str) -> Result<PgServer, String> {
        let bin = find_bin().ok_or("no PostgreSQL binaries (initdb, pg_ctl) in /usr/lib/postgresql/*/bin or on PATH; install Debian's postgresql package")?;
        let dir = std::env::temp_dir().join(format!("mutirao-pg-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let is_root = is_root();
        let mut user = None;
        if is_root {
            let name = ["postgres", "nobody"]
                .into_iter()
                .find(|u| uid_of(u).is_some())
                .ok_or("running as root and neither a postgres nor a nobody user exists to run the server")?;
            let (uid, gid) = uid_of(name).ok_or("cannot read the server user's ids")?;
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| format!("cannot give {} to {name}: {e}", dir.display()))?;
            user = Some(name.to_string());
        }
        let s = PgServer {
            dir,
            bin,
            user,
            next_db: 0.into(),
        };
        let data = s.dir.join("data");
        s.run(
            "initdb",
            &[
                "-D",
                path(&data),
                "-A",
                "trust",
                "-U",
                "mutirao",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        let opts = format!(
            "-k {} -c listen_addresses='' -c fsync=off -p 5432",
            s.dir.display()
        );
        let log = s.dir.join("log");
        s.run(
            "pg_ctl",
            &[
                "-D",
                path(&data),
                "-l",
                path(&log),
                "-w",
                "-t",
                "30",
                "-o",
                &opts,
                "start",
            ],
        )
        .map_err(|e| {
            format!(
                "{e}; server log: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })?;
        Ok(s)
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<(), String> {
        let exe = self.bin.join(tool);
        let mut cmd = match &self.user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let out = cmd
            .args(args)
            .current_dir(&self.dir)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{tool} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }

    pub fn url(&self, db: &str) -> String {
        format!(
            "host={} port=5432 user=mutirao dbname={db}",
            self.dir.display()
        )
    }

    /// A new empty database; its connection string.
    pub fn fresh_db(&self) -> String {
        let n = self
            .next_db
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("t{n}");
        let mut c = postgres::Client::connect(&self.url("postgres"), postgres::NoTls)
            .expect("connect to the test server");
        c.batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create a database");
        self.url(&name)
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = self.run(
            "pg_ctl",
            &[
                "-D",
                path(&data),
                "-m",
                "immediate",
                "-w",
                "-t",
                "20",
                "stop",
            ],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
