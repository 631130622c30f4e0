//! Global identifiers: a `u64` split into cluster (site), node (directory server) and counter bits.

use crate::error::DirError;
use std::fmt;

/// A global resource identifier. `Gid(0)` ([`Gid::NONE`]) never names a resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Gid(pub u64);

impl Gid {
    /// The null identifier: "no resource" (also "the server's own context" in requests).
    pub const NONE: Gid = Gid(0);
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// The administrative split of a [`Gid`]: `cluster_bits` high bits name the cluster (site),
/// the next `node_bits` name the directory server (node serial number), and the remaining
/// low bits are that server's registration counter. Default 16/16/32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidSplit {
    cluster_bits: u8,
    node_bits: u8,
}

impl Default for GidSplit {
    fn default() -> Self {
        GidSplit {
            cluster_bits: 16,
            node_bits: 16,
        }
    }
}

/// The three fields of a decoded [`Gid`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidParts {
    /// Cluster (site) id.
    pub cluster: u64,
    /// Node (directory server) serial number.
    pub node: u64,
    /// Per-server registration counter.
    pub counter: u64,
}

impl GidSplit {
    /// A split with `cluster_bits` and `node_bits`; the counter gets the remaining bits.
    /// Each field must have at least one bit and the counter at least 8.
    pub fn new(cluster_bits: u8, node_bits: u8) -> Result<Self, DirError> {
        if cluster_bits == 0 || node_bits == 0 || (cluster_bits as u32 + node_bits as u32) > 56 {
            return Err(DirError::BadConfig(format!(
                "gid split {cluster_bits}/{node_bits}: cluster and node need ≥1 bit each and together ≤56 bits (the counter needs ≥8)"
            )));
        }
        Ok(GidSplit {
            cluster_bits,
            node_bits,
        })
    }

    /// Bits of the cluster field.
    pub fn cluster_bits(&self) -> u8 {
        self.cluster_bits
    }

    /// Bits of the node field.
    pub fn node_bits(&self) -> u8 {
        self.node_bits
    }

    /// Bits of the counter field.
    pub fn counter_bits(&self) -> u8 {
        64 - self.cluster_bits - self.node_bits
    }

    fn mask(bits: u8) -> u64 {
        if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        }
    }

    /// Largest cluster id.
    pub fn max_cluster(&self) -> u64 {
        Self::mask(self.cluster_bits)
    }

    /// Largest node id.
    pub fn max_node(&self) -> u64 {
        Self::mask(self.node_bits)
    }

    /// Largest counter value.
    pub fn max_counter(&self) -> u64 {
        Self::mask(self.counter_bits())
    }

    /// Packs the three fields; fails when a field does not fit its bits.
    pub fn encode(&self, cluster: u64, node: u64, counter: u64) -> Result<Gid, DirError> {
        for (what, v, max) in [
            ("cluster", cluster, self.max_cluster()),
            ("node", node, self.max_node()),
            ("counter", counter, self.max_counter()),
        ] {
            if v > max {
                return Err(DirError::BadConfig(format!(
                    "gid {what} field {v} exceeds its maximum {max} under the {}/{}/{} split",
                    self.cluster_bits,
                    self.node_bits,
                    self.counter_bits()
                )));
            }
        }
        let cb = self.counter_bits();
        Ok(Gid((cluster << (cb + self.node_bits))
            | (node << cb)
            | counter))
    }

    /// Unpacks a gid into its three fields.
    pub fn decode(&self, gid: Gid) -> GidParts {
        let cb = self.counter_bits();
        GidParts {
            cluster: (gid.0 >> (cb + self.node_bits)) & self.max_cluster(),
            node: (gid.0 >> cb) & self.max_node(),
            counter: gid.0 & self.max_counter(),
        }
    }

    /// True when `gid` belongs to a cluster other than `my_cluster`.
    pub fn is_remote_cluster(&self, gid: Gid, my_cluster: u64) -> bool {
        self.decode(gid).cluster != my_cluster
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_default_and_custom_split() {
        let s = GidSplit::default();
        let g = s.encode(3, 7, 42).unwrap();
        assert_eq!(
            s.decode(g),
            GidParts {
                cluster: 3,
                node: 7,
                counter: 42
            }
        );
        assert!(s.is_remote_cluster(g, 4));
        assert!(!s.is_remote_cluster(g, 3));
        let s = GidSplit::new(4, 12).unwrap();
        assert_eq!(s.counter_bits(), 48);
        let g = s.encode(15, 4095, s.max_counter()).unwrap();
        assert_eq!(s.decode(g).cluster, 15);
        assert_eq!(s.decode(g).node, 4095);
        assert!(s.encode(16, 0, 0).is_err());
        assert!(GidSplit::new(0, 8).is_err());
        assert!(GidSplit::new(40, 20).is_err());
    }
}
