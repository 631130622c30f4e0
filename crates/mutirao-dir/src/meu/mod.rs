//! mεμ: the resource hierarchy (digest 002 §1.2–1.5, §3).
//!
//! One tree holds the physical resources (domains from a [`spec`] file) and the logical
//! entities of every application (operons, tasks, mailboxes, memory blocks, aggregators,
//! subtractors), joined by aliases. [`Hierarchy`] is the pure in-memory model: creation with
//! the chaining and alias rules, the property algebra `P = ∇(OP ∪ IP ∪ SiP ∪ ShP)`,
//! [`Hierarchy::lookup`] (Fig. 4.7), [`Hierarchy::lookup_aggreg`] (Fig. 4.8), allocation and
//! reservation with capacity checks, and message routing per destination type ([`route`]).
//! [`SharedHierarchy`] makes allocation atomic for concurrent creators.
//!
//! ```
//! use mutirao_dir::meu::{spec, Hierarchy, props::{PropSet, Property}};
//! let s = spec::parse(r#"
//!   Cl: Cluster {FastEthernet};
//!   Sub1: "Subcluster Dual PIII" <Cl> {Myrinet};
//!   "Nó A1" <Sub1> {CPU=2, Mem=512};
//! "#).unwrap();
//! let (h, labels) = Hierarchy::from_spec(&s).unwrap();
//! let want = PropSet::of([Property::flag("Myrinet"), Property::sum("CPU", 2)]);
//! let node = h.lookup(labels["Cl"], None, None, &want).unwrap();
//! assert_eq!(h.get(node).unwrap().name, "Nó A1");
//! ```

pub mod aggregator;
pub mod props;
pub mod route;
pub mod spec;

use crate::attr::AttrList;
use crate::directory::{Acl, Cred, Directory};
use crate::error::DirError;
use crate::gid::{Gid, GidSplit};
use props::{accumulate, Bag, PropSet, PropValue, Property};
use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

/// The kinds of mεμ entities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntityType {
    /// Groups and delimits entities; physical domains describe hardware.
    Domain,
    /// An execution context (an OS process).
    Operon,
    /// A thread.
    Task,
    /// A message repository.
    Mailbox,
    /// A contiguous memory block.
    Block,
    /// Chains memory blocks into one global address space.
    Aggregator,
    /// A reservation: a property bag subtracted from its parent.
    Subtractor,
}

impl EntityType {
    /// The `tipo` attribute value (the thesis's Portuguese names).
    pub fn tipo(self) -> &'static str {
        match self {
            EntityType::Domain => "domínio",
            EntityType::Operon => "operão",
            EntityType::Task => "tarefa",
            EntityType::Mailbox => "caixa postal",
            EntityType::Block => "bloco",
            EntityType::Aggregator => "agregador",
            EntityType::Subtractor => "subtractor",
        }
    }

    fn is_leaf(self) -> bool {
        matches!(
            self,
            EntityType::Task | EntityType::Block | EntityType::Mailbox | EntityType::Subtractor
        )
    }
}

/// One entity of the hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entity {
    /// Its gid.
    pub gid: Gid,
    /// Its kind.
    pub kind: EntityType,
    /// Its name.
    pub name: String,
    /// Its ancestor (None for a root).
    pub ancestor: Option<Gid>,
    /// Its originals (an alias when non-empty).
    pub originals: Vec<Gid>,
    /// Its own properties (OP).
    pub props: Vec<Property>,
    /// Its ACL.
    pub acl: Acl,
    /// The user who created it.
    pub owner: u32,
    /// The creating task (Gid::NONE for the administrator's spec).
    pub creator: Gid,
    /// True for domains from the physical specification.
    pub physical: bool,
    /// True for domains that represent a computing system (a node).
    pub node: bool,
}

impl Entity {
    /// True when it is an alias.
    pub fn is_alias(&self) -> bool {
        !self.originals.is_empty()
    }
}

/// What to create.
#[derive(Clone, Debug)]
pub struct NewEntity {
    /// Kind.
    pub kind: EntityType,
    /// Name.
    pub name: String,
    /// Ancestor.
    pub parent: Gid,
    /// Originals (empty: not an alias).
    pub originals: Vec<Gid>,
    /// Own properties; `X'` allocates and `X''` reserves from the nearest ancestor owning `X`.
    pub props: Vec<Property>,
    /// ACL.
    pub acl: Acl,
    /// Creating task.
    pub creator: Gid,
}

impl NewEntity {
    /// A public entity with no originals, properties or creator.
    pub fn new(kind: EntityType, name: impl Into<String>, parent: Gid) -> Self {
        NewEntity {
            kind,
            name: name.into(),
            parent,
            originals: vec![],
            props: vec![],
            acl: Acl::Public,
            creator: Gid::NONE,
        }
    }

    /// With originals (an alias).
    pub fn alias_of(mut self, originals: Vec<Gid>) -> Self {
        self.originals = originals;
        self
    }

    /// With own properties.
    pub fn with_props(mut self, props: Vec<Property>) -> Self {
        self.props = props;
        self
    }

    /// With an ACL.
    pub fn with_acl(mut self, acl: Acl) -> Self {
        self.acl = acl;
        self
    }
}

/// The resource hierarchy.
#[derive(Clone, Debug)]
pub struct Hierarchy {
    ents: HashMap<Gid, Entity>,
    children: HashMap<Gid, Vec<Gid>>,
    aliases: HashMap<Gid, Vec<Gid>>,
    roots: Vec<Gid>,
    split: GidSplit,
    cluster: u64,
    node: u64,
    counter: u64,
}

fn meu(msg: String) -> DirError {
    DirError::Meu(msg)
}

fn strip_usage(name: &str) -> (&str, usize) {
    let base = name.trim_end_matches('\'');
    (base, name.len() - base.len())
}

impl Default for Hierarchy {
    fn default() -> Self {
        Hierarchy::new(0, 1)
    }
}

impl Hierarchy {
    /// An empty hierarchy that numbers its entities under (cluster, node).
    pub fn new(cluster: u64, node: u64) -> Self {
        Hierarchy {
            ents: HashMap::new(),
            children: HashMap::new(),
            aliases: HashMap::new(),
            roots: vec![],
            split: GidSplit::default(),
            cluster,
            node,
            counter: 0,
        }
    }

    fn next_gid(&mut self) -> Result<Gid, DirError> {
        let g = self
            .split
            .encode(self.cluster, self.node, self.counter + 1)?;
        self.counter += 1;
        Ok(g)
    }

    /// An entity.
    pub fn get(&self, g: Gid) -> Option<&Entity> {
        self.ents.get(&g)
    }

    /// Number of entities.
    pub fn len(&self) -> usize {
        self.ents.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.ents.is_empty()
    }

    /// Root entities in creation order.
    pub fn roots(&self) -> &[Gid] {
        &self.roots
    }

    /// Direct descendants in creation order.
    pub fn descendants(&self, g: Gid) -> &[Gid] {
        self.children.get(&g).map_or(&[], |v| v.as_slice())
    }

    /// Aliases of `g` (entities that have `g` as an original).
    pub fn aliases(&self, g: Gid) -> &[Gid] {
        self.aliases.get(&g).map_or(&[], |v| v.as_slice())
    }

    /// Originals of `g`.
    pub fn originals(&self, g: Gid) -> &[Gid] {
        self.ents.get(&g).map_or(&[], |e| e.originals.as_slice())
    }

    /// Finds an entity by name (first in creation order of a depth-first walk).
    pub fn find_by_name(&self, name: &str) -> Option<Gid> {
        let mut stack: Vec<Gid> = self.roots.iter().rev().copied().collect();
        while let Some(g) = stack.pop() {
            if self.ents.get(&g).is_some_and(|e| e.name == name) {
                return Some(g);
            }
            stack.extend(self.descendants(g).iter().rev());
        }
        None
    }

    fn need(&self, g: Gid, what: &str) -> Result<&Entity, DirError> {
        self.ents
            .get(&g)
            .ok_or_else(|| meu(format!("{what} {g} does not exist")))
    }

    fn visible(&self, cred: Cred, g: Gid, what: &str) -> Result<&Entity, DirError> {
        let e = self.need(g, what)?;
        if e.acl.permits(e.owner, cred) {
            Ok(e)
        } else {
            Err(meu(format!("{what} {g} does not exist")))
        }
    }

    /// Every entity reachable from `g` by ancestor and alias→original edges, `g` included
    /// (the union of its pseudo-ancestry chains).
    pub fn pseudo_ancestry(&self, g: Gid) -> Vec<Gid> {
        let mut seen = HashSet::new();
        let mut out = vec![];
        let mut stack = vec![g];
        while let Some(x) = stack.pop() {
            if !seen.insert(x) {
                continue;
            }
            out.push(x);
            if let Some(e) = self.ents.get(&x) {
                stack.extend(e.ancestor);
                stack.extend(e.originals.iter().copied());
            }
        }
        out
    }

    fn insert(&mut self, e: Entity) {
        match e.ancestor {
            Some(a) => self.children.entry(a).or_default().push(e.gid),
            None => self.roots.push(e.gid),
        }
        for o in &e.originals {
            self.aliases.entry(*o).or_default().push(e.gid);
        }
        self.ents.insert(e.gid, e);
    }

    /// Builds the physical hierarchy of a specification (administrator-owned, public).
    /// Returns it with the label → gid map.
    pub fn from_spec(s: &spec::Spec) -> Result<(Hierarchy, HashMap<String, Gid>), spec::SpecError> {
        let mut h = Hierarchy::default();
        let labels = h.add_spec(s, |h, _| h.next_gid().map_err(|e| e.to_string()))?;
        Ok((h, labels))
    }

    /// Adds a specification's domains in registration order, taking each gid from `gid_for`
    /// (e.g. a directory registration). Nothing is added when the spec is invalid.
    pub fn add_spec(
        &mut self,
        s: &spec::Spec,
        mut gid_for: impl FnMut(&mut Hierarchy, &Entity) -> Result<Gid, String>,
    ) -> Result<HashMap<String, Gid>, spec::SpecError> {
        let order = s.registration_order()?;
        let mut staged = self.clone();
        let mut labels: HashMap<String, Gid> = HashMap::new();
        for i in order {
            let d = &s.domains[i];
            let err = |msg: String| spec::SpecError {
                line: d.line,
                col: d.col,
                msg,
            };
            let ancestor = d.ancestor.as_ref().map(|r| labels[&r.label]);
            let originals: Vec<Gid> = d.originals.iter().map(|r| labels[&r.label]).collect();
            let node = d.host.is_some()
                || d.props
                    .iter()
                    .any(|p| p.name == "CPU" && matches!(p.value, PropValue::Acc(..)));
            let mut e = Entity {
                gid: Gid::NONE,
                kind: EntityType::Domain,
                name: d.name.clone(),
                ancestor,
                originals,
                props: d.props.clone(),
                acl: Acl::Public,
                owner: 0,
                creator: Gid::NONE,
                physical: true,
                node,
            };
            e.gid = gid_for(&mut staged, &e).map_err(&err)?;
            if let Some(l) = &d.label {
                labels.insert(l.clone(), e.gid);
            }
            staged.insert(e);
        }
        *self = staged;
        Ok(labels)
    }

    /// The directory attributes of an entity: `tipo`, `nome`, `ascend` (gid, u64 LE),
    /// `originals` (one attribute: a list of u64 LE gids), `creator`, and one attribute per
    /// own property (`op_index u16 | payload`).
    pub fn entity_attrs(e: &Entity) -> Result<AttrList, DirError> {
        let mut pairs: Vec<(String, Vec<u8>)> = vec![
            ("tipo".into(), e.kind.tipo().as_bytes().to_vec()),
            ("nome".into(), e.name.as_bytes().to_vec()),
        ];
        if let Some(a) = e.ancestor {
            pairs.push(("ascend".into(), a.0.to_le_bytes().to_vec()));
        }
        if !e.originals.is_empty() {
            pairs.push((
                "originals".into(),
                e.originals.iter().flat_map(|g| g.0.to_le_bytes()).collect(),
            ));
        }
        if e.creator != Gid::NONE {
            pairs.push(("creator".into(), e.creator.0.to_le_bytes().to_vec()));
        }
        for p in &e.props {
            if matches!(
                p.name.as_str(),
                "tipo" | "nome" | "ascend" | "originals" | "creator"
            ) {
                return Err(meu(format!(
                    "property name {:?} is reserved for the entity record",
                    p.name
                )));
            }
            pairs.push((p.name.clone(), p.encode_value()));
        }
        AttrList::from_pairs(pairs)
    }

    /// Parses nothing: registers every domain of `s` in `dir` (as `cred`, bound to the
    /// server's own context, as the resident `meu-phyparse` does) in topological order of
    /// labels, and returns the hierarchy and label map. Nothing is registered when the spec
    /// is invalid.
    pub fn register_spec(
        s: &spec::Spec,
        dir: &mut Directory,
        cred: Cred,
    ) -> Result<(Hierarchy, HashMap<String, Gid>), spec::SpecError> {
        s.registration_order()?;
        let mut h = Hierarchy::default();
        let labels = h.add_spec(s, |_, e| {
            let attrs = Hierarchy::entity_attrs(e).map_err(|x| x.to_string())?;
            dir.register(cred, Gid::NONE, attrs, Acl::Public, false)
                .map(|r| r.gid)
                .map_err(|x| x.to_string())
        })?;
        Ok((h, labels))
    }

    // ----- creation and the chaining rules -----

    /// Creates an entity as `cred`, enforcing ACLs, the five chaining rules, the two alias
    /// rules and capacity for `X'`/`X''` properties. Nothing changes on error.
    pub fn create(&mut self, cred: Cred, n: NewEntity) -> Result<Gid, DirError> {
        self.check_create(cred, &n)?;
        self.check_capacity(&n)?;
        let gid = self.next_gid()?;
        let node = false;
        self.insert(Entity {
            gid,
            kind: n.kind,
            name: n.name,
            ancestor: Some(n.parent),
            originals: n.originals,
            props: n.props,
            acl: n.acl,
            owner: cred.uid,
            creator: n.creator,
            physical: false,
            node,
        });
        Ok(gid)
    }

    fn check_create(&self, cred: Cred, n: &NewEntity) -> Result<(), DirError> {
        use EntityType::*;
        let parent = self.visible(cred, n.parent, "ancestor")?;
        for o in &n.originals {
            self.visible(cred, *o, "original")?;
        }
        let k = n.kind;
        let what = format!(
            "cannot create {} {:?} under {:?}",
            k.tipo(),
            n.name,
            parent.name
        );
        // rule 1
        if parent.kind.is_leaf() {
            return Err(meu(format!(
                "{what}: rule 1 — a {} is always a leaf",
                parent.kind.tipo()
            )));
        }
        // rule 5
        if parent.kind == Aggregator
            && !(k == Block || (k == Aggregator && !n.originals.is_empty()))
        {
            return Err(meu(format!(
                "{what}: rule 5 — an aggregator may only have memory blocks (aliases) as descendants"
            )));
        }
        if k == Subtractor && parent.kind != Domain {
            return Err(meu(format!(
                "{what}: a subtractor must be created under a domain"
            )));
        }
        let alias = !n.originals.is_empty();
        if alias {
            if k == Subtractor {
                return Err(meu(format!("{what}: a subtractor cannot be an alias")));
            }
            if n.originals.len() > 1 && k != Domain {
                return Err(meu(format!(
                    "{what}: alias rule 1 — only domains may have several originals"
                )));
            }
            for o in &n.originals {
                let ok = self.ents[o].kind;
                let allowed = if k == Domain {
                    matches!(ok, Domain | Mailbox | Operon | Task)
                } else {
                    ok == k
                };
                if !allowed {
                    return Err(meu(format!(
                        "{what}: alias rule 2 — a {} alias cannot have a {} as original",
                        k.tipo(),
                        ok.tipo()
                    )));
                }
            }
        }
        let chain = self.pseudo_ancestry(n.parent);
        let has =
            |f: &dyn Fn(&Entity) -> bool| chain.iter().any(|g| self.ents.get(g).is_some_and(f));
        // rule 4 (also for aliases)
        if k == Operon && has(&|e| e.kind == Operon) {
            return Err(meu(format!(
                "{what}: rule 4 — no operon may have another operon in its ancestor chain"
            )));
        }
        if !alias {
            // rule 2
            if matches!(k, Task | Block) && !has(&|e| e.kind == Operon) {
                return Err(meu(format!(
                    "{what}: rule 2 — the ancestor chain of a {} must contain an operon",
                    k.tipo()
                )));
            }
            // rule 3
            if matches!(k, Operon | Aggregator | Mailbox) && !has(&|e| e.kind == Domain && e.node) {
                return Err(meu(format!(
                    "{what}: rule 3 — the ancestor chain of a {} must contain a node domain",
                    k.tipo()
                )));
            }
        }
        let mut names = HashSet::new();
        for p in &n.props {
            if !names.insert(&p.name) {
                return Err(meu(format!("property {:?} given twice", p.name)));
            }
        }
        Ok(())
    }

    /// For each `X'`/`X''` property of `n`: the nearest real ancestor owning `X` must have
    /// at least that much free (`X − X' − X''` over its whole subtree).
    fn check_capacity(&self, n: &NewEntity) -> Result<(), DirError> {
        for p in &n.props {
            let (base, primes) = strip_usage(&p.name);
            if primes == 0 {
                continue;
            }
            let PropValue::Acc(_, amount) = p.value else {
                return Err(meu(format!(
                    "usage property {:?} needs an integer value",
                    p.name
                )));
            };
            let holder = self.holder_of(n.parent, base).ok_or_else(|| {
                meu(format!(
                    "{:?}: no ancestor of {} provides {base:?} to allocate from",
                    p.name, n.parent
                ))
            })?;
            let free = self.free(holder, base);
            if free < amount {
                return Err(meu(format!(
                    "capacity: {:?} has {free} {base} free, {amount} requested by {:?}",
                    self.ents[&holder].name, p.name
                )));
            }
        }
        Ok(())
    }

    /// The nearest entity on the real ancestor chain from `g` (inclusive) that owns `base`.
    pub fn holder_of(&self, mut g: Gid, base: &str) -> Option<Gid> {
        loop {
            let e = self.ents.get(&g)?;
            if e.props.iter().any(|p| p.name == base) {
                return Some(g);
            }
            g = e.ancestor?;
        }
    }

    /// Free amount of `base` at `g`: `P(g)[X] − P(g)[X'] − P(g)[X'']`.
    pub fn free(&self, g: Gid, base: &str) -> i64 {
        let p = self.properties(g);
        p.get(base).unwrap_or(0)
            - p.get(&format!("{base}'")).unwrap_or(0)
            - p.get(&format!("{base}''")).unwrap_or(0)
    }

    /// Deletes a leaf entity created by `cred` (e.g. to release an allocation).
    pub fn remove(&mut self, cred: Cred, g: Gid) -> Result<(), DirError> {
        let e = self.visible(cred, g, "entity")?;
        if e.owner != cred.uid {
            return Err(DirError::PermissionDenied(format!(
                "entity {g} belongs to uid {}",
                e.owner
            )));
        }
        if !self.descendants(g).is_empty() || !self.aliases(g).is_empty() {
            return Err(meu(format!(
                "entity {g} still has descendants or aliases; remove them first"
            )));
        }
        let e = self
            .ents
            .remove(&g)
            .ok_or_else(|| meu(format!("entity {g} does not exist")))?;
        match e.ancestor {
            Some(a) => {
                if let Some(v) = self.children.get_mut(&a) {
                    v.retain(|x| *x != g);
                }
            }
            None => self.roots.retain(|x| *x != g),
        }
        for o in &e.originals {
            if let Some(v) = self.aliases.get_mut(o) {
                v.retain(|x| *x != g);
            }
        }
        Ok(())
    }

    // ----- the property algebra (Fig. 4.5) -----

    /// OP(x) tagged with x.
    pub fn op_bag(&self, x: Gid) -> Bag {
        self.ents
            .get(&x)
            .map(|e| e.props.iter().map(|p| (p.clone(), x)).collect())
            .unwrap_or_default()
    }

    /// IP(x): own and inherited properties of the ancestor and of the ancestor's originals.
    pub fn ip_bag(&self, x: Gid) -> Bag {
        let mut seen = HashSet::new();
        self.ip_inner(x, &mut seen)
    }

    fn ip_inner(&self, x: Gid, seen: &mut HashSet<Gid>) -> Bag {
        let mut p = Bag::new();
        if !seen.insert(x) {
            return p;
        }
        if let Some(y) = self.ents.get(&x).and_then(|e| e.ancestor) {
            let mut zs = vec![y];
            zs.extend(self.originals(y).iter().copied());
            for z in zs {
                p.extend(self.op_bag(z));
                p.extend(self.ip_inner(z, seen));
            }
        }
        p
    }

    /// SiP(x): properties synthesized from the subtree (descendants and their originals).
    pub fn sip_bag(&self, x: Gid) -> Bag {
        let mut seen = HashSet::new();
        self.sip_inner(x, &mut seen)
    }

    fn sip_inner(&self, x: Gid, seen: &mut HashSet<Gid>) -> Bag {
        let mut p = Bag::new();
        if !seen.insert(x) {
            return p;
        }
        let ds = self.descendants(x);
        let mut all: Vec<Gid> = ds.to_vec();
        for y in ds {
            all.extend(self.originals(*y).iter().copied());
        }
        for y in all {
            p.extend(self.op_bag(y));
            p.extend(self.sip_inner(y, seen));
        }
        p
    }

    /// ShP(x): everything of x's originals (P before ∇).
    pub fn shp_bag(&self, x: Gid) -> Bag {
        let mut p = Bag::new();
        for y in self.originals(x) {
            p.extend(self.p_bag(*y));
        }
        p
    }

    /// OP ∪ IP ∪ SiP ∪ ShP of x, before ∇.
    pub fn p_bag(&self, x: Gid) -> Bag {
        let mut seen = HashSet::new();
        self.p_inner(x, &mut seen)
    }

    fn p_inner(&self, x: Gid, seen: &mut HashSet<Gid>) -> Bag {
        let mut p = Bag::new();
        if !seen.insert(x) {
            return p;
        }
        p.extend(self.op_bag(x));
        p.extend(self.ip_bag(x));
        p.extend(self.sip_bag(x));
        for y in self.originals(x).to_vec() {
            p.extend(self.p_inner(y, seen));
        }
        p
    }

    /// P(x) = ∇(OP(x) ∪ IP(x) ∪ SiP(x) ∪ ShP(x)).
    pub fn properties(&self, x: Gid) -> PropSet {
        accumulate(&self.p_bag(x))
    }

    fn own_and_orig(&self, x: Gid, with_ip: bool) -> PropSet {
        let mut bag = Bag::new();
        for y in self.originals(x) {
            bag.extend(self.op_bag(*y));
            bag.extend(self.ip_bag(*y));
        }
        bag.extend(self.op_bag(x));
        if with_ip {
            bag.extend(self.ip_bag(x));
        }
        accumulate(&bag)
    }

    // ----- lookup (Fig. 4.7) and lookup_aggreg (Fig. 4.8) -----

    /// `meu_lookup`: depth-first from `x`, the first entity whose name and kind match (when
    /// given) and whose own + inherited + originals' properties satisfy `prps` (requirements
    /// met higher up are not re-checked below). Synthesized properties are not used: every
    /// descendant of the returned entity has the requested properties.
    pub fn lookup(
        &self,
        x: Gid,
        name: Option<&str>,
        kind: Option<EntityType>,
        prps: &PropSet,
    ) -> Option<Gid> {
        let mut seen = HashSet::new();
        self.lk(x, name, kind, prps, false, &mut seen)
    }

    fn lk(
        &self,
        x: Gid,
        name: Option<&str>,
        kind: Option<EntityType>,
        prps: &PropSet,
        fromwithin: bool,
        seen: &mut HashSet<Gid>,
    ) -> Option<Gid> {
        if !seen.insert(x) {
            return None;
        }
        let e = self.ents.get(&x)?;
        let p = if prps.is_empty() {
            PropSet::new()
        } else {
            self.own_and_orig(x, !fromwithin)
        };
        let info = name.is_none_or(|n| n == e.name) && kind.is_none_or(|k| k == e.kind);
        if info && prps.satisfied_by(&p) {
            return Some(x);
        }
        let rest = prps.minus(&p);
        for &y in self.descendants(x) {
            if let Some(z) = self.lk(y, name, kind, &rest, true, seen) {
                return Some(z);
            }
        }
        None
    }

    /// `meu_lookup_aggreg`: the set of entities under `x` that satisfy `p1` throughout
    /// their subtrees, if together they satisfy `p2`. One entity is returned as is; several
    /// are joined under a new alias domain named `name` with properties `prps`, created under
    /// `x` as `cred` (a view). `Ok(None)` when nothing qualifies.
    pub fn lookup_aggreg(
        &mut self,
        cred: Cred,
        x: Gid,
        p1: &PropSet,
        p2: &PropSet,
        name: &str,
        prps: Vec<Property>,
    ) -> Result<Option<Gid>, DirError> {
        self.visible(cred, x, "domain")?;
        let ip = accumulate(&self.ip_bag(x));
        let l = self.lk_set(x, &p1.minus(&ip), &mut HashSet::new());
        if l.is_empty() {
            return Ok(None);
        }
        let mut bag = Bag::new();
        for &y in &l {
            bag.extend(self.p_bag(y));
        }
        let p3 = accumulate(&bag);
        if !p2.satisfied_by(&p3) {
            return Ok(None);
        }
        if l.len() == 1 {
            return Ok(Some(l[0]));
        }
        let g = self.create(
            cred,
            NewEntity::new(EntityType::Domain, name, x)
                .alias_of(l)
                .with_props(prps),
        )?;
        Ok(Some(g))
    }

    fn lk_set(&self, x: Gid, p: &PropSet, seen: &mut HashSet<Gid>) -> Vec<Gid> {
        if !seen.insert(x) {
            return vec![];
        }
        let p1 = self.own_and_orig(x, false);
        if p.satisfied_by(&p1) {
            return vec![x];
        }
        let rest = p.minus(&p1);
        let ds = self.descendants(x).to_vec();
        if ds.is_empty() {
            return vec![];
        }
        let mut l = vec![];
        for y in &ds {
            for z in self.lk_set(*y, &rest, seen) {
                if !l.contains(&z) {
                    l.push(z);
                }
            }
        }
        if l == ds {
            vec![x]
        } else {
            l
        }
    }

    /// True when view `g` guarantees `amount` free units of `base` (`X − X' − X'' ≥ amount`).
    pub fn guarantees(&self, g: Gid, base: &str, amount: i64) -> bool {
        self.free(g, base) >= amount
    }

    /// Creates a view (alias domain over `originals` under `parent`) and, in the same step,
    /// reserves `amount` of each `(base, amount)` on the entities beneath the originals that
    /// own `base` (first fit, one subtractor per entity used). All or nothing.
    pub fn create_view_and_reserve(
        &mut self,
        cred: Cred,
        parent: Gid,
        name: &str,
        originals: Vec<Gid>,
        reserve: &[(String, i64)],
    ) -> Result<(Gid, Vec<Gid>), DirError> {
        let mut staged = self.clone();
        let view = staged.create(
            cred,
            NewEntity::new(EntityType::Domain, name, parent).alias_of(originals.clone()),
        )?;
        let mut subs = vec![];
        for (base, amount) in reserve {
            let mut left = *amount;
            let mut holders = vec![];
            for o in &originals {
                staged.collect_holders(*o, base, &mut holders);
            }
            for hld in holders {
                if left <= 0 {
                    break;
                }
                let take = staged.free(hld, base).min(left);
                if take <= 0 {
                    continue;
                }
                let s = staged.create(
                    cred,
                    NewEntity::new(EntityType::Subtractor, format!("{name}:{base}"), hld)
                        .with_props(vec![Property::sum(format!("{base}''"), take)]),
                )?;
                subs.push(s);
                left -= take;
            }
            if left > 0 {
                return Err(meu(format!(
                    "cannot reserve {amount} {base} for view {name:?}: {left} short"
                )));
            }
        }
        *self = staged;
        Ok((view, subs))
    }

    fn collect_holders(&self, g: Gid, base: &str, out: &mut Vec<Gid>) {
        if let Some(e) = self.ents.get(&g) {
            if e.props.iter().any(|p| p.name == base) {
                if !out.contains(&g) {
                    out.push(g);
                }
                return;
            }
            for o in e.originals.clone() {
                self.collect_holders(o, base, out);
            }
            for d in self.descendants(g).to_vec() {
                self.collect_holders(d, base, out);
            }
        }
    }
}

/// A hierarchy behind a lock: every creation (capacity check + insert) is one atomic step,
/// so concurrent allocators cannot over-commit.
#[derive(Debug, Default)]
pub struct SharedHierarchy {
    inner: RwLock<Hierarchy>,
}

impl SharedHierarchy {
    /// Wraps a hierarchy.
    pub fn new(h: Hierarchy) -> Self {
        SharedHierarchy {
            inner: RwLock::new(h),
        }
    }

    /// Creates an entity atomically (see [`Hierarchy::create`]).
    pub fn create(&self, cred: Cred, n: NewEntity) -> Result<Gid, DirError> {
        self.write(|h| h.create(cred, n))
    }

    /// Atomic [`Hierarchy::create_view_and_reserve`].
    pub fn create_view_and_reserve(
        &self,
        cred: Cred,
        parent: Gid,
        name: &str,
        originals: Vec<Gid>,
        reserve: &[(String, i64)],
    ) -> Result<(Gid, Vec<Gid>), DirError> {
        self.write(|h| h.create_view_and_reserve(cred, parent, name, originals, reserve))
    }

    /// Runs `f` with shared access.
    pub fn read<R>(&self, f: impl FnOnce(&Hierarchy) -> R) -> R {
        f(&self.inner.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Runs `f` with exclusive access.
    pub fn write<R>(&self, f: impl FnOnce(&mut Hierarchy) -> R) -> R {
        f(&mut self.inner.write().unwrap_or_else(|e| e.into_inner()))
    }
}
