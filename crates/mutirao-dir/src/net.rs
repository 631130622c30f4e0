//! Framing (`len u32 LE | packet`) and the server-to-server HMAC-SHA256 challenge–response.
//!
//! Handshake on a TCP connection, `C` = connecting server, `S` = accepting server:
//! 1. C → S: `"MDIR1" | c_cluster u64 | c_node u64 | nonce_c [32]`
//! 2. S → C: `s_cluster u64 | s_node u64 | nonce_s [32] | HMAC(key, "mdir-s" | nonce_c | nonce_s | s_cluster | s_node)`
//! 3. C → S: `HMAC(key, "mdir-c" | nonce_s | nonce_c | c_cluster | c_node)`
//!
//! Each side proves knowledge of the cluster key over the other's fresh nonce, so a replayed
//! transcript fails. The key never crosses the wire.

use crate::error::DirError;
use crate::wire::{Packet, MAX_PACKET};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

type HmacSha256 = Hmac<Sha256>;

const HELLO: &[u8; 5] = b"MDIR1";
const NONCE: usize = 32;
const MAC: usize = 32;
/// Time allowed for the whole handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// Reads one frame; `Ok(None)` on a clean end of stream before the length.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Option<()>, DirError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_PACKET {
        return Err(DirError::TooLarge(format!(
            "frame of {n} bytes exceeds the {MAX_PACKET}-byte limit"
        )));
    }
    buf.clear();
    buf.resize(n, 0);
    r.read_exact(buf).await?;
    Ok(Some(()))
}

/// Appends a length-prefixed packet to `out`.
pub fn frame_into(p: &Packet, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    p.encode_into(out);
    let n = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&n.to_le_bytes());
}

/// Writes one packet as a frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, p: &Packet) -> Result<(), DirError> {
    let mut out = Vec::with_capacity(p.encoded_len() + 4);
    frame_into(p, &mut out);
    w.write_all(&out).await?;
    Ok(())
}

fn nonce() -> Result<[u8; NONCE], DirError> {
    let mut n = [0u8; NONCE];
    getrandom::fill(&mut n).map_err(|e| DirError::Io(format!("no randomness: {e}")))?;
    Ok(n)
}

fn mac(key: &[u8], parts: &[&[u8]]) -> Result<HmacSha256, DirError> {
    let mut m = HmacSha256::new_from_slice(key)
        .map_err(|e| DirError::BadConfig(format!("cluster key: {e}")))?;
    for p in parts {
        m.update(p);
    }
    Ok(m)
}

/// Identity of the server at the other end of an authenticated connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerId {
    /// Cluster (site) id.
    pub cluster: u64,
    /// Node serial number.
    pub node: u64,
}

/// The connecting side of the handshake.
pub async fn handshake_connect<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    key: &[u8],
    me: PeerId,
) -> Result<PeerId, DirError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let nc = nonce()?;
        let mut hello = Vec::with_capacity(5 + 16 + NONCE);
        hello.extend_from_slice(HELLO);
        hello.extend_from_slice(&me.cluster.to_le_bytes());
        hello.extend_from_slice(&me.node.to_le_bytes());
        hello.extend_from_slice(&nc);
        s.write_all(&hello).await?;
        let mut resp = [0u8; 16 + NONCE + MAC];
        s.read_exact(&mut resp).await.map_err(|_| {
            DirError::Auth(
                "peer closed the connection during the handshake (wrong cluster key?)".into(),
            )
        })?;
        let sc = &resp[0..8];
        let sn = &resp[8..16];
        let ns = &resp[16..16 + NONCE];
        let tag = &resp[16 + NONCE..];
        mac(key, &[b"mdir-s", &nc, ns, sc, sn])?
            .verify_slice(tag)
            .map_err(|_| DirError::Auth("peer's proof does not match our cluster key".into()))?;
        let reply = mac(
            key,
            &[
                b"mdir-c",
                ns,
                &nc,
                &me.cluster.to_le_bytes(),
                &me.node.to_le_bytes(),
            ],
        )?
        .finalize()
        .into_bytes();
        s.write_all(&reply).await?;
        let mut a = [0u8; 8];
        a.copy_from_slice(sc);
        let mut b = [0u8; 8];
        b.copy_from_slice(sn);
        Ok(PeerId {
            cluster: u64::from_le_bytes(a),
            node: u64::from_le_bytes(b),
        })
    })
    .await
    .map_err(|_| DirError::Timeout("peer handshake".into()))?
}

/// The accepting side of the handshake.
pub async fn handshake_accept<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    key: &[u8],
    me: PeerId,
) -> Result<PeerId, DirError> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let mut hello = [0u8; 5 + 16 + NONCE];
        s.read_exact(&mut hello).await?;
        if &hello[..5] != HELLO {
            return Err(DirError::Auth(
                "not a mutirao directory peer (bad greeting)".into(),
            ));
        }
        let cc = &hello[5..13];
        let cn = &hello[13..21];
        let nc = &hello[21..];
        let ns = nonce()?;
        let sc = me.cluster.to_le_bytes();
        let sn = me.node.to_le_bytes();
        let tag = mac(key, &[b"mdir-s", nc, &ns, &sc, &sn])?
            .finalize()
            .into_bytes();
        let mut resp = Vec::with_capacity(16 + NONCE + MAC);
        resp.extend_from_slice(&sc);
        resp.extend_from_slice(&sn);
        resp.extend_from_slice(&ns);
        resp.extend_from_slice(&tag);
        s.write_all(&resp).await?;
        let mut proof = [0u8; MAC];
        s.read_exact(&mut proof).await?;
        mac(key, &[b"mdir-c", &ns, nc, cc, cn])?
            .verify_slice(&proof)
            .map_err(|_| {
                DirError::Auth("connecting peer's proof does not match our cluster key".into())
            })?;
        let mut a = [0u8; 8];
        a.copy_from_slice(cc);
        let mut b = [0u8; 8];
        b.copy_from_slice(cn);
        Ok(PeerId {
            cluster: u64::from_le_bytes(a),
            node: u64::from_le_bytes(b),
        })
    })
    .await
    .map_err(|_| DirError::Timeout("peer handshake".into()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn handshake_succeeds_with_same_key_fails_with_other() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let pa = PeerId {
            cluster: 1,
            node: 2,
        };
        let pb = PeerId {
            cluster: 1,
            node: 3,
        };
        let (ra, rb) = tokio::join!(
            handshake_connect(&mut a, b"secret", pa),
            handshake_accept(&mut b, b"secret", pb)
        );
        assert_eq!(ra.unwrap(), pb);
        assert_eq!(rb.unwrap(), pa);

        let (mut a, mut b) = tokio::io::duplex(4096);
        let acc = tokio::spawn(async move { handshake_accept(&mut b, b"other", pb).await });
        let ra = handshake_connect(&mut a, b"secret", pa).await;
        drop(a);
        assert!(matches!(ra, Err(DirError::Auth(_))));
        assert!(acc.await.unwrap().is_err());
    }
}
