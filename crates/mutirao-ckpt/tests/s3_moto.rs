//! S3Store against a real S3-compatible server: moto's `moto_server`, started here on a free
//! loopback port and killed at the end (also on failure). Skipped, with the reason printed, when
//! moto_server is not installed or does not answer.
#![cfg(feature = "s3")]

use mutirao_ckpt::repo::CheckpointRepo;
use mutirao_ckpt::{BlobStore, S3Config, S3Store};
#[path = "support/moto.rs"]
mod moto;
use moto::http;

fn store(port: u16, bucket: &str, prefix: &str) -> S3Store {
    S3Store::new(&S3Config {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        bucket: bucket.into(),
        region: "us-east-1".into(),
        access_key_id: Some("testing".into()),
        secret_access_key: Some("testing".into()),
        session_token: None,
        allow_http: true,
        prefix: prefix.into(),
    })
    .expect("S3Store::new")
}

#[test]
fn s3_store_put_get_list_delete_against_moto() {
    let (_server, port) = match moto::start() {
        Ok(s) => s,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let made = http(port, "PUT", "/ckpt-test").expect("create bucket");
    let status = made.lines().next().unwrap_or("");
    assert!(status.contains(" 200"), "create bucket: {status}");

    let s = store(port, "ckpt-test", "");
    assert_eq!(s.get("jobs/a/1/0.ckpt").unwrap(), None, "missing key");
    s.put("jobs/a/1/0.ckpt", b"one").unwrap();
    s.put("jobs/a/1/0.ckpt", b"two").unwrap();
    s.put("jobs/a/1/1.ckpt", &[0u8, 255, 7]).unwrap();
    s.put("jobs/a/10/0.ckpt", b"ten").unwrap();
    s.put("jobs/b/1/0.ckpt", b"b").unwrap();
    assert_eq!(
        s.get("jobs/a/1/0.ckpt").unwrap().as_deref(),
        Some(&b"two"[..])
    );
    assert_eq!(
        s.get("jobs/a/1/1.ckpt").unwrap().as_deref(),
        Some(&[0u8, 255, 7][..])
    );
    assert_eq!(
        s.list("jobs/a/1/").unwrap(),
        vec!["jobs/a/1/0.ckpt".to_string(), "jobs/a/1/1.ckpt".to_string()]
    );
    assert_eq!(
        s.list("jobs/a/1").unwrap().len(),
        3,
        "string prefix also matches 10/"
    );
    assert_eq!(s.list("").unwrap().len(), 4);
    s.delete("jobs/a/1/0.ckpt").unwrap();
    s.delete("jobs/a/1/0.ckpt").unwrap();
    assert_eq!(s.get("jobs/a/1/0.ckpt").unwrap(), None);
    assert!(s.put("../x", b"x").is_err(), "bad key refused");

    // A key prefix inside the bucket: invisible to and from the unprefixed store.
    let p = store(port, "ckpt-test", "team/x");
    p.put("jobs/a/1/0.ckpt", b"p").unwrap();
    assert_eq!(
        p.list("jobs/").unwrap(),
        vec!["jobs/a/1/0.ckpt".to_string()]
    );
    assert_eq!(
        s.get("team/x/jobs/a/1/0.ckpt").unwrap().as_deref(),
        Some(&b"p"[..])
    );
    assert_eq!(p.get("jobs/b/1/0.ckpt").unwrap(), None);

    // Several threads at once on one store (one hidden runtime).
    let shared = &s;
    std::thread::scope(|sc| {
        for t in 0..4 {
            sc.spawn(move || {
                for i in 0..5 {
                    let k = format!("conc/{t}/{i}");
                    shared.put(&k, k.as_bytes()).unwrap();
                    assert_eq!(shared.get(&k).unwrap().as_deref(), Some(k.as_bytes()));
                }
            });
        }
    });
    assert_eq!(s.list("conc/").unwrap().len(), 20);

    // The checkpoint repository on S3: commit, restore, collect.
    let repo = CheckpointRepo::new(store(port, "ckpt-test", "repo"), "job7").unwrap();
    for epoch in 1..=2u64 {
        for rank in 0..2u32 {
            repo.put_rank(epoch, rank, format!("{epoch}/{rank}").as_bytes())
                .unwrap();
        }
        repo.commit(epoch, 2).unwrap();
        repo.gc(epoch).unwrap();
    }
    assert_eq!(repo.last_committed().unwrap(), Some(2));
    assert_eq!(repo.get_rank(2, 1).unwrap(), b"2/1");
    assert_eq!(
        repo.epochs().unwrap().into_iter().collect::<Vec<_>>(),
        vec![2]
    );

    // A missing bucket is an error naming it, not an empty answer.
    let e = store(port, "no-such-bucket", "")
        .put("k", b"x")
        .unwrap_err();
    assert!(e.to_string().contains("s3://no-such-bucket"), "{e}");
}
