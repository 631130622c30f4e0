//! `mutirao-testbed-probe`: tiny measuring tools to run inside testbed hosts
//! (`Testbed::spawn` or `ip netns exec NS mutirao-testbed-probe …`). Used by the crate's root
//! tests and handy for checking a testbed by hand. Every command is bounded in time.
//!
//! ```text
//! mutirao-testbed-probe serve ADDR:PORT COUNT TIMEOUT_MS
//!     accept COUNT connections, read each to EOF; per connection print
//!     `recv BYTES SECONDS` (first byte to EOF); exit 1 if not done within TIMEOUT_MS
//! mutirao-testbed-probe send ADDR:PORT BYTES TIMEOUT_MS
//!     connect (retrying until TIMEOUT_MS), write BYTES, close; print `sent BYTES SECONDS`
//! mutirao-testbed-probe spin ITERATIONS
//!     a CPU-bound loop; print `spin WALL_SECONDS CPU_SECONDS`
//! mutirao-testbed-probe echo ADDR:PORT TIMEOUT_MS
//!     accept one connection; answer every message (8-byte length, then that many bytes) with
//!     one byte, until EOF
//! mutirao-testbed-probe pingpong ADDR:PORT SIZES REPS IDLE_MS TIMEOUT_MS
//!     for each size of the comma list, REPS times: wait IDLE_MS, send a message, wait for the
//!     echo's byte; print `pingpong BYTES MEDIAN_SECONDS` per size
//! ```

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn usage() -> ExitCode {
    eprintln!(
        "usage: mutirao-testbed-probe serve ADDR:PORT COUNT TIMEOUT_MS\n       \
         mutirao-testbed-probe send ADDR:PORT BYTES TIMEOUT_MS\n       \
         mutirao-testbed-probe spin ITERATIONS\n       \
         mutirao-testbed-probe echo ADDR:PORT TIMEOUT_MS\n       \
         mutirao-testbed-probe pingpong ADDR:PORT SIZES REPS IDLE_MS TIMEOUT_MS"
    );
    ExitCode::from(2)
}

fn num<T: std::str::FromStr>(s: Option<&String>, what: &str) -> Result<T, String> {
    let s = s.ok_or_else(|| format!("missing {what}"))?;
    s.parse()
        .map_err(|_| format!("{what} `{s}` is not a valid number"))
}

fn addr(s: Option<&String>) -> Result<SocketAddr, String> {
    let s = s.ok_or("missing ADDR:PORT")?;
    s.parse()
        .map_err(|_| format!("`{s}` is not an ADDR:PORT socket address"))
}

/// The next connection on the non-blocking listener `l`, as a blocking stream, by `deadline`.
fn accept(l: &TcpListener, a: SocketAddr, deadline: Instant) -> Result<TcpStream, String> {
    let s = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(format!("timed out waiting for a connection on {a}"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("accept on {a}: {e}")),
        }
    };
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    Ok(s)
}

fn serve(a: SocketAddr, count: usize, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let l = TcpListener::bind(a).map_err(|e| format!("cannot listen on {a}: {e}"))?;
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    println!("listening {a}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..count {
        let mut s = accept(&l, a, deadline)?;
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| e.to_string())?;
        let mut total = 0u64;
        let mut first: Option<Instant> = None;
        loop {
            let n = s.read(&mut buf).map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                break;
            }
            first.get_or_insert_with(Instant::now);
            total += n as u64;
        }
        let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
        println!("recv {total} {secs:.6}");
        std::io::stdout().flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn send(a: SocketAddr, bytes: u64, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut s = loop {
        match TcpStream::connect_timeout(&a, Duration::from_millis(200)) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => return Err(format!("connect to {a}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    s.set_write_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
    ))
    .map_err(|e| e.to_string())?;
    let buf = vec![0x5au8; 1 << 16];
    let t = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        s.write_all(&buf[..n])
            .map_err(|e| format!("write to {a}: {e}"))?;
        left -= n as u64;
    }
    s.shutdown(std::net::Shutdown::Write)
        .map_err(|e| e.to_string())?;
    // Wait for the peer to close so the data has really been delivered.
    let mut b = [0u8; 1];
    let _ = s.read(&mut b);
    println!("sent {bytes} {:.6}", t.elapsed().as_secs_f64());
    Ok(())
}

fn connect(a: SocketAddr, deadline: Instant) -> Result<TcpStream, String> {
    loop {
        match TcpStream::connect_timeout(&a, Duration::from_millis(200)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() > deadline => return Err(format!("connect to {a}: {e}")),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn echo(a: SocketAddr, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let l = TcpListener::bind(a).map_err(|e| format!("cannot listen on {a}: {e}"))?;
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut s = accept(&l, a, deadline)?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let mut len = [0u8; 8];
        match s.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("read: {e}")),
        }
        let mut left = u64::from_le_bytes(len);
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            s.read_exact(&mut buf[..n])
                .map_err(|e| format!("read: {e}"))?;
            left -= n as u64;
        }
        s.write_all(&[1]).map_err(|e| format!("write: {e}"))?;
        if Instant::now() > deadline {
            return Err("echo ran past its TIMEOUT_MS".into());
        }
    }
}

fn pingpong(
    a: SocketAddr,
    sizes: &[u64],
    reps: usize,
    idle: Duration,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut s = connect(a, deadline)?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let buf = vec![0x5au8; 1 << 16];
    for &m in sizes {
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            std::thread::sleep(idle);
            let t = Instant::now();
            s.write_all(&m.to_le_bytes())
                .map_err(|e| format!("write: {e}"))?;
            let mut left = m;
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                s.write_all(&buf[..n]).map_err(|e| format!("write: {e}"))?;
                left -= n as u64;
            }
            let mut b = [0u8; 1];
            s.read_exact(&mut b)
                .map_err(|e| format!("read echo: {e}"))?;
            times.push(t.elapsed().as_secs_f64());
            if Instant::now() > deadline {
                return Err("pingpong ran past its TIMEOUT_MS".into());
            }
        }
        times.sort_by(f64::total_cmp);
        println!("pingpong {m} {:.6}", times[times.len() / 2]);
    }
    Ok(())
}

fn cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

fn spin(iters: u64) {
    let (t, c) = (Instant::now(), cpu_seconds());
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..iters {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = x.wrapping_add(i);
    }
    let x = std::hint::black_box(x);
    println!(
        "spin {:.6} {:.6} {}",
        t.elapsed().as_secs_f64(),
        cpu_seconds() - c,
        x & 1
    );
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => (|| {
            serve(
                addr(args.get(1))?,
                num(args.get(2), "COUNT")?,
                Duration::from_millis(num(args.get(3), "TIMEOUT_MS")?),
            )
        })(),
        Some("send") => (|| {
            send(
                addr(args.get(1))?,
                num(args.get(2), "BYTES")?,
                Duration::from_millis(num(args.get(3), "TIMEOUT_MS")?),
            )
        })(),
        Some("spin") => num(args.get(1), "ITERATIONS").map(spin),
        Some("echo") => (|| {
            echo(
                addr(args.get(1))?,
                Duration::from_millis(num(args.get(2), "TIMEOUT_MS")?),
            )
        })(),
        Some("pingpong") => (|| {
            let sizes = args
                .get(2)
                .ok_or("missing SIZES")?
                .split(',')
                .map(|t| {
                    t.parse::<u64>()
                        .map_err(|_| format!("size `{t}` is not a byte count"))
                })
                .collect::<Result<Vec<u64>, String>>()?;
            let reps: usize = num(args.get(3), "REPS")?;
            if reps == 0 {
                return Err("REPS must be at least 1".into());
            }
            pingpong(
                addr(args.get(1))?,
                &sizes,
                reps,
                Duration::from_millis(num(args.get(4), "IDLE_MS")?),
                Duration::from_millis(num(args.get(5), "TIMEOUT_MS")?),
            )
        })(),
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mutirao-testbed-probe: {e}");
            ExitCode::FAILURE
        }
    }
}
