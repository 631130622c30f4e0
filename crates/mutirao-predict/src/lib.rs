//! PeMPSys interval prediction (digest 001; R. H. Herai's MSc thesis, Unicamp 2005).
//!
//! Predicts, without running it, how long a JoiN-style parallel application takes on a chosen
//! set of unequal machines, as an interval `[t_min; t_max]`:
//! * [`interval`]: the interval type and its construction from benchmark samples;
//! * [`machine`]: the op × type machine model and its Appendix-B text format;
//! * [`cres`]: the machine model from measurements on each host (op × type, W, sends);
//! * [`pamela`]: the Extended-PAMELA model language (parse and print);
//! * [`pasl`]: JoiN's flow-specification language, the batch DAG and its series-parallel form;
//! * [`amgen`]: the application model of a batch DAG (Extended PAMELA, thesis Figs 4.10–4.16);
//! * [`analytic`]: the analytic compiler (T_0, T_r, T = max) and the evaluator (TPT);
//! * [`shares`]: JoiN's static shares `S_i = ⌈f·c·W_i/ΣW⌉`, rounded to sum to c;
//! * [`harness`]: the interval error (Eq. 5.2/5.3) and a checker of printed results;
//! * [`analyse`]: op counting for task functions written in a subset of Rust (SCAn).
//!
//! Everything here is pure: no I/O; the CLI (`mutirao predict`) reads and writes files.
//!
//! ```
//! use mutirao_predict::{analytic, machine::MachineModel, pamela};
//! let model = pamela::parse(
//!     "COORD=0;\n\
//!      L={ par(p=1,P){ par(i=1,10*W[p]){ use(p,task[1,i](p)); } } }\n\
//!      task[1,n](p)=Work(p,n);\n\
//!      Work(p,0)={ taskrun{ seq(i=1,1000){ sum_int; } } }\n",
//! ).unwrap();
//! let compiled = analytic::compile(&model).unwrap();
//! let machines = MachineModel::from_appendix_b(
//!     &"W[1]=1.0\nW[2]=0.25\ninter_sum_int[1]=[1.0E-9;2.0E-9]\ninter_sum_int[2]=[4.0E-9;8.0E-9]\n"
//!         .parse().unwrap(),
//! );
//! let p = analytic::evaluate(&compiled, &machines, &analytic::Selection::Fastest(2),
//!                            analytic::Policy::Worst).unwrap();
//! // Shares of 10 tasks for W = (1, 0.25): 8 and 2; 8 × 1000 sums on machine 1.
//! assert_eq!(p.shares[&10], vec![8, 2]);
//! assert!((p.interval.hi - 8.0 * 1000.0 * 2.0e-9).abs() < 1e-15);
//! ```
#![warn(missing_docs)]

pub mod amgen;
pub mod analyse;
pub mod analytic;
pub mod cres;
pub mod harness;
pub mod interval;
pub mod machine;
pub mod pamela;
pub mod pasl;
pub mod shares;
