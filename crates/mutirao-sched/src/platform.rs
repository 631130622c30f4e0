//! A [`Platform`]: a model resolved for fast lookups (host index → speed, host pair → link).

use crate::net::Capacities;
use mutirao_model::{Host, LinkParams, Model, ModelError};
use std::collections::HashMap;

/// What is wrong with a platform.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum PlatformError {
    /// The model does not cover a host pair, or names an unknown host.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The model has no host.
    #[error("the model has no host; add at least one host")]
    NoHosts,
    /// A pair table does not have hosts² entries or points past the link list.
    #[error("platform pair table: {0}")]
    BadTable(String),
    /// The contention model needs a capacity the model does not give.
    #[error("{0}; contention needs the capacity of every host's NIC and of every link between two sites with hosts: re-run `mutirao calibrate` (it measures them), give a resource spec with `--resources NAME.meu` (nic_mbit, wan.A.B), or turn contention off with `--no-contention`")]
    NoCapacity(String),
    /// A host's speed is not a finite number > 0.
    #[error("host {name:?} has speed {speed}; speed must be a finite number > 0")]
    BadSpeed {
        /// Host name.
        name: String,
        /// Bad speed.
        speed: f64,
    },
}

/// Hosts and the HLogP parameters of every ordered host pair, resolved once.
///
/// All functions of message size return **seconds**. Link parameters may be negative
/// (the thesis's LAM overlap case) when a platform is built with [`Platform::from_parts`];
/// models loaded from files never are.
#[derive(Debug, Clone)]
pub struct Platform {
    hosts: Vec<Host>,
    links: Vec<LinkParams>,
    pair: Vec<u32>,
    by_name: HashMap<String, usize>,
    // For each host: the distinct link indices of its row (used for "max over destinations").
    row_links: Vec<Vec<u32>>,
    // For each link index: number of ordered pairs of distinct hosts using it.
    offdiag_count: Vec<usize>,
    // Link capacities for the contention model: complete, or what is missing.
    caps: Result<Capacities, String>,
    // The runtime's eager limit between hosts, if the model records it.
    eager_limit: Option<u64>,
    // Per host: seconds of its CPU per byte of a rendezvous message it pushes (0 = none).
    push: Vec<f64>,
}

impl Platform {
    /// Resolve a model: every ordered host pair (including a host with itself) must be covered.
    pub fn from_model(model: &Model) -> Result<Self, PlatformError> {
        model.validate()?;
        if model.hosts.is_empty() {
            return Err(PlatformError::NoHosts);
        }
        let n = model.hosts.len();
        let mut index_of_link: HashMap<*const mutirao_model::Link, u32> = HashMap::new();
        let mut links = Vec::new();
        let mut pair = Vec::with_capacity(n * n);
        for a in &model.hosts {
            for b in &model.hosts {
                let l = model.link_for(&a.name, &b.name)?;
                let id = *index_of_link.entry(l as *const _).or_insert_with(|| {
                    links.push(l.params());
                    (links.len() - 1) as u32
                });
                pair.push(id);
            }
        }
        let mut p = Self::from_parts(model.hosts.clone(), links, pair)?;
        p.caps = resolve_capacities(model);
        p.eager_limit = model.eager_limit_bytes;
        p.push = model
            .hosts
            .iter()
            .map(|h| model.push_us_per_byte(&h.name) * 1e-6)
            .collect();
        Ok(p)
    }

    /// The link capacities (bytes per second) the contention model needs, or an error naming
    /// the first NIC or site link the model gives no capacity for.
    pub fn capacities(&self) -> Result<&Capacities, PlatformError> {
        self.caps
            .as_ref()
            .map_err(|what| PlatformError::NoCapacity(what.clone()))
    }

    /// Replace the capacities (e.g. infinite ones in tests, or ones from elsewhere).
    pub fn set_capacities(&mut self, caps: Capacities) -> Result<(), PlatformError> {
        let n = self.hosts.len();
        if caps.nic_out.len() != n
            || caps.nic_in.len() != n
            || caps.site_of.len() != n
            || caps.site_link.len() != caps.sites * caps.sites
            || caps.site_of.iter().any(|&s| s >= caps.sites)
        {
            return Err(PlatformError::BadTable(format!(
                "capacities for {} hosts and {} sites do not fit a platform of {n} hosts",
                caps.nic_out.len(),
                caps.sites
            )));
        }
        self.caps = Ok(caps);
        Ok(())
    }

    /// Build a platform from hosts, a list of link parameter sets and a row-major
    /// `hosts × hosts` table of indices into `links` (`pair[src * n + dst]`).
    pub fn from_parts(
        hosts: Vec<Host>,
        links: Vec<LinkParams>,
        pair: Vec<u32>,
    ) -> Result<Self, PlatformError> {
        let n = hosts.len();
        if n == 0 {
            return Err(PlatformError::NoHosts);
        }
        if pair.len() != n * n {
            return Err(PlatformError::BadTable(format!(
                "{} entries for {n} hosts; expected {}",
                pair.len(),
                n * n
            )));
        }
        if let Some(&bad) = pair.iter().find(|&&i| i as usize >= links.len()) {
            return Err(PlatformError::BadTable(format!(
                "link index {bad} but only {} links",
                links.len()
            )));
        }
        let mut by_name = HashMap::with_capacity(n);
        for (i, h) in hosts.iter().enumerate() {
            if !(h.speed.is_finite() && h.speed > 0.0) {
                return Err(PlatformError::BadSpeed {
                    name: h.name.clone(),
                    speed: h.speed,
                });
            }
            if by_name.insert(h.name.clone(), i).is_some() {
                return Err(ModelError::DuplicateHost(h.name.clone()).into());
            }
        }
        let mut row_links = Vec::with_capacity(n);
        let mut offdiag_count = vec![0usize; links.len()];
        for a in 0..n {
            let mut row: Vec<u32> = pair[a * n..(a + 1) * n].to_vec();
            for (b, &l) in row.iter().enumerate() {
                if a != b {
                    offdiag_count[l as usize] += 1;
                }
            }
            row.sort_unstable();
            row.dedup();
            row_links.push(row);
        }
        Ok(Platform {
            hosts,
            links,
            pair,
            by_name,
            row_links,
            offdiag_count,
            caps: Err("the platform was built without capacities".to_string()),
            eager_limit: None,
            push: vec![0.0; n],
        })
    }

    /// Whether a message of `bytes` between two different hosts goes by rendezvous: its
    /// transfer waits for the receiver to post its receive. Only when the model records the
    /// runtime's eager limit (`eager_limit_bytes`); otherwise every message leaves at once.
    pub fn rendezvous(&self, bytes: u64, src: usize, dst: usize) -> bool {
        src != dst && self.eager_limit.is_some_and(|e| bytes > e)
    }

    /// Seconds host `src` spends pushing a rendezvous message of `bytes` after its send call
    /// ([`mutirao_model::Model::push_cost`]); 0 for an eager message, within a host, or when
    /// the model gives no push cost.
    pub fn push_s(&self, bytes: u64, src: usize, dst: usize) -> f64 {
        if self.rendezvous(bytes, src, dst) {
            self.push.get(src).map_or(0.0, |p| p * bytes as f64)
        } else {
            0.0
        }
    }

    /// The largest [`Platform::push_s`] of a message of `bytes` from `src` to any other host.
    pub fn max_push_s(&self, bytes: u64, src: usize) -> f64 {
        if self.len() > 1 && self.eager_limit.is_some_and(|e| bytes > e) {
            self.push.get(src).map_or(0.0, |p| p * bytes as f64)
        } else {
            0.0
        }
    }

    /// Set host `host`'s push cost in seconds per byte (tests; models give it in µs per byte).
    pub fn set_push(&mut self, host: usize, s_per_byte: f64) {
        if let Some(p) = self.push.get_mut(host) {
            *p = if s_per_byte.is_finite() {
                s_per_byte.max(0.0)
            } else {
                0.0
            };
        }
    }

    /// Set the eager limit (bytes) above which messages between hosts go by rendezvous.
    pub fn set_eager_limit(&mut self, bytes: Option<u64>) {
        self.eager_limit = bytes;
    }

    /// Number of hosts.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Always false: a platform has at least one host.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The hosts, by index.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Index of the host named `name`.
    pub fn host_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// Relative speed of host `h`.
    pub fn speed(&self, h: usize) -> f64 {
        self.hosts[h].speed
    }

    /// Seconds host `h` needs for `work`.
    pub fn exec_s(&self, work: f64, h: usize) -> f64 {
        work / self.hosts[h].speed
    }

    /// The link parameters that apply to `src -> dst`.
    pub fn link(&self, src: usize, dst: usize) -> &LinkParams {
        &self.links[self.pair[src * self.hosts.len() + dst] as usize]
    }

    /// Send overhead in seconds.
    pub fn os_s(&self, bytes: u64, src: usize, dst: usize) -> f64 {
        self.link(src, dst).os.value(bytes) * 1e-6
    }

    /// Receive overhead in seconds.
    pub fn or_s(&self, bytes: u64, src: usize, dst: usize) -> f64 {
        self.link(src, dst).or.value(bytes) * 1e-6
    }

    /// Latency in seconds.
    pub fn l_s(&self, bytes: u64, src: usize, dst: usize) -> f64 {
        self.link(src, dst).l.value(bytes) * 1e-6
    }

    /// One-way time `Os + L + Or` in seconds.
    pub fn one_way_s(&self, bytes: u64, src: usize, dst: usize) -> f64 {
        self.link(src, dst).one_way_s(bytes)
    }

    /// The largest send overhead host `src` may pay for a message of `bytes` bytes, over every
    /// destination (including itself), in seconds.
    pub fn max_os_s(&self, bytes: u64, src: usize) -> f64 {
        self.row_links[src]
            .iter()
            .map(|&l| self.links[l as usize].os.value(bytes) * 1e-6)
            .fold(f64::NEG_INFINITY, f64::max)
    }

    /// Mean one-way time `Os + L + Or` over all ordered pairs of distinct hosts, in seconds
    /// (0 with a single host): HEFT's average communication cost.
    pub fn mean_one_way_s(&self, bytes: u64) -> f64 {
        let n = self.hosts.len();
        if n < 2 {
            return 0.0;
        }
        let total: f64 = self
            .offdiag_count
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(l, &c)| c as f64 * self.links[l].one_way_s(bytes))
            .sum();
        total / (n * (n - 1)) as f64
    }

    /// Mean of `work / speed` over the hosts.
    pub fn mean_exec_s(&self, work: f64) -> f64 {
        work * self.mean_inv_speed()
    }

    /// Mean of `1 / speed` over the hosts.
    pub fn mean_inv_speed(&self) -> f64 {
        self.hosts.iter().map(|h| 1.0 / h.speed).sum::<f64>() / self.hosts.len() as f64
    }

    /// The largest host speed.
    pub fn max_speed(&self) -> f64 {
        self.hosts.iter().map(|h| h.speed).fold(0.0, f64::max)
    }
}

/// Bytes per second of `mbit` Mbit/s.
fn bps(mbit: f64) -> f64 {
    mbit * 1e6 / 8.0
}

fn resolve_capacities(model: &Model) -> Result<Capacities, String> {
    let mut sites: Vec<&str> = Vec::new();
    let mut site_of = Vec::with_capacity(model.hosts.len());
    for h in &model.hosts {
        let i = match sites.iter().position(|s| *s == h.site) {
            Some(i) => i,
            None => {
                sites.push(&h.site);
                sites.len() - 1
            }
        };
        site_of.push(i);
    }
    let mut nic_out = Vec::with_capacity(model.hosts.len());
    let mut nic_in = Vec::with_capacity(model.hosts.len());
    for h in &model.hosts {
        let n = model.nic_capacity(&h.name).ok_or_else(|| {
            format!(
                "the model gives no capacity for the NIC of host {:?}",
                h.name
            )
        })?;
        nic_out.push(bps(n.out_mbit));
        nic_in.push(bps(n.in_mbit));
    }
    let ns = sites.len();
    let mut site_link = vec![None; ns * ns];
    for a in 0..ns {
        for b in 0..ns {
            if a != b {
                let mbit = model.site_link_mbit(sites[a], sites[b]).ok_or_else(|| {
                    format!(
                        "the model gives no capacity for the site link {:?} -> {:?}",
                        sites[a], sites[b]
                    )
                })?;
                site_link[a * ns + b] = Some(bps(mbit));
            }
        }
    }
    Ok(Capacities {
        nic_out,
        nic_in,
        site_of,
        sites: ns,
        site_link,
    })
}
