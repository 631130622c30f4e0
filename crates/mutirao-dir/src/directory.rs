//! The in-memory directory of one server: no I/O, time passed in by the caller.
//!
//! A resource is a [`Gid`] plus an immutable [`AttrList`], an [`Acl`], an owner uid and the
//! context (process) it is bound to. Contexts send heartbeats; [`Directory::expire`] purges a
//! context that missed its deadline together with every resource bound to it.

use crate::attr::{Attr, AttrList, AttrValue};
use crate::error::DirError;
use crate::gid::{Gid, GidSplit};
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

/// Name of the system attribute that carries an ACL inside a register packet.
pub const ACL_ATTR: &str = "sys.acl";

/// The identity a request runs as (from SO_PEERCRED locally, from the origin server remotely).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cred {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

impl Cred {
    /// A credential.
    pub fn new(uid: u32, gid: u32) -> Self {
        Cred { uid, gid }
    }
}

/// Who, besides the owner, may see and use a resource.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Acl {
    /// Everyone.
    #[default]
    Public,
    /// The owner plus these users and groups.
    Only {
        /// Allowed user ids.
        users: Vec<u32>,
        /// Allowed group ids.
        groups: Vec<u32>,
    },
}

impl Acl {
    /// Only the owner.
    pub fn private() -> Self {
        Acl::Only {
            users: vec![],
            groups: vec![],
        }
    }

    /// True when `cred` may see a resource owned by `owner` under this ACL.
    pub fn permits(&self, owner: u32, cred: Cred) -> bool {
        match self {
            Acl::Public => true,
            Acl::Only { users, groups } => {
                cred.uid == owner || users.contains(&cred.uid) || groups.contains(&cred.gid)
            }
        }
    }

    /// Encodes as the value of [`ACL_ATTR`]: `public u8 | nusers u32 | users | ngroups u32 | groups`.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        match self {
            Acl::Public => v.push(1),
            Acl::Only { users, groups } => {
                v.push(0);
                v.extend_from_slice(&(users.len() as u32).to_le_bytes());
                for u in users {
                    v.extend_from_slice(&u.to_le_bytes());
                }
                v.extend_from_slice(&(groups.len() as u32).to_le_bytes());
                for g in groups {
                    v.extend_from_slice(&g.to_le_bytes());
                }
            }
        }
        v
    }

    /// Decodes [`Acl::encode`]'s output; malformed input is an error, never a panic.
    pub fn decode(b: &[u8]) -> Result<Acl, DirError> {
        let bad = |what: &str| DirError::BadAttrs(format!("{ACL_ATTR}: {what}"));
        let (&first, mut rest) = b.split_first().ok_or_else(|| bad("empty value"))?;
        if first == 1 && rest.is_empty() {
            return Ok(Acl::Public);
        }
        if first != 0 {
            return Err(bad("first byte must be 1 (public) or 0 (restricted)"));
        }
        let read_list = |rest: &mut &[u8]| -> Result<Vec<u32>, DirError> {
            if rest.len() < 4 {
                return Err(bad("truncated list length"));
            }
            let n = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            *rest = &rest[4..];
            if n > rest.len() / 4 {
                return Err(bad("list longer than the value"));
            }
            let out = rest[..n * 4]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            *rest = &rest[n * 4..];
            Ok(out)
        };
        let users = read_list(&mut rest)?;
        let groups = read_list(&mut rest)?;
        if !rest.is_empty() {
            return Err(bad("trailing bytes"));
        }
        Ok(Acl::Only { users, groups })
    }
}

/// Configuration of one directory (one server).
#[derive(Clone, Debug)]
pub struct DirConfig {
    /// The gid split.
    pub split: GidSplit,
    /// This server's cluster (site) id.
    pub cluster: u64,
    /// This server's node serial number.
    pub node: u64,
    /// A context that sent no heartbeat for this long is purged with its resources.
    pub heartbeat_timeout: Duration,
    /// A multi-answer query idle for this long is freed.
    pub query_timeout: Duration,
}

impl Default for DirConfig {
    fn default() -> Self {
        DirConfig {
            split: GidSplit::default(),
            cluster: 0,
            node: 1,
            heartbeat_timeout: Duration::from_secs(3),
            query_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    attrs: AttrList,
    acl: Acl,
    owner: u32,
    ctx: Gid,
    full_key: u64,
}

#[derive(Debug)]
struct Ctx {
    owner: u32,
    last_seen: Instant,
    resources: HashSet<Gid>,
}

#[derive(Debug)]
struct Cursor {
    cred: Cred,
    query: AttrList,
    pending: VecDeque<Gid>,
    last_used: Instant,
}

/// What [`Directory::expire`] purged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expired {
    /// Contexts that missed their heartbeat deadline.
    pub contexts: Vec<Gid>,
    /// Resources deleted with them.
    pub resources: Vec<Gid>,
}

/// Outcome of a registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    /// The resource's gid.
    pub gid: Gid,
    /// False when a `unique` registration found an equal resource and returned its gid.
    pub created: bool,
}

/// The directory of one server.
#[derive(Debug)]
pub struct Directory {
    cfg: DirConfig,
    counter: u64,
    entries: HashMap<Gid, Entry>,
    by_pair: HashMap<u64, Vec<Gid>>,
    by_name: HashMap<String, Vec<Gid>>,
    by_full: HashMap<u64, Vec<Gid>>,
    contexts: HashMap<Gid, Ctx>,
    cursors: HashMap<u64, Cursor>,
    next_query: u64,
    own_ctx: Gid,
}

fn pair_key(name: &str, value: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    name.hash(&mut h);
    value.hash(&mut h);
    h.finish()
}

/// Hash of a canonical full attribute list (the uniqueness key).
pub fn full_key(attrs: &AttrList) -> u64 {
    let mut h = DefaultHasher::new();
    for a in attrs {
        a.name.hash(&mut h);
        a.value.hash(&mut h);
    }
    h.finish()
}

fn remove_from(map: &mut HashMap<u64, Vec<Gid>>, key: u64, gid: Gid) {
    if let Some(v) = map.get_mut(&key) {
        v.retain(|g| *g != gid);
        if v.is_empty() {
            map.remove(&key);
        }
    }
}

/// True when resource attributes `r` match query `q`: every full attribute of `q` is in `r`
/// with the same value, and every wanted name exists in `r`.
pub fn matches(r: &AttrList, q: &AttrList) -> bool {
    q.iter().all(|qa| match (&qa.value, r.get(&qa.name)) {
        (AttrValue::Full(v), Some(ra)) => ra.bytes() == Some(v.as_slice()),
        (AttrValue::Want { .. }, Some(_)) => true,
        (_, None) => false,
    })
}

/// The answer to `q` from resource attributes `r`: if `q` has wanted attributes, `q` with each
/// filled in (truncated to the wanted length); otherwise all of `r`.
pub fn answer(r: &AttrList, q: &AttrList) -> AttrList {
    if q.is_full() {
        return r.clone();
    }
    let filled = q
        .iter()
        .map(|qa| match (&qa.value, r.value(&qa.name)) {
            (AttrValue::Want { len }, Some(v)) => {
                Attr::full(qa.name.clone(), &v[..v.len().min(*len as usize)])
            }
            _ => qa.clone(),
        })
        .collect();
    AttrList::from_sorted_unchecked(filled)
}

fn check_user_attrs(attrs: &AttrList) -> Result<(), DirError> {
    if let Some(a) = attrs.iter().find(|a| a.is_system()) {
        return Err(DirError::SystemNamespace(a.name.clone()));
    }
    Ok(())
}

impl Directory {
    /// An empty directory. `now` starts the server's own (never expiring) context.
    pub fn new(cfg: DirConfig) -> Result<Self, DirError> {
        cfg.split.encode(cfg.cluster, cfg.node, 0)?;
        let mut d = Directory {
            cfg,
            counter: 0,
            entries: HashMap::new(),
            by_pair: HashMap::new(),
            by_name: HashMap::new(),
            by_full: HashMap::new(),
            contexts: HashMap::new(),
            cursors: HashMap::new(),
            next_query: 1,
            own_ctx: Gid::NONE,
        };
        d.own_ctx = d.next_gid()?;
        Ok(d)
    }

    /// The configuration.
    pub fn config(&self) -> &DirConfig {
        &self.cfg
    }

    /// The server's own context: resources bound to it never expire.
    pub fn own_context(&self) -> Gid {
        self.own_ctx
    }

    /// Number of resources (contexts excluded).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no resource is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of open multi-answer queries.
    pub fn open_queries(&self) -> usize {
        self.cursors.len()
    }

    /// Number of live contexts (the server's own excluded).
    pub fn live_contexts(&self) -> usize {
        self.contexts.len()
    }

    fn next_gid(&mut self) -> Result<Gid, DirError> {
        let c = self.counter + 1;
        let g = self
            .cfg
            .split
            .encode(self.cfg.cluster, self.cfg.node, c)
            .map_err(|_| DirError::Exhausted)?;
        self.counter = c;
        Ok(g)
    }

    /// Opens a context for a process of user `cred` (contexts are resources with their own gid).
    pub fn open_context(&mut self, cred: Cred, now: Instant) -> Result<Gid, DirError> {
        let g = self.next_gid()?;
        self.contexts.insert(
            g,
            Ctx {
                owner: cred.uid,
                last_seen: now,
                resources: HashSet::new(),
            },
        );
        Ok(g)
    }

    /// Records a heartbeat of `ctx`.
    pub fn heartbeat(&mut self, cred: Cred, ctx: Gid, now: Instant) -> Result<(), DirError> {
        match self.contexts.get_mut(&ctx) {
            Some(c) if c.owner == cred.uid => {
                c.last_seen = now;
                Ok(())
            }
            Some(_) => Err(DirError::PermissionDenied(format!(
                "context {ctx} belongs to another user"
            ))),
            None => Err(DirError::UnknownContext(ctx)),
        }
    }

    /// Closes `ctx` and deletes its resources; returns them.
    pub fn close_context(&mut self, cred: Cred, ctx: Gid) -> Result<Vec<Gid>, DirError> {
        match self.contexts.get(&ctx) {
            Some(c) if c.owner == cred.uid => Ok(self.purge_context(ctx)),
            Some(_) => Err(DirError::PermissionDenied(format!(
                "context {ctx} belongs to another user"
            ))),
            None => Err(DirError::UnknownContext(ctx)),
        }
    }

    fn purge_context(&mut self, ctx: Gid) -> Vec<Gid> {
        let mut gone = Vec::new();
        if let Some(c) = self.contexts.remove(&ctx) {
            for g in c.resources {
                self.remove_entry(g);
                gone.push(g);
            }
        }
        gone.sort();
        gone
    }

    /// Purges every context whose last heartbeat is older than the timeout, with its
    /// resources, and frees idle queries. Returns the purged contexts and resources.
    pub fn expire(&mut self, now: Instant) -> Expired {
        let t = self.cfg.heartbeat_timeout;
        let dead: Vec<Gid> = self
            .contexts
            .iter()
            .filter(|(_, c)| now.saturating_duration_since(c.last_seen) > t)
            .map(|(g, _)| *g)
            .collect();
        let mut gone = Vec::new();
        for &ctx in &dead {
            gone.extend(self.purge_context(ctx));
        }
        let qt = self.cfg.query_timeout;
        self.cursors
            .retain(|_, c| now.saturating_duration_since(c.last_used) <= qt);
        Expired {
            contexts: dead,
            resources: gone,
        }
    }

    /// Registers a resource bound to context `ctx` (`Gid::NONE` = the server's own context).
    /// With `unique`, an existing resource with exactly these attributes visible to `cred`
    /// is returned instead (`created == false`). Nothing changes on error.
    pub fn register(
        &mut self,
        cred: Cred,
        ctx: Gid,
        attrs: AttrList,
        acl: Acl,
        unique: bool,
    ) -> Result<Registered, DirError> {
        self.check_registrable(&attrs)?;
        self.check_context(cred, ctx)?;
        let ctx = if ctx == Gid::NONE { self.own_ctx } else { ctx };
        let fk = full_key(&attrs);
        if unique {
            if let Some(g) = self.find_equal(&attrs, fk) {
                let e = &self.entries[&g];
                if e.acl.permits(e.owner, cred) {
                    return Ok(Registered {
                        gid: g,
                        created: false,
                    });
                }
                return Err(DirError::PermissionDenied(
                    "an equal unique resource exists and its ACL excludes you".into(),
                ));
            }
        }
        let gid = self.next_gid()?;
        self.insert_entry(gid, attrs, acl, cred.uid, ctx, fk);
        Ok(Registered { gid, created: true })
    }

    /// Checks that `cred` may register under `ctx` (`Gid::NONE` = the server's context).
    pub fn check_context(&self, cred: Cred, ctx: Gid) -> Result<(), DirError> {
        if ctx == Gid::NONE || ctx == self.own_ctx {
            return Ok(());
        }
        match self.contexts.get(&ctx) {
            None => Err(DirError::UnknownContext(ctx)),
            Some(c) if c.owner != cred.uid => Err(DirError::PermissionDenied(format!(
                "context {ctx} belongs to another user"
            ))),
            Some(_) => Ok(()),
        }
    }

    /// Checks that `attrs` could be registered (non-empty, full, no system names).
    pub fn check_registrable(&self, attrs: &AttrList) -> Result<(), DirError> {
        if attrs.is_empty() {
            return Err(DirError::BadAttrs(
                "cannot register an empty attribute list; give at least one attribute".into(),
            ));
        }
        if !attrs.is_full() {
            return Err(DirError::BadAttrs(
                "registration needs fully specified attributes (no `want` slots)".into(),
            ));
        }
        check_user_attrs(attrs)
    }

    /// True when `gid` is a live context.
    pub fn is_context(&self, gid: Gid) -> bool {
        self.contexts.contains_key(&gid)
    }

    /// The gid of a resource with exactly `attrs`, ignoring ACLs (used for uniqueness).
    pub fn find_equal(&self, attrs: &AttrList, fk: u64) -> Option<Gid> {
        self.by_full.get(&fk).and_then(|v| {
            v.iter()
                .copied()
                .find(|g| self.entries.get(g).is_some_and(|e| e.attrs == *attrs))
        })
    }

    fn insert_entry(&mut self, gid: Gid, attrs: AttrList, acl: Acl, owner: u32, ctx: Gid, fk: u64) {
        for a in &attrs {
            if let Some(v) = a.bytes() {
                self.by_pair
                    .entry(pair_key(&a.name, v))
                    .or_default()
                    .push(gid);
            }
            self.by_name.entry(a.name.clone()).or_default().push(gid);
        }
        self.by_full.entry(fk).or_default().push(gid);
        if let Some(c) = self.contexts.get_mut(&ctx) {
            c.resources.insert(gid);
        }
        self.entries.insert(
            gid,
            Entry {
                attrs,
                acl,
                owner,
                ctx,
                full_key: fk,
            },
        );
    }

    fn remove_entry(&mut self, gid: Gid) -> bool {
        let Some(e) = self.entries.remove(&gid) else {
            return false;
        };
        for a in &e.attrs {
            if let Some(v) = a.bytes() {
                remove_from(&mut self.by_pair, pair_key(&a.name, v), gid);
            }
            if let Some(v) = self.by_name.get_mut(&a.name) {
                v.retain(|g| *g != gid);
                if v.is_empty() {
                    self.by_name.remove(&a.name);
                }
            }
        }
        remove_from(&mut self.by_full, e.full_key, gid);
        if let Some(c) = self.contexts.get_mut(&e.ctx) {
            c.resources.remove(&gid);
        }
        true
    }

    /// Deletes a resource. An ACL outsider gets [`DirError::NotFound`]; a user who may see it
    /// but does not own it gets [`DirError::PermissionDenied`].
    pub fn delete(&mut self, cred: Cred, gid: Gid) -> Result<(), DirError> {
        if self.contexts.contains_key(&gid) {
            return self.close_context(cred, gid).map(|_| ());
        }
        let e = self.entries.get(&gid).ok_or(DirError::NotFound(gid))?;
        if !e.acl.permits(e.owner, cred) {
            return Err(DirError::NotFound(gid));
        }
        if e.owner != cred.uid {
            return Err(DirError::PermissionDenied(format!(
                "resource {gid} belongs to uid {}; only its owner may delete it",
                e.owner
            )));
        }
        self.remove_entry(gid);
        Ok(())
    }

    fn visible(&self, cred: Cred, gid: Gid) -> Option<&Entry> {
        self.entries
            .get(&gid)
            .filter(|e| e.acl.permits(e.owner, cred))
    }

    /// Single-answer query. With `gid`, that resource (if visible and matching `q`);
    /// otherwise the first visible resource matching `q`. Returns the gid and the answer.
    pub fn query(
        &self,
        cred: Cred,
        gid: Option<Gid>,
        q: &AttrList,
    ) -> Result<(Gid, AttrList), DirError> {
        check_user_attrs(q)?;
        match gid {
            Some(g) => {
                let e = self.visible(cred, g).ok_or(DirError::NotFound(g))?;
                if matches(&e.attrs, q) {
                    Ok((g, answer(&e.attrs, q)))
                } else {
                    Err(DirError::NotFound(g))
                }
            }
            None => {
                let mut found = None;
                self.for_each_match(cred, q, |g| {
                    found = Some(g);
                    false
                });
                let g = found.ok_or(DirError::NoMatch)?;
                Ok((g, answer(&self.entries[&g].attrs, q)))
            }
        }
    }

    /// Every visible resource matching `q`, in gid order.
    pub fn query_all(&self, cred: Cred, q: &AttrList) -> Result<Vec<Gid>, DirError> {
        check_user_attrs(q)?;
        let mut v = Vec::new();
        self.for_each_match(cred, q, |g| {
            v.push(g);
            true
        });
        v.sort();
        Ok(v)
    }

    /// The answer to `q` from resource `gid`, if it still exists, is visible and matches.
    pub fn answer_for(&self, cred: Cred, gid: Gid, q: &AttrList) -> Option<AttrList> {
        self.visible(cred, gid)
            .filter(|e| matches(&e.attrs, q))
            .map(|e| answer(&e.attrs, q))
    }

    fn for_each_match(&self, cred: Cred, q: &AttrList, mut f: impl FnMut(Gid) -> bool) {
        // Candidates: the smallest posting list among the full pairs, else among the names.
        let mut best: Option<&Vec<Gid>> = None;
        let mut any_index = false;
        for a in q {
            let list = match a.bytes() {
                Some(v) => self.by_pair.get(&pair_key(&a.name, v)),
                None => self.by_name.get(&a.name),
            };
            any_index = true;
            match list {
                None => return, // some attribute matches nothing
                Some(l) => {
                    if best.is_none_or(|b| l.len() < b.len()) {
                        best = Some(l);
                    }
                }
            }
        }
        let check = |g: Gid| {
            self.entries
                .get(&g)
                .is_some_and(|e| e.acl.permits(e.owner, cred) && matches(&e.attrs, q))
        };
        if any_index {
            if let Some(l) = best {
                for &g in l {
                    if check(g) && !f(g) {
                        return;
                    }
                }
            }
        } else {
            let mut all: Vec<Gid> = self.entries.keys().copied().collect();
            all.sort();
            for g in all {
                if check(g) && !f(g) {
                    return;
                }
            }
        }
    }

    /// Starts a multi-answer query; returns its id. Results are handed out one at a time by
    /// [`Directory::query_next`]; a resource deleted meanwhile is skipped.
    pub fn query_start(&mut self, cred: Cred, q: AttrList, now: Instant) -> Result<u64, DirError> {
        let pending: VecDeque<Gid> = self.query_all(cred, &q)?.into();
        let id = self.next_query;
        self.next_query += 1;
        self.cursors.insert(
            id,
            Cursor {
                cred,
                query: q,
                pending,
                last_used: now,
            },
        );
        Ok(id)
    }

    /// The next result of query `id`, or `None` when exhausted.
    pub fn query_next(
        &mut self,
        id: u64,
        now: Instant,
    ) -> Result<Option<(Gid, AttrList)>, DirError> {
        let mut c = self.cursors.remove(&id).ok_or(DirError::UnknownQuery(id))?;
        c.last_used = now;
        let mut out = None;
        while let Some(g) = c.pending.pop_front() {
            if let Some(a) = self.answer_for(c.cred, g, &c.query) {
                out = Some((g, a));
                break;
            }
        }
        self.cursors.insert(id, c);
        Ok(out)
    }

    /// True when query `id` has results left (some may vanish before they are fetched).
    pub fn query_has_more(&self, id: u64) -> bool {
        self.cursors.get(&id).is_some_and(|c| !c.pending.is_empty())
    }

    /// Stops query `id` and frees its state.
    pub fn query_stop(&mut self, id: u64) -> Result<(), DirError> {
        self.cursors
            .remove(&id)
            .map(|_| ())
            .ok_or(DirError::UnknownQuery(id))
    }

    /// The owner uid and ACL of a resource (for system use, e.g. receiver-side checks).
    pub fn acl_of(&self, gid: Gid) -> Option<(u32, &Acl)> {
        self.entries.get(&gid).map(|e| (e.owner, &e.acl))
    }

    /// The context a resource is bound to.
    pub fn context_of(&self, gid: Gid) -> Option<Gid> {
        self.entries.get(&gid).map(|e| e.ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acl_roundtrip_and_malformed() {
        for acl in [
            Acl::Public,
            Acl::private(),
            Acl::Only {
                users: vec![1, 2],
                groups: vec![7],
            },
        ] {
            assert_eq!(Acl::decode(&acl.encode()).unwrap(), acl);
        }
        assert!(Acl::decode(&[]).is_err());
        assert!(Acl::decode(&[0, 255, 255, 255, 255]).is_err());
        assert!(Acl::decode(&[2]).is_err());
    }
}
