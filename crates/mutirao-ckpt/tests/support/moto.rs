//! moto's S3-compatible server (`moto_server`) for tests: started on a free loopback port,
//! killed and reaped when its handle is dropped (also when a test fails). Used by
//! `mutirao-ckpt`'s `s3_moto` test and, through `#[path]`, by `mutirao-cli`'s `recover_s3`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running moto_server; killed and reaped when dropped.
pub struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One HTTP/1.1 request with an empty body to `127.0.0.1:port`; the whole answer (status line,
/// headers, body; at most 1 MiB). Reads and writes time out after 5 s.
pub fn http(port: u16, method: &str, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.take(1 << 20).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Start moto_server and wait (at most 30 s) until it answers; `Err(reason)` to skip the test.
pub fn start() -> Result<(Server, u16), String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free loopback port: {e}"))?
        .port();
    let child = Command::new("moto_server")
        .args(["-p", &port.to_string(), "-H", "127.0.0.1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!("cannot run moto_server ({e}); install it with pip install 'moto[server]'")
        })?;
    let mut server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(st)) = server.0.try_wait() {
            return Err(format!("moto_server exited at start ({st})"));
        }
        if http(port, "GET", "/").is_ok_and(|a| a.starts_with("HTTP/1.")) {
            return Ok((server, port));
        }
        if Instant::now() > deadline {
            return Err("moto_server did not answer within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
