//! Digest 002 §7.8 check 20 (multicast over relations) as pure planning; the wire part is
//! the runtime's.

use mutirao_dir::relations::{plan, DedupWindow, Hop, Rel, Relations};
use mutirao_dir::Gid;
use std::collections::{BTreeSet, HashMap};

#[test]
fn check_20_multicast_one_copy_per_member_per_context_and_no_bridge() {
    let g = Gid;
    let (a, b, c, d, e) = (g(1), g(2), g(3), g(4), g(5));
    let mut r = Relations::new();
    r.set(b, a, Rel::Filiation); // b under a
    r.set(c, a, Rel::Filiation); // c under a
    r.set(a, c, Rel::Filiation); // a under c: a cycle
    r.set(c, b, Rel::Pairing); // b <-> c: another cycle
    r.set(d, b, Rel::Pairing); // d <-> b
    r.set(e, d, Rel::Filiation); // e under d
    let got = r.recipients(a);
    assert_eq!(got.len(), 5, "{got:?}");
    let set: BTreeSet<Gid> = got.iter().copied().collect();
    assert_eq!(set, BTreeSet::from([a, b, c, d, e]));
    // messages to a descendant do not climb to the ancestor
    assert_eq!(r.recipients(e), vec![e]);
    // pairing is symmetric
    assert!(r.recipients(d).contains(&b) && r.recipients(d).contains(&c));
    r.unset(d, b, Rel::Pairing);
    assert!(!r.recipients(a).contains(&d));

    // Fig. 3.13: group G with 6 descendants in two remote contexts → 2 wire messages, not 6
    let group = g(100);
    let mut r = Relations::new();
    let members: Vec<Gid> = (0..6).map(|i| g(200 + i)).collect();
    for m in &members {
        r.set(*m, group, Rel::Filiation);
    }
    let (origin, p, q) = (g(1000), g(1001), g(1002));
    let ctx_of = |x: Gid| match x.0 {
        100 => origin,
        200..=202 => p,
        _ => q,
    };
    let techs: HashMap<Gid, BTreeSet<u32>> =
        [(origin, [1].into()), (p, [1].into()), (q, [1].into())].into();
    let (local, wire) = plan(&r, group, origin, ctx_of, &techs);
    assert_eq!(local, vec![group]);
    assert_eq!(wire.len(), 2);
    assert_eq!(wire.iter().map(|w| w.members.len()).sum::<usize>(), 6);
    assert!(wire.iter().all(|w| w.hop == Hop::Direct));

    // Fig. 3.15: A (tech X) cannot reach C (tech Y) but D has X and Y → via D, no bridge;
    // E (tech Z) has no multi-technology member to go through → bridge
    let (ca, cb, cd, cc, ce) = (g(1), g(2), g(4), g(3), g(5));
    let mut r = Relations::new();
    for m in [g(20), g(40), g(30), g(50)] {
        r.set(m, g(10), Rel::Filiation);
    }
    let ctx_of = |x: Gid| match x.0 {
        10 => ca,
        20 => cb,
        40 => cd,
        30 => cc,
        _ => ce,
    };
    let techs: HashMap<Gid, BTreeSet<u32>> = [
        (ca, [1].into()),
        (cb, [1].into()),
        (cd, [1, 2].into()),
        (cc, [2].into()),
        (ce, [3].into()),
    ]
    .into();
    let (_, wire) = plan(&r, g(10), ca, ctx_of, &techs);
    let hop = |c: Gid| wire.iter().find(|w| w.ctx == c).unwrap().hop.clone();
    assert_eq!(hop(cb), Hop::Direct);
    assert_eq!(hop(cd), Hop::Direct);
    assert_eq!(hop(cc), Hop::Via(cd));
    assert_eq!(hop(ce), Hop::Bridge);

    // receivers drop duplicates within the window
    let mut w = DedupWindow::new(2);
    assert!(w.first_time(ca, 1));
    assert!(!w.first_time(ca, 1));
    assert!(w.first_time(ca, 2) && w.first_time(cb, 1));
    assert!(w.first_time(ca, 1), "evicted after the window");
}
