//! The pure layout of a testbed: names, addresses, routes and shaping parameters derived from a
//! validated spec, a name prefix and an address slot. No I/O; `Testbed::up` carries it out.
//!
//! Addressing: the testbed owns `10.213.(16·slot).0/20`. Site `s` is `10.213.(16·slot+s).0/24`
//! (hosts `.1`…, gateway `.254`); the last /24, `10.213.(16·slot+15).0/24`, holds the control
//! links from the root namespace (`/30` each, `.4s+1` root side, `.4s+2` site side) and the WAN
//! links (`/31` each from `.64`).

use crate::spec::{Spec, MAX_SITES};
use std::net::Ipv4Addr;

/// First two octets of every testbed address.
pub const NET_PREFIX: [u8; 2] = [10, 213];
/// Number of address slots (each a /20), hence of testbeds that can be up at once.
pub const SLOTS: u8 = 16;
/// Largest `cpu.shares` the kernel accepts; also the weight of a testbed's parent cgroup.
pub const MAX_SHARES: u64 = 262_144;
/// Length of a testbed prefix: `mtb` and six lower-case hex digits.
pub const PREFIX_LEN: usize = 9;

/// Is `s` a well-formed testbed prefix (`mtb` + 6 lower-case hex digits)?
pub fn is_prefix(s: &str) -> bool {
    s.len() == PREFIX_LEN
        && s.starts_with("mtb")
        && s[3..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// If `name` is an object (network namespace, root-namespace link, cgroup) made by some testbed,
/// the prefix of that testbed.
pub fn prefix_of(name: &str) -> Option<&str> {
    let p = name.get(..PREFIX_LEN)?;
    let rest = &name[PREFIX_LEN..];
    let ours = rest.is_empty()
        || rest
            .strip_prefix('-')
            .is_some_and(|r| r.starts_with('s') || r.starts_with('h'))
        || rest
            .strip_prefix('c')
            .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()));
    (is_prefix(p) && ours).then_some(p)
}

/// A full Ethernet frame (1500 B MTU + header).
pub const FRAME_BYTES: u64 = 1514;

/// `ip link set dev DEV …` arguments applied to every shaped interface before its qdisc: no
/// GSO/TSO super-packets reach the token bucket, so it can be a few frames deep.
pub const GSO_ARGS: [&str; 4] = ["gso_max_size", "1500", "gso_max_segs", "1"];

/// Token-bucket parameters for one shaped interface.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tbf {
    /// Rate in kbit/s (tc's `kbit` is 1000 bit/s).
    pub rate_kbit: u64,
    /// Bucket size in bytes. On links of at most [`SMALL_BUCKET_MAX_MBIT`]: one full frame plus
    /// what the link carries in [`TIMER_LATE_US`] — the least that lets a frame through and still
    /// keeps the link at its rate when the kernel's timer releases each frame that late (the
    /// tokens of the late spell stay in the bucket). Faster links: three frames, or 0.2 ms of
    /// traffic (the kernel's watchdog cannot release one frame every few µs). The shaped
    /// interfaces send no GSO super-packets (`gso_max_segs 1`, see [`GSO_ARGS`]), so the bucket
    /// need not hold 64 KiB; a 128 KiB bucket let messages of up to ~256 KiB pass at up to twice
    /// the rate after an idle spell, and the calibrated model bent there. After an idle spell
    /// the bucket's bytes leave at once: a message is then faster than latency + size/rate by
    /// the bucket's time (one frame and 60 µs on slow links), nothing more.
    pub burst_bytes: u64,
    /// Queue size in bytes: 25 ms of traffic, at least 4 MiB. The queue holds a whole message
    /// of up to ~4 MiB, so the link never drops: with a 25 ms queue (125 KB at 40 Mbit/s) the
    /// first size beyond bucket + queue lost packets, and a 384 KiB message took 152–212 ms,
    /// longer than a 512 KiB one (167 ms), varying 21% between calibrations.
    pub limit_bytes: u64,
}

/// Fastest link given the small bucket of [`Tbf::burst_bytes`] (a frame every ≥ 120 µs, twice
/// [`TIMER_LATE_US`]).
pub const SMALL_BUCKET_MAX_MBIT: f64 = 100.0;

/// How late (µs) the kernel's timer may release a frame without slowing a link: about twice
/// the ~26 µs measured on this VM (2026-11-27). Until then slow links had a bucket of three
/// frames and a one-frame peak-rate bucket 2% above the rate; the peak bucket cannot keep the
/// tokens of a late release, and a 30 Mbit/s WAN carried 95% of its payload rate, a 100 Mbit/s
/// one 83%.
pub const TIMER_LATE_US: f64 = 60.0;

impl Tbf {
    /// Parameters for a link of `mbit` Mbit/s.
    pub fn for_mbit(mbit: f64) -> Tbf {
        let rate_kbit = ((mbit * 1000.0).round() as u64).max(1);
        let bytes_per_s = rate_kbit * 1000 / 8;
        let burst_bytes = if mbit <= SMALL_BUCKET_MAX_MBIT {
            FRAME_BYTES + (bytes_per_s as f64 * TIMER_LATE_US * 1e-6).ceil() as u64
        } else {
            (bytes_per_s / 5000).max(3 * FRAME_BYTES)
        };
        Tbf {
            rate_kbit,
            burst_bytes,
            limit_bytes: (bytes_per_s / 40).max(4 << 20),
        }
    }

    /// The arguments after `tc qdisc add dev DEV root`.
    pub fn tc_args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "tbf".into(),
            "rate".into(),
            format!("{}kbit", self.rate_kbit),
            "burst".into(),
            self.burst_bytes.to_string(),
        ];
        args.extend(["limit".into(), self.limit_bytes.to_string()]);
        args
    }

    /// `tc` invocations (each after `tc -n NS`) that put, under a root tbf with handle `1:`,
    /// a two-band child that sends small packets first: TCP segments under 128 bytes (pure
    /// acknowledgements, small control frames) ahead of bulk data, which waits in a byte FIFO
    /// of `limit_bytes`. Without it, the acknowledgements of a flow in one direction queue
    /// behind the other direction's data (up to `limit_bytes`, over a second on a slow link),
    /// and a 265 KB message across a 30 Mbit/s WAN took 286 ms instead of 74 while traffic
    /// flowed the other way. A router with flow queueing (fq_codel, Linux's default) behaves the
    /// same way; this kernel offers only fifo, tbf and htb, so htb's priority bands stand in.
    pub fn ack_first_args(&self, dev: &str) -> Vec<Vec<String>> {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        let limit = self.limit_bytes.to_string();
        vec![
            v(&[
                "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "2:", "htb", "default", "20",
            ]),
            v(&[
                "class", "add", "dev", dev, "parent", "2:", "classid", "2:10", "htb", "rate",
                "10gbit", "quantum", "1514", "prio", "0",
            ]),
            v(&[
                "class", "add", "dev", dev, "parent", "2:", "classid", "2:20", "htb", "rate",
                "10gbit", "quantum", "1514", "prio", "1",
            ]),
            v(&[
                "qdisc", "add", "dev", dev, "parent", "2:20", "bfifo", "limit", &limit,
            ]),
            // IPv4, protocol 6 (TCP), total length (16 bits at offset 2) below 128.
            v(&[
                "filter", "add", "dev", dev, "parent", "2:", "protocol", "ip", "prio", "1", "u32",
                "match", "ip", "protocol", "6", "0xff", "match", "u16", "0x0000", "0xff80", "at",
                "2", "flowid", "2:10",
            ]),
        ]
    }
}

/// Most host pairs one shaped interface queues separately ([`flow_queue_batch`]); an interface
/// that would carry more keeps one FIFO for its bulk data (with a warning at `up`). 4096 pairs
/// is a WAN between two sites of 45 hosts.
pub const MAX_FLOW_QUEUES: usize = 4096;

/// `tc -batch` lines (each run as `tc -n NS -batch -`) that give every host pair whose packets
/// leave through `dev` its own queue under the bulk band of [`Tbf::ack_first_args`], served
/// round-robin one frame at a time: concurrent flows share the link max–min fair, as in
/// SimGrid's flow model and behind a router with flow queueing (fq_codel, Linux's default, which
/// this kernel lacks). With one FIFO, whichever TCP connection held more of the queue took most
/// of the link: of two 1 MiB transfers from one host across a 10 Mbit/s WAN, started 50 ms
/// apart, the second ended 0.48 s before the first (max–min fair: together); a round-robin
/// schedule's run took 2.45 s or 2.9 s depending on it. Pairs are matched on both addresses;
/// the u32 filters hash on the last octet of the side with more distinct addresses. Traffic of
/// no listed pair (control links) stays in the default band 2:20.
pub fn flow_queue_batch(dev: &str, pairs: &[(Ipv4Addr, Ipv4Addr)], limit_bytes: u64) -> String {
    use std::collections::BTreeSet;
    let mut out = String::new();
    if pairs.is_empty() {
        return out;
    }
    let srcs: BTreeSet<u8> = pairs.iter().map(|(s, _)| s.octets()[3]).collect();
    let dsts: BTreeSet<u8> = pairs.iter().map(|(_, d)| d.octets()[3]).collect();
    // IPv4 header: source address at byte 12, destination at 16.
    let by_dst = dsts.len() > srcs.len();
    let key_at = if by_dst { 16 } else { 12 };
    let key_of = |p: &(Ipv4Addr, Ipv4Addr)| if by_dst { p.1 } else { p.0 }.octets()[3];
    for i in 0..pairs.len() {
        let class = 0x100 + i;
        out.push_str(&format!(
            "class add dev {dev} parent 2: classid 2:{class:x} htb rate 10gbit quantum {FRAME_BYTES} prio 1\n\
             qdisc add dev {dev} parent 2:{class:x} bfifo limit {limit_bytes}\n"
        ));
    }
    out.push_str(&format!(
        "filter add dev {dev} parent 2: prio 1 handle 100: protocol ip u32 divisor 256\n"
    ));
    for (i, pair) in pairs.iter().enumerate() {
        out.push_str(&format!(
            "filter add dev {dev} parent 2: prio 1 protocol ip u32 ht 100:{:x}: match ip src {}/32 \
             match ip dst {}/32 flowid 2:{:x}\n",
            key_of(pair),
            pair.0,
            pair.1,
            0x100 + i
        ));
    }
    out.push_str(&format!(
        "filter add dev {dev} parent 2: prio 1 protocol ip u32 ht 800:: match u8 0 0 \
         hashkey mask 0x000000ff at {key_at} link 100:\n"
    ));
    out
}

/// CFS settings giving a cgroup `cpu` cores: `quota_us / period_us = cpu` caps it, and a large
/// `cpu.shares` weight lets it get that much even while other work loads the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuQuota {
    /// `cpu.shares`: 16 × 1024 per core of quota (a nice-0 task weighs 1024), at most 262144.
    pub shares: u64,
    /// `cpu.cfs_period_us`: 10 ms for hosts of a core or more; 5 ms for fractional hosts, longer
    /// only where the quota would fall under the kernel's 1 ms minimum. After an idle spell a
    /// throttled host runs at full speed until its period's quota is spent, so a task's speed
    /// depends on its length, the more so the longer the period: at `cpu = 0.6` with a 10 ms
    /// period, 20 ms of full-speed work ran at 0.81 and 300 ms at 0.60 (a task graph's 40 ms
    /// tasks took a third less time than the calibrated speed predicted); with 5 ms, 0.63 and
    /// 0.57 (medians of 7 after 100 ms idle; docs/testbed.md). Shorter periods cost more in
    /// throttling overhead (3 ms: 0.51 sustained), which calibration measures.
    pub period_us: u64,
    /// `cpu.cfs_quota_us`.
    pub quota_us: u64,
    /// `cpu.cfs_burst_us` (kernels ≥ 5.14): the quota for hosts of one core or more, else 0.
    /// A burst lets a host spend up to one period's quota that it left unused earlier. Without
    /// it CFS strands quota in per-CPU slices, so a `cpu = 1.0` host running one busy thread
    /// was throttled in ~40% of its periods and ran ~15% slower than an unlimited process
    /// (measured, docs/testbed.md). A fractional host needs none, and with one its share in a
    /// short busy spell after idling rose 1–2% above `cpu` (H runs of ~1 s).
    pub burst_us: u64,
}

impl CpuQuota {
    /// The quota for a share of `cpu` cores (validated: at least [`crate::spec::MIN_CPU`]).
    pub fn for_cpu(cpu: f64) -> CpuQuota {
        let period_us = if cpu >= 1.0 {
            10_000
        } else {
            ((1000.0 / cpu).ceil() as u64).clamp(5_000, 1_000_000)
        };
        let quota_us = ((cpu * period_us as f64).round() as u64).max(1000);
        CpuQuota {
            shares: ((cpu * 16.0 * 1024.0).round() as u64).clamp(2, MAX_SHARES),
            period_us,
            quota_us,
            burst_us: if cpu >= 1.0 { quota_us } else { 0 },
        }
    }
}

/// One site as laid out.
#[derive(Debug, Clone, PartialEq)]
pub struct SitePlan {
    /// Site name from the spec.
    pub name: String,
    /// Network namespace holding the site's bridge `br0` and its router.
    pub netns: String,
    /// The site's /24 network address.
    pub net: Ipv4Addr,
    /// The gateway address (on `br0`).
    pub gateway: Ipv4Addr,
    /// Link in the root namespace leading to the site (`PREFIXc<s>`).
    pub root_link: String,
    /// Root-side address of that link (/30).
    pub root_addr: Ipv4Addr,
    /// Site-side address of that link (/30), on interface `ctl`.
    pub ctl_addr: Ipv4Addr,
    /// Shaping of every host link of the site.
    pub nic: Tbf,
}

/// One host as laid out.
#[derive(Debug, Clone, PartialEq)]
pub struct HostPlan {
    /// Host name from the spec.
    pub name: String,
    /// Index of its site.
    pub site: usize,
    /// Its network namespace (`PREFIX-h<i>`); inside it the host's interface is `eth0`.
    pub netns: String,
    /// Its port on the site bridge, in the site namespace (`h<i>`).
    pub port: String,
    /// Its address (/24).
    pub addr: Ipv4Addr,
    /// Its CPU share in cores.
    pub cpu: f64,
    /// Its cgroup's name under the testbed's cgroup (`h<i>`).
    pub cgroup: String,
    /// Its CFS quota.
    pub quota: CpuQuota,
    /// Shaping of its link (both ends): the host's own `nic_mbit`, else its site's.
    pub nic: Tbf,
}

/// One WAN link as laid out: a veth pair `w<k>` between two site namespaces.
#[derive(Debug, Clone, PartialEq)]
pub struct WanPlan {
    /// Index of the first site.
    pub a: usize,
    /// Index of the second site.
    pub b: usize,
    /// Interface name at both ends (`w<k>`).
    pub ifname: String,
    /// Address of site `a`'s end (/31).
    pub addr_a: Ipv4Addr,
    /// Address of site `b`'s end (/31).
    pub addr_b: Ipv4Addr,
    /// Shaping at both ends.
    pub tbf: Tbf,
}

/// A route inside a site namespace: `net/24 via gateway dev ifname`.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutePlan {
    /// Site whose namespace holds the route.
    pub site: usize,
    /// Destination /24.
    pub dest: Ipv4Addr,
    /// Next hop (the far end of a WAN link).
    pub via: Ipv4Addr,
    /// Outgoing interface.
    pub dev: String,
}

/// The complete layout of one testbed.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Name prefix of everything it creates.
    pub prefix: String,
    /// Address slot: the testbed owns `10.213.(16·slot).0/20`.
    pub slot: u8,
    /// Sites in spec order.
    pub sites: Vec<SitePlan>,
    /// Hosts in spec order.
    pub hosts: Vec<HostPlan>,
    /// WAN links in spec order.
    pub wans: Vec<WanPlan>,
    /// Inter-site routes.
    pub routes: Vec<RoutePlan>,
    /// The /26 holding every control link's root-side address: each site namespace routes it
    /// over its own control link, so hosts of every site reach a launcher in the root namespace
    /// whichever control link it used.
    pub control_net: Ipv4Addr,
}

fn addr(slot: u8, third: usize, fourth: usize) -> Ipv4Addr {
    // Callers keep third < 16 and fourth < 256 (validated spec limits).
    Ipv4Addr::new(
        NET_PREFIX[0],
        NET_PREFIX[1],
        slot.wrapping_mul(16).wrapping_add(third as u8),
        fourth as u8,
    )
}

impl Plan {
    /// Lay out a validated `spec` under `prefix` in address `slot` (< [`SLOTS`]).
    pub fn new(spec: &Spec, prefix: &str, slot: u8) -> Plan {
        let xfer = MAX_SITES; // third-octet offset of the control/WAN /24
        let sites = spec
            .sites
            .iter()
            .enumerate()
            .map(|(s, site)| SitePlan {
                name: site.name.clone(),
                netns: format!("{prefix}-s{s}"),
                net: addr(slot, s, 0),
                gateway: addr(slot, s, 254),
                root_link: format!("{prefix}c{s}"),
                root_addr: addr(slot, xfer, 4 * s + 1),
                ctl_addr: addr(slot, xfer, 4 * s + 2),
                nic: Tbf::for_mbit(site.nic_mbit),
            })
            .collect();
        let hosts = spec
            .hosts()
            .into_iter()
            .map(|h| HostPlan {
                name: h.spec.name.clone(),
                site: h.site,
                netns: format!("{prefix}-h{}", h.index),
                port: format!("h{}", h.index),
                addr: addr(slot, h.site, h.local + 1),
                cpu: h.spec.cpu,
                cgroup: format!("h{}", h.index),
                quota: CpuQuota::for_cpu(h.spec.cpu),
                nic: Tbf::for_mbit(h.spec.nic_mbit.unwrap_or(spec.sites[h.site].nic_mbit)),
            })
            .collect();
        let wans: Vec<WanPlan> = spec
            .wans
            .iter()
            .zip(spec.wan_ends())
            .enumerate()
            .filter_map(|(k, (w, ends))| {
                let (a, b) = ends?;
                Some(WanPlan {
                    a,
                    b,
                    ifname: format!("w{k}"),
                    addr_a: addr(slot, xfer, 64 + 2 * k),
                    addr_b: addr(slot, xfer, 65 + 2 * k),
                    tbf: Tbf::for_mbit(w.mbit),
                })
            })
            .collect();
        let mut routes = Vec::new();
        for (s, row) in spec.next_hops().iter().enumerate() {
            for (t, hop) in row.iter().enumerate() {
                let Some(w) = hop.and_then(|k| wans.get(k)) else {
                    continue;
                };
                let via = if w.a == s { w.addr_b } else { w.addr_a };
                routes.push(RoutePlan {
                    site: s,
                    dest: addr(slot, t, 0),
                    via,
                    dev: w.ifname.clone(),
                });
            }
        }
        Plan {
            prefix: prefix.to_string(),
            slot,
            sites,
            hosts,
            wans,
            routes,
            control_net: addr(slot, xfer, 0),
        }
    }

    /// Ordered pairs of host addresses whose packets leave through interface `dev` of network
    /// namespace `netns`: a host's `eth0` carries its own traffic to every other host, a site's
    /// port `h<i>` the traffic to host `i`, and a WAN end the traffic between the hosts on
    /// either side whose route leaves that site through it (transit included). Empty for an
    /// interface the plan does not shape.
    pub fn pairs_through(&self, netns: &str, dev: &str) -> Vec<(Ipv4Addr, Ipv4Addr)> {
        let mut out = Vec::new();
        for x in &self.hosts {
            for y in &self.hosts {
                if x.addr == y.addr {
                    continue;
                }
                let through = (x.netns == netns && dev == "eth0")
                    || (y.port == dev && self.sites[y.site].netns == netns)
                    || self
                        .wan_hops(x.site, y.site)
                        .any(|(s, ifname)| self.sites[s].netns == netns && ifname == dev);
                if through {
                    out.push((x.addr, y.addr));
                }
            }
        }
        out
    }

    /// The (site, WAN interface) pairs a packet from site `from` to site `to` leaves through,
    /// following the routes (at most one hop per site).
    fn wan_hops(&self, from: usize, to: usize) -> impl Iterator<Item = (usize, &str)> + '_ {
        let mut at = from;
        let mut hops = 0;
        std::iter::from_fn(move || {
            if at == to || hops >= self.sites.len() {
                return None;
            }
            hops += 1;
            let net = self.sites.get(to)?.net;
            let route = self.routes.iter().find(|r| r.site == at && r.dest == net)?;
            let wan = self.wans.iter().find(|w| w.ifname == route.dev)?;
            let here = at;
            at = if wan.a == at { wan.b } else { wan.a };
            Some((here, route.dev.as_str()))
        })
    }

    /// The whole /20 the testbed owns, as `10.213.X.0/20`.
    pub fn block(&self) -> String {
        format!("{}/20", addr(self.slot, 0, 0))
    }
}

/// Open MPI-style hostfile text: one line `ADDR slots=N port=P` per host, in spec order, where
/// `N = max(1, ceil(cpu))` and `port=P` (the agent's port) is present only when agents run.
pub fn hostfile(hosts: &[(Ipv4Addr, f64)], port: Option<u16>) -> String {
    let mut out = String::new();
    for (addr, cpu) in hosts {
        let slots = (cpu.ceil() as u64).max(1);
        out.push_str(&format!("{addr} slots={slots}"));
        if let Some(p) = port {
            out.push_str(&format!(" port={p}"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec::parse(
            r#"
[[site]]
name = "a"
nic_mbit = 800
hosts = [ { name = "a1", cpu = 1.0 }, { name = "a2", cpu = 0.5 } ]
[[site]]
name = "b"
nic_mbit = 200
hosts = [ { name = "b1", cpu = 0.25 } ]
[[wan]]
sites = ["a", "b"]
mbit = 40
"#,
            2,
        )
        .expect("valid spec")
    }

    #[test]
    fn a_host_nic_overrides_its_site() {
        let text = r#"
[[site]]
name = "a"
nic_mbit = 800
hosts = [ { name = "a1", cpu = 1.0 }, { name = "a2", cpu = 1.0, nic_mbit = 100 } ]
"#;
        let p = Plan::new(&Spec::parse(text, 2).expect("valid"), "mtb000001", 3);
        assert_eq!(p.hosts[0].nic.rate_kbit, 800_000);
        assert_eq!(p.hosts[1].nic.rate_kbit, 100_000);
        let bad = text.replace("nic_mbit = 100", "nic_mbit = -5");
        let e = Spec::parse(&bad, 2).unwrap_err().to_string();
        assert!(e.contains("site[0].hosts[1].nic_mbit"), "{e}");
    }

    #[test]
    fn each_interface_queues_the_host_pairs_whose_packets_leave_through_it() {
        // Three sites in a chain: a — b — c (traffic between a and c transits b).
        let text = r#"
[[site]]
name = "a"
nic_mbit = 800
hosts = [ { name = "a1", cpu = 0.5 }, { name = "a2", cpu = 0.5 } ]
[[site]]
name = "b"
nic_mbit = 200
hosts = [ { name = "b1", cpu = 0.25 } ]
[[site]]
name = "c"
nic_mbit = 100
hosts = [ { name = "c1", cpu = 0.25 } ]
[[wan]]
sites = ["a", "b"]
mbit = 40
[[wan]]
sites = ["b", "c"]
mbit = 20
"#;
        let p = Plan::new(&Spec::parse(text, 2).expect("valid"), "mtb000001", 3);
        let addr = |n: &str| p.hosts.iter().find(|h| h.name == n).expect(n).addr;
        let (a1, a2, b1, c1) = (addr("a1"), addr("a2"), addr("b1"), addr("c1"));
        let sorted = |mut v: Vec<(Ipv4Addr, Ipv4Addr)>| {
            v.sort();
            v
        };
        // A host's own interface: its traffic to every other host.
        assert_eq!(
            sorted(p.pairs_through(&p.hosts[0].netns, "eth0")),
            sorted(vec![(a1, a2), (a1, b1), (a1, c1)])
        );
        // The site's port toward a host: every other host's traffic to it.
        assert_eq!(
            sorted(p.pairs_through(&p.sites[0].netns, &p.hosts[1].port)),
            sorted(vec![(a1, a2), (b1, a2), (c1, a2)])
        );
        // WAN a-b at a's end: a's hosts to b's and, in transit, to c's.
        assert_eq!(
            sorted(p.pairs_through(&p.sites[0].netns, "w0")),
            sorted(vec![(a1, b1), (a1, c1), (a2, b1), (a2, c1)])
        );
        // WAN a-b at b's end: b's and c's hosts to a's.
        assert_eq!(
            sorted(p.pairs_through(&p.sites[1].netns, "w0")),
            sorted(vec![(b1, a1), (b1, a2), (c1, a1), (c1, a2)])
        );
        // WAN b-c at b's end: a's and b's hosts to c1.
        assert_eq!(
            sorted(p.pairs_through(&p.sites[1].netns, "w1")),
            sorted(vec![(a1, c1), (a2, c1), (b1, c1)])
        );
        assert!(p.pairs_through(&p.sites[2].netns, "nope").is_empty());
    }

    #[test]
    fn every_host_pair_gets_its_own_round_robin_queue() {
        let a = |x: u8, y: u8| Ipv4Addr::new(10, 213, 48 + x, y);
        // Two sources, one destination: hashed on the source side.
        let pairs = [(a(0, 1), a(1, 1)), (a(0, 2), a(1, 1)), (a(1, 2), a(1, 1))];
        let b = flow_queue_batch("w0", &pairs, 4 << 20);
        let lines: Vec<&str> = b.lines().collect();
        // A class and a FIFO per pair, each a full-frame round-robin turn at the bulk priority.
        for c in ["100", "101", "102"] {
            assert!(lines.contains(
                &format!("class add dev w0 parent 2: classid 2:{c} htb rate 10gbit quantum 1514 prio 1")
                    .as_str()
            ), "{b}");
            assert!(
                lines.contains(
                    &format!("qdisc add dev w0 parent 2:{c} bfifo limit 4194304").as_str()
                ),
                "{b}"
            );
        }
        // Each pair matched on both addresses, in the bucket of its source's last octet
        // (10.213.48.2 and 10.213.49.2 share bucket 2).
        assert!(lines.contains(&"filter add dev w0 parent 2: prio 1 protocol ip u32 ht 100:1: match ip src 10.213.48.1/32 match ip dst 10.213.49.1/32 flowid 2:100"), "{b}");
        assert!(lines.contains(&"filter add dev w0 parent 2: prio 1 protocol ip u32 ht 100:2: match ip src 10.213.48.2/32 match ip dst 10.213.49.1/32 flowid 2:101"), "{b}");
        assert!(lines.contains(&"filter add dev w0 parent 2: prio 1 protocol ip u32 ht 100:2: match ip src 10.213.49.2/32 match ip dst 10.213.49.1/32 flowid 2:102"), "{b}");
        // The table exists before its entries; the hashing link comes last, after the
        // acknowledgement filter that `ack_first_args` put first in table 800.
        let table = lines
            .iter()
            .position(|l| l.contains("handle 100: protocol ip u32 divisor 256"));
        assert_eq!(table, Some(6), "{b}");
        assert_eq!(
            lines.last().copied(),
            Some("filter add dev w0 parent 2: prio 1 protocol ip u32 ht 800:: match u8 0 0 hashkey mask 0x000000ff at 12 link 100:")
        );
        // One source, many destinations (a host's own interface): hashed on the destination.
        let out = [(a(0, 1), a(0, 2)), (a(0, 1), a(1, 1))];
        assert!(flow_queue_batch("eth0", &out, 1 << 22).ends_with("at 16 link 100:\n"));
        assert!(flow_queue_batch("eth0", &[], 1 << 22).is_empty());
    }

    #[test]
    fn prefixes_are_recognised() {
        assert!(is_prefix("mtb0a1f9c"));
        assert!(!is_prefix("mtb0A1F9C"));
        assert!(!is_prefix("mtb0a1f9"));
        assert!(!is_prefix("xtb0a1f9c"));
        assert_eq!(prefix_of("mtb0a1f9c-h3"), Some("mtb0a1f9c"));
        assert_eq!(prefix_of("mtb0a1f9c-s0"), Some("mtb0a1f9c"));
        assert_eq!(prefix_of("mtb0a1f9cc12"), Some("mtb0a1f9c"));
        assert_eq!(prefix_of("mtb0a1f9c"), Some("mtb0a1f9c"));
        assert_eq!(prefix_of("mtb0a1f9cx"), None);
        assert_eq!(prefix_of("mtb0a1f9c-foo"), None);
        assert_eq!(prefix_of("eth0"), None);
    }

    #[test]
    fn layout_of_the_two_site_example() {
        let p = Plan::new(&spec(), "mtb000001", 3);
        assert_eq!(p.block(), "10.213.48.0/20");
        assert_eq!(p.sites[0].netns, "mtb000001-s0");
        assert_eq!(p.sites[1].gateway, Ipv4Addr::new(10, 213, 49, 254));
        assert_eq!(p.sites[1].root_link, "mtb000001c1");
        assert_eq!(p.sites[1].root_addr, Ipv4Addr::new(10, 213, 63, 5));
        assert_eq!(p.sites[1].ctl_addr, Ipv4Addr::new(10, 213, 63, 6));
        let addrs: Vec<_> = p.hosts.iter().map(|h| h.addr).collect();
        assert_eq!(
            addrs,
            [
                Ipv4Addr::new(10, 213, 48, 1),
                Ipv4Addr::new(10, 213, 48, 2),
                Ipv4Addr::new(10, 213, 49, 1)
            ]
        );
        assert_eq!(p.hosts[2].netns, "mtb000001-h2");
        assert_eq!(p.control_net, Ipv4Addr::new(10, 213, 63, 0));
        assert_eq!(p.wans[0].addr_a, Ipv4Addr::new(10, 213, 63, 64));
        assert_eq!(p.wans[0].addr_b, Ipv4Addr::new(10, 213, 63, 65));
        assert_eq!(
            p.routes,
            vec![
                RoutePlan {
                    site: 0,
                    dest: Ipv4Addr::new(10, 213, 49, 0),
                    via: Ipv4Addr::new(10, 213, 63, 65),
                    dev: "w0".into()
                },
                RoutePlan {
                    site: 1,
                    dest: Ipv4Addr::new(10, 213, 48, 0),
                    via: Ipv4Addr::new(10, 213, 63, 64),
                    dev: "w0".into()
                },
            ]
        );
    }

    #[test]
    fn interface_names_fit_the_kernel_limit() {
        // 15 sites, the longest names: root link PREFIXc14, host port h3749.
        let p = Plan::new(&spec(), "mtbffffff", SLOTS - 1);
        for s in &p.sites {
            assert!(s.root_link.len() <= 15, "{}", s.root_link);
        }
        assert!("mtbffffffc14".len() <= 15);
        assert!(format!("h{}", 15 * 250 - 1).len() <= 15);
        assert_eq!(p.block(), "10.213.240.0/20");
        assert_eq!(p.sites[0].root_addr, Ipv4Addr::new(10, 213, 255, 1));
    }

    #[test]
    fn quotas_use_a_5ms_period_below_a_core_and_respect_the_1ms_minimum() {
        assert_eq!(
            CpuQuota::for_cpu(0.25),
            CpuQuota {
                shares: 4096,
                period_us: 5_000,
                quota_us: 1250,
                burst_us: 0
            }
        );
        assert_eq!(CpuQuota::for_cpu(0.6).period_us, 5_000);
        assert_eq!(CpuQuota::for_cpu(0.6).quota_us, 3_000);
        // 1 ms of quota at least: a tenth of a core gets a 10 ms period.
        assert_eq!(CpuQuota::for_cpu(0.1).period_us, 10_000);
        assert_eq!(CpuQuota::for_cpu(0.1).quota_us, 1_000);
        assert_eq!(CpuQuota::for_cpu(1.0).period_us, 10_000);
        assert_eq!(CpuQuota::for_cpu(1.5).quota_us, 15_000);
        assert_eq!(CpuQuota::for_cpu(1.0).burst_us, 10_000);
        assert_eq!(CpuQuota::for_cpu(1.5).burst_us, 15_000);
        let small = CpuQuota::for_cpu(0.01);
        assert_eq!(small.period_us, 100_000);
        assert_eq!(small.quota_us, 1000);
    }

    #[test]
    fn tbf_bucket_is_a_frame_and_the_timers_lateness_or_on_fast_links_a_fifth_of_a_millisecond() {
        let slow = Tbf::for_mbit(40.0);
        assert_eq!(slow.rate_kbit, 40_000);
        // 40 Mbit/s = 5 MB/s: one frame + 60 µs of it (300 B).
        assert_eq!(slow.burst_bytes, 1514 + 300);
        assert_eq!(
            &slow.tc_args()[..5],
            ["tbf", "rate", "40000kbit", "burst", "1814"]
        );
        for mbit in [0.5, 10.0, 30.0, 100.0] {
            let t = Tbf::for_mbit(mbit);
            // Enough for one frame and for the tokens of a release TIMER_LATE_US late ...
            let late_bytes = t.rate_kbit as f64 * 1000.0 / 8.0 * TIMER_LATE_US * 1e-6;
            assert!(
                t.burst_bytes as f64 >= FRAME_BYTES as f64 + late_bytes,
                "{mbit}"
            );
            // ... and no more than two frames: what passes at once after an idle spell.
            assert!(
                t.burst_bytes <= 2 * FRAME_BYTES,
                "{mbit}: {}",
                t.burst_bytes
            );
        }
        let fast = Tbf::for_mbit(800.0);
        assert_eq!(fast.burst_bytes, 20_000);
        assert_eq!(Tbf::for_mbit(200.0).burst_bytes, 5_000);
        assert_eq!(Tbf::for_mbit(101.0).burst_bytes, 3 * 1514);
        // Below the smallest size calibrated on a line (16 KiB) at every rate up to 640 Mbit/s.
        assert!(Tbf::for_mbit(640.0).burst_bytes <= 16 << 10);
        assert_eq!(fast.tc_args()[2], "800000kbit");
        // No peak-rate bucket: it cannot keep the tokens of a late release.
        assert!(!slow.tc_args().iter().any(|a| a == "peakrate"));
        // The queue holds 25 ms of traffic, and never less than a 4 MiB message.
        assert_eq!(slow.limit_bytes, 4 << 20);
        assert_eq!(Tbf::for_mbit(10_000.0).limit_bytes, 31_250_000);
        assert_eq!(&fast.tc_args()[5..], ["limit", "4194304"]);
    }

    #[test]
    fn small_tcp_segments_go_first_and_bulk_waits_in_the_links_queue() {
        let t = Tbf::for_mbit(30.0);
        let cmds = t.ack_first_args("w0");
        // Under the root tbf (1:1), an htb whose default band is the bulk one.
        assert_eq!(
            &cmds[0][4..],
            ["parent", "1:1", "handle", "2:", "htb", "default", "20"]
        );
        // Band 2:10 has priority over 2:20.
        assert!(cmds[1].windows(2).any(|w| w == ["classid", "2:10"]));
        assert_eq!(cmds[1].last().map(String::as_str), Some("0"));
        assert!(cmds[2].windows(2).any(|w| w == ["classid", "2:20"]));
        assert_eq!(cmds[2].last().map(String::as_str), Some("1"));
        // Bulk data queues in a byte FIFO as deep as the tbf's own queue.
        assert_eq!(
            &cmds[3][4..],
            ["parent", "2:20", "bfifo", "limit", "4194304"]
        );
        // TCP segments with an IP total length under 128 bytes go to band 2:10.
        let f = cmds[4].join(" ");
        assert!(f.contains("match ip protocol 6 0xff"), "{f}");
        assert!(f.contains("match u16 0x0000 0xff80 at 2"), "{f}");
        assert!(f.ends_with("flowid 2:10"), "{f}");
        assert!(cmds
            .iter()
            .all(|c| c.windows(2).any(|w| w == ["dev", "w0"])));
    }

    #[test]
    fn hostfile_has_open_mpi_form() {
        let text = hostfile(
            &[
                (Ipv4Addr::new(10, 213, 0, 1), 1.0),
                (Ipv4Addr::new(10, 213, 0, 2), 0.25),
                (Ipv4Addr::new(10, 213, 1, 1), 1.5),
            ],
            Some(7700),
        );
        assert_eq!(
            text,
            "10.213.0.1 slots=1 port=7700\n10.213.0.2 slots=1 port=7700\n10.213.1.1 slots=2 port=7700\n"
        );
        assert_eq!(
            hostfile(&[(Ipv4Addr::new(10, 213, 0, 1), 2.0)], None),
            "10.213.0.1 slots=2\n"
        );
    }
}
