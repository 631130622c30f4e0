//! Message semantics per destination type (digest 002 §1.3, Fig. 2.3) as a pure routing
//! function, plus [`Mailroom`], an in-memory store that enforces "exactly one consumer".
//!
//! - task: delivered to it; a task alias forwards to its original (repeatedly);
//! - operon: one copy stored at the operon, consumable by exactly one of its non-alias tasks;
//! - mailbox: one copy stored, consumable by one task in the subtree of the mailbox's ancestor;
//! - domain: a copy to every member that can receive (tasks, operons, mailboxes, domains),
//!   recursively, and to each original when the domain is an alias;
//! - a physical (non-alias) domain: dropped;
//! - sources: a task or a mailbox only.
//!
//! Each final destination gets at most one copy per message, whatever the number of paths.

use super::{EntityType, Hierarchy};
use crate::directory::Cred;
use crate::error::DirError;
use crate::gid::Gid;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

/// Where one copy of a message goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Straight to a task.
    Task(Gid),
    /// Stored at an operon or mailbox; exactly one of `consumers` takes it.
    Stored {
        /// The operon or mailbox.
        at: Gid,
        /// Tasks allowed to take it.
        consumers: Vec<Gid>,
    },
}

impl Delivery {
    /// The entity the copy is stored at.
    pub fn at(&self) -> Gid {
        match self {
            Delivery::Task(g) => *g,
            Delivery::Stored { at, .. } => *at,
        }
    }
}

/// The result of routing one message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Route {
    /// Copies to deliver.
    pub deliveries: Vec<Delivery>,
    /// Physical domains reached (their copies are discarded).
    pub dropped: Vec<Gid>,
}

/// Routes a message from `src` to `dst` as `cred`. The sender must be a task or mailbox; a
/// destination the sender may not see is "not found".
pub fn route(h: &Hierarchy, cred: Cred, src: Gid, dst: Gid) -> Result<Route, DirError> {
    let s = h
        .get(src)
        .ok_or_else(|| DirError::Meu(format!("source {src} does not exist")))?;
    if !matches!(s.kind, EntityType::Task | EntityType::Mailbox) {
        return Err(DirError::Meu(format!(
            "a {} ({src}) cannot send: the source must be a task or a mailbox",
            s.kind.tipo()
        )));
    }
    let d = h.get(dst).ok_or(DirError::NotFound(dst))?;
    if !d.acl.permits(d.owner, cred) {
        return Err(DirError::NotFound(dst));
    }
    if matches!(
        d.kind,
        EntityType::Block | EntityType::Aggregator | EntityType::Subtractor
    ) {
        return Err(DirError::Meu(format!(
            "a {} ({dst}) cannot receive messages",
            d.kind.tipo()
        )));
    }
    let mut r = Route::default();
    let mut seen = HashSet::new();
    let mut stored = HashSet::new();
    reach(h, dst, &mut seen, &mut stored, &mut r);
    Ok(r)
}

fn tasks_under(h: &Hierarchy, g: Gid, out: &mut Vec<Gid>) {
    for &c in h.descendants(g) {
        if let Some(e) = h.get(c) {
            if e.kind == EntityType::Task && !e.is_alias() {
                out.push(c);
            }
            tasks_under(h, c, out);
        }
    }
}

fn reach(h: &Hierarchy, x: Gid, seen: &mut HashSet<Gid>, stored: &mut HashSet<Gid>, r: &mut Route) {
    if !seen.insert(x) {
        return;
    }
    let Some(e) = h.get(x) else { return };
    match e.kind {
        EntityType::Task | EntityType::Operon | EntityType::Mailbox if e.is_alias() => {
            for &o in &e.originals {
                reach(h, o, seen, stored, r);
            }
        }
        EntityType::Task => {
            if stored.insert(x) {
                r.deliveries.push(Delivery::Task(x));
            }
        }
        EntityType::Operon => {
            let mut consumers = vec![];
            tasks_under(h, x, &mut consumers);
            if stored.insert(x) {
                r.deliveries.push(Delivery::Stored { at: x, consumers });
            }
        }
        EntityType::Mailbox => {
            let mut consumers = vec![];
            if let Some(a) = e.ancestor {
                tasks_under(h, a, &mut consumers);
            }
            if stored.insert(x) {
                r.deliveries.push(Delivery::Stored { at: x, consumers });
            }
        }
        EntityType::Domain => {
            if e.physical && !e.is_alias() {
                r.dropped.push(x);
                return;
            }
            for &c in h.descendants(x) {
                if h.get(c).is_some_and(|ce| {
                    matches!(
                        ce.kind,
                        EntityType::Task
                            | EntityType::Operon
                            | EntityType::Mailbox
                            | EntityType::Domain
                    )
                }) {
                    reach(h, c, seen, stored, r);
                }
            }
            for &o in &e.originals {
                reach(h, o, seen, stored, r);
            }
        }
        EntityType::Block | EntityType::Aggregator | EntityType::Subtractor => {}
    }
}

struct Store<T> {
    consumers: HashSet<Gid>,
    queue: VecDeque<T>,
}

/// Stored copies awaiting their consumer. Thread-safe; every copy is taken at most once.
pub struct Mailroom<T> {
    stores: Mutex<HashMap<Gid, Store<T>>>,
}

impl<T> Default for Mailroom<T> {
    fn default() -> Self {
        Mailroom {
            stores: Mutex::new(HashMap::new()),
        }
    }
}

impl<T: Clone> Mailroom<T> {
    /// An empty mailroom.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores one copy of `msg` per delivery of `r`; returns the number of copies.
    pub fn deliver(&self, r: &Route, msg: T) -> usize {
        let mut s = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        for d in &r.deliveries {
            let (at, consumers): (Gid, Vec<Gid>) = match d {
                Delivery::Task(t) => (*t, vec![*t]),
                Delivery::Stored { at, consumers } => (*at, consumers.clone()),
            };
            let st = s.entry(at).or_insert_with(|| Store {
                consumers: HashSet::new(),
                queue: VecDeque::new(),
            });
            st.consumers.extend(consumers);
            st.queue.push_back(msg.clone());
        }
        r.deliveries.len()
    }

    /// Task `task` takes the oldest copy stored at `at` (itself, its operon or a mailbox).
    pub fn take(&self, task: Gid, at: Gid) -> Result<Option<T>, DirError> {
        let mut s = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        match s.get_mut(&at) {
            None => Ok(None),
            Some(st) if !st.consumers.contains(&task) => Err(DirError::PermissionDenied(format!(
                "task {task} may not take messages stored at {at}"
            ))),
            Some(st) => Ok(st.queue.pop_front()),
        }
    }

    /// Copies waiting at `at`.
    pub fn pending(&self, at: Gid) -> usize {
        self.stores
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&at)
            .map_or(0, |s| s.queue.len())
    }
}
