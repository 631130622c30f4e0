//! Digest 002 §7.8 mεμ checks 21–27 and spec bad input.

use mutirao_dir::meu::aggregator::{AggregatorMap, MemBlocks, Target, Window};
use mutirao_dir::meu::props::{PropSet, Property};
use mutirao_dir::meu::route::{route, Delivery, Mailroom};
use mutirao_dir::meu::{spec, EntityType, Hierarchy, NewEntity, SharedHierarchy};
use mutirao_dir::{Acl, AttrList, Cred, DirConfig, DirError, Directory, Gid};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

const ADMIN: Cred = Cred { uid: 0, gid: 0 };
const USER: Cred = Cred {
    uid: 1000,
    gid: 100,
};

/// Fig. 4.4 exactly as printed (including the trailing ellipsis line).
const FIG_4_4: &str = r#"/* organizadores de nós */
Cl: Cluster {FastEthernet};
Sub1: "Subcluster Dual PIII" <Cl> {Myrinet};
Sub2: "Subcluster Quad Xeon" <Cl> {Myrinet, Gigabit};
Sub3: "Subcluster Dual Athlon" <Cl> {Gigabit};
"Subcluster Myrinet" <Cl> (Sub1, Sub2);

/* nós computacionais */
"Nó A1" <Sub1> {CPU=2, Mem=512};
"Nó B1" <Sub2> {CPU=4, Mem=1024};
"Nó C1" <Sub3> {CPU=2, Mem=512};
....
"#;

fn u64le(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().unwrap())
}

#[test]
fn check_21_phyparse_accepts_fig_4_4_and_registers_no_a1() {
    let s = spec::parse(FIG_4_4).unwrap();
    assert_eq!(s.domains.len(), 8);
    let mut dir = Directory::new(DirConfig::default()).unwrap();
    let (h, labels) = Hierarchy::register_spec(&s, &mut dir, ADMIN).unwrap();
    assert_eq!(dir.len(), 8);
    let q = AttrList::from_pairs([("nome", "Nó A1")]).unwrap();
    let (gid, attrs) = dir.query(USER, None, &q).unwrap();
    assert_eq!(attrs.value("tipo"), Some("domínio".as_bytes()));
    assert_eq!(attrs.value("nome"), Some("Nó A1".as_bytes()));
    assert_eq!(Gid(u64le(attrs.value("ascend").unwrap())), labels["Sub1"]);
    let cpu = Property::decode_value("CPU", attrs.value("CPU").unwrap()).unwrap();
    let mem = Property::decode_value("Mem", attrs.value("Mem").unwrap()).unwrap();
    assert_eq!(cpu, Property::sum("CPU", 2));
    assert_eq!(mem, Property::sum("Mem", 512));
    assert_eq!(attrs.len(), 5, "{attrs:?}");
    // the hierarchy agrees with the directory
    assert_eq!(h.get(gid).unwrap().ancestor, Some(labels["Sub1"]));
    let alias = h.find_by_name("Subcluster Myrinet").unwrap();
    assert_eq!(h.originals(alias), &[labels["Sub1"], labels["Sub2"]]);
    // labels are resolved in topological order even when used before their definition
    let s = spec::parse("\"Nó\" <S> {CPU=1};\nS: Sub <C>;\nC: Cluster;").unwrap();
    let mut dir = Directory::new(DirConfig::default()).unwrap();
    let (_, labels) = Hierarchy::register_spec(&s, &mut dir, ADMIN).unwrap();
    assert!(labels["C"] < labels["S"]);
    // unknown labels and cycles are rejected, and nothing is registered
    let mut dir = Directory::new(DirConfig::default()).unwrap();
    let e = Hierarchy::register_spec(&spec::parse("A: a;\nB: b <X>;").unwrap(), &mut dir, ADMIN)
        .unwrap_err();
    assert_eq!((e.line, e.col), (2, 7));
    assert!(e.msg.contains("unknown label \"X\""), "{e}");
    let e = Hierarchy::register_spec(
        &spec::parse("A: a <B>;\nB: b <C>;\nC: c (A);\nR: r;").unwrap(),
        &mut dir,
        ADMIN,
    )
    .unwrap_err();
    assert!(e.msg.contains("cycle"), "{e}");
    assert_eq!(dir.len(), 0);
}

#[test]
fn malformed_specs_report_line_and_column() {
    let cases: &[(&str, usize, usize, &str)] = &[
        ("Cl: Cluster {FastEthernet}", 1, 27, "expected ';'"),
        ("Cl: Cluster\n  {CPU=}", 2, 8, "value of property \"CPU\""),
        ("Cl: \"Cluster {A};", 1, 5, "not closed"),
        ("/* open\nCl: Cluster;", 1, 1, "never closed"),
        ("Cl: Cluster <> ;", 1, 14, "label"),
        ("A: a;\nA: b;", 2, 1, "already defined"),
        ("Cl: Cluster {A, A};", 1, 17, "twice"),
        ("N: n (A B);", 1, 9, "expected ')'"),
        ("", 1, 1, "no domain"),
    ];
    for (text, line, col, needle) in cases {
        let e = spec::parse(text)
            .and_then(|s| s.registration_order().map(|_| s))
            .unwrap_err();
        assert_eq!((e.line, e.col), (*line, *col), "{text:?}: {e}");
        assert!(e.to_string().contains(needle), "{text:?}: {e}");
        assert!(e
            .to_string()
            .starts_with(&format!("line {line}, column {col}:")));
    }
}

/// Fig. 4.6: D <B>, B <A>, C <B> is an original of D.
#[test]
fn check_22_property_algebra_fig_4_6_and_fig_4_7() {
    let s =
        spec::parse("A: A {a, b=5};\nB: B <A> {a, b=5};\nC: C <B> {c, b=2};\nD: D <B> (C) {b=3};")
            .unwrap();
    let (h, l) = Hierarchy::from_spec(&s).unwrap();
    let p = h.properties(l["D"]);
    let want = PropSet::of([
        Property::flag("a"),
        Property::flag("c"),
        Property::sum("b", 15),
    ]);
    assert_eq!(p, want, "P(D) = {p}");
    // Fig. 4.7: p = {(a,3)+, b, c}, q = {(a,1)+, c} ⇒ q ⊆ p
    let pp = PropSet::of([
        Property::sum("a", 3),
        Property::flag("b"),
        Property::flag("c"),
    ]);
    let q = PropSet::of([Property::sum("a", 1), Property::flag("c")]);
    assert!(q.satisfied_by(&pp));
    assert!(!pp.satisfied_by(&q));
    // q' = {(a,1)+, c, d} ⇒ p ∖ q' = {(a,2)+, b}
    let q2 = PropSet::of([
        Property::sum("a", 1),
        Property::flag("c"),
        Property::flag("d"),
    ]);
    assert_eq!(
        pp.minus(&q2),
        PropSet::of([Property::sum("a", 2), Property::flag("b")])
    );
    // exact values match bit for bit
    let g1 = PropSet::of([Property::exact("GFS", "/ethfs")]);
    assert!(!PropSet::of([Property::exact("GFS", "/ethfs2")]).satisfied_by(&g1));
    // the attribute encoding round-trips
    for prop in [
        Property::flag("x"),
        Property::exact("GFS", "/ethfs"),
        Property::sum("CPU", -3),
    ] {
        assert_eq!(
            Property::decode_value(&prop.name, &prop.encode_value()).unwrap(),
            prop
        );
    }
    assert!(Property::decode_value("x", &[9, 0]).is_err());
    assert!(Property::decode_value("x", &[1, 0, 1]).is_err());
}

/// Fig. 2.2: n Dual PIII nodes, m Quad Xeon nodes, k Dual Athlon nodes.
fn fig_2_2(n: usize, m: usize, k: usize) -> String {
    let mut s = String::from(
        "Cl: Cluster {FastEthernet, GFS=/ethfs};\n\
         Sub1: \"Subcluster Dual PIII\" <Cl> {Myrinet, GFS=myrfs};\n\
         Sub2: \"Subcluster Quad Xeon\" <Cl> {Myrinet, Gigabit};\n\
         Sub3: \"Subcluster Dual Athlon\" <Cl> {Gigabit};\n",
    );
    for i in 1..=n {
        s += &format!("\"Nó A{i}\" <Sub1> {{CPU=2, Mem=512}};\n");
    }
    for i in 1..=m {
        s += &format!("\"Nó B{i}\" <Sub2> {{CPU=4, Mem=1024}};\n");
    }
    for i in 1..=k {
        s += &format!("\"Nó C{i}\" <Sub3> {{CPU=2, Mem=512}};\n");
    }
    s
}

#[test]
fn check_23_lookup_synthesis_and_views_on_fig_2_2() {
    let (n, m, k) = (4i64, 2i64, 3i64);
    let (mut h, l) =
        Hierarchy::from_spec(&spec::parse(&fig_2_2(n as usize, m as usize, k as usize)).unwrap())
            .unwrap();
    let cl = l["Cl"];
    // (Myrinet) ∧ (CPU=2) → a Nó A-type node
    let q = PropSet::of([Property::flag("Myrinet"), Property::sum("CPU", 2)]);
    let got = h.lookup(cl, None, None, &q).unwrap();
    assert_eq!(h.get(got).unwrap().name, "Nó A1");
    // inheritance: Nó A1 accumulates its ancestors' properties
    let p = h.properties(got);
    for (name, v) in [
        ("GFS", Some("/ethfs")),
        ("FastEthernet", None),
        ("GFS", Some("myrfs")),
        ("Myrinet", None),
    ] {
        assert!(p.has(name, v), "{p}");
    }
    assert_eq!((p.get("CPU"), p.get("Mem")), (Some(2), Some(512)));
    // lookup by name and type only
    let b2 = h
        .lookup(cl, Some("Nó B2"), Some(EntityType::Domain), &PropSet::new())
        .unwrap();
    assert_eq!(h.get(b2).unwrap().name, "Nó B2");
    // synthesis: the Quad Xeon subcluster satisfies (Myrinet) ∧ (Gigabit) ∧ (CPU=4m)
    let q = PropSet::of([
        Property::flag("Myrinet"),
        Property::flag("Gigabit"),
        Property::sum("CPU", 4 * m),
    ]);
    assert!(q.satisfied_by(&h.properties(l["Sub2"])));
    assert!(!PropSet::of([Property::sum("CPU", 4 * m + 1)]).satisfied_by(&h.properties(l["Sub2"])));
    // (Myrinet) ∧ (CPU=2n+4m): no domain of the base tree …
    let q = PropSet::of([
        Property::flag("Myrinet"),
        Property::sum("CPU", 2 * n + 4 * m),
    ]);
    assert_eq!(h.lookup(cl, None, None, &q), None);
    // … but the alias Subcluster Myrinet satisfies it through property sharing
    let alias = h
        .create(
            ADMIN,
            NewEntity::new(EntityType::Domain, "Subcluster Myrinet", cl)
                .alias_of(vec![l["Sub1"], l["Sub2"]]),
        )
        .unwrap();
    let pa = h.properties(alias);
    assert!(q.satisfied_by(&pa), "{pa}");
    assert_eq!(pa.get("CPU"), Some(2 * n + 4 * m));
    // and lookup_aggreg builds such a view itself
    let (mut h2, _) =
        Hierarchy::from_spec(&spec::parse(&fig_2_2(n as usize, m as usize, k as usize)).unwrap())
            .unwrap();
    let p1 = PropSet::of([Property::flag("Myrinet")]);
    let p2 = PropSet::of([Property::sum("CPU", 2 * n + 4 * m)]);
    let v = h2
        .lookup_aggreg(USER, cl, &p1, &p2, "MyrinetView", vec![])
        .unwrap()
        .unwrap();
    let ve = h2.get(v).unwrap();
    assert_eq!(ve.kind, EntityType::Domain);
    assert_eq!(ve.originals, vec![l["Sub1"], l["Sub2"]]);
    assert!(q.satisfied_by(&h2.properties(v)));
    // a single qualifying entity is returned as is (on a tree without the view, which would
    // itself qualify); an impossible aggregate gives None
    let (mut h3, _) =
        Hierarchy::from_spec(&spec::parse(&fig_2_2(n as usize, m as usize, k as usize)).unwrap())
            .unwrap();
    let one = h3
        .lookup_aggreg(
            USER,
            cl,
            &PropSet::of([Property::flag("Gigabit"), Property::flag("Myrinet")]),
            &PropSet::new(),
            "x",
            vec![],
        )
        .unwrap();
    assert_eq!(one, Some(l["Sub2"]));
    let before = h2.len();
    let none = h2
        .lookup_aggreg(
            USER,
            cl,
            &p1,
            &PropSet::of([Property::sum("CPU", 1000)]),
            "y",
            vec![],
        )
        .unwrap();
    assert_eq!((none, h2.len()), (None, before));
}

fn small_world() -> (Hierarchy, HashMap<String, Gid>) {
    Hierarchy::from_spec(
        &spec::parse(
            "Cl: Cluster;\nS: Sub <Cl> {Myrinet};\nN1: \"Nó 1\" <S> {CPU=2, Mem=512};\nN2: \"Nó 2\" <S> {CPU=2, Mem=512};",
        )
        .unwrap(),
    )
    .unwrap()
}

#[test]
fn check_24_chaining_and_alias_rules_are_enforced() {
    use EntityType::*;
    let (mut h, l) = small_world();
    let n1 = l["N1"];
    let c =
        |h: &mut Hierarchy, k, name: &str, parent| h.create(USER, NewEntity::new(k, name, parent));
    let op = c(&mut h, Operon, "op", n1).unwrap();
    let task = c(&mut h, Task, "t", op).unwrap();
    let blk = c(&mut h, Block, "b", op).unwrap();
    let mb = c(&mut h, Mailbox, "mb", n1).unwrap();
    let aggr = c(&mut h, Aggregator, "ag", n1).unwrap();
    let app = c(&mut h, Domain, "app", l["Cl"]).unwrap();
    let before = h.len();
    let rule = |r: Result<Gid, DirError>, needle: &str| {
        let e = r.unwrap_err().to_string();
        assert!(e.contains(needle), "expected {needle:?} in {e}");
    };
    rule(c(&mut h, Task, "t2", task), "rule 1");
    rule(c(&mut h, Task, "t3", mb), "rule 1");
    rule(c(&mut h, Operon, "op2", blk), "rule 1");
    rule(c(&mut h, Task, "t4", n1), "rule 2");
    rule(c(&mut h, Block, "b2", app), "rule 2");
    rule(c(&mut h, Operon, "op3", app), "rule 3");
    rule(c(&mut h, Mailbox, "mb2", l["S"]), "rule 3");
    rule(c(&mut h, Operon, "inner", op), "rule 4");
    rule(c(&mut h, Domain, "d", aggr), "rule 5");
    rule(c(&mut h, Task, "ta", aggr), "rule 5");
    let op_b = c(&mut h, Operon, "op_b", l["N2"]).unwrap();
    let before = before + 1;
    rule(
        h.create(
            USER,
            NewEntity::new(Operon, "two", app).alias_of(vec![op, op_b]),
        ),
        "alias rule 1",
    );
    rule(
        h.create(USER, NewEntity::new(Task, "ta", op).alias_of(vec![op])),
        "alias rule 2",
    );
    rule(
        h.create(USER, NewEntity::new(Domain, "da", app).alias_of(vec![blk])),
        "alias rule 2",
    );
    rule(
        h.create(USER, NewEntity::new(Subtractor, "s", op)),
        "under a domain",
    );
    // ACL: a private domain of another user looks absent
    let private = h
        .create(
            Cred::new(7, 7),
            NewEntity::new(Domain, "private", l["Cl"]).with_acl(Acl::private()),
        )
        .unwrap();
    let before = before + 1;
    rule(c(&mut h, Domain, "inside", private), "does not exist");
    rule(
        h.create(
            USER,
            NewEntity::new(Domain, "v", app).alias_of(vec![private]),
        ),
        "does not exist",
    );
    assert_eq!(h.len(), before, "rejected creations changed nothing");
    // what the rules allow: programmer-view aliases and tasks under them
    let op_alias = h
        .create(
            USER,
            NewEntity::new(Operon, "op (view)", app).alias_of(vec![op]),
        )
        .unwrap();
    c(&mut h, Task, "t5", op_alias).unwrap();
    h.create(
        USER,
        NewEntity::new(Block, "b (in aggr)", aggr).alias_of(vec![blk]),
    )
    .unwrap();
    h.create(
        USER,
        NewEntity::new(Domain, "group", app).alias_of(vec![op, mb, task, l["S"]]),
    )
    .unwrap();
}

#[test]
fn check_25_message_semantics_per_destination_type() {
    use EntityType::*;
    let (mut h, l) = small_world();
    let c = |h: &mut Hierarchy, k, name: &str, parent| {
        h.create(USER, NewEntity::new(k, name, parent)).unwrap()
    };
    let alias = |h: &mut Hierarchy, k, name: &str, parent, o: Vec<Gid>| {
        h.create(USER, NewEntity::new(k, name, parent).alias_of(o))
            .unwrap()
    };
    let op1 = c(&mut h, Operon, "robo1", l["N1"]);
    let t1 = c(&mut h, Task, "t1", op1);
    let t2 = c(&mut h, Task, "t2", op1);
    let op2 = c(&mut h, Operon, "robo2", l["N2"]);
    let t3 = c(&mut h, Task, "t3", op2);
    let mb = c(&mut h, Mailbox, "pendentes", l["N1"]);
    // (a) to a task
    let r = route(&h, USER, t1, t3).unwrap();
    assert_eq!(r.deliveries, vec![Delivery::Task(t3)]);
    // (b) task alias → original; (c) alias of an alias → original
    let app = c(&mut h, Domain, "app", l["Cl"]);
    let ta = alias(&mut h, Task, "t3'", app, vec![t3]);
    let taa = alias(&mut h, Task, "t3''", app, vec![ta]);
    assert_eq!(
        route(&h, USER, t1, ta).unwrap().deliveries,
        vec![Delivery::Task(t3)]
    );
    assert_eq!(
        route(&h, USER, t1, taa).unwrap().deliveries,
        vec![Delivery::Task(t3)]
    );
    // (d) a physical domain drops the message
    let r = route(&h, USER, t1, l["N1"]).unwrap();
    assert!(r.deliveries.is_empty());
    assert_eq!(r.dropped, vec![l["N1"]]);
    // operon: one stored copy, consumers = its non-alias tasks
    let r = route(&h, USER, t3, op1).unwrap();
    assert_eq!(
        r.deliveries,
        vec![Delivery::Stored {
            at: op1,
            consumers: vec![t1, t2]
        }]
    );
    // mailbox: consumers = tasks under the mailbox's ancestor (N1 → robo1's tasks)
    let r = route(&h, USER, t3, mb).unwrap();
    assert_eq!(
        r.deliveries,
        vec![Delivery::Stored {
            at: mb,
            consumers: vec![t1, t2]
        }]
    );
    // (e)/(f) Fig. 6.7(a): Recolha = {operon robo1 (alias), mailbox, domain AlgunsRobôs = {robo2, robo3}}
    let recolha = c(&mut h, Domain, "Recolha", app);
    alias(&mut h, Operon, "robo1'", recolha, vec![op1]);
    alias(&mut h, Mailbox, "pendentes'", recolha, vec![mb]);
    let alguns = c(&mut h, Domain, "AlgunsRobôs", recolha);
    alias(&mut h, Operon, "robo2'", alguns, vec![op2]);
    let op3 = c(&mut h, Operon, "robo3", l["N2"]);
    let t4 = c(&mut h, Task, "t4", op3);
    let t5 = c(&mut h, Task, "t5", op3);
    alias(&mut h, Operon, "robo3'", alguns, vec![op3]);
    let r = route(&h, USER, t1, recolha).unwrap();
    assert_eq!(r.deliveries.len(), 4, "{r:?}");
    let ats: Vec<Gid> = r.deliveries.iter().map(Delivery::at).collect();
    for g in [op1, mb, op2, op3] {
        assert!(ats.contains(&g));
    }
    // (f) an alias domain whose originals include a physical domain: that copy is dropped,
    // and a task reached twice gets one copy
    let mix = alias(&mut h, Domain, "mix", app, vec![l["N2"], t4]);
    c(&mut h, Domain, "sub", mix);
    let _t4a = alias(&mut h, Task, "t4 again", mix, vec![t4]);
    let r = route(&h, USER, t1, mix).unwrap();
    assert_eq!(r.deliveries, vec![Delivery::Task(t4)]);
    assert_eq!(r.dropped, vec![l["N2"]]);
    // sources: task or mailbox only; blocks cannot receive
    assert!(route(&h, USER, op1, t1).is_err());
    assert!(route(&h, USER, mb, t1).is_ok());
    let blk = c(&mut h, Block, "blk", op1);
    assert!(route(&h, USER, t1, blk).is_err());
    // an ACL outsider cannot even find the destination
    let secret = h
        .create(
            Cred::new(9, 9),
            NewEntity::new(Mailbox, "s", l["N1"]).with_acl(Acl::private()),
        )
        .unwrap();
    assert_eq!(route(&h, USER, t1, secret), Err(DirError::NotFound(secret)));
    // operon and mailbox messages are consumed exactly once, even by racing tasks
    let room: Mailroom<u32> = Mailroom::new();
    let r = route(&h, USER, t1, op3).unwrap();
    for i in 0..2000 {
        room.deliver(&r, i);
    }
    let taken = AtomicUsize::new(0);
    let got: Vec<Vec<u32>> = std::thread::scope(|s| {
        let hs: Vec<_> = [t4, t5, t4, t5]
            .iter()
            .map(|&t| {
                let room = &room;
                let taken = &taken;
                s.spawn(move || {
                    let mut v = vec![];
                    while let Some(m) = room.take(t, op3).unwrap() {
                        v.push(m);
                        taken.fetch_add(1, Ordering::Relaxed);
                    }
                    v
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<u32> = got.into_iter().flatten().collect();
    all.sort();
    assert_eq!(all, (0..2000).collect::<Vec<_>>());
    // a task outside the consumer set may not take
    room.deliver(&r, 1);
    assert!(room.take(t1, op3).is_err());
}

#[test]
fn check_26_allocation_and_reservation_never_overcommit() {
    use EntityType::*;
    // 16 nodes of 512 Mem and 2 CPUs = 8192 Mem, 32 CPUs.
    let mut text = String::from("Cl: Cluster;\nS: Sub <Cl>;\n");
    for i in 1..=16 {
        text += &format!("A{i}: \"Nó A{i}\" <S> {{CPU=2, Mem=512}};\n");
    }
    let (mut h, l) = Hierarchy::from_spec(&spec::parse(&text).unwrap()).unwrap();
    let view_x = h
        .create(
            USER,
            NewEntity::new(Domain, "Vista X", l["Cl"]).alias_of(vec![l["S"]]),
        )
        .unwrap();
    let need = PropSet::of([Property::sum("Mem", 8192), Property::sum("Mem'", 0)]);
    assert!(need.satisfied_by(&h.properties(view_x)));
    // a 64-unit block under Nó A8 → the 8192 view fails
    let op = h
        .create(USER, NewEntity::new(Operon, "op", l["A8"]))
        .unwrap();
    h.create(
        USER,
        NewEntity::new(Block, "blk", op).with_props(vec![Property::sum("Mem'", 64)]),
    )
    .unwrap();
    assert!(!need.satisfied_by(&h.properties(view_x)));
    assert!(!h.guarantees(view_x, "Mem", 8192));
    assert!(h.guarantees(view_x, "Mem", 8192 - 64));
    // 31 CPUs: one occupied by a task alone would still leave 31 …
    h.create(
        USER,
        NewEntity::new(Task, "Tarefa", op).with_props(vec![Property::sum("CPU'", 1)]),
    )
    .unwrap();
    let view_y = h
        .create(
            USER,
            NewEntity::new(Domain, "Vista Y", l["Cl"]).alias_of(vec![l["S"]]),
        )
        .unwrap();
    assert!(h.guarantees(view_y, "CPU", 31));
    // … but subtractor Reserva holds 2 CPUs of Nó A1 → fails
    h.create(
        USER,
        NewEntity::new(Subtractor, "Reserva", l["A1"]).with_props(vec![Property::sum("CPU''", 2)]),
    )
    .unwrap();
    assert!(!h.guarantees(view_y, "CPU", 31));
    let p = h.properties(view_y);
    assert_eq!(
        (p.get("CPU"), p.get("CPU'"), p.get("CPU''")),
        (Some(32), Some(1), Some(2))
    );
    // over-allocation on one node is refused and changes nothing
    let before = h.len();
    let e = h
        .create(
            USER,
            NewEntity::new(Block, "big", op).with_props(vec![Property::sum("Mem'", 512)]),
        )
        .unwrap_err();
    assert!(e.to_string().contains("capacity"), "{e}");
    assert_eq!(h.len(), before);
    // create-view-and-reserve is all or nothing
    let e = h
        .create_view_and_reserve(
            USER,
            l["Cl"],
            "too big",
            vec![l["S"]],
            &[("CPU".into(), 30)],
        )
        .unwrap_err();
    assert!(e.to_string().contains("short"), "{e}");
    assert_eq!(h.len(), before);
    let (v, subs) = h
        .create_view_and_reserve(USER, l["Cl"], "mine", vec![l["S"]], &[("CPU".into(), 5)])
        .unwrap();
    assert!(!subs.is_empty());
    assert!(!h.guarantees(view_y, "CPU", 32 - 3 - 5 + 1));
    assert!(h.guarantees(view_y, "CPU", 32 - 3 - 5));
    assert_eq!(h.get(v).unwrap().originals, vec![l["S"]]);
    // concurrent allocators: 32 threads try 64 Mem each on one 512 node → exactly 8 succeed
    let shared = SharedHierarchy::new(h);
    let op2 = shared
        .create(USER, NewEntity::new(Operon, "op2", l["A3"]))
        .unwrap();
    let ok = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for i in 0..32 {
            let shared = &shared;
            let ok = &ok;
            s.spawn(move || {
                let r = shared.create(
                    USER,
                    NewEntity::new(Block, format!("b{i}"), op2)
                        .with_props(vec![Property::sum("Mem'", 64)]),
                );
                if r.is_ok() {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // and concurrent view reservations on the whole subcluster never exceed its CPUs
        for i in 0..8 {
            let shared = &shared;
            let l = &l;
            s.spawn(move || {
                let _ = shared.create_view_and_reserve(
                    USER,
                    l["Cl"],
                    &format!("v{i}"),
                    vec![l["S"]],
                    &[("CPU".into(), 4)],
                );
            });
        }
    });
    assert_eq!(ok.load(Ordering::Relaxed), 8);
    shared.read(|h| {
        assert_eq!(h.free(l["A3"], "Mem"), 0);
        assert!(
            h.free(l["S"], "CPU") >= 0,
            "CPU over-committed: {}",
            h.free(l["S"], "CPU")
        );
    });
}

#[test]
fn check_27_aggregator_layout_nesting_and_windows() {
    let g = |n| Gid(n);
    let (b1, b2, b3, b4, b5) = (g(1), g(2), g(3), g(4), g(5));
    let (a1, a2) = (g(100), g(200));
    let mut blocks: MemBlocks = HashMap::new();
    for (b, n, fill) in [
        (b1, 100, 1u8),
        (b2, 50, 2),
        (b3, 30, 3),
        (b4, 40, 4),
        (b5, 10, 5),
    ] {
        blocks.insert(b, vec![fill; n]);
    }
    let mut maps = HashMap::new();
    // blocks appended in order are contiguous
    let mut m1 = AggregatorMap::new();
    assert_eq!(m1.append_block(b1, 100).start, 0);
    assert_eq!(m1.append_block(b2, 50).start, 100);
    assert_eq!(m1.size(), 150);
    maps.insert(a1, m1);
    // A2 = B4, then A1 through a fixed fraction (0..150), then B5, plus half of B3 at 300
    let mut m2 = AggregatorMap::new();
    m2.append_block(b4, 40);
    let nested = m2.map(Target::Aggregator(a1), 0, 150, None).unwrap();
    assert_eq!(nested.start, 40);
    assert_eq!(m2.append_block(b5, 10).start, 190);
    m2.map(Target::Block(b3), 15, 15, Some(300)).unwrap();
    assert!(
        m2.map(Target::Block(b3), 0, 20, Some(195)).is_err(),
        "overlap"
    );
    maps.insert(a2, m2);
    // A1 grows: B5's place in A2 does not move
    maps.get_mut(&a1).unwrap().append_block(b3, 30);
    assert_eq!(maps[&a1].size(), 180);
    let w = Window::map(&maps, a2, 185, 195).unwrap();
    let mut w = w;
    w.get(&blocks).unwrap();
    assert_eq!(w.data, [[2u8; 5].as_slice(), &[5u8; 5]].concat());
    // get/put round trip across B4 | A1(B1,B2) | B5
    let mut w = Window::map(&maps, a2, 30, 200).unwrap();
    w.get(&blocks).unwrap();
    assert_eq!(&w.data[..10], &[4u8; 10]);
    assert_eq!(&w.data[10..110], &[1u8; 100][..]);
    assert_eq!(&w.data[110..160], &[2u8; 50][..]);
    assert_eq!(&w.data[160..], &[5u8; 10]);
    for (i, b) in w.data.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    w.put(&mut blocks).unwrap();
    let mut again = Window::map(&maps, a2, 30, 200).unwrap();
    again.get(&blocks).unwrap();
    assert_eq!(again.data, w.data);
    assert_eq!(blocks[&b1][0], 10);
    assert_eq!(blocks[&b4][..30], [4u8; 30]);
    // holes are reported
    assert!(Window::map(&maps, a2, 195, 305).is_err());
    let mut half = Window::map(&maps, a2, 300, 315).unwrap();
    half.get(&blocks).unwrap();
    assert_eq!(half.data, vec![3u8; 15]);
}
