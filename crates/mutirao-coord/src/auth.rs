//! Principals and their tokens. Users and agents are distinct kinds: a user submits, reads and
//! cancels its own jobs; an agent reports its host and appends the output of the jobs it runs.
//!
//! A token file has one principal a line, `KIND NAME TOKEN` (`user ana 6f1c…`,
//! `agent n1 90ab…`); `#` starts a comment. Tokens are kept only as SHA-256 digests. A request's
//! token is hashed and its digest looked up in a map, then compared with the entry found in
//! constant time: the time taken depends only on the digest of what the caller sent, which
//! tells the caller nothing about any stored token (finding a token from its digest is a
//! preimage attack on SHA-256). The lookup costs the same with 10 or 10 000 principals.

use crate::{Error, Result};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::Path;
use subtle::ConstantTimeEq;

/// Shortest token accepted (a guessable token is no authentication).
pub const MIN_TOKEN_LEN: usize = 16;

/// What kind of principal a request speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A person submitting jobs.
    User,
    /// A host's agent.
    Agent,
}

impl Kind {
    /// Its name in a token file.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::User => "user",
            Kind::Agent => "agent",
        }
    }
}

/// Who a request speaks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    /// User or agent.
    pub kind: Kind,
    /// The user's name, or the agent's host name.
    pub name: String,
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind.as_str(), self.name)
    }
}

/// The principals a coordinator knows.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    entries: HashMap<[u8; 32], Principal>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// No principals (every request is refused).
    pub fn new() -> Tokens {
        Tokens::default()
    }

    /// Add a principal with its token.
    pub fn add(&mut self, kind: Kind, name: &str, token: &str) -> Result<()> {
        if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::Invalid(format!(
                "principal name {name:?} must be non-empty, without spaces or control characters"
            )));
        }
        if token.len() < MIN_TOKEN_LEN || token.chars().any(|c| c.is_whitespace()) {
            return Err(Error::Invalid(format!(
                "the token of {} {name} must be at least {MIN_TOKEN_LEN} characters without spaces (make one with `head -c 24 /dev/urandom | base64`)",
                kind.as_str()
            )));
        }
        let d = digest(token);
        if self.entries.contains_key(&d) {
            return Err(Error::Invalid(format!(
                "the token of {} {name} is already another principal's; every principal needs its own",
                kind.as_str()
            )));
        }
        self.entries.insert(
            d,
            Principal {
                kind,
                name: name.to_string(),
            },
        );
        Ok(())
    }

    /// Parse a token file's text.
    pub fn parse(text: &str) -> Result<Tokens> {
        let mut t = Tokens::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let kind = match f.first().copied() {
                Some("user") => Kind::User,
                Some("agent") => Kind::Agent,
                _ => {
                    return Err(Error::Invalid(format!(
                        "token file line {}: expected `user NAME TOKEN` or `agent NAME TOKEN`",
                        i + 1
                    )))
                }
            };
            if f.len() != 3 {
                return Err(Error::Invalid(format!(
                    "token file line {}: expected 3 fields (KIND NAME TOKEN), found {}",
                    i + 1,
                    f.len()
                )));
            }
            t.add(kind, f[1], f[2])
                .map_err(|e| Error::Invalid(format!("token file line {}: {e}", i + 1)))?;
        }
        Ok(t)
    }

    /// Read a token file.
    pub fn load(path: &Path) -> Result<Tokens> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Io(format!("cannot read token file {}: {e}", path.display())))?;
        Tokens::parse(&text).map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))
    }

    /// How many principals.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No principals.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The principal whose token this is (see the module's note on timing).
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let d = digest(token);
        let (stored, p) = self.entries.get_key_value(&d)?;
        bool::from(stored.ct_eq(&d)).then(|| p.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_names_users_and_agents_and_bad_lines_are_refused() {
        let t = Tokens::parse(
            "# grid principals\nuser ana aaaaaaaaaaaaaaaaaaaa\nagent n1 bbbbbbbbbbbbbbbbbbbb # host n1\n",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.authenticate("aaaaaaaaaaaaaaaaaaaa"),
            Some(Principal {
                kind: Kind::User,
                name: "ana".into()
            })
        );
        assert_eq!(
            t.authenticate("bbbbbbbbbbbbbbbbbbbb").map(|p| p.kind),
            Some(Kind::Agent)
        );
        assert_eq!(t.authenticate("aaaaaaaaaaaaaaaaaaab"), None);
        assert_eq!(t.authenticate(""), None);
        let e = Tokens::parse("user ana short").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("at least 16"), "{e}");
        let e = Tokens::parse("root ana aaaaaaaaaaaaaaaaaaaa")
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected `user NAME TOKEN`"), "{e}");
        let e = Tokens::parse("user ana aaaaaaaaaaaaaaaaaaaa\nuser bia aaaaaaaaaaaaaaaaaaaa")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("its own"), "{e}");
    }
}
