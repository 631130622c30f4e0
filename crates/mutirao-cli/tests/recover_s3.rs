//! `mutirao run --checkpoint-store s3://BUCKET/PREFIX` end to end, against a real
//! S3-compatible server (moto's `moto_server`, started here on a free loopback port, killed at
//! the end even on failure): jacobi's checkpoints go to the bucket, a rank is killed once an
//! epoch is committed there, every rank restarts from it, and the result is the failure-free
//! run's. Skipped, with the reason printed, when moto_server is not installed or does not answer.

mod common;
use common::moto::{self, http};
use common::{checksum, jacobi, kill9, plain_checksum, rank_pid, Running, MUTIRAO};

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_killed_rank_restarts_from_checkpoints_kept_on_s3() {
    let Some(j) = jacobi() else {
        println!("skipped: the jacobi example is not built (cargo build -p mutirao --examples)");
        return;
    };
    let (_server, port) = match moto::start() {
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
    // About 2-3 s of work without checkpoints (debug build): long enough for a commit before
    // the kill, whatever the runtime's speed.
    let args = ["--n", "192", "--iters", "2000"];
    let want = plain_checksum(&j, 3, &args);

    let endpoint = format!("http://127.0.0.1:{port}");
    let mut cmd = Command::new(MUTIRAO);
    cmd.args(["run", "-n", "3", "--timeout", "120"])
        .args(["--checkpoint-interval", "0.4", "--keep-checkpoints"])
        .args(["--checkpoint-store", &format!("s3://{bucket}/ckpt")])
        .env("AWS_ENDPOINT_URL", &endpoint)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ALLOW_HTTP", "true")
        .arg(&j)
        .arg("--")
        .args(args);
    let mut child = Running::spawn(cmd);
    // Once the bucket holds a commit record, kill rank 1.
    let t0 = Instant::now();
    let mut killed = false;
    while t0.elapsed() < Duration::from_secs(60) {
        let list =
            http(port, "GET", &format!("/{bucket}?list-type=2&prefix=ckpt/")).unwrap_or_default();
        if list.contains("/COMMITTED</Key>") {
            if let Some(pid) = rank_pid(child.id(), 1) {
                kill9(pid);
                killed = true;
                break;
            }
        }
        if child.exited() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait(Duration::from_secs(150));
    let (so, se) = (&out.stdout, &out.stderr);
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
    assert_eq!(checksum(so).as_deref(), Some(want.as_str()), "{so}\n{se}");
    eprintln!("{se}");
}
