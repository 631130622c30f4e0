//! `mutirao`: one binary, one subcommand per tool. Each subcommand lives in its own module
//! (`cmd_*.rs`) and is a thin shell over a library crate; this file only dispatches.

use clap::{Parser, Subcommand};

mod capacity_spec;
mod cmd_agent;
mod cmd_calibrate;
mod cmd_coord;
mod cmd_dir;
mod cmd_exec;
mod cmd_fit;
mod cmd_model;
mod cmd_predict;
mod cmd_predict_machine;
mod cmd_run;
mod cmd_sched;
mod cmd_submit;
mod cmd_testbed;
use mutirao_launch::{fsutil, hostfile};

/// mutirão: run parallel message-passing programs on unequal, non-dedicated machines —
/// measure them, predict run times, place work, run it, and survive hosts that leave.
#[derive(Parser)]
#[command(name = "mutirao", version, about, long_about = None, propagate_version = true,
    after_help = "Environment: MUTIRAO_LOG=warn (default) | info | debug | off, or per target (e.g. mutirao_ckpt=debug): what the libraries log to stderr.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect and validate mutirao-model/1 files.
    #[command(subcommand)]
    Model(cmd_model::ModelCommand),
    /// Run a parallel program on N ranks (locally, or on a hostfile's hosts through their agents).
    Run(cmd_run::RunArgs),
    /// Run the per-host agent that starts ranks for authenticated launchers.
    Agent(cmd_agent::AgentArgs),
    /// Emulate a grid on this machine: namespaces, shaped links, CPU quotas, agents (needs root).
    #[command(subcommand)]
    Testbed(cmd_testbed::TestbedCommand),
    /// Fit a mutirao-model/1 model to a calibration (segmented least squares per link class).
    Fit(cmd_fit::FitArgs),
    /// Calibration files: check, plan, and the thesis's legacy host-list and output formats.
    #[command(subcommand)]
    Calib(cmd_fit::CalibCommand),
    /// Task graphs, the HLogP simulator and schedulers (simulate, schedule, dag).
    #[command(flatten)]
    Sched(cmd_sched::SchedCommand),
    /// The directory service: serve, register, query, ls, rm.
    #[command(subcommand)]
    Dir(cmd_dir::DirCommand),
    /// mεμ physical resource specifications: check, show, lookup.
    #[command(subcommand)]
    Resources(cmd_dir::ResourcesCommand),
    /// Run a task graph for real as a schedule places it, and measure its makespan.
    ExecDag(cmd_exec::ExecArgs),
    /// Measure hosts for the HLogP model: H per host, version II ping-pong per pair and size.
    Calibrate(cmd_calibrate::CalibrateArgs),
    /// PeMPSys interval prediction: [t_min; t_max] of an application on chosen machines; op counting of Rust tasks; JoiN shares.
    Predict(cmd_predict::PredictArgs),
    // (its help text is CoordArgs's doc comment)
    Coordinator(cmd_coord::CoordArgs),
    /// Grid jobs: submit, jobs, job, logs, cancel.
    #[command(flatten)]
    Grid(cmd_submit::GridCommand),
    // NEW SUBCOMMANDS: add one variant here and one match arm below, nothing else.
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Warnings from the libraries (a checkpoint replica missing, corrupt or written degraded, …)
    // go to stderr; MUTIRAO_LOG=info|debug|<target>=<level> shows more, MUTIRAO_LOG=off none.
    let filter = match tracing_subscriber::EnvFilter::try_from_env("MUTIRAO_LOG") {
        Ok(f) => f,
        Err(e) => {
            if std::env::var_os("MUTIRAO_LOG").is_some() {
                eprintln!("mutirao: MUTIRAO_LOG not understood ({e}); logging warnings only");
            }
            tracing_subscriber::EnvFilter::new("warn")
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .init();
    let result = match cli.command {
        Command::Model(c) => cmd_model::run(c),
        Command::Run(a) => cmd_run::run(a),
        Command::Agent(a) => cmd_agent::run(a),
        Command::Testbed(c) => cmd_testbed::run(c),
        Command::Fit(a) => cmd_fit::run_fit(a),
        Command::Calib(c) => cmd_fit::run_calib(c),
        Command::Sched(c) => cmd_sched::run(c),
        Command::Dir(c) => cmd_dir::run_dir(c),
        Command::Resources(c) => cmd_dir::run_resources(c),
        Command::ExecDag(a) => cmd_exec::run(a),
        Command::Calibrate(a) => cmd_calibrate::run(a),
        Command::Predict(a) => cmd_predict::run(a),
        Command::Coordinator(a) => cmd_coord::run(a),
        Command::Grid(c) => cmd_submit::run(c),
        // NEW MATCH ARMS
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mutirao: error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
