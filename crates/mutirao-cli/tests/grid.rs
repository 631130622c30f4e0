//! `mutirao coordinator` as a process on loopback, driven by the client commands: submit
//! (uploads, then queues), jobs, job, logs, cancel; an unknown token (401) and another user's
//! job (403) refused with a message, changing nothing.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mutirao");
const ANA: &str = "ana-token-0123456789";
const BIA: &str = "bia-token-0123456789";

struct Coord {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Drop for Coord {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(tag: &str) -> Coord {
    let dir = std::env::temp_dir().join(format!("mutirao-grid-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("grid.tokens");
    std::fs::write(
        &tokens,
        format!("# test grid\nuser ana {ANA}\nuser bia {BIA}\nagent n1 n1-agent-token-0123456\n"),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["coordinator", "--listen", "127.0.0.1:0", "--db"])
        .arg(dir.join("coord.sqlite"))
        .arg("--tokens")
        .arg(&tokens)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start mutirao coordinator");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the coordinator says where it listens within 30 s");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_string();
    Coord { child, url, dir }
}

fn mutirao(c: &Coord, token: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("MUTIRAO_COORD", &c.url)
        .env("MUTIRAO_COORD_TOKEN", token)
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    assert!(
        !o.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn submit_jobs_job_logs_cancel_through_a_coordinator_process() {
    let c = start("cli");
    let prog = c.dir.join("hello.sh");
    std::fs::write(&prog, "#!/bin/sh\necho hello from $1\n").unwrap();
    let id = ok(&mutirao(
        &c,
        ANA,
        &[
            "submit",
            "-n",
            "2",
            "--require",
            "cpu>=1",
            "--",
            prog.to_str().unwrap(),
            "--flag",
            "x",
        ],
    ));
    let id: i64 = id.trim().parse().expect("submit prints the job id");

    let list = ok(&mutirao(&c, ANA, &["jobs"]));
    assert!(
        list.contains("waiting") && list.contains("--flag x"),
        "{list}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&mutirao(&c, ANA, &["jobs", "--json"]))).unwrap();
    assert_eq!(json[0]["id"], id);
    assert_eq!(json[0]["spec"]["ranks"], 2);
    assert_eq!(json[0]["spec"]["require"], "cpu>=1");
    // bia sees none of ana's jobs.
    assert!(ok(&mutirao(&c, BIA, &["jobs"])).contains("no jobs"));

    let one = ok(&mutirao(&c, ANA, &["job", &id.to_string()]));
    assert!(
        one.contains("waiting") && one.contains("submitted"),
        "{one}"
    );
    let why = ok(&mutirao(&c, ANA, &["job", &id.to_string(), "--why"]));
    assert!(why.contains("no placement decision recorded yet"), "{why}");
    assert_eq!(ok(&mutirao(&c, ANA, &["logs", &id.to_string()])), "");

    // 401: an unknown token; 403: bia cancelling ana's job. Neither changes anything.
    let e = err(&mutirao(
        &c,
        "not-a-token-of-this-grid",
        &["cancel", &id.to_string()],
    ));
    assert!(e.contains("401") && e.contains("unknown token"), "{e}");
    let e = err(&mutirao(&c, BIA, &["cancel", &id.to_string()]));
    assert!(e.contains("403") && e.contains("not yours"), "{e}");
    let e = err(&mutirao(&c, BIA, &["logs", &id.to_string()]));
    assert!(e.contains("403"), "{e}");
    assert!(ok(&mutirao(&c, ANA, &["jobs"])).contains("waiting"));

    let out = ok(&mutirao(&c, ANA, &["cancel", &id.to_string()]));
    assert!(out.contains("cancelled"), "{out}");
    let one = ok(&mutirao(&c, ANA, &["job", &id.to_string()]));
    assert!(one.contains("cancelled by ana"), "{one}");
    // Following a cancelled job's log ends at once, saying why, with a failing status.
    let t0 = Instant::now();
    let o = mutirao(&c, ANA, &["logs", "--follow", &id.to_string()]);
    assert!(err(&o).contains("cancelled"));
    assert!(t0.elapsed() < Duration::from_secs(10));
    let e = err(&mutirao(&c, ANA, &["cancel", &id.to_string()]));
    assert!(e.contains("409"), "{e}");
    let e = err(&mutirao(&c, ANA, &["job", "424242"]));
    assert!(e.contains("404") && e.contains("does not exist"), "{e}");
}

#[test]
fn client_commands_explain_what_is_missing() {
    let c = start("missing");
    let e = err(&mutirao(&c, "", &["jobs"]));
    assert!(e.contains("MUTIRAO_COORD_TOKEN"), "{e}");
    let e = err(&mutirao(
        &c,
        ANA,
        &["submit", "-n", "2", "/no/such/program"],
    ));
    assert!(e.contains("cannot read the program"), "{e}");
    let o = Command::new(BIN)
        .args(["jobs", "--coord", "http://127.0.0.1:9"])
        .env("MUTIRAO_COORD_TOKEN", ANA)
        .output()
        .unwrap();
    let e = err(&o);
    assert!(e.contains("cannot reach the coordinator"), "{e}");
    let o = Command::new(BIN)
        .args(["coordinator", "--listen", "127.0.0.1:0"])
        .env_remove("MUTIRAO_COORD_TOKENS")
        .output()
        .unwrap();
    assert!(err(&o).contains("no token file"));
}
