//! [`Replicated`]: a [`BlobStore`] keeping k copies of every blob on named peers (agents), none of
//! them on the host that produced the blob.
//!
//! Every replica is wrapped in an envelope (`MRPL`, format version, SHA-256 of the data, data), so a
//! read can tell a corrupt replica from a good one: a corrupt or missing replica is reported (in
//! the returned [`ReadReport`] and by `tracing::warn!`) and the read falls back to the next
//! replica; bad data is never returned.

use crate::{BlobStore, StoreError};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

const MAGIC: &[u8; 4] = b"MRPL";
const VERSION: u8 = 1;
const ENVELOPE: usize = 4 + 1 + 32;

/// Which host produced a key's blob (its replicas go elsewhere); `None` = no host to avoid.
pub type ProducerOf = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// One peer's store, named by its host.
pub type Peer = (String, Arc<dyn BlobStore>);

/// Wraps `data` in a replica envelope.
pub fn seal(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENVELOPE + data.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&Sha256::digest(data));
    out.extend_from_slice(data);
    out
}

/// Checks a replica envelope and returns its data, or what is wrong with it.
pub fn open(replica: &[u8]) -> Result<&[u8], String> {
    if replica.len() < ENVELOPE {
        return Err(format!(
            "truncated: {} bytes, shorter than the {ENVELOPE}-byte replica header",
            replica.len()
        ));
    }
    if &replica[..4] != MAGIC {
        return Err("not a replica (bad magic)".into());
    }
    if replica[4] != VERSION {
        return Err(format!(
            "replica format version {} (this build reads {VERSION})",
            replica[4]
        ));
    }
    let data = &replica[ENVELOPE..];
    if Sha256::digest(data).as_slice() != &replica[5..ENVELOPE] {
        return Err("checksum mismatch: the replica is corrupt or truncated".into());
    }
    Ok(data)
}

/// What a read found wrong on the way (the data returned, if any, is from a good replica).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReadReport {
    /// The host whose replica was returned.
    pub served_by: Option<String>,
    /// Hosts expected to hold a replica that did not have it.
    pub missing: Vec<String>,
    /// Hosts whose replica failed its check, with what was wrong.
    pub corrupt: Vec<(String, String)>,
    /// Hosts that could not be asked, with the error.
    pub unreachable: Vec<(String, String)>,
}

impl ReadReport {
    /// Nothing was wrong.
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.corrupt.is_empty() && self.unreachable.is_empty()
    }
}

/// k replicas of every blob over a list of peers.
pub struct Replicated {
    peers: Vec<Peer>,
    k: usize,
    /// Fewest replicas a write may end with once every eligible peer was tried (≤ k).
    min_k: usize,
    producer_of: ProducerOf,
    health: Health,
}

/// What the peers did lately, so that a dead agent is reported once when it stops answering
/// (and once when it answers again), not on every operation, and is tried after the others.
#[derive(Default)]
struct Health {
    down: Mutex<BTreeSet<String>>,
    /// The peers that were down when a write last ended with fewer than k replicas (said once
    /// per such set).
    degraded_for: Mutex<Option<BTreeSet<String>>>,
}

/// FNV-1a: a stable spread of keys over peers (not a security measure).
fn spread(key: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as usize
}

impl Replicated {
    /// `k` replicas (k ≥ 1) over `peers` (distinct host names). Until
    /// [`Replicated::with_producer`] says otherwise, no host is avoided.
    pub fn new(peers: Vec<Peer>, k: usize) -> Result<Replicated, StoreError> {
        let bad = |detail: String| StoreError::Replicas {
            op: "configure",
            key: String::new(),
            detail,
        };
        if k == 0 {
            return Err(bad(
                "k = 0 replicas: ask for at least 1 (2 or more to survive a host)".into(),
            ));
        }
        let mut names: Vec<&str> = peers.iter().map(|(h, _)| h.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!("host {:?} listed twice among the peers", w[0])));
        }
        Ok(Replicated {
            peers,
            k,
            min_k: k,
            producer_of: Arc::new(|_| None),
            health: Health::default(),
        })
    }

    /// Lets a write succeed with fewer than k replicas, but at least `min` (1 ≤ min ≤ k), when
    /// every eligible peer has been tried: after hosts are lost a job keeps checkpointing on
    /// those left instead of running unprotected. Such a write is logged as degraded.
    pub fn with_min_replicas(mut self, min: usize) -> Replicated {
        self.min_k = min.clamp(1, self.k);
        self
    }

    /// Tells which host produced each key's blob; its replicas are placed on other hosts.
    pub fn with_producer(mut self, producer_of: ProducerOf) -> Replicated {
        self.producer_of = producer_of;
        self
    }

    /// A peer failed: the first failure after it last answered is logged.
    fn peer_failed(&self, host: &str, op: &str, key: &str, e: &StoreError) {
        let newly = self
            .health
            .down
            .lock()
            .map(|mut d| d.insert(host.to_string()))
            .unwrap_or(true);
        if newly {
            tracing::warn!(
                host = %host, op, key, error = %e,
                "checkpoint peer failed; it is tried after the others and not reported again until it answers"
            );
        }
    }

    /// A peer answered: if it had failed before, that is logged.
    fn peer_answered(&self, host: &str) {
        let back = self
            .health
            .down
            .lock()
            .map(|mut d| d.remove(host))
            .unwrap_or(false);
        if back {
            tracing::warn!(host = %host, "checkpoint peer answers again");
        }
    }

    /// `order` with the peers that failed last moved to the end (stable otherwise).
    fn up_first<'a>(&self, order: Vec<&'a Peer>) -> Vec<&'a Peer> {
        let Ok(down) = self.health.down.lock() else {
            return order;
        };
        if down.is_empty() {
            return order;
        }
        let (up, dn): (Vec<&Peer>, Vec<&Peer>) =
            order.into_iter().partition(|(h, _)| !down.contains(h));
        up.into_iter().chain(dn).collect()
    }

    /// The peers eligible for `key` in placement order (the producer's host left out): the first
    /// k are where a write goes first, the rest are fallbacks.
    pub fn placement(&self, key: &str, producer: Option<&str>) -> Vec<&Peer> {
        let eligible: Vec<&Peer> = self
            .peers
            .iter()
            .filter(|(h, _)| Some(h.as_str()) != producer)
            .collect();
        if eligible.is_empty() {
            return eligible;
        }
        let start = spread(key) % eligible.len();
        eligible[start..]
            .iter()
            .chain(eligible[..start].iter())
            .copied()
            .collect()
    }

    /// Writes k replicas of `bytes` on hosts other than `producer`, concurrently; returns the
    /// hosts written. A failing host is replaced by the next eligible one; fewer than k successes is an error
    /// naming every host that failed.
    pub fn put_from(
        &self,
        producer: Option<&str>,
        key: &str,
        bytes: &[u8],
    ) -> Result<Vec<String>, StoreError> {
        crate::check_key(key)?;
        let order = self.up_first(self.placement(key, producer));
        let sealed = seal(bytes);
        let mut written = Vec::new();
        let mut failed = Vec::new();
        let mut next = order.into_iter();
        // Write the missing replicas concurrently; replace failed peers by the next eligible ones.
        while written.len() < self.k {
            let batch: Vec<&Peer> = next.by_ref().take(self.k - written.len()).collect();
            if batch.is_empty() {
                break;
            }
            let results: Vec<(&String, Result<(), StoreError>)> = std::thread::scope(|sc| {
                let handles: Vec<_> = batch
                    .iter()
                    .map(|(host, store)| {
                        let sealed = &sealed;
                        (host, sc.spawn(move || store.put(key, sealed)))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|(host, h)| {
                        let r = h.join().unwrap_or_else(|_| {
                            Err(StoreError::Replicas {
                                op: "put",
                                key: key.to_string(),
                                detail: format!("the writer thread for {host} panicked"),
                            })
                        });
                        (host, r)
                    })
                    .collect()
            });
            for (host, r) in results {
                match r {
                    Ok(()) => {
                        self.peer_answered(host);
                        written.push(host.clone())
                    }
                    Err(e) => {
                        self.peer_failed(host, "put", key, &e);
                        failed.push(format!("{host}: {e}"));
                    }
                }
            }
        }
        if written.len() < self.k && written.len() >= self.min_k {
            let down = self
                .health
                .down
                .lock()
                .map(|d| d.clone())
                .unwrap_or_default();
            let said = self
                .health
                .degraded_for
                .lock()
                .map(|mut d| d.replace(down.clone()) == Some(down))
                .unwrap_or(false);
            if !said {
                tracing::warn!(
                    key,
                    written = written.len(),
                    wanted = self.k,
                    failed = %failed.join("; "),
                    "checkpoints kept with fewer replicas than asked: every eligible host was tried"
                );
            }
            return Ok(written);
        }
        if written.len() < self.k {
            let avoid = producer
                .map(|p| format!(" (producer host {p} excluded)"))
                .unwrap_or_default();
            return Err(StoreError::Replicas {
                op: "put",
                key: key.to_string(),
                detail: format!(
                    "only {} of {} replicas written{avoid}: written on [{}]; failed: [{}]; \
                     add peers or bring the failed agents back",
                    written.len(),
                    self.k,
                    written.join(", "),
                    failed.join("; ")
                ),
            });
        }
        Ok(written)
    }

    /// Reads `key`, falling back across replicas; `Ok((None, report))` when no peer has it.
    /// A replica that is corrupt, missing where expected, or unreachable is in the report (and
    /// logged); if replicas exist but none is good, the read fails naming them.
    pub fn get_with_report(&self, key: &str) -> Result<(Option<Vec<u8>>, ReadReport), StoreError> {
        crate::check_key(key)?;
        let producer = (self.producer_of)(key);
        let order = self.up_first(self.placement(key, producer.as_deref()));
        let mut report = ReadReport::default();
        for (i, (host, store)) in order.into_iter().enumerate() {
            match store.get(key) {
                Ok(Some(replica)) => match open(&replica).inspect(|_| self.peer_answered(host)) {
                    Ok(data) => {
                        report.served_by = Some(host.clone());
                        if !report.missing.is_empty() {
                            // Only now is a missing replica news: the blob exists.
                            tracing::info!(key, missing = ?report.missing, served_by = %host, "replicas missing (the blob was read from another)");
                        }
                        return Ok((Some(data.to_vec()), report));
                    }
                    Err(why) => {
                        tracing::warn!(host = %host, key, problem = %why, "corrupt replica ignored");
                        report.corrupt.push((host.clone(), why));
                    }
                },
                Ok(None) => {
                    self.peer_answered(host);
                    if i < self.k {
                        report.missing.push(host.clone());
                    }
                }
                Err(e) => {
                    self.peer_failed(host, "get", key, &e);
                    report.unreachable.push((host.clone(), e.to_string()));
                }
            }
        }
        if report.corrupt.is_empty() && report.unreachable.is_empty() {
            return Ok((None, report));
        }
        let mut parts: Vec<String> = report
            .corrupt
            .iter()
            .map(|(h, w)| format!("{h}: corrupt ({w})"))
            .collect();
        parts.extend(
            report
                .unreachable
                .iter()
                .map(|(h, w)| format!("{h}: unreachable ({w})")),
        );
        parts.extend(report.missing.iter().map(|h| format!("{h}: missing")));
        Err(StoreError::Replicas {
            op: "get",
            key: key.to_string(),
            detail: format!("no good replica: {}", parts.join("; ")),
        })
    }
}

impl BlobStore for Replicated {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let producer = (self.producer_of)(key);
        self.put_from(producer.as_deref(), key, bytes).map(|_| ())
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.get_with_report(key).map(|(d, _)| d)
    }

    /// Deletes the key on every peer; fails naming the peers that could not delete it (after
    /// trying all of them). A peer already known to be down is not asked (its failure was
    /// reported when it stopped answering; what it holds stays there).
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        crate::check_key(key)?;
        let down = self
            .health
            .down
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default();
        let failed: Vec<String> = self
            .peers
            .iter()
            .filter(|(h, _)| !down.contains(h))
            .filter_map(|(h, s)| match s.delete(key) {
                Ok(()) => {
                    self.peer_answered(h);
                    None
                }
                Err(e) => {
                    self.peer_failed(h, "delete", key, &e);
                    Some(format!("{h}: {e}"))
                }
            })
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(StoreError::Replicas {
                op: "delete",
                key: key.to_string(),
                detail: format!("not deleted on [{}]", failed.join("; ")),
            })
        }
    }

    /// The union of the peers' keys. Unreachable peers are logged and skipped; if none answers
    /// the list fails.
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut all = std::collections::BTreeSet::new();
        let mut failed = Vec::new();
        for (h, s) in &self.peers {
            match s.list(prefix) {
                Ok(keys) => {
                    self.peer_answered(h);
                    all.extend(keys)
                }
                Err(e) => {
                    self.peer_failed(h, "list", prefix, &e);
                    failed.push(format!("{h}: {e}"));
                }
            }
        }
        if !self.peers.is_empty() && failed.len() == self.peers.len() {
            return Err(StoreError::Replicas {
                op: "list",
                key: prefix.to_string(),
                detail: format!("no peer answered: [{}]", failed.join("; ")),
            });
        }
        Ok(all.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DirStore;

    /// A peer that is down: every call fails.
    struct Down;
    impl BlobStore for Down {
        fn put(&self, k: &str, _: &[u8]) -> Result<(), StoreError> {
            Err(down(k))
        }
        fn get(&self, k: &str) -> Result<Option<Vec<u8>>, StoreError> {
            Err(down(k))
        }
        fn delete(&self, k: &str) -> Result<(), StoreError> {
            Err(down(k))
        }
        fn list(&self, k: &str) -> Result<Vec<String>, StoreError> {
            Err(down(k))
        }
    }
    fn down(k: &str) -> StoreError {
        StoreError::Backend {
            store: "down".into(),
            op: "any",
            key: k.into(),
            detail: "connection refused".into(),
        }
    }

    fn dirs(n: usize) -> (Vec<tempfile::TempDir>, Vec<Peer>) {
        let ds: Vec<_> = (0..n).map(|_| tempfile::tempdir().unwrap()).collect();
        let peers = ds
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    format!("h{i}"),
                    Arc::new(DirStore::open(d.path()).unwrap()) as Arc<dyn BlobStore>,
                )
            })
            .collect();
        (ds, peers)
    }

    #[test]
    fn writes_k_replicas_away_from_the_producer() {
        let (_d, peers) = dirs(4);
        let r = Replicated::new(peers.clone(), 2).unwrap();
        for i in 0..20 {
            let key = format!("jobs/j/1/{i}.ckpt");
            for producer in ["h0", "h1", "h2", "h3"] {
                let hosts = r.put_from(Some(producer), &key, b"data").unwrap();
                assert_eq!(hosts.len(), 2);
                assert!(!hosts.iter().any(|h| h == producer), "{hosts:?} {producer}");
                let holders: Vec<&str> = peers
                    .iter()
                    .filter(|(_, s)| s.get(&key).unwrap().is_some())
                    .map(|(h, _)| h.as_str())
                    .collect();
                assert_eq!(holders.len(), 2, "{holders:?}");
                assert!(!holders.contains(&producer), "{holders:?} {producer}");
                for (_, s) in &peers {
                    s.delete(&key).unwrap();
                }
            }
        }
    }

    #[test]
    fn too_few_peers_is_an_error_naming_them() {
        let (_d, mut peers) = dirs(2);
        peers.push(("h-down".into(), Arc::new(Down)));
        let r = Replicated::new(peers, 2).unwrap();
        // Producer h0: eligible h1 and h-down; h-down fails → 1 of 2.
        let e = r.put_from(Some("h0"), "k", b"x").unwrap_err().to_string();
        assert!(e.contains("only 1 of 2"), "{e}");
        assert!(
            e.contains("h-down") && e.contains("connection refused"),
            "{e}"
        );
        assert!(e.contains("producer host h0 excluded"), "{e}");
        // Producer h-down: h0 and h1 both take it.
        assert_eq!(r.put_from(Some("h-down"), "k", b"x").unwrap().len(), 2);
        assert!(Replicated::new(vec![], 0).is_err());
        let (_d2, p2) = dirs(1);
        let dup = vec![p2[0].clone(), p2[0].clone()];
        assert!(Replicated::new(dup, 1).is_err());
    }

    #[test]
    fn with_a_floor_a_write_ends_degraded_once_every_eligible_host_was_tried() {
        let (_d, mut peers) = dirs(2);
        peers.push(("h-down".into(), Arc::new(Down)));
        let r = Replicated::new(peers.clone(), 2)
            .unwrap()
            .with_min_replicas(1);
        // Producer h0: h1 takes it, h-down fails, nobody else is eligible → 1 replica, accepted.
        let hosts = r.put_from(Some("h0"), "k", b"x").unwrap();
        assert_eq!(hosts, vec!["h1".to_string()]);
        assert_eq!(r.get("k").unwrap().as_deref(), Some(&b"x"[..]));
        // Nobody eligible is up (producer h1, h0 excluded too by being down): still an error.
        let only_down: Vec<Peer> = vec![peers[0].clone(), ("h-down".into(), Arc::new(Down))];
        let r = Replicated::new(only_down, 2).unwrap().with_min_replicas(1);
        let e = r.put_from(Some("h0"), "k2", b"x").unwrap_err().to_string();
        assert!(e.contains("only 0 of 2"), "{e}");
        // The floor never exceeds k nor drops below 1.
        let (_d3, p3) = dirs(3);
        let r = Replicated::new(p3, 2).unwrap().with_min_replicas(0);
        assert_eq!(r.put_from(Some("h0"), "k3", b"x").unwrap().len(), 2);
    }

    /// A down peer that counts how often it is asked.
    use std::sync::atomic::Ordering;
    struct CountingDown(std::sync::atomic::AtomicUsize);
    impl BlobStore for CountingDown {
        fn put(&self, k: &str, _: &[u8]) -> Result<(), StoreError> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Err(down(k))
        }
        fn get(&self, k: &str) -> Result<Option<Vec<u8>>, StoreError> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Err(down(k))
        }
        fn delete(&self, k: &str) -> Result<(), StoreError> {
            Err(down(k))
        }
        fn list(&self, k: &str) -> Result<Vec<String>, StoreError> {
            Err(down(k))
        }
    }

    #[test]
    fn a_peer_that_failed_is_tried_after_the_others() {
        let (_d, mut peers) = dirs(2);
        let dead = Arc::new(CountingDown(Default::default()));
        peers.insert(0, ("h-down".into(), dead.clone() as Arc<dyn BlobStore>));
        let r = Replicated::new(peers, 1).unwrap();
        for i in 0..30 {
            let key = format!("jobs/j/1/{i}.ckpt");
            assert_eq!(r.put_from(None, &key, b"x").unwrap().len(), 1);
            assert_eq!(r.get(&key).unwrap().as_deref(), Some(&b"x"[..]));
        }
        // Asked at most once: after its first failure it comes after two good peers.
        assert!(dead.0.load(Ordering::Relaxed) <= 1, "{:?}", dead.0);
    }

    /// A peer whose put only succeeds if the other peer's put runs at the same time.
    struct Rendezvous {
        arrived: std::sync::Mutex<u32>,
        cv: std::sync::Condvar,
    }
    struct Meet(Arc<Rendezvous>);
    impl BlobStore for Meet {
        fn put(&self, k: &str, _: &[u8]) -> Result<(), StoreError> {
            let mut n = self.0.arrived.lock().unwrap();
            *n += 1;
            self.0.cv.notify_all();
            let (n, t) = self
                .0
                .cv
                .wait_timeout_while(n, std::time::Duration::from_secs(5), |n| *n < 2)
                .unwrap();
            if t.timed_out() && *n < 2 {
                return Err(down(k));
            }
            Ok(())
        }
        fn get(&self, _: &str) -> Result<Option<Vec<u8>>, StoreError> {
            Ok(None)
        }
        fn delete(&self, _: &str) -> Result<(), StoreError> {
            Ok(())
        }
        fn list(&self, _: &str) -> Result<Vec<String>, StoreError> {
            Ok(vec![])
        }
    }

    #[test]
    fn replicas_are_written_concurrently() {
        let rv = Arc::new(Rendezvous {
            arrived: std::sync::Mutex::new(0),
            cv: std::sync::Condvar::new(),
        });
        let peers: Vec<Peer> = vec![
            ("a".into(), Arc::new(Meet(rv.clone()))),
            ("b".into(), Arc::new(Meet(rv.clone()))),
        ];
        let r = Replicated::new(peers, 2).unwrap();
        assert_eq!(r.put_from(None, "k", b"x").unwrap().len(), 2);
    }

    #[test]
    fn a_failed_host_is_replaced_by_the_next() {
        let (_d, mut peers) = dirs(3);
        peers.insert(1, ("h-down".into(), Arc::new(Down)));
        let r = Replicated::new(peers, 2).unwrap();
        for i in 0..10 {
            let hosts = r.put_from(None, &format!("k{i}"), b"x").unwrap();
            assert_eq!(hosts.len(), 2);
            assert!(!hosts.contains(&"h-down".to_string()));
        }
    }

    #[test]
    fn read_falls_back_and_reports_corrupt_and_missing_replicas() {
        let (_d, peers) = dirs(3);
        let r = Replicated::new(peers.clone(), 2).unwrap();
        let key = "jobs/j/3/0.ckpt";
        let hosts = r.put_from(None, key, b"precious").unwrap();
        let (data, rep) = r.get_with_report(key).unwrap();
        assert_eq!(data.as_deref(), Some(&b"precious"[..]));
        assert!(rep.is_clean(), "{rep:?}");
        let store_of = |h: &str| peers.iter().find(|(n, _)| n == h).unwrap().1.clone();

        // Corrupt the first replica (flip a data byte): the second one is served.
        let first = store_of(&hosts[0]);
        let mut bad = first.get(key).unwrap().unwrap();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        first.put(key, &bad).unwrap();
        let (data, rep) = r.get_with_report(key).unwrap();
        assert_eq!(data.as_deref(), Some(&b"precious"[..]));
        assert_eq!(rep.served_by.as_deref(), Some(hosts[1].as_str()));
        assert_eq!(rep.corrupt.len(), 1);
        assert_eq!(rep.corrupt[0].0, hosts[0]);
        assert!(rep.corrupt[0].1.contains("checksum"), "{rep:?}");

        // The second replica is lost as well: no good data, an error naming both.
        store_of(&hosts[1]).delete(key).unwrap();
        let e = r.get(key).unwrap_err().to_string();
        assert!(e.contains(&format!("{}: corrupt", hosts[0])), "{e}");
        assert!(e.contains(&format!("{}: missing", hosts[1])), "{e}");

        // Truncated replica: reported, never returned.
        first.put(key, &bad[..10]).unwrap();
        assert!(r.get(key).unwrap_err().to_string().contains("truncated"));

        // Nothing anywhere: plainly absent.
        let (none, rep) = r.get_with_report("other").unwrap();
        assert!(none.is_none());
        assert_eq!(rep.missing.len(), 2);
    }

    #[test]
    fn list_and_delete_span_the_peers() {
        let (_d, mut peers) = dirs(3);
        let r = Replicated::new(peers.clone(), 1).unwrap();
        for i in 0..6 {
            r.put(&format!("p/{i}"), b"x").unwrap();
        }
        assert_eq!(r.list("p/").unwrap().len(), 6);
        for i in 0..6 {
            r.delete(&format!("p/{i}")).unwrap();
        }
        assert!(r.list("").unwrap().is_empty());
        peers.push(("h-down".into(), Arc::new(Down)));
        let r = Replicated::new(peers.clone(), 1).unwrap();
        assert!(r.delete("p/0").unwrap_err().to_string().contains("h-down"));
        // Known down now: later deletes do not ask it again (its failure was reported once).
        assert!(r.delete("p/1").is_ok());
        let r = Replicated::new(peers, 1).unwrap();
        assert!(
            r.list("").unwrap().is_empty(),
            "one peer down: still listed"
        );
    }

    #[test]
    fn envelope_rejects_garbage() {
        assert_eq!(open(&seal(b"abc")).unwrap(), b"abc");
        assert!(open(b"").is_err());
        assert!(open(&[0u8; 64]).unwrap_err().contains("magic"));
        let mut v = seal(b"abc");
        v[4] = 9;
        assert!(open(&v).unwrap_err().contains("version"));
    }
}
