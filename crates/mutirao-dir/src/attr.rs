//! Attributes, query attributes and canonical attribute lists.

use crate::error::DirError;

/// Longest attribute name in bytes.
pub const MAX_NAME_LEN: usize = 255;
/// Largest attribute value in bytes.
pub const MAX_VALUE_LEN: usize = 64 * 1024;
/// Most attributes in one list.
pub const MAX_ATTRS: usize = 1024;
/// Prefix of the reserved system namespace (ACLs, contexts, errors); never readable by users.
pub const SYS_PREFIX: &str = "sys.";

/// An attribute's value: fully specified bytes, or a query slot asking for up to `len` bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AttrValue {
    /// A full value.
    Full(Vec<u8>),
    /// A partial (query) attribute: "give me this attribute's value", up to `len` bytes.
    Want {
        /// Maximum value length the caller accepts; longer values are truncated.
        len: u32,
    },
}

/// One attribute: a UTF-8 name and a byte value (or a [`AttrValue::Want`] slot).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attr {
    /// The attribute name.
    pub name: String,
    /// The value or query slot.
    pub value: AttrValue,
}

impl Attr {
    /// A fully specified attribute.
    pub fn full(name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Attr {
            name: name.into(),
            value: AttrValue::Full(value.into()),
        }
    }

    /// A query attribute asking for the value of `name`, at most `len` bytes.
    pub fn want(name: impl Into<String>, len: u32) -> Self {
        Attr {
            name: name.into(),
            value: AttrValue::Want { len },
        }
    }

    /// The full value, if this is not a query slot.
    pub fn bytes(&self) -> Option<&[u8]> {
        match &self.value {
            AttrValue::Full(v) => Some(v),
            AttrValue::Want { .. } => None,
        }
    }

    /// True when the name is in the reserved system namespace.
    pub fn is_system(&self) -> bool {
        self.name.starts_with(SYS_PREFIX)
    }
}

/// An attribute list in canonical order (sorted by name, names unique).
///
/// Canonical order makes hashing and uniqueness deterministic: two lists with the same
/// attributes compare equal and encode to the same bytes whatever order they were built in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AttrList {
    attrs: Vec<Attr>,
}

impl AttrList {
    /// An empty list.
    pub fn new() -> Self {
        AttrList::default()
    }

    /// Builds a canonical list, checking limits and duplicate names.
    pub fn from_attrs(attrs: impl IntoIterator<Item = Attr>) -> Result<Self, DirError> {
        let mut l = AttrList::new();
        for a in attrs {
            l.insert(a)?;
        }
        Ok(l)
    }

    /// A list of full attributes from `(name, value)` pairs.
    pub fn from_pairs<N: Into<String>, V: Into<Vec<u8>>>(
        pairs: impl IntoIterator<Item = (N, V)>,
    ) -> Result<Self, DirError> {
        Self::from_attrs(pairs.into_iter().map(|(n, v)| Attr::full(n, v)))
    }

    /// Inserts an attribute at its canonical place. Rejects duplicate names and oversized input.
    pub fn insert(&mut self, a: Attr) -> Result<(), DirError> {
        check_attr(&a)?;
        if self.attrs.len() >= MAX_ATTRS {
            return Err(DirError::TooLarge(format!(
                "more than {MAX_ATTRS} attributes in one list"
            )));
        }
        match self
            .attrs
            .binary_search_by(|x| x.name.as_str().cmp(&a.name))
        {
            Ok(_) => Err(DirError::BadAttrs(format!(
                "attribute {:?} appears twice; each name may appear once",
                a.name
            ))),
            Err(pos) => {
                self.attrs.insert(pos, a);
                Ok(())
            }
        }
    }

    /// Removes and returns the attribute called `name`.
    pub fn remove(&mut self, name: &str) -> Option<Attr> {
        match self.attrs.binary_search_by(|x| x.name.as_str().cmp(name)) {
            Ok(pos) => Some(self.attrs.remove(pos)),
            Err(_) => None,
        }
    }

    /// The attribute called `name`.
    pub fn get(&self, name: &str) -> Option<&Attr> {
        self.attrs
            .binary_search_by(|x| x.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.attrs[i])
    }

    /// The full value of `name`.
    pub fn value(&self, name: &str) -> Option<&[u8]> {
        self.get(name).and_then(Attr::bytes)
    }

    /// Attributes in canonical order.
    pub fn iter(&self) -> std::slice::Iter<'_, Attr> {
        self.attrs.iter()
    }

    /// Number of attributes.
    pub fn len(&self) -> usize {
        self.attrs.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.attrs.is_empty()
    }

    /// True when every attribute is fully specified.
    pub fn is_full(&self) -> bool {
        self.attrs.iter().all(|a| a.bytes().is_some())
    }

    /// True when some attribute is in the system namespace.
    pub fn has_system(&self) -> bool {
        self.attrs.iter().any(Attr::is_system)
    }

    /// The list without system attributes (what a user may see).
    pub fn without_system(&self) -> AttrList {
        AttrList {
            attrs: self
                .attrs
                .iter()
                .filter(|a| !a.is_system())
                .cloned()
                .collect(),
        }
    }

    /// Consumes the list into its attributes.
    pub fn into_vec(self) -> Vec<Attr> {
        self.attrs
    }

    pub(crate) fn from_sorted_unchecked(attrs: Vec<Attr>) -> Self {
        AttrList { attrs }
    }
}

impl<'a> IntoIterator for &'a AttrList {
    type Item = &'a Attr;
    type IntoIter = std::slice::Iter<'a, Attr>;
    fn into_iter(self) -> Self::IntoIter {
        self.attrs.iter()
    }
}

/// Checks one attribute against the size limits.
pub fn check_attr(a: &Attr) -> Result<(), DirError> {
    if a.name.is_empty() {
        return Err(DirError::BadAttrs("attribute with an empty name".into()));
    }
    if a.name.len() > MAX_NAME_LEN {
        return Err(DirError::TooLarge(format!(
            "name {:?}… is {} bytes, the limit is {MAX_NAME_LEN}",
            a.name.chars().take(16).collect::<String>(),
            a.name.len()
        )));
    }
    let len = match &a.value {
        AttrValue::Full(v) => v.len(),
        AttrValue::Want { len } => *len as usize,
    };
    if len > MAX_VALUE_LEN {
        return Err(DirError::TooLarge(format!(
            "value of {:?} is {len} bytes, the limit is {MAX_VALUE_LEN}",
            a.name
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_order_independent_of_insertion() {
        let a = AttrList::from_pairs([("b", "2"), ("a", "1"), ("c", "3")]).unwrap();
        let b = AttrList::from_pairs([("c", "3"), ("b", "2"), ("a", "1")]).unwrap();
        assert_eq!(a, b);
        let names: Vec<_> = a.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn rejects_duplicates_and_oversize() {
        assert!(matches!(
            AttrList::from_pairs([("a", "1"), ("a", "2")]),
            Err(DirError::BadAttrs(_))
        ));
        let big = vec![0u8; MAX_VALUE_LEN + 1];
        assert!(matches!(
            AttrList::from_pairs([("a", big)]),
            Err(DirError::TooLarge(_))
        ));
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(
            AttrList::from_pairs([(long, "v")]),
            Err(DirError::TooLarge(_))
        ));
    }
}
