//! A coordinator serving its API on loopback from a runtime of its own, in the test's process
//! (so the test can read the process's memory, and the coordinator's audit).

use mutirao_coord::api::{self, Coordinator};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Serves `c` until dropped.
pub struct InProcess {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl InProcess {
    /// Serve `c` on a free loopback port.
    pub fn start(c: Arc<Coordinator>) -> InProcess {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(api::serve(listener, c, async move {
            let _ = stopped.await;
        }));
        InProcess {
            addr,
            stop: Some(stop),
            rt: Some(rt),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}
