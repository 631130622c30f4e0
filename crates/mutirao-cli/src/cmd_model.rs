//! `mutirao model check FILE`: validate a model and print its hosts and link coverage.
//! `mutirao model compare REF OTHER`: how far apart two models' predictions are.

use anyhow::Context;
use clap::Subcommand;
use mutirao_model::Model;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Validate a mutirao-model/1 file and check that every host pair is covered by a link.
    Check {
        /// The model file (JSON).
        file: std::path::PathBuf,
    },
    /// Compare two models of the same hosts: per ordered pair and size the one-way time
    /// Os + L + Or of OTHER against REFERENCE, and the relative speeds. Judges a cheap strategy
    /// against all-pairs, or two calibrations in a row.
    ///
    /// Example:
    ///   mutirao model compare all-pairs.json site-sampled.json --min-size 64K
    #[command(verbatim_doc_comment)]
    Compare {
        /// The reference model (e.g. from an all-pairs calibration).
        reference: std::path::PathBuf,
        /// The model to judge.
        other: std::path::PathBuf,
        /// Message sizes to compare at (comma list; K and M suffixes).
        #[arg(long, default_value = "0,64,1K,16K,64K,256K,1M,4M")]
        sizes: String,
        /// The summary line (worst and median difference) counts sizes from this one up.
        #[arg(long, default_value = "64K")]
        min_size: String,
        /// Exit 1 when the worst difference at sizes >= --min-size exceeds this fraction.
        #[arg(long, value_name = "FRACTION")]
        tolerance: Option<f64>,
        /// Print the whole comparison as JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn load(file: &std::path::Path) -> anyhow::Result<Model> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read model file {}", file.display()))?;
    Model::from_json(&text).with_context(|| format!("in {}", file.display()))
}

pub fn run(cmd: ModelCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ModelCommand::Check { file } => {
            let model = load(&file)?;
            model
                .check_complete()
                .with_context(|| format!("in {}", file.display()))?;
            println!(
                "{}: ok, {} hosts, {} links, every host pair covered",
                file.display(),
                model.hosts.len(),
                model.links.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        ModelCommand::Compare {
            reference,
            other,
            sizes,
            min_size,
            tolerance,
            json,
        } => {
            let sizes = crate::cmd_calibrate::parse_sizes(&sizes).context("--sizes")?;
            let min = *crate::cmd_calibrate::parse_sizes(&min_size)
                .context("--min-size")?
                .first()
                .context("--min-size: give one size")?;
            if let Some(t) = tolerance {
                anyhow::ensure!(
                    t.is_finite() && t >= 0.0,
                    "--tolerance must be a fraction >= 0, e.g. 0.10"
                );
            }
            let (a, b) = (load(&reference)?, load(&other)?);
            let c = mutirao_model::compare::compare(&a, &b, &sizes);
            anyhow::ensure!(
                !c.speeds.is_empty(),
                "{} and {} have no host in common",
                reference.display(),
                other.display()
            );
            if json {
                println!("{}", serde_json::to_string_pretty(&c)?);
            } else {
                print!("{}", c.to_text(min));
            }
            let worst = c.worst_time(min).map(|w| w.rel.abs()).unwrap_or(0.0);
            Ok(match tolerance {
                Some(t) if worst > t => ExitCode::from(1),
                _ => ExitCode::SUCCESS,
            })
        }
    }
}
