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
use std::collections::{BinaryHeap, HashMap, VecDeque};

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

#[derive(Debug, Clone)]
struct Flow {
    key: usize,
    path: Path,
    start: f64,
    bytes: f64,
    /// Bytes left at `since` (the flow moves at `rate` from then on; `rate` is NaN until the
    /// first recompute after it joins).
    left: f64,
    since: f64,
    rate: f64,
    alone: f64,
    /// A network-wide stamp, renewed whenever `rate` or `left` changes: heap entries with
    /// another stamp (older, or of an earlier flow in the same slot) are stale.
    ver: u64,
    /// Index of this flow in `members[r]` of each resource `r` of its path.
    pos: [usize; 3],
    /// The rate found by the last progressive filling, and in which one (`fill`).
    new_rate: f64,
    fixed_in: u64,
}

impl Flow {
    fn left_at(&self, t: f64) -> f64 {
        if self.rate.is_nan() {
            self.left // not moving yet: it has never had a rate
        } else if self.rate.is_infinite() {
            0.0
        } else {
            (self.left - self.rate * (t - self.since)).max(0.0)
        }
    }

    /// When it ends at its current rate.
    fn finish(&self) -> f64 {
        if self.left <= 0.0 || self.rate.is_infinite() {
            self.since
        } else if self.rate > 0.0 {
            self.since + self.left / self.rate
        } else {
            f64::INFINITY
        }
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
/// its place, the set is the same: the successor takes over its slot and rate and nothing else
/// moves (O(log F)). A recompute is progressive filling over the resources' member lists, which
/// are kept up to date as flows come and go: O(F · path) array updates plus O(R log R) for a
/// heap of resource shares (a share only grows while filling, so a stale entry is pushed back
/// when it surfaces rather than on every update). Only flows whose rate changed get a new
/// entry in the heap of finish times (stale entries skipped by a version stamp), and a flow's
/// progress is kept as (bytes left, since when), so moving time on costs nothing.
#[derive(Debug, Clone)]
pub struct Network {
    caps: Capacities,
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
    /// Slots of the flows in progress whose path has only infinite resources.
    unbounded: Vec<usize>,
    // Per connection (src, dst): flows waiting behind the active one.
    waiting: HashMap<(usize, usize), VecDeque<Flow>>,
    busy_conn: HashMap<(usize, usize), usize>,
    /// The set of paths in flight changed since the rates were computed.
    dirty: bool,
    /// (finish time, slot, version), earliest first.
    finishes: BinaryHeap<Reverse<Finish>>,
    // Scratch for progressive filling.
    cap_left: Vec<f64>,
    users: Vec<u32>,
    heap: BinaryHeap<Reverse<Share>>,
    recomputes: u64,
    /// The last stamp given to a flow (`Flow::ver`).
    stamp: u64,
}

impl Network {
    /// An idle network over `caps`.
    pub fn new(caps: Capacities) -> Self {
        let r = caps.resources();
        Network {
            caps,
            now: 0.0,
            flows: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            members: vec![Vec::new(); r],
            live: Vec::new(),
            live_at: vec![usize::MAX; r],
            unbounded: Vec::new(),
            waiting: HashMap::new(),
            busy_conn: HashMap::new(),
            dirty: false,
            finishes: BinaryHeap::new(),
            cap_left: vec![0.0; r],
            users: vec![0; r],
            heap: BinaryHeap::new(),
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

    /// Start a flow of `bytes` from `src` to `dst` (different hosts) at time `at` (≥ the last
    /// event): it moves now, or after the flows already on its connection. (A start before the
    /// network's current time moves from that time on; its delay still counts from `at`.)
    pub fn start(&mut self, key: usize, src: usize, dst: usize, bytes: u64, at: f64) {
        self.move_to(at);
        let Some(path) = self.caps.path(src, dst) else {
            return;
        };
        let b = self.caps.bottleneck(&path);
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
            left: bytes as f64,
            since: self.now,
            rate: f64::NAN,
            alone,
            ver: 0,
            pos: [usize::MAX; 3],
            new_rate: f64::INFINITY,
            fixed_in: 0,
        };
        let conn = (src, dst);
        let n = self.busy_conn.entry(conn).or_insert(0);
        if *n > 0 {
            self.waiting.entry(conn).or_default().push_back(f);
        } else {
            *n = 1;
            self.insert(f);
            self.dirty = true;
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
            if self.caps.capacity(r).is_finite() {
                bounded = true;
            }
            if self.members[r].is_empty() {
                self.live_at[r] = self.live.len();
                self.live.push(r);
            }
            f.pos[k] = self.members[r].len();
            self.members[r].push(slot);
        }
        if !bounded {
            self.unbounded.push(slot);
        }
        self.flows[slot] = Some(f);
        self.in_flight += 1;
        slot
    }

    /// A flow leaves the network: out of its resources' member lists, its slot freed.
    fn remove(&mut self, slot: usize) -> Option<Flow> {
        let f = self.flows[slot].take()?;
        for (k, &r) in f.path.ids().iter().enumerate() {
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
        if let Some(i) = self.unbounded.iter().position(|&s| s == slot) {
            self.unbounded.swap_remove(i);
        }
        self.free.push(slot);
        self.in_flight -= 1;
        Some(f)
    }

    fn push_finish(&mut self, slot: usize) {
        if let Some(f) = &self.flows[slot] {
            self.finishes.push(Reverse(Finish(f.finish(), slot, f.ver)));
        }
    }

    /// When the next flow in progress finishes at the current rates (`None` when idle).
    pub fn next_finish(&mut self) -> Option<f64> {
        if self.dirty {
            self.rates();
        }
        while let Some(&Reverse(Finish(t, slot, ver))) = self.finishes.peek() {
            match &self.flows[slot] {
                Some(f) if f.ver == ver => return Some(t),
                _ => {
                    self.finishes.pop();
                }
            }
        }
        None
    }

    /// Move time to `t` and finish every flow done by then (at most until the next finish:
    /// call with `t = next_finish()`), appending them to `out`.
    pub fn finish_until(&mut self, t: f64, out: &mut Vec<Done>) {
        if self.dirty {
            self.rates();
        }
        self.move_to(t);
        // A flow is done when what is left would take under a nanosecond.
        while let Some(&Reverse(Finish(ft, slot, ver))) = self.finishes.peek() {
            if ft > self.now + 1e-9 {
                break;
            }
            self.finishes.pop();
            let Some(f) = self.flows[slot].as_mut() else {
                continue;
            };
            if f.ver != ver {
                continue;
            }
            out.push(Done {
                key: f.key,
                at: self.now,
                delay: (self.now - f.start - f.alone).max(0.0),
            });
            let np = self.caps.nic_out.len();
            let conn = (f.path.res[0], f.path.res[1] - np);
            match self.waiting.get_mut(&conn).and_then(VecDeque::pop_front) {
                Some(next) => {
                    // Same path, so the same set of paths in flight: the same rates. The
                    // successor takes over the slot (and its places in the member lists).
                    f.key = next.key;
                    f.start = next.start;
                    f.bytes = next.bytes;
                    f.alone = next.alone;
                    f.left = next.bytes;
                    f.since = self.now;
                    self.stamp += 1;
                    f.ver = self.stamp;
                    self.push_finish(slot);
                }
                None => {
                    self.remove(slot);
                    self.busy_conn.remove(&conn);
                    self.dirty = true;
                }
            }
        }
    }

    /// Max–min fair rates by progressive filling: repeatedly saturate the resource with the
    /// smallest fair share among the flows not yet fixed, fixing those flows at that share.
    /// Settles the progress of the flows whose rate changed at the current instant and gives
    /// them a new finish time.
    fn rates(&mut self) {
        self.dirty = false;
        self.recomputes += 1;
        let fill = self.recomputes;
        let now = self.now;
        self.heap.clear();
        for &r in &self.live {
            let c = self.caps.capacity(r);
            self.cap_left[r] = c;
            self.users[r] = self.members[r].len() as u32;
            let share = c / self.users[r] as f64;
            if share.is_finite() {
                self.heap.push(Reverse(Share(share, r)));
            }
        }
        while let Some(Reverse(Share(share, r))) = self.heap.pop() {
            if self.users[r] == 0 {
                continue;
            }
            let cur = self.cap_left[r] / self.users[r] as f64;
            if cur != share {
                // Flows fixed elsewhere since this entry: the share grew; back in the heap.
                self.heap.push(Reverse(Share(cur, r)));
                continue;
            }
            let rate = share.max(0.0);
            for k in 0..self.members[r].len() {
                let slot = self.members[r][k];
                let Some(f) = self.flows[slot].as_mut() else {
                    continue;
                };
                if f.fixed_in == fill {
                    continue;
                }
                f.fixed_in = fill;
                f.new_rate = rate;
                for &q in f.path.ids() {
                    self.cap_left[q] -= share;
                    self.users[q] -= 1;
                }
            }
        }
        // Flows crossing only infinite resources are unbounded.
        for &slot in &self.unbounded {
            if let Some(f) = self.flows[slot].as_mut() {
                f.fixed_in = fill;
                f.new_rate = f64::INFINITY;
            }
        }
        // Settle progress at the old rate and switch to the new one where it changed. Every
        // flow in progress is a member of some live resource.
        let mut stale = 0usize;
        for &r in &self.live {
            for &slot in &self.members[r] {
                let Some(f) = self.flows[slot].as_mut() else {
                    continue;
                };
                // Visit each flow once: through the first resource of its path.
                if f.path.res[0] != r || f.new_rate == f.rate {
                    continue;
                }
                f.left = f.left_at(now);
                f.since = now;
                f.rate = f.new_rate;
                self.stamp += 1;
                f.ver = self.stamp;
                self.finishes.push(Reverse(Finish(f.finish(), slot, f.ver)));
                stale += 1;
            }
        }
        // Drop the stale entries once they outnumber the live ones.
        if stale > 0 && self.finishes.len() > 2 * self.in_flight + 64 {
            let flows = &self.flows;
            self.finishes
                .retain(|Reverse(Finish(_, s, v))| matches!(&flows[*s], Some(f) if f.ver == *v));
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
