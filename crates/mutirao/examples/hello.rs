//! Every rank says hello; rank 0 collects the greetings in rank order and checks them.
//!
//!     mutirao run -n 4 target/release/examples/hello

fn main() -> Result<(), mutirao::Error> {
    let world = mutirao::init()?;
    let (rank, size) = (world.rank(), world.size());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let me = format!("hello from rank {rank} of {size} on {}", host.trim());
    if rank == 0 {
        println!("{me}");
        for r in 1..size {
            let (msg, st): (String, _) = world.recv_obj(r, 0)?;
            assert_eq!(st.source, r);
            if !msg.starts_with(&format!("hello from rank {r} ")) {
                eprintln!("wrong greeting from rank {r}: {msg}");
                std::process::exit(1);
            }
            println!("{msg}");
        }
    } else {
        world.send_obj(&me, 0, 0)?;
    }
    world.finalize()
}
