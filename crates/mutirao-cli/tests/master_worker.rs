//! Seed 003 §9.3 check 1 through `mutirao run`: the `mw` example's distributed matrix product
//! equals the serial one bit for bit (64-bit integers, the whole matrix compared on the master
//! with `--verify full`) for n = 300 and 600, without dynamic inclusion and with one and three
//! workers added at `PERC_CONS_ADD` (the "3+1" and "3+3" configurations); every run's
//! repository log also passes the exactly-once audit (check 2). n = 2000 takes minutes of
//! serial checking on this machine and is in docs/master-worker.md as a command.

mod common;
use common::mw;

use std::process::Command;

#[test]
fn matmul_equals_the_serial_product_bit_for_bit_with_and_without_inclusion() {
    let Some(mw) = mw() else {
        println!("skipped: the mw example is not built (cargo build -p mutirao-mw --examples)");
        return;
    };
    for n in ["300", "600"] {
        for add in [0, 1, 3] {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_mutirao"));
            cmd.args(["run", "-n", "3", "--timeout", "120"])
                .arg(&mw)
                .args(["matmul", "--n", n, "--policy", "hnow", "--verify", "full"]);
            if add > 0 {
                // The thesis's blocking spawn: the workers surely join before the work ends.
                cmd.args([
                    "--add",
                    &add.to_string(),
                    "--add-at",
                    "30",
                    "--blocking-spawn",
                ]);
            }
            let out = cmd.output().unwrap();
            let (so, se) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
            );
            let case = format!("n={n}, 2 workers + {add}");
            assert!(out.status.success(), "{case}: {so}\n{se}");
            assert!(
                so.contains("result correct (whole result compared with a serial run)"),
                "{case}: {so}"
            );
            assert!(
                so.contains(&format!(
                    "exactly-once audit of the repository log: {n} tasks in"
                )),
                "{case}: {so}"
            );
            if add > 0 {
                assert!(
                    se.contains(&format!("mw: {add} worker(s) added at")),
                    "{case}: {se}"
                );
                // The newcomers (worker ids 3 and up) computed rows of C.
                assert!(so.contains(", 3: "), "{case}: {so}");
            }
        }
    }
}

#[test]
fn a_bad_verify_mode_is_refused_with_the_choices() {
    let Some(mw) = mw() else {
        println!("skipped: the mw example is not built (cargo build -p mutirao-mw --examples)");
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_mutirao"))
        .args(["run", "-n", "2", "--timeout", "60"])
        .arg(&mw)
        .args(["matmul", "--n", "50", "--verify", "most"])
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("--verify: \"most\" is not full or sample"),
        "{all}"
    );
}
