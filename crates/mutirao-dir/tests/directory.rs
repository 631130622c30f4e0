//! Digest 002 §7.8 directory checks on the in-process directory, and bad input.

use mutirao_dir::{Acl, Attr, AttrList, Cred, DirConfig, DirError, Directory, Gid, GidSplit};
use std::time::{Duration, Instant};

const ALICE: Cred = Cred {
    uid: 1000,
    gid: 100,
};
const BOB: Cred = Cred {
    uid: 1001,
    gid: 101,
};
const CAROL: Cred = Cred {
    uid: 1002,
    gid: 100,
};

fn dir() -> Directory {
    Directory::new(DirConfig {
        cluster: 3,
        node: 9,
        ..DirConfig::default()
    })
    .unwrap()
}

fn al(pairs: &[(&str, &str)]) -> AttrList {
    AttrList::from_pairs(
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.as_bytes().to_vec())),
    )
    .unwrap()
}

/// A snapshot of everything a user can observe, to assert "nothing changed".
fn snapshot(d: &Directory, who: Cred) -> Vec<(Gid, AttrList)> {
    d.query_all(who, &AttrList::new())
        .unwrap()
        .into_iter()
        .map(|g| (g, d.answer_for(who, g, &AttrList::new()).unwrap()))
        .collect()
}

#[test]
fn check_01_register_is_local_and_gid_decodes_under_split() {
    // The in-process directory has no I/O at all; the server-level half of this check
    // (no peer traffic on register) is in tests/server.rs.
    let mut d = dir();
    let now = Instant::now();
    let ctx = d.open_context(ALICE, now).unwrap();
    let r = d
        .register(ALICE, ctx, al(&[("type", "task")]), Acl::Public, false)
        .unwrap();
    let parts = GidSplit::default().decode(r.gid);
    assert_eq!((parts.cluster, parts.node), (3, 9));
    assert!(parts.counter > 0);
    // a custom split
    let split = GidSplit::new(8, 8).unwrap();
    let mut d = Directory::new(DirConfig {
        split,
        cluster: 200,
        node: 17,
        ..DirConfig::default()
    })
    .unwrap();
    let r = d
        .register(ALICE, Gid::NONE, al(&[("a", "b")]), Acl::Public, false)
        .unwrap();
    let p = split.decode(r.gid);
    assert_eq!((p.cluster, p.node), (200, 17));
    assert_eq!(r.gid.0 >> 56, 200);
}

#[test]
fn check_02_query_by_gid_full_partial_and_immutability() {
    let mut d = dir();
    let g = d
        .register(
            ALICE,
            Gid::NONE,
            al(&[
                ("type", "mailbox"),
                ("name", "pending"),
                ("port", "0123456789"),
            ]),
            Acl::Public,
            false,
        )
        .unwrap()
        .gid;
    d.register(
        ALICE,
        Gid::NONE,
        al(&[("type", "task")]),
        Acl::Public,
        false,
    )
    .unwrap();
    // by gid: direct hit, all attributes
    let (got, a) = d.query(BOB, Some(g), &AttrList::new()).unwrap();
    assert_eq!(got, g);
    assert_eq!(a.len(), 3);
    // full attributes -> hash hit, no partials -> all attributes returned
    let (got, a) = d.query(BOB, None, &al(&[("type", "mailbox")])).unwrap();
    assert_eq!(got, g);
    assert_eq!(
        a,
        al(&[
            ("type", "mailbox"),
            ("name", "pending"),
            ("port", "0123456789")
        ])
    );
    // partial attribute filled from the resource (truncated to the wanted length)
    let q = AttrList::from_attrs([Attr::full("name", "pending"), Attr::want("port", 4)]).unwrap();
    let (_, a) = d.query(BOB, None, &q).unwrap();
    assert_eq!(a.value("port"), Some(&b"0123"[..]));
    assert_eq!(a.len(), 2);
    // a want-only query uses the name index
    let (got, _) = d
        .query(
            BOB,
            None,
            &AttrList::from_attrs([Attr::want("port", 64)]).unwrap(),
        )
        .unwrap();
    assert_eq!(got, g);
    // no match
    assert_eq!(
        d.query(BOB, None, &al(&[("type", "operon")])),
        Err(DirError::NoMatch)
    );
    // immutable: registering again makes a new resource, the old one is unchanged
    let g2 = d
        .register(
            ALICE,
            Gid::NONE,
            al(&[("type", "mailbox"), ("name", "other")]),
            Acl::Public,
            false,
        )
        .unwrap()
        .gid;
    assert_ne!(g, g2);
    let (_, a) = d.query(BOB, Some(g), &AttrList::new()).unwrap();
    assert_eq!(a.value("name"), Some(&b"pending"[..]));
}

#[test]
fn check_03_dead_context_purged_within_heartbeat_timeout() {
    let mut d = dir(); // heartbeat timeout 3 s
    let t0 = Instant::now();
    let alive = d.open_context(ALICE, t0).unwrap();
    let dead = d.open_context(BOB, t0).unwrap();
    let keep = d
        .register(ALICE, alive, al(&[("k", "1")]), Acl::Public, false)
        .unwrap()
        .gid;
    let mut gone = vec![];
    for i in 0..5 {
        gone.push(
            d.register(
                BOB,
                dead,
                al(&[("k", "2"), ("i", &i.to_string())]),
                Acl::Public,
                false,
            )
            .unwrap()
            .gid,
        );
    }
    let persistent = d
        .register(BOB, Gid::NONE, al(&[("k", "3")]), Acl::Public, false)
        .unwrap()
        .gid;
    // heartbeats every second for `alive`; `dead` stops
    for s in 1..=3 {
        let t = t0 + Duration::from_secs(s);
        d.heartbeat(ALICE, alive, t).unwrap();
        assert!(d.expire(t).resources.is_empty(), "purged too early at {s}s");
    }
    let t = t0 + Duration::from_millis(3500);
    d.heartbeat(ALICE, alive, t).unwrap();
    let ex = d.expire(t);
    assert_eq!(ex.contexts, vec![dead]);
    let mut gone_sorted = gone.clone();
    gone_sorted.sort();
    assert_eq!(ex.resources, gone_sorted);
    for g in gone {
        assert_eq!(
            d.query(BOB, Some(g), &AttrList::new()),
            Err(DirError::NotFound(g))
        );
    }
    assert!(d.query(ALICE, Some(keep), &AttrList::new()).is_ok());
    assert!(d.query(ALICE, Some(persistent), &AttrList::new()).is_ok());
    // the dead context cannot come back
    assert_eq!(
        d.heartbeat(BOB, dead, t),
        Err(DirError::UnknownContext(dead))
    );
    assert!(matches!(
        d.register(BOB, dead, al(&[("x", "y")]), Acl::Public, false),
        Err(DirError::UnknownContext(_))
    ));
}

#[test]
fn check_05_paging_yields_each_gid_once_and_stop_frees_state() {
    let mut d = dir();
    let now = Instant::now();
    let mut want = vec![];
    for _ in 0..50 {
        want.push(
            d.register(
                ALICE,
                Gid::NONE,
                al(&[("kind", "robot")]),
                Acl::Public,
                false,
            )
            .unwrap()
            .gid,
        );
    }
    d.register(
        ALICE,
        Gid::NONE,
        al(&[("kind", "other")]),
        Acl::Public,
        false,
    )
    .unwrap();
    let q = d.query_start(BOB, al(&[("kind", "robot")]), now).unwrap();
    let mut got = vec![];
    while let Some((g, _)) = d.query_next(q, now).unwrap() {
        got.push(g);
    }
    got.sort();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(d.open_queries(), 1);
    d.query_stop(q).unwrap();
    assert_eq!(d.open_queries(), 0);
    assert_eq!(d.query_next(q, now), Err(DirError::UnknownQuery(q)));
    // an abandoned query is freed by the timeout
    let q = d.query_start(BOB, al(&[("kind", "robot")]), now).unwrap();
    d.query_next(q, now).unwrap();
    d.expire(now + Duration::from_secs(31));
    assert_eq!(d.open_queries(), 0);
}

#[test]
fn check_06_unique_registration_returns_one_gid() {
    let mut d = dir();
    let a = al(&[("group", "robots"), ("type", "domain")]);
    let r1 = d
        .register(ALICE, Gid::NONE, a.clone(), Acl::Public, true)
        .unwrap();
    let r2 = d
        .register(BOB, Gid::NONE, a.clone(), Acl::Public, true)
        .unwrap();
    assert!(r1.created && !r2.created);
    assert_eq!(r1.gid, r2.gid);
    // concurrent unique registrations through a shared lock: one gid for all
    let shared = std::sync::Arc::new(std::sync::Mutex::new(dir()));
    let gids: Vec<Gid> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|i| {
                let shared = shared.clone();
                let a = a.clone();
                s.spawn(move || {
                    shared
                        .lock()
                        .unwrap()
                        .register(Cred::new(2000 + i, 1), Gid::NONE, a, Acl::Public, true)
                        .unwrap()
                        .gid
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(gids.iter().all(|g| *g == gids[0]));
    assert_eq!(shared.lock().unwrap().len(), 1);
    // the cross-server case (K servers) is check_06 in tests/server.rs
}

#[test]
fn check_07_acl_outsider_sees_not_found() {
    let mut d = dir();
    let acl = Acl::Only {
        users: vec![BOB.uid],
        groups: vec![],
    };
    let g = d
        .register(ALICE, Gid::NONE, al(&[("secret", "yes")]), acl, false)
        .unwrap()
        .gid;
    let grp = d
        .register(
            ALICE,
            Gid::NONE,
            al(&[("team", "x")]),
            Acl::Only {
                users: vec![],
                groups: vec![100],
            },
            false,
        )
        .unwrap()
        .gid;
    let outsider = Cred::new(4242, 4242);
    // insider and owner see it
    assert!(d.query(ALICE, Some(g), &AttrList::new()).is_ok());
    assert!(d.query(BOB, Some(g), &AttrList::new()).is_ok());
    assert!(d.query(CAROL, Some(grp), &AttrList::new()).is_ok()); // by group
                                                                  // outsider: exactly what a missing resource gives
    let missing = Gid(g.0 + 1000);
    assert_eq!(
        d.query(outsider, Some(g), &AttrList::new()),
        Err(DirError::NotFound(g))
    );
    assert_eq!(
        d.query(outsider, Some(missing), &AttrList::new()),
        Err(DirError::NotFound(missing))
    );
    assert_eq!(
        d.query(outsider, None, &al(&[("secret", "yes")])),
        Err(DirError::NoMatch)
    );
    assert!(d.query_all(outsider, &AttrList::new()).unwrap().is_empty());
    // delete: outsider -> not found, insider non-owner -> permission denied; nothing changes
    let before = snapshot(&d, ALICE);
    assert_eq!(d.delete(outsider, g), Err(DirError::NotFound(g)));
    assert!(matches!(
        d.delete(BOB, g),
        Err(DirError::PermissionDenied(_))
    ));
    assert_eq!(snapshot(&d, ALICE), before);
    d.delete(ALICE, g).unwrap();
    assert_eq!(
        d.query(BOB, Some(g), &AttrList::new()),
        Err(DirError::NotFound(g))
    );
    // (send/put/get refusal needs the runtime; receiver-side checks use `acl_of`.)
    let (owner, acl) = d.acl_of(grp).unwrap();
    assert!(acl.permits(owner, CAROL) && !acl.permits(owner, outsider));
}

#[test]
fn check_13_replacement_found_by_requery() {
    // Directory half of component replacement: after the resource is deleted, the same
    // property query finds its replacement. (The delivery error needs the runtime.)
    let mut d = dir();
    let props = al(&[("role", "analyser"), ("app", "sire")]);
    let x = d
        .register(ALICE, Gid::NONE, props.clone(), Acl::Public, false)
        .unwrap()
        .gid;
    assert_eq!(d.query(BOB, None, &props).unwrap().0, x);
    d.delete(ALICE, x).unwrap();
    let y = d
        .register(ALICE, Gid::NONE, props.clone(), Acl::Public, false)
        .unwrap()
        .gid;
    assert_ne!(x, y);
    assert_eq!(d.query(BOB, None, &props).unwrap().0, y);
}

#[test]
fn bad_input_is_rejected_and_changes_nothing() {
    let mut d = dir();
    let now = Instant::now();
    let ctx = d.open_context(ALICE, now).unwrap();
    d.register(ALICE, ctx, al(&[("a", "1")]), Acl::Public, false)
        .unwrap();
    let before = snapshot(&d, ALICE);
    let contexts = d.live_contexts();
    // system namespace
    let sys = AttrList::from_pairs([("sys.acl", "x")]).unwrap();
    assert!(matches!(
        d.register(ALICE, ctx, sys.clone(), Acl::Public, false),
        Err(DirError::SystemNamespace(_))
    ));
    assert!(matches!(
        d.query(ALICE, None, &sys),
        Err(DirError::SystemNamespace(_))
    ));
    // empty and partial registrations
    assert!(matches!(
        d.register(ALICE, ctx, AttrList::new(), Acl::Public, false),
        Err(DirError::BadAttrs(_))
    ));
    let partial = AttrList::from_attrs([Attr::want("a", 3)]).unwrap();
    assert!(matches!(
        d.register(ALICE, ctx, partial, Acl::Public, false),
        Err(DirError::BadAttrs(_))
    ));
    // someone else's context
    assert!(matches!(
        d.register(BOB, ctx, al(&[("b", "2")]), Acl::Public, false),
        Err(DirError::PermissionDenied(_))
    ));
    // oversized attributes never make it into a list
    let big = vec![0u8; mutirao_dir::attr::MAX_VALUE_LEN + 1];
    let err = AttrList::from_pairs([("blob", big)]).unwrap_err();
    assert!(
        err.to_string().contains("blob") && err.to_string().contains("limit"),
        "{err}"
    );
    // nothing changed
    assert_eq!(snapshot(&d, ALICE), before);
    assert_eq!(d.live_contexts(), contexts);
    // the counter did not move either: the next gid follows the last good one
    let last = before.last().unwrap().0;
    let next = d
        .register(ALICE, ctx, al(&[("c", "3")]), Acl::Public, false)
        .unwrap()
        .gid;
    assert_eq!(next.0, last.0 + 1);
}
