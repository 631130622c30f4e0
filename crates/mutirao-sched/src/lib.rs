//! Task graphs, the HLogP simulator and list schedulers for mutirão.
//!
//! * [`dag`]: the `mutirao-dag/1` format ([`Dag`]), validation, DOT export;
//! * [`gen`]: generators (diamond, fork, join, ring, Gaussian elimination, FFT, Topcuoglu's
//!   random layered graphs) and a random platform with heterogeneity β;
//! * [`platform`]: a `mutirao-model/1` [`Model`](mutirao_model::Model) resolved for fast lookups;
//! * [`sim`]: the HLogP simulator (thesis semantics: overheads block the CPU) and the
//!   latency-model baseline;
//! * [`sched`]: HEFT, the thesis's HLogP-aware HEFT, PEFT and round-robin, the
//!   `mutirao-schedule/1` format, hostfile/rankfile writers, and SLR / speedup / efficiency;
//! * [`gantt`]: an SVG Gantt chart of a simulated schedule;
//! * [`wfcommons`]: import of WfCommons (WfFormat 1.5/1.6) workflow instances.
//!
//! Everything here is pure: no file or network I/O. The `mutirao` CLI reads and writes files.
//!
//! ```
//! use mutirao_model::presets::gridrio2004;
//! use mutirao_sched::{gen, platform::Platform, sched, sim};
//!
//! let dag = gen::diamond(5, 2.0, 4 << 20).unwrap();         // 5×5 diamond, 4 MiB edges
//! let platform = Platform::from_model(&gridrio2004()).unwrap();
//! let s = sched::schedule(&dag, &platform, sched::Algorithm::HlogpHeft).unwrap();
//! let placement = s.placement(&dag, &platform).unwrap();
//! let r = sim::simulate(&dag, &platform, &placement, sim::SimOptions::default()).unwrap();
//! assert!(r.makespan_s >= sim::critical_path_bound_s(&dag, &platform));
//! println!("{} predicts {:.3} s, the HLogP simulator {:.3} s", s.algorithm, s.makespan_s, r.makespan_s);
//! ```

#![warn(missing_docs)]

pub mod dag;
pub mod gantt;
pub mod gen;
pub mod net;
pub mod platform;
pub mod sched;
pub mod sim;
pub mod wfcommons;

pub use dag::{Dag, DagError};
pub use platform::Platform;
pub use sched::{Algorithm, Schedule};
pub use sim::{simulate, Placement, SimOptions, SimResult};
