//! Memory aggregators (digest 002 §2.3.5): a map ⟨start, size, target⟩ that chains memory
//! blocks (and, with a fixed fraction, other aggregators) into one global address space, and
//! windows that copy a range of that space from (`get`) and to (`put`) the blocks.
//!
//! Blocks appended in order are laid out contiguously. An inner aggregator must be added with
//! an explicit fraction (offset, length) so that its later growth does not shift what follows
//! it in the outer one.

use crate::error::DirError;
use crate::gid::Gid;
use std::collections::HashMap;

/// What a map entry points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A memory block.
    Block(Gid),
    /// Another aggregator (through a fixed fraction).
    Aggregator(Gid),
}

/// One mapping: global `[start, start+len)` ↦ `target[offset, offset+len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapEntry {
    /// Start in the global space.
    pub start: u64,
    /// Length.
    pub len: u64,
    /// Mapped entity.
    pub target: Target,
    /// Offset inside the target.
    pub offset: u64,
}

/// An aggregator's map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AggregatorMap {
    entries: Vec<MapEntry>,
}

impl AggregatorMap {
    /// An empty map (size 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// Current size of the global space (the end of the furthest entry).
    pub fn size(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| e.start + e.len)
            .max()
            .unwrap_or(0)
    }

    /// The entries in order of addition.
    pub fn entries(&self) -> &[MapEntry] {
        &self.entries
    }

    /// Appends a whole block at the end: start = current size.
    pub fn append_block(&mut self, block: Gid, size: u64) -> MapEntry {
        let e = MapEntry {
            start: self.size(),
            len: size,
            target: Target::Block(block),
            offset: 0,
        };
        self.entries.push(e);
        e
    }

    /// Maps `len` bytes of `target` from `offset` at global position `at` (end when None).
    /// Overlapping an existing entry is an error.
    pub fn map(
        &mut self,
        target: Target,
        offset: u64,
        len: u64,
        at: Option<u64>,
    ) -> Result<MapEntry, DirError> {
        if len == 0 {
            return Err(DirError::Meu("cannot map an empty fraction".into()));
        }
        let start = at.unwrap_or_else(|| self.size());
        let end = start
            .checked_add(len)
            .ok_or_else(|| DirError::Meu("mapping overflows the address space".into()))?;
        if let Some(o) = self
            .entries
            .iter()
            .find(|e| start < e.start + e.len && e.start < end)
        {
            return Err(DirError::Meu(format!(
                "[{start}, {end}) overlaps the mapping at [{}, {})",
                o.start,
                o.start + o.len
            )));
        }
        let e = MapEntry {
            start,
            len,
            target,
            offset,
        };
        self.entries.push(e);
        Ok(e)
    }
}

/// A piece of a resolved range: `len` bytes of `block` from `block_off`, at `window_off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The block.
    pub block: Gid,
    /// Offset in the block.
    pub block_off: u64,
    /// Offset in the window.
    pub window_off: u64,
    /// Length.
    pub len: u64,
}

/// Resolves global `[lo, hi)` of aggregator `aggr` into block pieces, through nested
/// aggregators. Unmapped holes are an error.
pub fn resolve(
    maps: &HashMap<Gid, AggregatorMap>,
    aggr: Gid,
    lo: u64,
    hi: u64,
) -> Result<Vec<Piece>, DirError> {
    let mut out = vec![];
    resolve_into(maps, aggr, lo, hi, 0, 0, &mut out)?;
    out.sort_by_key(|p| p.window_off);
    let mut at = 0;
    for p in &out {
        if p.window_off != at {
            return Err(DirError::Meu(format!(
                "global range [{}, {}) of aggregator {aggr} is not mapped",
                lo + at,
                lo + p.window_off
            )));
        }
        at += p.len;
    }
    if at != hi - lo {
        return Err(DirError::Meu(format!(
            "global range [{}, {hi}) of aggregator {aggr} is not mapped",
            lo + at
        )));
    }
    Ok(out)
}

fn resolve_into(
    maps: &HashMap<Gid, AggregatorMap>,
    aggr: Gid,
    lo: u64,
    hi: u64,
    window_base: u64,
    depth: usize,
    out: &mut Vec<Piece>,
) -> Result<(), DirError> {
    if depth > 32 {
        return Err(DirError::Meu(
            "aggregators nested more than 32 deep (a cycle?)".into(),
        ));
    }
    let m = maps
        .get(&aggr)
        .ok_or_else(|| DirError::Meu(format!("aggregator {aggr} has no map")))?;
    for e in &m.entries {
        let s = lo.max(e.start);
        let t = hi.min(e.start + e.len);
        if s >= t {
            continue;
        }
        let inner = e.offset + (s - e.start);
        let wo = window_base + (s - lo);
        match e.target {
            Target::Block(b) => out.push(Piece {
                block: b,
                block_off: inner,
                window_off: wo,
                len: t - s,
            }),
            Target::Aggregator(a) => {
                resolve_into(maps, a, inner, inner + (t - s), wo, depth + 1, out)?
            }
        }
    }
    Ok(())
}

/// Access to block memory (local bytes here; remote reads/writes over the runtime later).
pub trait BlockStore {
    /// Reads `buf.len()` bytes of `block` from `off`.
    fn read(&self, block: Gid, off: u64, buf: &mut [u8]) -> Result<(), DirError>;
    /// Writes `data` into `block` at `off`.
    fn write(&mut self, block: Gid, off: u64, data: &[u8]) -> Result<(), DirError>;
}

/// Blocks held in memory.
pub type MemBlocks = HashMap<Gid, Vec<u8>>;

fn range(b: &[u8], block: Gid, off: u64, len: usize) -> Result<std::ops::Range<usize>, DirError> {
    let s = usize::try_from(off).map_err(|_| DirError::Meu("offset too large".into()))?;
    let e = s
        .checked_add(len)
        .filter(|&e| e <= b.len())
        .ok_or_else(|| {
            DirError::Meu(format!(
                "block {block}: range [{s}, {}) beyond its {} bytes",
                s + len,
                b.len()
            ))
        })?;
    Ok(s..e)
}

impl BlockStore for MemBlocks {
    fn read(&self, block: Gid, off: u64, buf: &mut [u8]) -> Result<(), DirError> {
        let b = self
            .get(&block)
            .ok_or_else(|| DirError::Meu(format!("block {block} does not exist")))?;
        let r = range(b, block, off, buf.len())?;
        buf.copy_from_slice(&b[r]);
        Ok(())
    }
    fn write(&mut self, block: Gid, off: u64, data: &[u8]) -> Result<(), DirError> {
        let b = self
            .get_mut(&block)
            .ok_or_else(|| DirError::Meu(format!("block {block} does not exist")))?;
        let r = range(b, block, off, data.len())?;
        b[r].copy_from_slice(data);
        Ok(())
    }
}

/// A local contiguous window on `[lo, hi)` of an aggregator's global space.
#[derive(Clone, Debug)]
pub struct Window {
    /// Lower bound (inclusive).
    pub lo: u64,
    /// Upper bound (exclusive).
    pub hi: u64,
    /// The local copy.
    pub data: Vec<u8>,
    pieces: Vec<Piece>,
}

impl Window {
    /// Maps `[lo, hi)` of `aggr` (content zeroed until [`Window::get`]).
    pub fn map(
        maps: &HashMap<Gid, AggregatorMap>,
        aggr: Gid,
        lo: u64,
        hi: u64,
    ) -> Result<Window, DirError> {
        if hi < lo {
            return Err(DirError::Meu(format!("window [{lo}, {hi}) is reversed")));
        }
        let pieces = resolve(maps, aggr, lo, hi)?;
        let n = usize::try_from(hi - lo).map_err(|_| DirError::Meu("window too large".into()))?;
        Ok(Window {
            lo,
            hi,
            data: vec![0; n],
            pieces,
        })
    }

    /// Refreshes the window from the blocks.
    pub fn get(&mut self, store: &impl BlockStore) -> Result<(), DirError> {
        for p in &self.pieces {
            let s = p.window_off as usize;
            store.read(p.block, p.block_off, &mut self.data[s..s + p.len as usize])?;
        }
        Ok(())
    }

    /// Writes the window back to the blocks.
    pub fn put(&self, store: &mut impl BlockStore) -> Result<(), DirError> {
        for p in &self.pieces {
            let s = p.window_off as usize;
            store.write(p.block, p.block_off, &self.data[s..s + p.len as usize])?;
        }
        Ok(())
    }
}
