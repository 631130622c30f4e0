//! The launcher ↔ agent protocol: newline-delimited JSON over TCP, mutually authenticated with a
//! shared secret (the agent token file) by HMAC-SHA256 challenge–response, then sealed
//! ([`mutirao::seal`]). The secret never crosses the wire.
//!
//! 1. agent → `{"op":"challenge","version":3,"nonce":N1}`
//! 2. launcher → `{"op":"auth","mac":HMAC(k,"mutirao-agent-client-v3",N1,N2),"nonce":N2}`
//! 3. agent → `{"op":"welcome","mac":HMAC(k,"mutirao-agent-server-v3",N2,N1),"host":…}` or
//!    `{"op":"error","msg":…}` and close.
//!
//!    From here on both directions are sealed records under keys derived from k, N1 and N2
//!    ([`SESSION_CONTEXT`]): every message is authenticated, numbered and encrypted, so a
//!    relay or a re-pointed address learns nothing (not the launch, not the job's environment)
//!    and can neither forge, replay nor reorder a message. The lines below travel inside them.
//! 4. launcher → `{"op":"launch",…}`; agent → `started`, `output`, `exit` events. The launcher
//!    may send `kill`. If the launcher's connection drops, the agent kills what it started.
//!
//!    Or, instead of `launch`: launcher → `{"op":"store","scope":S}`; agent → `{"op":"ready"}`,
//!    and from then on the session carries `mutirao_ckpt::remote` frames over the agent's
//!    checkpoint store, confined to the keys of scope S ([`checkpoint_scope`]: an HMAC of the
//!    job under its checkpoint key, which only the job's launcher holds).
//! 5. When the launch carries `heartbeat_ms`, both sides send `{"op":"heartbeat"}` at that
//!    period. The agent takes a launcher silent for [`HEARTBEAT_MISSES`] periods as gone and
//!    kills what it started; the launcher takes an agent silent for [`launcher_silence`] (2.5
//!    periods) as a lost host. A host whose network vanishes without closing its sockets is
//!    detected this way.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};

pub const AGENT_PROTOCOL: u32 = 3;
/// Heartbeat periods of silence after which a peer is taken as gone.
pub const HEARTBEAT_MISSES: u32 = 5;

/// How long the launcher waits without a word from an agent before it takes the host as lost:
/// 2.5 heartbeat periods (so the ranks that go on learn of it within 3), but never less than
/// one period plus a second, which a loaded machine may delay a heartbeat by.
pub fn launcher_silence(period: std::time::Duration) -> std::time::Duration {
    (period * 5 / 2).max(period + std::time::Duration::from_secs(1))
}
/// Longest line either side accepts.
pub const MAX_LINE: u64 = 4 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Msg {
    Challenge {
        version: u32,
        nonce: String,
    },
    Auth {
        mac: String,
        nonce: String,
    },
    Welcome {
        mac: String,
        host: String,
        cores: usize,
    },
    Error {
        msg: String,
    },
    Launch {
        program: String,
        args: Vec<String>,
        cwd: Option<String>,
        ranks: Vec<RankSpec>,
        /// Heartbeat period in milliseconds (none: no heartbeats, the session ends only when
        /// its socket closes).
        #[serde(default)]
        heartbeat_ms: Option<u64>,
    },
    /// "I am still here" (both directions, every `heartbeat_ms`).
    Heartbeat,
    /// Launcher → agent, instead of `launch`: turn this connection into a checkpoint blob
    /// session (`mutirao_ckpt::remote` framing) over the agent's store, confined to `scope`
    /// ([`checkpoint_scope`]: 64 hex digits only the job's launcher can name): the session sees
    /// only that scope's keys.
    Store {
        scope: String,
    },
    /// Agent → launcher: the blob session starts with the next byte.
    Ready,
    Started {
        rank: usize,
        pid: u32,
    },
    Output {
        rank: usize,
        stream: Stream,
        line: String,
    },
    Exit {
        rank: usize,
        code: Option<i32>,
        signal: Option<i32>,
    },
    Kill {
        signal: i32,
    },
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Out,
    Err,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankSpec {
    pub rank: usize,
    pub env: BTreeMap<String, String>,
}

/// Longest line an agent reads before the launcher has proved it holds the token.
pub const MAX_PRE_AUTH_LINE: u64 = 4 << 10;
/// Longest piece of a rank's output line sent as one [`Msg::Output`]: longer lines go as
/// several (escaped for JSON, a piece stays far below [`MAX_LINE`]).
pub const MAX_OUTPUT_PIECE: u64 = 64 << 10;
/// Time an agent gives a connection to complete the whole handshake.
pub const HANDSHAKE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

pub fn read_msg(r: &mut impl BufRead) -> Result<Option<Msg>, String> {
    read_msg_max(r, MAX_LINE)
}

/// [`read_msg`] of a line of at most `max` bytes.
pub fn read_msg_max(r: &mut impl BufRead, max: u64) -> Result<Option<Msg>, String> {
    let mut line = Vec::new();
    let n = std::io::Read::take(&mut *r, max + 1)
        .read_until(b'\n', &mut line)
        .map_err(|e| format!("read failed: {e}"))?;
    if n == 0 {
        return Ok(None);
    }
    if line.len() as u64 > max {
        return Err(format!("message longer than {max} bytes"));
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|e| format!("malformed message: {e}"))
}

/// A rank's output stream read as lines, a line longer than [`MAX_OUTPUT_PIECE`] as several
/// pieces (cut between UTF-8 characters, never inside one; the newline that ends a cut line
/// gives no empty piece of its own): memory stays bounded and no message grows too long.
#[derive(Debug)]
pub struct LinePieces<R> {
    r: std::io::BufReader<R>,
    carry: Vec<u8>,
    cut: bool,
}

impl<R: std::io::Read> LinePieces<R> {
    /// Pieces of `r`.
    pub fn new(r: R) -> Self {
        LinePieces {
            r: std::io::BufReader::new(r),
            carry: Vec::new(),
            cut: false,
        }
    }

    /// The next line or piece, without its newline; `None` at the end (or a read error).
    pub fn next_piece(&mut self) -> Option<String> {
        loop {
            let mut buf = std::mem::take(&mut self.carry);
            let room = MAX_OUTPUT_PIECE.saturating_sub(buf.len() as u64).max(1);
            let n = std::io::Read::take(&mut self.r, room)
                .read_until(b'\n', &mut buf)
                .unwrap_or(0);
            if n == 0 && buf.is_empty() {
                return None;
            }
            if buf.last() == Some(&b'\n') {
                buf.pop();
                let after_cut = std::mem::replace(&mut self.cut, false);
                if after_cut && buf.is_empty() {
                    continue;
                }
                return Some(String::from_utf8_lossy(&buf).into_owned());
            }
            // Cut (or the end of the stream): keep an unfinished character for the next piece.
            self.cut = n > 0;
            if let Err(e) = std::str::from_utf8(&buf) {
                if e.error_len().is_none() && n > 0 && e.valid_up_to() > 0 {
                    self.carry = buf.split_off(e.valid_up_to());
                }
            }
            return Some(String::from_utf8_lossy(&buf).into_owned());
        }
    }
}

/// A socket reader with a deadline for everything read through it (while one is set): each
/// read waits at most until the deadline, so a peer trickling a byte at a time cannot hold a
/// handshake open past it.
#[derive(Debug)]
pub struct DeadlineReader {
    sock: std::net::TcpStream,
    deadline: Option<std::time::Instant>,
}

impl DeadlineReader {
    /// Reads of `sock`, ended at `deadline` (none: the socket's own read timeout applies).
    pub fn new(sock: std::net::TcpStream, deadline: Option<std::time::Instant>) -> Self {
        DeadlineReader { sock, deadline }
    }

    /// Set or clear the deadline (clearing it leaves the socket's read timeout as it was set
    /// last: set the one wanted after it).
    pub fn set_deadline(&mut self, deadline: Option<std::time::Instant>) {
        self.deadline = deadline;
    }

    /// The socket.
    pub fn get_ref(&self) -> &std::net::TcpStream {
        &self.sock
    }
}

impl std::io::Read for DeadlineReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the handshake took too long",
                ));
            }
            self.sock.set_read_timeout(Some(left))?;
        }
        self.sock.read(buf)
    }
}

pub fn write_msg(w: &mut impl Write, m: &Msg) -> std::io::Result<()> {
    let mut s = serde_json::to_vec(m).map_err(std::io::Error::other)?;
    s.push(b'\n');
    w.write_all(&s)?;
    w.flush()
}

/// The launcher's proof that it holds the token: over the agent's nonce, then its own.
pub fn client_mac(secret: &[u8], agent_nonce: &str, launcher_nonce: &str) -> String {
    mutirao::seal::mac_hex(
        secret,
        CLIENT_LABEL,
        &[agent_nonce.as_bytes(), launcher_nonce.as_bytes()],
    )
}

/// The agent's proof that it holds the token: over the launcher's nonce, then its own.
pub fn server_mac(secret: &[u8], agent_nonce: &str, launcher_nonce: &str) -> String {
    mutirao::seal::mac_hex(
        secret,
        SERVER_LABEL,
        &[launcher_nonce.as_bytes(), agent_nonce.as_bytes()],
    )
}

/// Whether `mac` is the launcher's proof ([`client_mac`]).
pub fn verify_client(secret: &[u8], agent_nonce: &str, launcher_nonce: &str, mac: &str) -> bool {
    mutirao::seal::verify_hex(
        secret,
        CLIENT_LABEL,
        &[agent_nonce.as_bytes(), launcher_nonce.as_bytes()],
        mac,
    )
}

/// Whether `mac` is the agent's proof ([`server_mac`]).
pub fn verify_server(secret: &[u8], agent_nonce: &str, launcher_nonce: &str, mac: &str) -> bool {
    mutirao::seal::verify_hex(
        secret,
        SERVER_LABEL,
        &[launcher_nonce.as_bytes(), agent_nonce.as_bytes()],
        mac,
    )
}

pub const CLIENT_LABEL: &str = "mutirao-agent-client-v3";
pub const SERVER_LABEL: &str = "mutirao-agent-server-v3";
/// Names the agent protocol's session keys.
pub const SESSION_CONTEXT: &str = "mutirao-agent-session-v3";

/// The keys of one end of an agent session whose handshake exchanged these nonces.
pub fn session_keys(
    secret: &[u8],
    agent_nonce: &str,
    launcher_nonce: &str,
    role: mutirao::seal::Role,
) -> mutirao::seal::SessionKeys {
    mutirao::seal::SessionKeys::derive(
        secret,
        SESSION_CONTEXT,
        launcher_nonce.as_bytes(),
        agent_nonce.as_bytes(),
        role,
    )
}

/// Sealed messages to the other end of a session.
pub type SessionWriter = mutirao::seal::SealedWriter<std::net::TcpStream>;

/// The scope of a job's checkpoint sessions on agents: an HMAC of the job's name under its
/// checkpoint key, so a session of another job (or of anyone holding the agent token without
/// that key) cannot name it.
pub fn checkpoint_scope(ckpt_key: &[u8; 32], job: &str) -> String {
    mutirao::seal::mac_hex(ckpt_key, "mutirao-ckpt-scope-v1", &[job.as_bytes()])
}

/// Whether `scope` has the shape of a [`checkpoint_scope`] (64 lowercase hex digits).
pub fn is_scope(scope: &str) -> bool {
    scope.len() == 64
        && scope
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A fresh handshake nonce.
pub fn nonce() -> std::io::Result<String> {
    mutirao::seal::nonce_hex()
}

/// Read a token file: at least 16 bytes of secret after trimming whitespace.
pub fn read_token_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the agent token file {}: {e}\n  create one with: mutirao agent --gen-token {}",
            path.display(),
            path.display()
        )
    })?;
    let t = text.trim();
    if t.len() < 16 {
        return Err(format!(
            "the agent token in {} is shorter than 16 characters: use `mutirao agent --gen-token`",
            path.display()
        ));
    }
    Ok(t.as_bytes().to_vec())
}

/// A warning when the token file at `path` may be read by users other than its owner (its
/// group or others have read bits), or `None`.
pub fn token_file_warning(path: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o044 != 0).then(|| {
        format!(
            "the token file {} has mode {mode:o}: other users of this host may read it; make it private with `chmod 600 {}`",
            path.display(),
            path.display()
        )
    })
}

/// Where the token lives unless `--token-file` says otherwise: `$MUTIRAO_AGENT_TOKEN_FILE`, else
/// `$HOME/.mutirao/agent.token`.
pub fn default_token_path() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("MUTIRAO_AGENT_TOKEN_FILE") {
        return p.into();
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    std::path::Path::new(&home).join(".mutirao/agent.token")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_the_secret_the_side_and_both_nonces() {
        let k = b"secret-secret-16";
        let c = client_mac(k, "n1", "n2");
        assert!(verify_client(k, "n1", "n2", &c));
        assert!(!verify_client(b"secret-secret-17", "n1", "n2", &c));
        assert!(
            !verify_server(k, "n1", "n2", &c),
            "a client proof is no server proof"
        );
        assert!(!verify_client(k, "n1", "n3", &c));
        assert!(!verify_client(k, "n0", "n2", &c));
        let s = server_mac(k, "n1", "n2");
        assert!(verify_server(k, "n1", "n2", &s));
        assert!(!verify_server(k, "n2", "n1", &s));
    }

    #[test]
    fn long_lines_come_in_pieces_cut_between_characters_with_no_empty_piece() {
        let piece = MAX_OUTPUT_PIECE as usize;
        // A line two pieces and a bit long, whose cut would fall inside a 2-byte character.
        let mut text = "x".repeat(piece - 1);
        text.push('é');
        text.push_str(&"y".repeat(piece));
        text.push_str("\nshort\n\nlast");
        let mut p = LinePieces::new(std::io::Cursor::new(text.clone().into_bytes()));
        let mut got = Vec::new();
        while let Some(l) = p.next_piece() {
            got.push(l);
        }
        assert!(
            got.iter().all(|l| l.len() <= piece),
            "a piece over the limit"
        );
        assert!(
            !got.iter().any(|l| l.contains('\u{fffd}')),
            "a character was cut"
        );
        assert_eq!(
            got[..got.len() - 3].concat(),
            text.split('\n').next().unwrap()
        );
        assert_eq!(got[got.len() - 3..], ["short", "", "last"]);
        // A line of exactly one piece and its newline: one piece, no empty one after it.
        let one = format!("{}\nnext\n", "z".repeat(piece));
        let mut p = LinePieces::new(std::io::Cursor::new(one.into_bytes()));
        assert_eq!(p.next_piece().map(|l| l.len()), Some(piece));
        assert_eq!(p.next_piece().as_deref(), Some("next"));
        assert_eq!(p.next_piece(), None);
    }

    #[test]
    fn malformed_lines_are_errors() {
        let mut r = std::io::Cursor::new(b"{\"op\":\"launch\"\n".to_vec());
        assert!(read_msg(&mut r).is_err());
        let mut r = std::io::Cursor::new(b"".to_vec());
        assert!(read_msg(&mut r).unwrap().is_none());
    }
}
