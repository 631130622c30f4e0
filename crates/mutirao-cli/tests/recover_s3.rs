//! `mutirao run --checkpoint-store s3://BUCKET/PREFIX` end to end, against a real
//! S3-compatible server (moto's `moto_server`, started here on a free loopback port, killed at
//! the end even on failure): jacobi's checkpoints go to the bucket, a rank is killed once an
//! epoch is committed there, every rank restarts from it, and the result is the failure-free
//! run's. Skipped, with the reason printed, when moto_server is not installed or does not answer.

mod common;
use common::{checksum, jacobi, rank_pid};

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills and reaps the server when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 request with an empty body; the whole answer (status line, headers, body).
fn http(port: u16, method: &str, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.take(1 << 20).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn moto() -> Result<(Server, u16), String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free loopback port: {e}"))?
        .port();
    let child = Command::new("moto_server")
        .args(["-p", &port.to_string(), "-H", "127.0.0.1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!("cannot run moto_server ({e}); install it with pip install 'moto[server]'")
        })?;
    let mut server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(st)) = server.0.try_wait() {
            return Err(format!("moto_server exited at start ({st})"));
        }
        if http(port, "GET", "/").is_ok_and(|a| a.starts_with("HTTP/1.")) {
            return Ok((server, port));
        }
        if Instant::now() > deadline {
            return Err("moto_server did not answer within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_killed_rank_restarts_from_checkpoints_kept_on_s3() {
    let Some(j) = jacobi() else {
        println!("skipped: the jacobi example is not built (cargo build -p mutirao --examples)");
        return;
    };
    let (_server, port) = match moto() {
        Ok(s) => s,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let bucket = "mutirao-recover";
    let made = http(port, "PUT", &format!("/{bucket}")).unwrap();
    assert!(
        made.starts_with("HTTP/1.1 200"),
        "cannot create the bucket: {made}"
    );
    let bin = env!("CARGO_BIN_EXE_mutirao");
    // About 2-3 s of work without checkpoints (debug build): long enough for a commit before
    // the kill, whatever the runtime's speed.
    let args = ["--n", "192", "--iters", "2000"];
    let plain = Command::new(bin)
        .args(["run", "-n", "3", "--timeout", "120"])
        .arg(&j)
        .arg("--")
        .args(args)
        .output()
        .unwrap();
    assert!(plain.status.success());
    let want = checksum(&String::from_utf8_lossy(&plain.stdout)).expect("a checksum");

    let endpoint = format!("http://127.0.0.1:{port}");
    let mut child = Command::new(bin)
        .args(["run", "-n", "3", "--timeout", "120"])
        .args(["--checkpoint-interval", "0.4", "--keep-checkpoints"])
        .args(["--checkpoint-store", &format!("s3://{bucket}/ckpt")])
        .env("AWS_ENDPOINT_URL", &endpoint)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ALLOW_HTTP", "true")
        .arg(&j)
        .arg("--")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the bucket holds a commit record, kill rank 1.
    let t0 = Instant::now();
    let mut killed = false;
    while t0.elapsed() < Duration::from_secs(60) {
        let list =
            http(port, "GET", &format!("/{bucket}?list-type=2&prefix=ckpt/")).unwrap_or_default();
        if list.contains("/COMMITTED</Key>") {
            if let Some(pid) = rank_pid(child.id(), 1) {
                // SAFETY: kill(2) with a pid read from /proc; no memory is involved.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
                killed = true;
                break;
            }
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if !killed {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        killed,
        "no epoch reached the bucket before the job ended:\n{se}"
    );
    assert!(out.status.success(), "{so}\n{se}");
    assert!(
        se.contains(&format!("go to s3://{bucket}/ckpt")),
        "the S3 store was not used:\n{se}"
    );
    assert!(
        se.contains("restart 1 of 3: every rank from committed epoch"),
        "no restart from a committed epoch:\n{se}"
    );
    // The epoch the launcher names is the one the ranks resumed from.
    let named = se
        .split("every rank from committed epoch ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .map(str::to_string);
    let resumed = se
        .split("(epoch ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .map(str::to_string);
    assert!(
        named.is_some() && named == resumed,
        "{named:?} vs {resumed:?}:\n{se}"
    );
    assert_eq!(checksum(&so).as_deref(), Some(want.as_str()), "{so}\n{se}");
    eprintln!("{se}");
}
