//! The `mutirao-model/1` format: what `mutirao fit` produces and `predict`, `schedule` and
//! `simulate` consume.
//!
//! A model names every host with its site and relative `speed` (a task of `work` seconds on a
//! speed-1.0 host takes `work / speed` seconds here) and gives, per link class, three piecewise
//! linear functions of the message size in bytes (HLogP's `Os`, `Or` and `L`, in microseconds).
//!
//! ```
//! use mutirao_model::{Model, Piecewise};
//! let json = r#"{
//!   "format": "mutirao-model/1",
//!   "hosts": [{"name": "a1", "site": "a", "speed": 1.0},
//!             {"name": "b1", "site": "b", "speed": 0.5}],
//!   "links": [{"class": "inter-site", "sites": ["a", "b"],
//!              "os": [{"from": 0, "base_us": 10.0, "per_byte_us": 0.001}],
//!              "or": [{"from": 0, "base_us": 12.0, "per_byte_us": 0.001}],
//!              "l":  [{"from": 0, "base_us": 50.0, "per_byte_us": 0.2}]}]
//! }"#;
//! let model = Model::from_json(json).unwrap();
//! let p = model.link_params("a1", "b1").unwrap();
//! assert_eq!(p.l.value(1000), 50.0 + 0.2 * 1000.0);
//! ```
//!
//! This crate is pure: no I/O beyond parsing strings the caller read.

pub mod calib;
pub mod capacity;
pub mod compare;
pub mod fit;
pub mod hcap;
pub mod legacy;
pub mod presets;
pub mod strategy;

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The format tag every model file carries.
pub const MODEL_FORMAT: &str = "mutirao-model/1";

/// Errors in a model: always say what and where.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ModelError {
    #[error("model is not valid JSON: {0}")]
    Json(String),
    #[error("model format is {found:?}, expected {MODEL_FORMAT:?}")]
    Format { found: String },
    #[error("host {0:?} is listed twice; host names must be unique")]
    DuplicateHost(String),
    #[error("host {name:?} has speed {speed}; speed must be a finite number > 0")]
    BadSpeed { name: String, speed: f64 },
    #[error("links[{index}]: {msg}")]
    BadLink { index: usize, msg: String },
    #[error("capacity: {0}")]
    BadCapacity(String),
    /// A push cost entry is invalid.
    #[error("{0}")]
    BadPushCost(String),
    #[error("unknown host {0:?}: it is not in the model's host list")]
    UnknownHost(String),
    #[error("no link class in the model covers {src:?} -> {dst:?} ({class}); add a {class:?} link (or a pair link) to the model")]
    MissingClass {
        src: String,
        dst: String,
        class: &'static str,
    },
}

/// One segment of a piecewise linear function: valid from `from` bytes up to the next segment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub from: u64,
    pub base_us: f64,
    pub per_byte_us: f64,
}

/// A piecewise linear function of the message size: value(m) = base_us + per_byte_us·(m − from)
/// on the last segment with from ≤ m. Segments are sorted by `from`; the first starts at 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Piecewise(pub Vec<Segment>);

impl Piecewise {
    /// A single linear segment from 0.
    pub fn linear(base_us: f64, per_byte_us: f64) -> Self {
        Piecewise(vec![Segment {
            from: 0,
            base_us,
            per_byte_us,
        }])
    }

    /// The constant zero function.
    pub fn zero() -> Self {
        Self::linear(0.0, 0.0)
    }

    /// Value in microseconds for a message of `bytes` bytes.
    pub fn value(&self, bytes: u64) -> f64 {
        let segs = &self.0;
        // Last segment with from <= bytes (segments are sorted; validated on load).
        let idx = segs.partition_point(|s| s.from <= bytes);
        match idx.checked_sub(1).and_then(|i| segs.get(i)) {
            Some(s) => s.base_us + s.per_byte_us * (bytes - s.from) as f64,
            None => 0.0,
        }
    }

    /// Value in seconds.
    pub fn value_s(&self, bytes: u64) -> f64 {
        self.value(bytes) * 1e-6
    }

    fn validate(&self) -> Result<(), String> {
        if self.0.is_empty() {
            return Err("has no segments".into());
        }
        if self.0[0].from != 0 {
            return Err(format!(
                "first segment starts at {} bytes; it must start at 0",
                self.0[0].from
            ));
        }
        for (i, s) in self.0.iter().enumerate() {
            if !s.base_us.is_finite() || !s.per_byte_us.is_finite() {
                return Err(format!("segment {i} has a non-finite coefficient"));
            }
            if s.base_us < 0.0 || s.per_byte_us < 0.0 {
                return Err(format!(
                    "segment {i} has a negative coefficient (base_us {}, per_byte_us {})",
                    s.base_us, s.per_byte_us
                ));
            }
            if i > 0 && self.0[i - 1].from >= s.from {
                return Err(format!(
                    "segments are not strictly increasing in `from` at segment {i}"
                ));
            }
        }
        Ok(())
    }
}

/// A host of the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    pub name: String,
    pub site: String,
    /// Relative speed: a task of `work` seconds on a speed-1.0 host takes `work / speed` here.
    pub speed: f64,
    /// The address the host was calibrated at (its agent's, or its hostfile entry), when it
    /// differs from `name`: lets `schedule` write hostfiles and `exec-dag` find the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
}

/// Which pairs of hosts a link entry covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkClass {
    /// Two processes on the same host.
    SameHost,
    /// Two hosts of the same site (optionally restricted by `site`).
    IntraSite,
    /// Two hosts of different sites (optionally restricted by `sites`).
    InterSite,
    /// One ordered pair of hosts (`src`, `dst`): overrides every other class.
    Pair,
}

impl LinkClass {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkClass::SameHost => "same-host",
            LinkClass::IntraSite => "intra-site",
            LinkClass::InterSite => "inter-site",
            LinkClass::Pair => "pair",
        }
    }
}

/// HLogP parameters of a link: sender overhead, receiver overhead, latency (all in µs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkParams {
    pub os: Piecewise,
    pub or: Piecewise,
    pub l: Piecewise,
}

impl LinkParams {
    /// Total one-way time of a message of `bytes` bytes in seconds (Os + L + Or).
    pub fn one_way_s(&self, bytes: u64) -> f64 {
        (self.os.value(bytes) + self.l.value(bytes) + self.or.value(bytes)) * 1e-6
    }
}

/// One entry of `links`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub class: LinkClass,
    /// For `intra-site` (and optionally `same-host`): the site it applies to; absent = every site.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// For `inter-site`: the two sites it joins (either order); absent = every site pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sites: Option<[String; 2]>,
    /// For `pair`: source host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<String>,
    /// For `pair`: destination host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    pub os: Piecewise,
    pub or: Piecewise,
    pub l: Piecewise,
}

impl Link {
    pub fn params(&self) -> LinkParams {
        LinkParams {
            os: self.os.clone(),
            or: self.or.clone(),
            l: self.l.clone(),
        }
    }
}

/// Capacity of one host's network interface, in Mbit/s (10⁶ bit/s), per direction: the
/// messages a host sends at the same time share `out_mbit`; those it receives share `in_mbit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NicCapacity {
    pub host: String,
    pub out_mbit: f64,
    pub in_mbit: f64,
}

/// Capacity of the link from site `from` to site `to` (one direction), in Mbit/s: every
/// message between a host of `from` and a host of `to` at the same time shares it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteLinkCapacity {
    pub from: String,
    pub to: String,
    pub mbit: f64,
}

/// Link capacities for the contention model (optional in `mutirao-model/1`). Messages between
/// different hosts share the sender's NIC out, the receiver's NIC in and, across sites, the
/// directed site link, max–min fair. Messages within one host share nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// Where the figures come from: `calibrate` (concurrent streams measured),
    /// `resource-spec` (a mεμ spec's `nic_mbit` / `wan.A.B`), or free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<NicCapacity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub site_links: Vec<SiteLinkCapacity>,
}

/// A whole `mutirao-model/1` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Model {
    pub format: String,
    pub hosts: Vec<Host>,
    pub links: Vec<Link>,
    /// Link capacities for the contention model; absent in models without them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
    /// Set only by `fit --allow-poor-fit`: one line per emitted segment that misses a measured
    /// median it covers by more than 10% (class, size, measured, modelled).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub poor_fit: Vec<String>,
    /// The runtime's eager limit between hosts when it was calibrated (bytes): larger messages
    /// go by rendezvous, so their transfer starts only once the receiver has posted its
    /// receive. The contention simulator uses it; absent (older models), every message is
    /// taken to leave at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eager_limit_bytes: Option<u64>,
    /// Per host, the time its CPU spends pushing the bytes of a rendezvous message to another
    /// host after the send call returned (the runtime moves them while the program computes and
    /// tests its requests). `fit` derives it from the slope of the eager send overhead (the same
    /// copy and protocol work, done inside the call) times the host's wall/CPU ratio. The
    /// contention simulator charges it to the sender's CPU; absent, a rendezvous send costs its
    /// sender only `Os`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub push_cost: Vec<PushCost>,
}

/// Time a host spends per byte pushing a rendezvous message (see [`Model::push_cost`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PushCost {
    /// Host name.
    pub host: String,
    /// Microseconds of that host's time per byte (≥ 0).
    pub us_per_byte: f64,
}

impl Model {
    /// Build and validate a model.
    pub fn new(hosts: Vec<Host>, links: Vec<Link>) -> Result<Self, ModelError> {
        let m = Model {
            format: MODEL_FORMAT.to_string(),
            hosts,
            links,
            capacity: None,
            poor_fit: Vec::new(),
            eager_limit_bytes: None,
            push_cost: Vec::new(),
        };
        m.validate()?;
        Ok(m)
    }

    /// Parse and validate a model from JSON text.
    pub fn from_json(text: &str) -> Result<Self, ModelError> {
        let m: Model = serde_json::from_str(text).map_err(|e| ModelError::Json(e.to_string()))?;
        m.validate()?;
        Ok(m)
    }

    /// Pretty JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a model always serializes")
    }

    /// Check every invariant of the format.
    pub fn validate(&self) -> Result<(), ModelError> {
        if self.format != MODEL_FORMAT {
            return Err(ModelError::Format {
                found: self.format.clone(),
            });
        }
        let mut seen = HashMap::new();
        for h in &self.hosts {
            if seen.insert(h.name.as_str(), ()).is_some() {
                return Err(ModelError::DuplicateHost(h.name.clone()));
            }
            if !(h.speed.is_finite() && h.speed > 0.0) {
                return Err(ModelError::BadSpeed {
                    name: h.name.clone(),
                    speed: h.speed,
                });
            }
        }
        for (index, l) in self.links.iter().enumerate() {
            let bad = |msg: String| ModelError::BadLink { index, msg };
            for (name, f) in [("os", &l.os), ("or", &l.or), ("l", &l.l)] {
                f.validate().map_err(|e| bad(format!("{name} {e}")))?;
            }
            if l.class == LinkClass::Pair {
                for (what, h) in [("src", &l.src), ("dst", &l.dst)] {
                    match h {
                        None => return Err(bad(format!("a pair link needs `{what}`"))),
                        Some(h) if !seen.contains_key(h.as_str()) => {
                            return Err(bad(format!("{what} {h:?} is not a host of the model")))
                        }
                        _ => {}
                    }
                }
            }
        }
        if let Some(c) = &self.capacity {
            let ok = |v: f64| v.is_finite() && v > 0.0;
            let mut nic_seen = HashMap::new();
            for (i, n) in c.nics.iter().enumerate() {
                if !seen.contains_key(n.host.as_str()) {
                    return Err(ModelError::BadCapacity(format!(
                        "nics[{i}]: host {:?} is not a host of the model",
                        n.host
                    )));
                }
                if nic_seen.insert(n.host.as_str(), ()).is_some() {
                    return Err(ModelError::BadCapacity(format!(
                        "nics[{i}]: host {:?} is listed twice",
                        n.host
                    )));
                }
                if !ok(n.out_mbit) || !ok(n.in_mbit) {
                    return Err(ModelError::BadCapacity(format!(
                        "nics[{i}] (host {:?}): out_mbit {} and in_mbit {} must be finite numbers > 0",
                        n.host, n.out_mbit, n.in_mbit
                    )));
                }
            }
            let mut pair_seen = HashMap::new();
            for (i, l) in c.site_links.iter().enumerate() {
                if l.from == l.to {
                    return Err(ModelError::BadCapacity(format!(
                        "site_links[{i}]: from and to are both {:?}; a site link joins two sites",
                        l.from
                    )));
                }
                if pair_seen
                    .insert((l.from.as_str(), l.to.as_str()), ())
                    .is_some()
                {
                    return Err(ModelError::BadCapacity(format!(
                        "site_links[{i}]: {:?} -> {:?} is listed twice",
                        l.from, l.to
                    )));
                }
                if !ok(l.mbit) {
                    return Err(ModelError::BadCapacity(format!(
                        "site_links[{i}] ({:?} -> {:?}): mbit {} must be a finite number > 0",
                        l.from, l.to, l.mbit
                    )));
                }
            }
        }
        let mut pushed = HashMap::new();
        for (i, p) in self.push_cost.iter().enumerate() {
            if !seen.contains_key(p.host.as_str()) {
                return Err(ModelError::BadPushCost(format!(
                    "push_cost[{i}]: host {:?} is not in the model's host list",
                    p.host
                )));
            }
            if pushed.insert(p.host.as_str(), ()).is_some() {
                return Err(ModelError::BadPushCost(format!(
                    "push_cost[{i}]: host {:?} is listed twice",
                    p.host
                )));
            }
            if !(p.us_per_byte.is_finite() && p.us_per_byte >= 0.0) {
                return Err(ModelError::BadPushCost(format!(
                    "push_cost[{i}] ({:?}): us_per_byte {} must be a finite number >= 0",
                    p.host, p.us_per_byte
                )));
            }
        }
        Ok(())
    }

    /// Push cost of `host` in µs per byte (0 when the model has none for it).
    pub fn push_us_per_byte(&self, host: &str) -> f64 {
        self.push_cost
            .iter()
            .find(|p| p.host == host)
            .map_or(0.0, |p| p.us_per_byte)
    }

    /// NIC capacity of `host`, if the model has one.
    pub fn nic_capacity(&self, host: &str) -> Option<&NicCapacity> {
        self.capacity.as_ref()?.nics.iter().find(|n| n.host == host)
    }

    /// Capacity of the directed site link `from -> to` in Mbit/s, if the model has one.
    pub fn site_link_mbit(&self, from: &str, to: &str) -> Option<f64> {
        self.capacity
            .as_ref()?
            .site_links
            .iter()
            .find(|l| l.from == from && l.to == to)
            .map(|l| l.mbit)
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> Result<&Host, ModelError> {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .ok_or_else(|| ModelError::UnknownHost(name.to_string()))
    }

    /// The class a message from `src` to `dst` belongs to (before pair overrides).
    pub fn class_of(&self, src: &Host, dst: &Host) -> LinkClass {
        if src.name == dst.name {
            LinkClass::SameHost
        } else if src.site == dst.site {
            LinkClass::IntraSite
        } else {
            LinkClass::InterSite
        }
    }

    /// The link entry that applies to `src -> dst`: narrower classes override wider ones
    /// (pair > site-restricted class > unrestricted class).
    pub fn link_for(&self, src: &str, dst: &str) -> Result<&Link, ModelError> {
        let s = self.host(src)?;
        let d = self.host(dst)?;
        if let Some(l) = self.links.iter().find(|l| {
            l.class == LinkClass::Pair
                && l.src.as_deref() == Some(src)
                && l.dst.as_deref() == Some(dst)
        }) {
            return Ok(l);
        }
        let class = self.class_of(s, d);
        let mut best: Option<(u8, &Link)> = None;
        for l in self.links.iter().filter(|l| l.class == class) {
            let rank = match class {
                LinkClass::SameHost | LinkClass::IntraSite => match &l.site {
                    Some(site) if *site == s.site => 2,
                    Some(_) => continue,
                    None => 1,
                },
                LinkClass::InterSite => match &l.sites {
                    Some([a, b])
                        if (*a == s.site && *b == d.site) || (*a == d.site && *b == s.site) =>
                    {
                        2
                    }
                    Some(_) => continue,
                    None => 1,
                },
                LinkClass::Pair => unreachable!("pair handled above"),
            };
            if best.is_none_or(|(r, _)| rank > r) {
                best = Some((rank, l));
            }
        }
        best.map(|(_, l)| l).ok_or(ModelError::MissingClass {
            src: src.to_string(),
            dst: dst.to_string(),
            class: class.as_str(),
        })
    }

    /// The parameters that apply to `src -> dst`.
    pub fn link_params(&self, src: &str, dst: &str) -> Result<LinkParams, ModelError> {
        self.link_for(src, dst).map(Link::params)
    }

    /// Check that every ordered pair of hosts (including same-host) is covered by some link.
    pub fn check_complete(&self) -> Result<(), ModelError> {
        for a in &self.hosts {
            for b in &self.hosts {
                self.link_for(&a.name, &b.name)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(n: &str, s: &str, speed: f64) -> Host {
        Host {
            name: n.into(),
            site: s.into(),
            speed,
            addr: None,
        }
    }

    fn link(class: LinkClass, l: f64) -> Link {
        Link {
            class,
            site: None,
            sites: None,
            src: None,
            dst: None,
            os: Piecewise::zero(),
            or: Piecewise::zero(),
            l: Piecewise::linear(l, 0.0),
        }
    }

    #[test]
    fn piecewise_picks_last_segment_at_or_below() {
        let f = Piecewise(vec![
            Segment {
                from: 0,
                base_us: 1.0,
                per_byte_us: 0.1,
            },
            Segment {
                from: 100,
                base_us: 50.0,
                per_byte_us: 0.01,
            },
        ]);
        assert_eq!(f.value(0), 1.0);
        assert!((f.value(99) - 10.9).abs() < 1e-9);
        assert_eq!(f.value(100), 50.0);
        assert!((f.value(200) - 51.0).abs() < 1e-9);
    }

    #[test]
    fn narrower_classes_override_wider() {
        let hosts = vec![
            host("a1", "a", 1.0),
            host("a2", "a", 1.0),
            host("b1", "b", 2.0),
        ];
        let mut site_a = link(LinkClass::IntraSite, 7.0);
        site_a.site = Some("a".into());
        let mut pair = link(LinkClass::Pair, 99.0);
        pair.src = Some("a2".into());
        pair.dst = Some("a1".into());
        let m = Model::new(
            hosts,
            vec![
                site_a,
                link(LinkClass::IntraSite, 5.0),
                link(LinkClass::InterSite, 30.0),
                link(LinkClass::SameHost, 1.0),
                pair,
            ],
        )
        .unwrap();
        assert_eq!(m.link_params("a1", "a2").unwrap().l.value(0), 7.0);
        assert_eq!(m.link_params("a2", "a1").unwrap().l.value(0), 99.0);
        assert_eq!(m.link_params("a1", "b1").unwrap().l.value(0), 30.0);
        assert_eq!(m.link_params("b1", "b1").unwrap().l.value(0), 1.0);
        m.check_complete().unwrap();
    }

    #[test]
    fn missing_class_and_unknown_host_are_named() {
        let m = Model::new(vec![host("a1", "a", 1.0), host("b1", "b", 1.0)], vec![]).unwrap();
        let e = m.link_params("a1", "b1").unwrap_err();
        assert!(e.to_string().contains("inter-site"), "{e}");
        let e = m.link_params("a1", "zz").unwrap_err();
        assert_eq!(e, ModelError::UnknownHost("zz".into()));
    }

    #[test]
    fn bad_documents_are_rejected_with_place() {
        let e = Model::from_json(r#"{"format":"x","hosts":[],"links":[]}"#).unwrap_err();
        assert!(matches!(e, ModelError::Format { .. }));
        let e = Model::from_json(
            r#"{"format":"mutirao-model/1","hosts":[{"name":"a","site":"s","speed":0}],"links":[]}"#,
        )
        .unwrap_err();
        assert!(matches!(e, ModelError::BadSpeed { .. }));
        let e = Model::from_json(
            r#"{"format":"mutirao-model/1","hosts":[],"links":[{"class":"same-host","os":[{"from":5,"base_us":0,"per_byte_us":0}],"or":[],"l":[]}]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("links[0]: os"), "{e}");
    }

    #[test]
    fn capacities_round_trip_and_bad_ones_are_named() {
        let text = r#"{"format":"mutirao-model/1",
          "hosts":[{"name":"a1","site":"a","speed":1},{"name":"b1","site":"b","speed":1}],
          "links":[],
          "capacity":{"source":"calibrate",
            "nics":[{"host":"a1","out_mbit":800,"in_mbit":790}],
            "site_links":[{"from":"a","to":"b","mbit":40}]}}"#;
        let m = Model::from_json(text).unwrap();
        assert_eq!(m.nic_capacity("a1").unwrap().in_mbit, 790.0);
        assert!(m.nic_capacity("b1").is_none());
        assert_eq!(m.site_link_mbit("a", "b"), Some(40.0));
        assert_eq!(m.site_link_mbit("b", "a"), None);
        assert_eq!(Model::from_json(&m.to_json()).unwrap(), m);
        let bad = text.replace(r#""host":"a1""#, r#""host":"zz""#);
        let e = Model::from_json(&bad).unwrap_err().to_string();
        assert!(e.contains("nics[0]") && e.contains("zz"), "{e}");
        let bad = text.replace(r#""mbit":40"#, r#""mbit":0"#);
        let e = Model::from_json(&bad).unwrap_err().to_string();
        assert!(e.contains("site_links[0]"), "{e}");
    }

    #[test]
    fn json_round_trip() {
        let m = Model::new(
            vec![host("a1", "a", 1.0)],
            vec![link(LinkClass::SameHost, 1.0)],
        )
        .unwrap();
        let back = Model::from_json(&m.to_json()).unwrap();
        assert_eq!(m, back);
    }
}
