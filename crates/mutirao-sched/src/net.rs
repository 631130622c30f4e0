//! Flow-level network contention (SimGrid's model, reduced to what mutirão's platforms have).
//!
//! A message between two different hosts is a **flow** of its bytes over the resources of its
//! path: the sender's NIC out, the receiver's NIC in and, between sites, the directed link from
//! the sender's site to the receiver's. Flows in progress share each resource **max–min fair**
//! (progressive filling), and the rates are recomputed whenever a flow starts or ends.
//! Two messages between the same ordered pair of hosts travel on one connection: the second
//! starts when the first has finished (FIFO per connection).
//!
//! The simulator uses the network only to know how much **later** than alone a message arrives:
//! a flow of `m` bytes whose bottleneck capacity is `B` would take `w = m / B` alone; if it
//! finishes at `f` after starting at `s`, the message's HLogP arrival is delayed by
//! `f − s − w` (≥ 0). A message alone is thus exactly HLogP's, whatever the model's `L` holds
//! (with the runtime's rendezvous protocol the transfer shows in `Or`, not in `L`).
//!
//! Pure: no I/O, time is passed in.

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// Capacities of a platform's shared resources, bytes per second, resolved per host.
#[derive(Debug, Clone, PartialEq)]
pub struct Capacities {
    /// NIC out capacity of each host.
    pub nic_out: Vec<f64>,
    /// NIC in capacity of each host.
    pub nic_in: Vec<f64>,
    /// Site index of each host.
    pub site_of: Vec<usize>,
    /// Number of sites.
    pub sites: usize,
    /// Directed site links, row-major `sites × sites` (`None` on the diagonal).
    pub site_link: Vec<Option<f64>>,
}

impl Capacities {
    /// Resource ids of the path `src -> dst` (two or three), or `None` within one host.
    pub fn path(&self, src: usize, dst: usize) -> Option<Path> {
        if src == dst {
            return None;
        }
        let np = self.nic_out.len();
        let (a, b) = (self.site_of[src], self.site_of[dst]);
        let wan = if a == b {
            None
        } else {
            Some(2 * np + a * self.sites + b)
        };
        Some(Path {
            res: [src, np + dst, wan.unwrap_or(usize::MAX)],
            len: if wan.is_some() { 3 } else { 2 },
        })
    }

    /// Number of resource ids (`2 · hosts + sites²`).
    pub fn resources(&self) -> usize {
        2 * self.nic_out.len() + self.sites * self.sites
    }

    /// Capacity of resource `r`, bytes per second (infinite for an absent site link).
    pub fn capacity(&self, r: usize) -> f64 {
        let np = self.nic_out.len();
        if r < np {
            self.nic_out[r]
        } else if r < 2 * np {
            self.nic_in[r - np]
        } else {
            self.site_link[r - 2 * np].unwrap_or(f64::INFINITY)
        }
    }

    /// The bottleneck capacity of a path: what a flow alone gets.
    pub fn bottleneck(&self, path: &Path) -> f64 {
        path.ids()
            .iter()
            .map(|&r| self.capacity(r))
            .fold(f64::INFINITY, f64::min)
    }
}

/// The resources a flow crosses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    res: [usize; 3],
    len: usize,
}

impl Path {
    /// The resource ids.
    pub fn ids(&self) -> &[usize] {
        &self.res[..self.len]
    }
}

/// A flow in progress (or waiting behind another on its connection).
#[derive(Debug, Clone)]
struct Flow {
    key: usize,
    path: Path,
    start: f64,
    bytes: f64,
    alone: f64,
    /// Its bottleneck group (the resource whose saturation fixed its rate in the last
    /// progressive filling), [`NO_GROUP`] until the first filling after it joins, or
    /// [`UNBOUNDED`] when its path has only infinite resources.
    group: usize,
    /// In a group: the group's served amount at which it ends. Not yet in one: the bytes left.
    /// Unbounded: the instant it ends (it joined then).
    target: f64,
    /// A network-wide stamp, renewed whenever the flow changes group or a successor takes over
    /// its slot: heap entries with another stamp are stale.
    ver: u64,
    /// Index of this flow in `members[r]` of each resource `r` of its path.
    pos: [usize; 3],
}

/// What a local filling found.
enum Local {
    /// The max–min fair rates.
    Solved,
    /// More groups to solve (added to `s_list`).
    Again,
    /// Something only the full filling can settle.
    Full,
}

/// Not yet in a group (joined since the last filling).
const NO_GROUP: usize = usize::MAX;
/// Crosses only infinite resources: ends the instant it starts.
const UNBOUNDED: usize = usize::MAX - 1;

/// The flows whose rate the same resource fixed: they all move at that resource's fair share
/// (`rate`), so they share one clock of **served bytes**, `served + rate · (t − since)`, and
/// a flow ends when that clock reaches its `target`. A rate change touches the group, not its
/// flows.
#[derive(Debug, Clone, Default)]
struct Group {
    rate: f64,
    served: f64,
    since: f64,
    len: u32,
    /// (resource, how many flows of the group cross it), the group's own resource included.
    coupling: Vec<(usize, u32)>,
    /// (target, slot, flow stamp), smallest target first; stale entries are skipped.
    heap: BinaryHeap<Reverse<Finish>>,
    /// The filling that fixed it last.
    fixed_in: u64,
    /// Already listed in `touched`.
    touched: bool,
}

impl Group {
    /// The served clock at `t` (a group without a rate yet has not moved).
    fn served_at(&self, t: f64) -> f64 {
        if self.rate > 0.0 && self.rate.is_finite() {
            self.served + self.rate * (t - self.since)
        } else {
            self.served
        }
    }

    /// Re-base the clock at `t`.
    fn settle(&mut self, t: f64) {
        self.served = self.served_at(t);
        self.since = t;
    }

    /// When a flow ending at served amount `target` ends.
    fn finish_of(&self, target: f64) -> f64 {
        let left = target - self.served;
        if left <= 0.0 || self.rate.is_infinite() {
            self.since
        } else if self.rate > 0.0 {
            self.since + left / self.rate
        } else {
            f64::INFINITY
        }
    }
}

/// Add `by` to the count of `key` in a short list of (key, count), dropping zero counts.
fn adjust(list: &mut Vec<(usize, u32)>, key: usize, by: i32) {
    match list.iter().position(|&(k, _)| k == key) {
        Some(i) => {
            let c = list[i].1 as i32 + by;
            if c <= 0 {
                list.swap_remove(i);
            } else {
                list[i].1 = c as u32;
            }
        }
        None if by > 0 => list.push((key, by as u32)),
        None => {}
    }
}

/// A flow that has finished.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Done {
    /// The caller's key (the simulator uses the edge index).
    pub key: usize,
    /// When it finished.
    pub at: f64,
    /// How much later than alone: `finish − start − bytes / bottleneck` (≥ 0).
    pub delay: f64,
}

/// Flows in progress and their max–min fair rates.
///
/// Cost: the rates depend only on the set of paths in flight, so they are recomputed only when
/// that set changes — a connection starts or goes idle — and at most once per instant, however
/// many flows start or end then. When a flow ends and the next message on its connection takes
/// its place, the set is the same: the successor takes over its slot, group and rate, and
/// nothing else moves (O(log F)).
///
/// Flows are kept in **bottleneck groups**, one per resource: the flows whose rate that
/// resource fixed. A group's flows all move at its rate, so a group keeps one clock of served
/// bytes and a heap of the amounts at which its flows end; a rate change settles the group's
/// clock and renews its one entry in the heap of group finishes — no per-flow work.
///
/// A recompute is **local** (`fill_local`): progressive filling of the groups on the
/// resources of the flows that came or went, the groups on those groups' resources, and the new
/// flows, every other group held at
/// its rate — per-resource loads are kept up to date, so that costs the solved groups'
/// resources, not the network's. When a resource saturates, the unfixed flows crossing it are
/// its group's plus any of other unfixed groups, moved to it (only when its count of unfixed
/// users says there are some: first from the short list of flows that just joined, then by
/// scanning its member list until all are found). The result is then checked
/// against the max–min conditions on every resource whose load changed; a group that fails is
/// solved too, in another round. The allocation is unique, so what passes is exact (within
/// rounding). After four rounds, or when the groups to solve pass half the resources in use,
/// the filling runs over everything (`fill_all`). No allocation per event once the buffers have grown.
#[derive(Debug, Clone)]
pub struct Network {
    caps: Capacities,
    /// Capacity of each resource (`caps.capacity(r)`, looked up often).
    cap: Vec<f64>,
    now: f64,
    /// Flows in progress, by slot; `None` for a free slot.
    flows: Vec<Option<Flow>>,
    free: Vec<usize>,
    in_flight: usize,
    /// Slots of the flows in progress crossing each resource.
    members: Vec<Vec<usize>>,
    /// Resources with at least one member, and each one's index in it.
    live: Vec<usize>,
    live_at: Vec<usize>,
    /// Bottleneck groups, one per resource.
    groups: Vec<Group>,
    /// Per resource: (group, how many of its flows cross the resource).
    rcoup: Vec<Vec<(usize, u32)>>,
    /// Per resource: the sum of the rates of the flows in groups crossing it (kept up to date
    /// as rates change and flows come and go; exactly 0 when none).
    load: Vec<f64>,
    /// Groups whose finish entry must be renewed.
    touched: Vec<usize>,
    /// Resources on the paths of flows that joined or left since the last filling.
    dirty_res: Vec<usize>,
    res_dirty: Vec<bool>,
    /// Flows that joined since the last filling (no group yet).
    fresh: Vec<usize>,
    /// The groups solved again in this recompute (`s_mark == call`), and the resources their
    /// flows cross (`q_mark == epoch`).
    s_list: Vec<usize>,
    s_mark: Vec<u64>,
    q_list: Vec<usize>,
    q_mark: Vec<u64>,
    local_order: ShareQueue,
    /// Per resource: the fastest rate given in this local filling to a group crossing it.
    fast_s: Vec<f64>,
    /// Resources found over capacity while left out of a local filling (`== call`).
    forced: Vec<u64>,
    /// Light resources a group of this local filling that got faster or took in flows left
    /// over capacity when it was fixed (checked again once the filling ends).
    raised: Vec<usize>,
    call: u64,
    /// Stamp of the current filling attempt (`Group::fixed_in`).
    epoch: u64,
    full_fills: u64,
    /// (finish time, group, group stamp), earliest first.
    finishes: GroupHeap,
    /// Flows crossing only infinite resources: (instant, slot, stamp); they end at once.
    unbounded: Vec<Finish>,
    /// How many flows in progress are unbounded.
    n_unbounded: usize,
    /// The busy connections (src, dst), each with the flows waiting behind its active one.
    conns: HashMap<(usize, usize), VecDeque<Flow>, BuildHasherDefault<ConnHasher>>,
    /// The set of paths in flight changed since the rates were computed.
    dirty: bool,
    // Scratch for progressive filling.
    cap_left: Vec<f64>,
    users: Vec<u32>,
    /// The live resources by their share at the start of the last filling (kept from one
    /// filling to the next: nearly sorted already), and which resources it holds.
    order: Vec<Share>,
    in_order: Vec<bool>,
    /// Resources whose share grew while filling, smallest first.
    regrown: BinaryHeap<Reverse<Share>>,
    recomputes: u64,
    /// The last stamp given (flows and groups).
    stamp: u64,
}

impl Network {
    /// An idle network over `caps`.
    pub fn new(caps: Capacities) -> Self {
        let r = caps.resources();
        Network {
            cap: (0..r).map(|i| caps.capacity(i)).collect(),
            caps,
            now: 0.0,
            flows: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            members: vec![Vec::new(); r],
            live: Vec::new(),
            live_at: vec![usize::MAX; r],
            groups: vec![Group::default(); r],
            rcoup: vec![Vec::new(); r],
            load: vec![0.0; r],
            touched: Vec::new(),
            dirty_res: Vec::new(),
            res_dirty: vec![false; r],
            fresh: Vec::new(),
            s_list: Vec::new(),
            s_mark: vec![0; r],
            q_list: Vec::new(),
            q_mark: vec![0; r],
            local_order: ShareQueue::default(),
            fast_s: vec![0.0; r],
            forced: vec![0; r],
            raised: Vec::new(),
            call: 0,
            epoch: 0,
            full_fills: 0,
            finishes: GroupHeap::new(r),
            unbounded: Vec::new(),
            n_unbounded: 0,
            conns: HashMap::default(),
            dirty: false,
            cap_left: vec![0.0; r],
            users: vec![0; r],
            order: Vec::new(),
            in_order: vec![false; r],
            regrown: BinaryHeap::new(),
            recomputes: 0,
            stamp: 0,
        }
    }

    /// The capacities.
    pub fn capacities(&self) -> &Capacities {
        &self.caps
    }

    /// Flows in progress (not counting those waiting behind another on their connection).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// How many times the max–min rates were computed (for benchmarks and tests).
    pub fn recomputes(&self) -> u64 {
        self.recomputes
    }

    /// Move time to `t` (≥ now): rates that changed at the current instant are settled first.
    fn move_to(&mut self, t: f64) {
        if t > self.now {
            if self.dirty {
                self.rates();
            }
            self.now = t;
        }
    }

    fn next_stamp(&mut self) -> u64 {
        self.stamp += 1;
        self.stamp
    }

    fn touch(&mut self, g: usize) {
        if !self.groups[g].touched {
            self.groups[g].touched = true;
            self.touched.push(g);
        }
    }

    /// Renew the finish entry of every touched group.
    fn renew_touched(&mut self) {
        while let Some(g) = self.touched.pop() {
            let flows = &self.flows;
            let grp = &mut self.groups[g];
            grp.touched = false;
            while let Some(&Reverse(Finish(target, slot, ver))) = grp.heap.peek() {
                match &flows[slot] {
                    Some(f) if f.ver == ver && f.group == g => {
                        let at = grp.finish_of(target);
                        self.finishes.set(g, at);
                        break;
                    }
                    _ => {
                        grp.heap.pop();
                    }
                }
            }
            if grp.heap.is_empty() {
                self.finishes.remove(g);
            }
        }
    }

    /// Put the flow in `slot` (bytes `left` to go) into group `g` at the current instant.
    fn join_group(&mut self, slot: usize, g: usize, left: f64) {
        let ver = self.next_stamp();
        let now = self.now;
        let Some(f) = self.flows[slot].as_mut() else {
            return;
        };
        let grp = &mut self.groups[g];
        if grp.len == 0 {
            // An empty group's clock restarts at 0 (keeps the served amounts small).
            grp.served = 0.0;
            grp.since = now;
        }
        let target = grp.served_at(now) + left;
        f.group = g;
        f.target = target;
        f.ver = ver;
        grp.len += 1;
        for &q in f.path.ids() {
            adjust(&mut grp.coupling, q, 1);
            adjust(&mut self.rcoup[q], g, 1);
            self.load[q] += grp.rate;
        }
        grp.heap.push(Reverse(Finish(target, slot, ver)));
        // Drop stale entries once they outnumber the live ones.
        if grp.heap.len() > 2 * grp.len as usize + 16 {
            let flows = &self.flows;
            grp.heap.retain(|Reverse(Finish(_, s, v))| {
                matches!(&flows[*s], Some(f) if f.ver == *v && f.group == g)
            });
        }
        self.touch(g);
    }

    /// Take the flow in `slot` out of its group; the bytes it has left.
    fn leave_group(&mut self, slot: usize) -> f64 {
        let now = self.now;
        let Some(f) = self.flows[slot].as_ref() else {
            return 0.0;
        };
        let g = f.group;
        if g == NO_GROUP || g == UNBOUNDED {
            return if g == NO_GROUP { f.target } else { 0.0 };
        }
        let grp = &mut self.groups[g];
        let left = (f.target - grp.served_at(now)).max(0.0);
        grp.len -= 1;
        for &q in f.path.ids() {
            adjust(&mut grp.coupling, q, -1);
            adjust(&mut self.rcoup[q], g, -1);
            self.load[q] = if self.rcoup[q].is_empty() {
                0.0 // exactly: no rounding carried over
            } else {
                self.load[q] - grp.rate
            };
        }
        self.touch(g);
        left
    }

    /// Start a flow of `bytes` from `src` to `dst` (different hosts) at time `at` (≥ the last
    /// event): it moves now, or after the flows already on its connection. (A start before the
    /// network's current time moves from that time on; its delay still counts from `at`.)
    pub fn start(&mut self, key: usize, src: usize, dst: usize, bytes: u64, at: f64) {
        self.move_to(at);
        let Some(path) = self.caps.path(src, dst) else {
            return;
        };
        let b = path
            .ids()
            .iter()
            .map(|&r| self.cap[r])
            .fold(f64::INFINITY, f64::min);
        let alone = if b.is_finite() && b > 0.0 {
            bytes as f64 / b
        } else {
            0.0
        };
        let f = Flow {
            key,
            path,
            start: at,
            bytes: bytes as f64,
            alone,
            group: NO_GROUP,
            target: bytes as f64,
            ver: 0,
            pos: [usize::MAX; 3],
        };
        match self.conns.entry((src, dst)) {
            Entry::Occupied(mut e) => e.get_mut().push_back(f),
            Entry::Vacant(e) => {
                e.insert(VecDeque::new());
                self.insert(f);
                self.dirty = true;
            }
        }
    }

    /// A flow joins the network: a slot, and a place in the member list of each resource of
    /// its path (or among the unbounded flows).
    fn insert(&mut self, mut f: Flow) -> usize {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.flows.push(None);
                self.flows.len() - 1
            }
        };
        let mut bounded = false;
        for (k, &r) in f.path.ids().iter().enumerate() {
            if self.cap[r].is_finite() {
                bounded = true;
            }
            if !self.res_dirty[r] {
                self.res_dirty[r] = true;
                self.dirty_res.push(r);
            }
            if self.members[r].is_empty() {
                self.live_at[r] = self.live.len();
                self.live.push(r);
            }
            f.pos[k] = self.members[r].len();
            self.members[r].push(slot);
        }
        if !bounded {
            f.group = UNBOUNDED;
            f.target = self.now;
            f.ver = self.next_stamp();
            self.unbounded.push(Finish(self.now, slot, f.ver));
            self.n_unbounded += 1;
        } else {
            self.fresh.push(slot);
        }
        self.flows[slot] = Some(f);
        self.in_flight += 1;
        slot
    }

    /// A flow leaves the network: out of its group and its resources' member lists, its slot
    /// freed.
    fn remove(&mut self, slot: usize) -> Option<Flow> {
        self.leave_group(slot);
        let f = self.flows[slot].take()?;
        if f.group == UNBOUNDED {
            self.n_unbounded -= 1;
        }
        for (k, &r) in f.path.ids().iter().enumerate() {
            if !self.res_dirty[r] {
                self.res_dirty[r] = true;
                self.dirty_res.push(r);
            }
            let i = f.pos[k];
            let m = &mut self.members[r];
            m.swap_remove(i);
            if let Some(&moved) = m.get(i) {
                if let Some(g) = self.flows[moved].as_mut() {
                    if let Some(kk) = g.path.ids().iter().position(|&q| q == r) {
                        g.pos[kk] = i;
                    }
                }
            }
            if m.is_empty() {
                let at = self.live_at[r];
                self.live.swap_remove(at);
                if let Some(&moved) = self.live.get(at) {
                    self.live_at[moved] = at;
                }
                self.live_at[r] = usize::MAX;
            }
        }
        self.free.push(slot);
        self.in_flight -= 1;
        Some(f)
    }

    /// When the next flow in progress finishes at the current rates (`None` when idle).
    pub fn next_finish(&mut self) -> Option<f64> {
        if self.dirty {
            self.rates();
        }
        let instant = self.unbounded.first().map(|u| u.0);
        match self.finishes.peek() {
            Some((t, _)) => Some(instant.map_or(t, |i| i.min(t))),
            None => instant,
        }
    }

    /// The flow in `slot` has ended: report it, and let the next message on its connection
    /// take over its slot (same path, so the same set of paths in flight: the same rates), or
    /// free the slot and mark the rates for recompute.
    fn end(&mut self, slot: usize, out: &mut Vec<Done>) {
        let now = self.now;
        let Some(f) = self.flows[slot].as_mut() else {
            return;
        };
        out.push(Done {
            key: f.key,
            at: now,
            delay: (now - f.start - f.alone).max(0.0),
        });
        let np = self.caps.nic_out.len();
        let conn = (f.path.res[0], f.path.res[1] - np);
        match self.conns.get_mut(&conn).and_then(VecDeque::pop_front) {
            Some(next) => {
                f.key = next.key;
                f.start = next.start;
                f.bytes = next.bytes;
                f.alone = next.alone;
                let g = f.group;
                if g == UNBOUNDED {
                    let ver = self.next_stamp();
                    if let Some(f) = self.flows[slot].as_mut() {
                        f.ver = ver;
                        f.target = now;
                    }
                    self.unbounded.push(Finish(now, slot, ver));
                } else {
                    // Same group: out and back in with the successor's bytes.
                    self.leave_group(slot);
                    self.join_group(slot, g, next.bytes);
                }
            }
            None => {
                self.remove(slot);
                self.conns.remove(&conn);
                self.dirty = true;
            }
        }
    }

    /// Move time to `t` and finish every flow done by then (at most until the next finish:
    /// call with `t = next_finish()`), appending them to `out`.
    pub fn finish_until(&mut self, t: f64, out: &mut Vec<Done>) {
        if self.dirty {
            self.rates();
        }
        self.move_to(t);
        let now = self.now;
        // Unbounded flows end the instant they start.
        let mut i = 0;
        while i < self.unbounded.len() {
            let Finish(at, slot, ver) = self.unbounded[i];
            if at > now + 1e-9 {
                i += 1;
                continue;
            }
            self.unbounded.swap_remove(i);
            if matches!(&self.flows[slot], Some(f) if f.ver == ver && f.group == UNBOUNDED) {
                self.end(slot, out);
            }
        }
        // A flow is done when what is left would take under a nanosecond.
        while let Some((ft, g)) = self.finishes.peek() {
            if ft > now + 1e-9 {
                break;
            }
            // Out of the heap until renewed below.
            self.finishes.remove(g);
            loop {
                let grp = &mut self.groups[g];
                let Some(&Reverse(Finish(target, slot, fver))) = grp.heap.peek() else {
                    break;
                };
                let valid = matches!(&self.flows[slot], Some(f) if f.ver == fver && f.group == g);
                if !valid {
                    grp.heap.pop();
                    continue;
                }
                if grp.finish_of(target) > now + 1e-9 {
                    break;
                }
                grp.heap.pop();
                self.end(slot, out);
            }
            self.touch(g);
        }
        self.renew_touched();
    }

    /// Recompute the max–min fair rates after flows joined or left: first locally (see
    /// [`Network::fill_local`]), growing the set of groups solved again until the result
    /// passes the max–min conditions; over everything ([`Network::fill_all`]) when that set
    /// grows past half the resources in use or after four rounds. Renews the finish entries of
    /// the groups whose rate changed.
    fn rates(&mut self) {
        self.dirty = false;
        self.recomputes += 1;
        self.call += 1;
        let call = self.call;
        self.s_list.clear();
        for i in 0..self.dirty_res.len() {
            let d = self.dirty_res[i];
            if self.groups[d].len > 0 && self.s_mark[d] != call {
                self.s_mark[d] = call;
                self.s_list.push(d);
            }
        }
        // And the groups on their resources: a change of their rates most often leaves those
        // unsaturated, which the checks would find only after a first round.
        let n0 = self.s_list.len();
        for i in 0..n0 {
            let g = self.s_list[i];
            for k in 0..self.groups[g].coupling.len() {
                let q = self.groups[g].coupling[k].0;
                if self.groups[q].len > 0 {
                    self.add_s(q);
                }
            }
        }
        let flows = &self.flows;
        self.fresh
            .retain(|&slot| matches!(&flows[slot], Some(f) if f.group == NO_GROUP));
        let mut rounds = 0;
        loop {
            rounds += 1;
            if rounds > 4 || 2 * self.s_list.len() > self.live.len() {
                self.fill_all();
                break;
            }
            match self.fill_local() {
                Local::Solved => break,
                Local::Again => {}
                Local::Full => {
                    self.fill_all();
                    break;
                }
            }
        }
        for &d in &self.dirty_res {
            self.res_dirty[d] = false;
        }
        self.dirty_res.clear();
        self.fresh.clear();
        self.renew_touched();
    }

    /// How many recomputes fell back to progressive filling over every resource (for tests).
    pub fn full_fills(&self) -> u64 {
        self.full_fills
    }

    fn add_s(&mut self, g: usize) {
        if self.s_mark[g] != self.call {
            self.s_mark[g] = self.call;
            self.s_list.push(g);
        }
    }

    /// Resource `q` joins the local filling: no unfixed users yet, and what the groups' rates
    /// leave of it.
    fn add_q(&mut self, q: usize) {
        if self.q_mark[q] != self.epoch {
            self.q_mark[q] = self.epoch;
            self.q_list.push(q);
            self.users[q] = 0;
            self.cap_left[q] = self.cap[q] - self.load[q];
            self.fast_s[q] = 0.0;
        }
    }

    /// Progressive filling of the flows of the groups in `s_list` and the fresh flows, every
    /// other group keeping its rate (what it takes of each resource is subtracted first). Its
    /// result is the max–min fair allocation if every flow has a bottleneck — a saturated
    /// resource on which no flow is faster — and no resource is over capacity (the allocation
    /// is unique). The filling gives that to the flows it fixes; it is checked here for the
    /// groups on the resources it touched (the others' resources saw no change). A group
    /// that fails joins `s_list` and the answer is [`Local::Again`]; so does a group met
    /// while filling whose resource saturates at another level than its rate.
    fn fill_local(&mut self) -> Local {
        self.epoch += 1;
        // The resources concerned, their unfixed users and what the other groups leave. A
        // resource the groups' flows cross that fixes no group, saw no flow come or go and
        // was not found over capacity before is left out ("light"): it has slack, and only
        // whether the new rates overload it is checked after the filling.
        self.q_list.clear();
        self.raised.clear();
        for i in 0..self.s_list.len() {
            let g = self.s_list[i];
            self.add_q(g);
        }
        for i in 0..self.dirty_res.len() {
            let d = self.dirty_res[i];
            self.add_q(d);
        }
        for i in 0..self.s_list.len() {
            let g = self.s_list[i];
            let rate = self.groups[g].rate;
            for k in 0..self.groups[g].coupling.len() {
                let (q, n) = self.groups[g].coupling[k];
                if self.q_mark[q] == self.epoch
                    || self.groups[q].len > 0
                    || self.forced[q] == self.call
                {
                    self.add_q(q);
                    self.users[q] += n;
                    self.cap_left[q] += rate * n as f64;
                }
            }
        }
        let mut unfixed = 0usize;
        for &slot in &self.fresh {
            // (A fresh flow a previous round put in a group is counted with its group.)
            if let Some(f) = self.flows[slot].as_ref().filter(|f| f.group == NO_GROUP) {
                for &q in f.path.ids() {
                    self.users[q] += 1;
                }
                unfixed += 1;
            }
        }
        for &g in &self.s_list {
            unfixed += self.groups[g].len as usize;
        }
        // Resources by share (the filling often ends after a few of them).
        let mut order = std::mem::take(&mut self.local_order);
        order.clear();
        for &q in &self.q_list {
            if self.users[q] > 0 {
                let share = self.cap_left[q] / self.users[q] as f64;
                if share.is_finite() {
                    order.push(Share(share, q));
                }
            }
        }
        let solved = self.fill_local_from(&mut order, unfixed);
        self.local_order = order;
        solved
    }

    /// The filling and checks of [`Network::fill_local`], from the heap of resource shares.
    fn fill_local_from(&mut self, heap: &mut ShareQueue, mut unfixed: usize) -> Local {
        const TOL: f64 = 1e-12;
        let (call, ep, now) = (self.call, self.epoch, self.now);
        while unfixed > 0 {
            let Some(Share(share, r)) = heap.pop() else {
                break;
            };
            if self.users[r] == 0 {
                continue;
            }
            let cur = self.cap_left[r] / self.users[r] as f64;
            if cur != share {
                heap.push(Share(cur, r));
                continue;
            }
            if self.s_mark[r] != call {
                if self.groups[r].len > 0 {
                    // A group kept at its rate on a resource saturating now: solve it too.
                    // If its rate is not below this level and none of the resources its flows
                    // cross has been saturated yet, a filling with it from the start would
                    // have gone the same way so far (its flows' resources' shares lie between
                    // their shares here and its rate): take it in and go on. Else start again.
                    self.add_s(r);
                    let grp = &self.groups[r];
                    let popped = |q: usize| self.s_mark[q] == call && self.groups[q].fixed_in == ep;
                    if grp.rate < share || grp.coupling.iter().any(|&(q, _)| popped(q)) {
                        return Local::Again;
                    }
                    for k in 0..self.groups[r].coupling.len() {
                        let (q, n) = self.groups[r].coupling[k];
                        if self.q_mark[q] != ep {
                            // A light resource joins: its users and what is left of it, from
                            // the groups crossing it (this one included).
                            self.add_q(q);
                            let (mut users, mut left, mut fast) = (0u32, self.cap_left[q], 0.0f64);
                            for &(h, m) in &self.rcoup[q] {
                                if self.s_mark[h] == call {
                                    if self.groups[h].fixed_in == ep {
                                        fast = fast.max(self.groups[h].rate);
                                    } else {
                                        users += m;
                                        left += self.groups[h].rate * m as f64;
                                    }
                                }
                            }
                            self.users[q] = users;
                            self.cap_left[q] = left;
                            self.fast_s[q] = fast;
                        } else {
                            self.users[q] += n;
                            self.cap_left[q] += self.groups[r].rate * n as f64;
                        }
                        let sh = self.cap_left[q] / self.users[q] as f64;
                        if sh.is_finite() {
                            heap.push(Share(sh, q));
                        }
                    }
                    unfixed += self.groups[r].len as usize;
                    continue;
                }
                self.add_s(r);
            }
            let moved = self.users[r] > self.groups[r].len;
            if moved {
                // The unfixed flows crossing r outside its group: most often only fresh ones,
                // found in the (short) fresh list; else in r's members, until all are found.
                let mut extra = self.users[r] - self.groups[r].len;
                for i in 0..self.fresh.len() {
                    if extra == 0 {
                        break;
                    }
                    let slot = self.fresh[i];
                    let here = matches!(&self.flows[slot],
                        Some(f) if f.group == NO_GROUP && f.path.ids().contains(&r));
                    if here {
                        let left = self.leave_group(slot);
                        self.join_group(slot, r, left);
                        extra -= 1;
                    }
                }
                let mut k = 0;
                while extra > 0 && k < self.members[r].len() {
                    let slot = self.members[r][k];
                    k += 1;
                    let Some(f) = self.flows[slot].as_ref() else {
                        continue;
                    };
                    let g = f.group;
                    let unfixed_elsewhere = g == NO_GROUP
                        || (g != r
                            && g != UNBOUNDED
                            && self.s_mark[g] == call
                            && self.groups[g].fixed_in != ep);
                    if unfixed_elsewhere {
                        let left = self.leave_group(slot);
                        self.join_group(slot, r, left);
                        extra -= 1;
                    }
                }
            }
            let rate = share.max(0.0);
            let grp = &mut self.groups[r];
            grp.fixed_in = ep;
            unfixed = unfixed.saturating_sub(grp.len as usize);
            let d = rate - grp.rate;
            if d != 0.0 {
                grp.settle(now);
                grp.rate = rate;
            }
            // Only a group that got faster, or took in flows, can add load to a light
            // resource: note the ones it leaves over capacity (checked again at the end).
            let raised = d > 0.0 || moved;
            for &(q, n) in &grp.coupling {
                if self.q_mark[q] == ep {
                    self.cap_left[q] -= share * n as f64;
                    self.users[q] -= n;
                    self.fast_s[q] = self.fast_s[q].max(rate);
                } else if raised && self.load[q] + d * n as f64 > self.cap[q] * (1.0 + TOL) {
                    self.raised.push(q);
                }
                if d != 0.0 {
                    self.load[q] += d * n as f64;
                }
            }
            if d != 0.0 {
                self.touch(r);
            }
        }
        // The max–min conditions on every resource touched. What is left of a resource's
        // capacity is `cap_left`; the groups kept were max–min fair before (their rates did
        // not change), so only the new rates can be faster than a kept group's.
        let mut ok = true;
        for i in 0..self.raised.len() {
            let q = self.raised[i];
            if self.q_mark[q] != ep && self.load[q] > self.cap[q] * (1.0 + TOL) {
                // A light resource the new rates overload: fill again with it.
                self.forced[q] = call;
                ok = false;
            }
        }
        for i in 0..self.q_list.len() {
            let q = self.q_list[i];
            let c = self.cap[q];
            if !c.is_finite() {
                continue;
            }
            if self.cap_left[q] < -c * TOL - f64::MIN_POSITIVE {
                // Over capacity (rounding): trust only the full filling.
                return Local::Full;
            }
            if self.groups[q].len == 0 {
                continue;
            }
            let own = self.groups[q].rate;
            // (Groups fixed by this filling; not those this loop has just marked to solve.)
            let solved = self.s_mark[q] == call && self.groups[q].fixed_in == ep;
            if !solved {
                if self.cap_left[q] > c * TOL || self.fast_s[q] > own * (1.0 + TOL) {
                    self.add_s(q);
                    ok = false;
                }
            } else {
                if self.cap_left[q] > c * TOL {
                    // Saturated when fixed, then given back (cannot happen when the group
                    // taken in on the way met the conditions above).
                    return Local::Full;
                }
                for k in 0..self.rcoup[q].len() {
                    let h = self.rcoup[q][k].0;
                    if self.groups[h].rate > own * (1.0 + TOL) {
                        self.add_s(h);
                        ok = false;
                    }
                }
            }
        }
        if ok {
            Local::Solved
        } else {
            Local::Again
        }
    }

    /// Max–min fair rates by progressive filling: repeatedly saturate the resource with the
    /// smallest fair share among the flows not yet fixed, fixing those flows at that share —
    /// a group at a time (see [`Network`]). Settles the clocks of the groups whose rate changed
    /// at the current instant and marks them for a new finish entry.
    fn fill_all(&mut self) {
        self.full_fills += 1;
        self.epoch += 1;
        let fill = self.epoch;
        let now = self.now;
        for &r in &self.live {
            self.cap_left[r] = self.cap[r];
            self.users[r] = self.members[r].len() as u32;
            if !self.in_order[r] {
                self.in_order[r] = true;
                self.order.push(Share(0.0, r));
            }
        }
        // Shares at the start, sorted by insertion (O(R) plus the few resources that moved).
        let (live_at, in_order) = (&self.live_at, &mut self.in_order);
        self.order.retain(|s| {
            let keep = live_at[s.1] != usize::MAX;
            in_order[s.1] = keep;
            keep
        });
        for s in &mut self.order {
            s.0 = self.cap_left[s.1] / self.users[s.1] as f64;
        }
        for i in 1..self.order.len() {
            let mut j = i;
            while j > 0 && self.order[j] < self.order[j - 1] {
                self.order.swap(j, j - 1);
                j -= 1;
            }
        }
        // Resources in that order, or the one whose share grew, whichever is smaller; the
        // filling stops once every bounded flow is fixed, so resources with slack left are
        // never visited.
        self.regrown.clear();
        let mut next = 0;
        let mut unfixed = self.in_flight - self.n_unbounded;
        while unfixed > 0 {
            let first = self.order.get(next).copied().filter(|s| s.0.is_finite());
            let Share(share, r) = match (first, self.regrown.peek()) {
                (Some(a), Some(&Reverse(b))) if b < a => {
                    self.regrown.pop();
                    b
                }
                (Some(a), _) => {
                    next += 1;
                    a
                }
                (None, Some(&Reverse(b))) => {
                    self.regrown.pop();
                    b
                }
                (None, None) => break,
            };
            if self.users[r] == 0 {
                continue;
            }
            let cur = self.cap_left[r] / self.users[r] as f64;
            if cur != share {
                // Flows fixed elsewhere since: the share grew; it comes back in its turn.
                self.regrown.push(Reverse(Share(cur, r)));
                continue;
            }
            if self.users[r] > self.groups[r].len {
                // Unfixed flows crossing r from other groups (or new ones): r fixes them.
                for k in 0..self.members[r].len() {
                    let slot = self.members[r][k];
                    let Some(f) = self.flows[slot].as_ref() else {
                        continue;
                    };
                    let g = f.group;
                    if g == r
                        || g == UNBOUNDED
                        || (g != NO_GROUP && self.groups[g].fixed_in == fill)
                    {
                        continue;
                    }
                    let left = self.leave_group(slot);
                    self.join_group(slot, r, left);
                }
            }
            let rate = share.max(0.0);
            let grp = &mut self.groups[r];
            grp.fixed_in = fill;
            unfixed = unfixed.saturating_sub(grp.len as usize);
            for &(q, n) in &grp.coupling {
                self.cap_left[q] -= share * n as f64;
                self.users[q] -= n;
            }
            if grp.rate != rate {
                grp.settle(now);
                let d = rate - grp.rate;
                grp.rate = rate;
                for &(q, n) in &grp.coupling {
                    self.load[q] += d * n as f64;
                }
                self.touch(r);
            }
        }
    }
}

/// What the simulator asks of a flow network ([`Network`]; tests plug a reference solver in
/// through [`crate::sim::simulate_with_network`]).
#[doc(hidden)]
pub trait FlowNetwork {
    /// See [`Network::start`].
    fn start(&mut self, key: usize, src: usize, dst: usize, bytes: u64, at: f64);
    /// See [`Network::next_finish`].
    fn next_finish(&mut self) -> Option<f64>;
    /// See [`Network::finish_until`].
    fn finish_until(&mut self, t: f64, out: &mut Vec<Done>);
}

impl FlowNetwork for Network {
    fn start(&mut self, key: usize, src: usize, dst: usize, bytes: u64, at: f64) {
        Network::start(self, key, src, dst, bytes, at)
    }
    fn next_finish(&mut self) -> Option<f64> {
        Network::next_finish(self)
    }
    fn finish_until(&mut self, t: f64, out: &mut Vec<Done>) {
        Network::finish_until(self, t, out)
    }
}

/// Hashes a connection's host indices by multiplying (as rustc's Fx hash): the keys are small
/// trusted integers, so SipHash's resistance to chosen keys buys nothing here.
#[derive(Default)]
struct ConnHasher(u64);

impl Hasher for ConnHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A finish time, ordered by time then slot.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Finish(f64, usize, u64);

impl Eq for Finish {}

impl PartialOrd for Finish {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Finish {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0
            .total_cmp(&o.0)
            .then(self.1.cmp(&o.1))
            .then(self.2.cmp(&o.2))
    }
}

/// The groups' next finishes, earliest first (ties: lower group): a binary heap with one
/// entry per group, updated in place — no stale entries to pop.
#[derive(Debug, Clone)]
struct GroupHeap {
    /// (finish, group).
    heap: Vec<(f64, usize)>,
    /// Index of each group's entry in `heap`, `usize::MAX` when it has none.
    pos: Vec<usize>,
}

impl GroupHeap {
    fn new(groups: usize) -> Self {
        GroupHeap {
            heap: Vec::new(),
            pos: vec![usize::MAX; groups],
        }
    }

    fn less(a: (f64, usize), b: (f64, usize)) -> bool {
        a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).is_lt()
    }

    fn peek(&self) -> Option<(f64, usize)> {
        self.heap.first().copied()
    }

    /// Group `g`'s entry becomes `at` (added if absent).
    fn set(&mut self, g: usize, at: f64) {
        let i = self.pos[g];
        if i == usize::MAX {
            self.heap.push((at, g));
            let i = self.heap.len() - 1;
            self.pos[g] = i;
            self.up(i);
        } else {
            let old = self.heap[i].0;
            self.heap[i].0 = at;
            if at.total_cmp(&old).is_lt() {
                self.up(i);
            } else {
                self.down(i);
            }
        }
    }

    /// Group `g` leaves the heap (nothing if absent).
    fn remove(&mut self, g: usize) {
        let i = self.pos[g];
        if i == usize::MAX {
            return;
        }
        self.pos[g] = usize::MAX;
        let Some(last) = self.heap.pop() else {
            return;
        };
        if i < self.heap.len() {
            // The last entry fills the hole and moves to its place.
            self.heap[i] = last;
            self.pos[last.1] = i;
            self.up(i);
            self.down(self.pos[last.1]);
        }
    }

    fn up(&mut self, mut i: usize) {
        while i > 0 {
            let p = (i - 1) / 2;
            if !Self::less(self.heap[i], self.heap[p]) {
                break;
            }
            self.swap(i, p);
            i = p;
        }
    }

    fn down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < n && Self::less(self.heap[l], self.heap[m]) {
                m = l;
            }
            if r < n && Self::less(self.heap[r], self.heap[m]) {
                m = r;
            }
            if m == i {
                break;
            }
            self.swap(i, m);
            i = m;
        }
    }

    fn swap(&mut self, i: usize, j: usize) {
        self.heap.swap(i, j);
        self.pos[self.heap[i].1] = i;
        self.pos[self.heap[j].1] = j;
    }
}

/// Resources by share, smallest first: an unsorted list while short (a local filling most
/// often has a handful of resources, and a scan beats a heap there), a heap past that.
#[derive(Debug, Clone, Default)]
struct ShareQueue {
    short: Vec<Share>,
    heap: BinaryHeap<Reverse<Share>>,
    big: bool,
}

impl ShareQueue {
    /// Past this many entries, a heap.
    const SHORT: usize = 24;

    fn clear(&mut self) {
        self.short.clear();
        self.heap.clear();
        self.big = false;
    }

    fn push(&mut self, s: Share) {
        if self.big {
            self.heap.push(Reverse(s));
        } else {
            self.short.push(s);
            if self.short.len() > Self::SHORT {
                self.big = true;
                self.heap.extend(self.short.drain(..).map(Reverse));
            }
        }
    }

    fn pop(&mut self) -> Option<Share> {
        if self.big {
            return self.heap.pop().map(|Reverse(s)| s);
        }
        let mut best = 0;
        for i in 1..self.short.len() {
            if self.short[i] < self.short[best] {
                best = i;
            }
        }
        (best < self.short.len()).then(|| self.short.swap_remove(best))
    }
}

/// A resource's fair share, ordered by share then resource.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Share(f64, usize);

impl Eq for Share {}

impl PartialOrd for Share {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Share {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0).then(self.1.cmp(&o.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hosts 0, 1 in site 0 and 2, 3 in site 1; NICs `nic`, site links `wan` (bytes/s).
    fn caps(nic: f64, wan: f64) -> Capacities {
        Capacities {
            nic_out: vec![nic; 4],
            nic_in: vec![nic; 4],
            site_of: vec![0, 0, 1, 1],
            sites: 2,
            site_link: vec![None, Some(wan), Some(wan), None],
        }
    }

    fn run(net: &mut Network) -> Vec<Done> {
        let mut out = Vec::new();
        while let Some(t) = net.next_finish() {
            net.finish_until(t, &mut out);
        }
        out
    }

    #[test]
    fn a_lone_flow_takes_bytes_over_its_bottleneck_and_no_delay() {
        let mut net = Network::new(caps(100.0, 10.0));
        net.start(7, 0, 2, 50, 1.0);
        let d = run(&mut net);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].key, 7);
        assert!((d[0].at - 6.0).abs() < 1e-9, "{d:?}");
        assert!(d[0].delay.abs() < 1e-9);
    }

    #[test]
    fn two_flows_out_of_one_nic_share_it() {
        let mut net = Network::new(caps(100.0, 1e9));
        net.start(0, 0, 1, 100, 0.0);
        net.start(1, 0, 2, 100, 0.0);
        let d = run(&mut net);
        for x in &d {
            assert!(
                (x.at - 2.0).abs() < 1e-9 && (x.delay - 1.0).abs() < 1e-9,
                "{d:?}"
            );
        }
    }

    #[test]
    fn wan_fan_out_arrives_one_after_another_in_total() {
        // One sender, two receivers across a WAN 10x slower than the NICs: the WAN is shared.
        let mut net = Network::new(caps(100.0, 10.0));
        net.start(0, 0, 2, 10, 0.0);
        net.start(1, 0, 3, 10, 0.0);
        let d = run(&mut net);
        assert_eq!(d.len(), 2);
        for x in &d {
            assert!((x.at - 2.0).abs() < 1e-9, "{d:?}");
        }
    }

    #[test]
    fn max_min_gives_the_rest_to_the_unconstrained_flow() {
        // Flow A: 0 -> 2 across the WAN (10); flow B: 0 -> 1 inside the site. NIC out of 0 is
        // 100: A is held to 10 by the WAN, B gets the other 90.
        let mut net = Network::new(caps(100.0, 10.0));
        net.start(0, 0, 2, 100, 0.0);
        net.start(1, 0, 1, 90, 0.0);
        let d = run(&mut net);
        let b = d.iter().find(|x| x.key == 1).unwrap();
        let a = d.iter().find(|x| x.key == 0).unwrap();
        assert!((b.at - 1.0).abs() < 1e-9, "{d:?}");
        assert!((a.at - 10.0).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn rates_are_recomputed_when_a_flow_ends() {
        // Two flows into host 1 (NIC in 100): 50 and 150 bytes. Both at 50/s until the small one
        // ends at 1 s; then the big one alone at 100/s: 100 bytes left → ends at 2 s.
        let mut net = Network::new(caps(100.0, 1e9));
        net.start(0, 0, 1, 50, 0.0);
        net.start(1, 2, 1, 150, 0.0);
        let d = run(&mut net);
        let small = d.iter().find(|x| x.key == 0).unwrap();
        let big = d.iter().find(|x| x.key == 1).unwrap();
        assert!((small.at - 1.0).abs() < 1e-9, "{d:?}");
        assert!((big.at - 2.0).abs() < 1e-9, "{d:?}");
        assert!((big.delay - 0.5).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn one_connection_carries_its_messages_in_order() {
        let mut net = Network::new(caps(100.0, 1e9));
        net.start(0, 0, 1, 100, 0.0);
        net.start(1, 0, 1, 100, 0.5);
        let d = run(&mut net);
        assert_eq!(d[0].key, 0);
        assert!((d[0].at - 1.0).abs() < 1e-9, "{d:?}");
        assert_eq!(d[1].key, 1);
        assert!((d[1].at - 2.0).abs() < 1e-9, "{d:?}");
        assert!((d[1].delay - 0.5).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn a_flow_started_later_slows_one_in_progress() {
        let mut net = Network::new(caps(100.0, 1e9));
        net.start(0, 0, 1, 100, 0.0);
        let mut out = Vec::new();
        // At 0.5 s, 50 bytes left; a second flow out of host 0 halves the rate.
        net.start(1, 0, 2, 100, 0.5);
        while let Some(t) = net.next_finish() {
            net.finish_until(t, &mut out);
        }
        let first = out.iter().find(|x| x.key == 0).unwrap();
        assert!((first.at - 1.5).abs() < 1e-9, "{out:?}");
        let second = out.iter().find(|x| x.key == 1).unwrap();
        // 50 bytes at 50/s until 1.5, then 50 bytes at 100/s: 2.0.
        assert!((second.at - 2.0).abs() < 1e-9, "{out:?}");
    }
}
