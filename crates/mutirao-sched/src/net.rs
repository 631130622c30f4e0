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
    left: f64,
    rate: f64,
    alone: f64,
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
#[derive(Debug, Clone)]
pub struct Network {
    caps: Capacities,
    now: f64,
    active: Vec<Flow>,
    // Per connection (src, dst): flows waiting behind the active one.
    waiting: HashMap<(usize, usize), VecDeque<Flow>>,
    busy_conn: HashMap<(usize, usize), usize>,
    // Scratch for progressive filling.
    cap_left: Vec<f64>,
    users: Vec<u32>,
    touched: Vec<usize>,
    members: Vec<Vec<usize>>,
    heap: BinaryHeap<Reverse<Share>>,
    fixed: Vec<bool>,
}

impl Network {
    /// An idle network over `caps`.
    pub fn new(caps: Capacities) -> Self {
        let r = caps.resources();
        Network {
            caps,
            now: 0.0,
            active: Vec::new(),
            waiting: HashMap::new(),
            busy_conn: HashMap::new(),
            cap_left: vec![0.0; r],
            users: vec![0; r],
            touched: Vec::new(),
            members: vec![Vec::new(); r],
            heap: BinaryHeap::new(),
            fixed: Vec::new(),
        }
    }

    /// The capacities.
    pub fn capacities(&self) -> &Capacities {
        &self.caps
    }

    /// Flows in progress (not counting those waiting behind another on their connection).
    pub fn in_flight(&self) -> usize {
        self.active.len()
    }

    /// Start a flow of `bytes` from `src` to `dst` (different hosts) at time `at` (≥ the last
    /// event): it moves now, or after the flows already on its connection.
    pub fn start(&mut self, key: usize, src: usize, dst: usize, bytes: u64, at: f64) {
        self.advance(at);
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
            rate: 0.0,
            alone,
        };
        let conn = (src, dst);
        let n = self.busy_conn.entry(conn).or_insert(0);
        if *n > 0 {
            self.waiting.entry(conn).or_default().push_back(f);
        } else {
            *n = 1;
            self.active.push(f);
            self.rates();
        }
    }

    /// When the next flow in progress finishes at the current rates (`None` when idle).
    pub fn next_finish(&self) -> Option<f64> {
        self.active
            .iter()
            .map(|f| {
                if f.left <= 0.0 {
                    self.now
                } else if f.rate > 0.0 {
                    self.now + f.left / f.rate
                } else {
                    f64::INFINITY
                }
            })
            .min_by(f64::total_cmp)
    }

    /// Move time to `t` and finish every flow done by then (at most until the next finish:
    /// call with `t = next_finish()`), appending them to `out`.
    pub fn finish_until(&mut self, t: f64, out: &mut Vec<Done>) {
        self.advance(t);
        let mut any = false;
        let mut i = 0;
        while i < self.active.len() {
            let f = &self.active[i];
            // A flow is done when what is left would take under a nanosecond.
            if f.left <= f.bytes * 1e-12 || (f.rate > 0.0 && f.left / f.rate < 1e-9) {
                let f = self.active.swap_remove(i);
                out.push(Done {
                    key: f.key,
                    at: self.now,
                    delay: (self.now - f.start - f.alone).max(0.0),
                });
                let np = self.caps.nic_out.len();
                let src = f.path.res[0];
                let dst = f.path.res[1] - np;
                let conn = (src, dst);
                match self.waiting.get_mut(&conn).and_then(VecDeque::pop_front) {
                    Some(next) => self.active.push(next),
                    None => {
                        self.busy_conn.remove(&conn);
                    }
                }
                any = true;
            } else {
                i += 1;
            }
        }
        if any {
            self.rates();
        }
    }

    fn advance(&mut self, t: f64) {
        let dt = t - self.now;
        if dt > 0.0 {
            for f in &mut self.active {
                f.left = (f.left - f.rate * dt).max(0.0);
            }
            self.now = t;
        }
    }

    /// Max–min fair rates by progressive filling: repeatedly saturate the resource with the
    /// smallest fair share among the flows not yet fixed, fixing those flows at that share.
    /// O(F · path · log R) with a lazy heap of resource shares.
    fn rates(&mut self) {
        for &r in &self.touched {
            self.users[r] = 0;
            self.members[r].clear();
        }
        self.touched.clear();
        for (i, f) in self.active.iter().enumerate() {
            for &r in f.path.ids() {
                if self.users[r] == 0 {
                    self.touched.push(r);
                    self.cap_left[r] = self.caps.capacity(r);
                }
                self.users[r] += 1;
                self.members[r].push(i);
            }
        }
        self.heap.clear();
        for &r in &self.touched {
            let share = self.cap_left[r] / self.users[r] as f64;
            if share.is_finite() {
                self.heap.push(Reverse(Share(share, r)));
            }
        }
        self.fixed.clear();
        self.fixed.resize(self.active.len(), false);
        while let Some(Reverse(Share(share, r))) = self.heap.pop() {
            if self.users[r] == 0 {
                continue;
            }
            let now = self.cap_left[r] / self.users[r] as f64;
            if now != share {
                continue; // stale entry: a fresher one is in the heap
            }
            for k in 0..self.members[r].len() {
                let i = self.members[r][k];
                if self.fixed[i] {
                    continue;
                }
                self.fixed[i] = true;
                self.active[i].rate = share.max(0.0);
                let path = self.active[i].path;
                for &q in path.ids() {
                    self.cap_left[q] -= share;
                    self.users[q] -= 1;
                    if q != r && self.users[q] > 0 {
                        let s = self.cap_left[q] / self.users[q] as f64;
                        if s.is_finite() {
                            self.heap.push(Reverse(Share(s, q)));
                        }
                    }
                }
            }
        }
        // Flows crossing only infinite resources are unbounded.
        for (i, f) in self.active.iter_mut().enumerate() {
            if !self.fixed[i] {
                f.rate = f64::INFINITY;
            }
        }
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
