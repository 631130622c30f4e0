//! `mutirao model check FILE`: validate a model and print its hosts and link coverage.

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
}

pub fn run(cmd: ModelCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ModelCommand::Check { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read model file {}", file.display()))?;
            let model =
                Model::from_json(&text).with_context(|| format!("in {}", file.display()))?;
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
    }
}
