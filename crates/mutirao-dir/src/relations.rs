//! Selective multicast over relations (digest 002 §2.6) as pure planning: who receives a
//! message sent to a resource, how many wire messages that takes, and which contexts forward
//! for which. The runtime executes the plan; nothing here does I/O.
//!
//! - filiation (`set_rel(o, d, Filiation)`): `o` becomes a descendant of `d`; a message to `d`
//!   is also delivered to `o`, recursively;
//! - pairing: `o` and `d` are peers; a message to either is delivered to both (and onwards);
//! - cycles are allowed: each member gets exactly one copy ([`Relations::recipients`]);
//! - per-context multicast: one wire message per destination context, whatever the number of
//!   members living there ([`plan`]); the origin's own context needs none;
//! - technology-aware trees: a context the origin cannot reach directly is served through a
//!   multi-technology member context rather than a bridge when one exists ([`plan`]);
//! - [`DedupWindow`]: receiver-side duplicate detection for `(origin context, sequence)`.

use crate::gid::Gid;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

/// A relation kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rel {
    /// The origin becomes a descendant of the target.
    Filiation,
    /// The two become peers.
    Pairing,
}

/// The relation graph (the mutable part of the directory).
#[derive(Clone, Debug, Default)]
pub struct Relations {
    descendants: HashMap<Gid, Vec<Gid>>,
    peers: HashMap<Gid, Vec<Gid>>,
}

impl Relations {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// `rocl_set_rel(ogid, dgid, rel)`.
    pub fn set(&mut self, ogid: Gid, dgid: Gid, rel: Rel) {
        let push = |m: &mut HashMap<Gid, Vec<Gid>>, a: Gid, b: Gid| {
            let v = m.entry(a).or_default();
            if !v.contains(&b) {
                v.push(b);
            }
        };
        match rel {
            Rel::Filiation => push(&mut self.descendants, dgid, ogid),
            Rel::Pairing => {
                push(&mut self.peers, ogid, dgid);
                push(&mut self.peers, dgid, ogid);
            }
        }
    }

    /// Removes a relation.
    pub fn unset(&mut self, ogid: Gid, dgid: Gid, rel: Rel) {
        let pull = |m: &mut HashMap<Gid, Vec<Gid>>, a: Gid, b: Gid| {
            if let Some(v) = m.get_mut(&a) {
                v.retain(|x| *x != b);
            }
        };
        match rel {
            Rel::Filiation => pull(&mut self.descendants, dgid, ogid),
            Rel::Pairing => {
                pull(&mut self.peers, ogid, dgid);
                pull(&mut self.peers, dgid, ogid);
            }
        }
    }

    /// Every resource a message to `dst` reaches (`dst` first), each exactly once, in
    /// breadth-first order; cycles are harmless.
    pub fn recipients(&self, dst: Gid) -> Vec<Gid> {
        let mut seen = HashSet::from([dst]);
        let mut out = vec![];
        let mut q = VecDeque::from([dst]);
        while let Some(x) = q.pop_front() {
            out.push(x);
            let next = self
                .descendants
                .get(&x)
                .into_iter()
                .flatten()
                .chain(self.peers.get(&x).into_iter().flatten());
            for &y in next {
                if seen.insert(y) {
                    q.push_back(y);
                }
            }
        }
        out
    }
}

/// A technology (transport) id.
pub type Tech = u32;

/// How one wire message travels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hop {
    /// Straight from the origin context.
    Direct,
    /// Through another destination context that shares a technology with both ends.
    Via(Gid),
    /// Through a bridge (no multi-technology member could forward).
    Bridge,
}

/// One wire message of a multicast plan: to `ctx`, for its `members`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireMsg {
    /// Destination context.
    pub ctx: Gid,
    /// Resources in that context that get a copy (the context copies locally).
    pub members: Vec<Gid>,
    /// Route.
    pub hop: Hop,
}

/// Plans a multicast from context `origin` to the resources reached from `dst`:
/// one [`WireMsg`] per destination context other than `origin` (members in `origin` itself
/// are returned separately as local deliveries). `ctx_of` maps a resource to its context and
/// `techs` gives each context's technologies.
pub fn plan(
    rel: &Relations,
    dst: Gid,
    origin: Gid,
    ctx_of: impl Fn(Gid) -> Gid,
    techs: &HashMap<Gid, BTreeSet<Tech>>,
) -> (Vec<Gid>, Vec<WireMsg>) {
    let mut by_ctx: BTreeMap<Gid, Vec<Gid>> = BTreeMap::new();
    for r in rel.recipients(dst) {
        by_ctx.entry(ctx_of(r)).or_default().push(r);
    }
    let local = by_ctx.remove(&origin).unwrap_or_default();
    let none = BTreeSet::new();
    let t_origin = techs.get(&origin).unwrap_or(&none);
    let shares = |a: &BTreeSet<Tech>, b: &BTreeSet<Tech>| a.intersection(b).next().is_some();
    let direct: BTreeSet<Gid> = by_ctx
        .keys()
        .copied()
        .filter(|c| shares(t_origin, techs.get(c).unwrap_or(&none)))
        .collect();
    let msgs = by_ctx
        .into_iter()
        .map(|(ctx, members)| {
            let tc = techs.get(&ctx).unwrap_or(&none);
            let hop = if direct.contains(&ctx) {
                Hop::Direct
            } else {
                direct
                    .iter()
                    .find(|d| shares(techs.get(d).unwrap_or(&none), tc))
                    .map_or(Hop::Bridge, |d| Hop::Via(*d))
            };
            WireMsg { ctx, members, hop }
        })
        .collect();
    (local, msgs)
}

/// A bounded window of recently seen `(origin context, sequence)` pairs for duplicate
/// detection at a receiver (messages may arrive twice over relation cycles or retries).
#[derive(Clone, Debug)]
pub struct DedupWindow {
    cap: usize,
    seen: HashSet<(Gid, u64)>,
    order: VecDeque<(Gid, u64)>,
}

impl DedupWindow {
    /// A window remembering the last `cap` messages.
    pub fn new(cap: usize) -> Self {
        DedupWindow {
            cap: cap.max(1),
            seen: HashSet::new(),
            order: VecDeque::new(),
        }
    }

    /// True the first time `(origin, seq)` is seen within the window.
    pub fn first_time(&mut self, origin: Gid, seq: u64) -> bool {
        if !self.seen.insert((origin, seq)) {
            return false;
        }
        self.order.push_back((origin, seq));
        if self.order.len() > self.cap {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        true
    }
}
