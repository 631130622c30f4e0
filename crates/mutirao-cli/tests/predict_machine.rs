//! `mutirao predict machine` end to end: a local two-rank CRES run writes a machine model that
//! `mutirao predict` accepts for a model generated from the pi_tasks example's own source; bad
//! input is refused with a message and writes nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn mutirao(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mutirao"))
        .args(args)
        .output()
        .expect("run mutirao")
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "mutirao-predict-machine-{}-{tag}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mutirao/examples")
}

#[test]
fn local_two_ranks_write_a_model_that_predict_accepts() {
    let d = scratch("ok");
    let m = d.join("m.txt");
    let out = mutirao(&[
        "predict",
        "machine",
        "-n",
        "2",
        "-o",
        m.to_str().unwrap(),
        "--iterations",
        "20000",
        "--samples",
        "5",
        "--kernel-s",
        "0.02",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&m).expect("model written");
    for want in [
        "name[0]=",
        "name[1]=",
        "\nW[1]=1\n",
        "inter_sum_long[1]=[",
        "inter_shift_long[1]=[",
        "inter_send[1][0](16)=[",
        "inter_send[0][1](16384)=[",
    ] {
        assert!(text.contains(want), "{want} missing from\n{text}");
    }
    assert!(!text.contains("W[0]"), "the coordinator has no W:\n{text}");
    let model = d.join("pi.pamela");
    let ex = examples();
    let out = mutirao(&[
        "predict",
        "generate",
        ex.join("pi_tasks.pasl").to_str().unwrap(),
        "--source",
        ex.join("pi_tasks.rs").to_str().unwrap(),
        "--card",
        "tasks=10",
        "--task",
        "T1=distribute",
        "--task",
        "T2=task:in=8:out=16:code=0",
        "--task",
        "T3=gather",
        "-o",
        model.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = mutirao(&[
        "predict",
        "--app",
        model.to_str().unwrap(),
        "--machines",
        m.to_str().unwrap(),
        "-p",
        "1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("prediction JSON");
    let (lo, hi) = (
        v["t_min_s"].as_f64().unwrap(),
        v["t_max_s"].as_f64().unwrap(),
    );
    assert!(lo > 0.0 && lo <= hi, "{v}");
    // Every key the π task uses was measured: no fallback.
    assert_eq!(
        v["prediction"]["fallbacks"].as_array().map(Vec::len),
        Some(0),
        "{v}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_unknown_testbed_is_named_and_nothing_is_written() {
    let d = scratch("tb");
    let m = d.join("m.txt");
    let out = mutirao(&[
        "predict",
        "machine",
        "--testbed",
        "no-such-testbed-xyz",
        "-o",
        m.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"no-such-testbed-xyz\" is not up"), "{err}");
    assert!(!m.exists());
    assert_eq!(
        std::fs::read_dir(&d).unwrap().count(),
        0,
        "scratch files left"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_unwritable_output_is_refused_before_measuring() {
    let out = mutirao(&[
        "predict",
        "machine",
        "-n",
        "2",
        "-o",
        "/nonexistent-mutirao-dir/m.txt",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("directory /nonexistent-mutirao-dir does not exist"),
        "{err}"
    );
    let d = scratch("dir");
    let out = mutirao(&["predict", "machine", "-n", "2", "-o", d.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is a directory"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&d);
}
