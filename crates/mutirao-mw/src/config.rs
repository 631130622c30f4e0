//! The repository's configuration (seed 003 §2.3): `TAM_BLOCO` (alias `VALTAM_BLOCO`),
//! `THRESHOLD_MIN` and `THRESHOLD_MAX` (percent of the reference time), `WORKERS_ADD`,
//! `PERC_CONS_ADD` (percent of the tasks processed when workers are added).
//!
//! Text form, one `KEY=VALUE` per line, `#` comments; the paper's spellings with a space
//! (`THRESHOLD MIN`, `VALTAM BLOCO`) are accepted:
//!
//! ```
//! let c = mutirao_mw::Config::parse("TAM_BLOCO=10\nTHRESHOLD_MIN=80\nTHRESHOLD_MAX=120\n").unwrap();
//! assert_eq!((c.tam_bloco, c.threshold_min, c.threshold_max), (10, 80.0, 120.0));
//! assert_eq!(c.workers_add, 0); // no dynamic inclusion unless asked
//! ```

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

/// Which time the thresholds are percentages of (the paper says both "the worst time of each
/// iteration" and "the predicted time of an iteration"; seed 003 §8.1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TRef {
    /// The worst `t_comp` of the previous iteration (the faithful default).
    WorstOfLastIteration,
    /// The worst `t_comp` of the characterization round, kept for the whole run.
    CharacterizationWorst,
    /// An exponentially weighted mean of each iteration's worst `t_comp` (weight of the newest).
    Ewma(f64),
}

/// The balancer's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Tasks per worker in the characterization round (`TAM_BLOCO`).
    pub tam_bloco: u64,
    /// Lower threshold, percent of the reference time (`THRESHOLD_MIN`).
    pub threshold_min: f64,
    /// Upper threshold, percent of the reference time (`THRESHOLD_MAX`).
    pub threshold_max: f64,
    /// Workers added dynamically (`WORKERS_ADD`), 0 = none.
    pub workers_add: u32,
    /// When to add them: percent of the tasks processed (`PERC_CONS_ADD`).
    pub perc_cons_add: f64,
    /// Reference time of the thresholds (`T_REF`: `worst`, `characterization` or `ewma:0.5`).
    pub t_ref: TRef,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            tam_bloco: 10,
            threshold_min: 80.0,
            threshold_max: 120.0,
            workers_add: 0,
            perc_cons_add: 50.0,
            t_ref: TRef::WorstOfLastIteration,
        }
    }
}

impl Config {
    /// Parse the `KEY=VALUE` text form; unset keys keep [`Config::default`]'s values.
    pub fn parse(text: &str) -> Result<Config> {
        let mut c = Config::default();
        for (no, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (k, v) = line.split_once('=').ok_or_else(|| {
                Error::Config(format!("line {}: expected KEY=VALUE, got {line:?}", no + 1))
            })?;
            let key = k.trim().to_ascii_uppercase().replace([' ', '-'], "_");
            let v = v.trim();
            let num = |what: &str| -> Result<f64> {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| {
                        Error::Config(format!("line {}: {what}={v:?} is not a number", no + 1))
                    })
            };
            match key.as_str() {
                "TAM_BLOCO" | "VALTAM_BLOCO" => {
                    c.tam_bloco = v.parse().map_err(|_| {
                        Error::Config(format!(
                            "line {}: TAM_BLOCO={v:?} is not a whole number of tasks",
                            no + 1
                        ))
                    })?
                }
                "THRESHOLD_MIN" => c.threshold_min = num("THRESHOLD_MIN")?,
                "THRESHOLD_MAX" => c.threshold_max = num("THRESHOLD_MAX")?,
                "WORKERS_ADD" => {
                    c.workers_add = v.parse().map_err(|_| {
                        Error::Config(format!(
                            "line {}: WORKERS_ADD={v:?} is not a whole number",
                            no + 1
                        ))
                    })?
                }
                "PERC_CONS_ADD" => c.perc_cons_add = num("PERC_CONS_ADD")?,
                "T_REF" => c.t_ref = parse_t_ref(v).map_err(|e| {
                    Error::Config(format!("line {}: {e}", no + 1))
                })?,
                other => {
                    return Err(Error::Config(format!(
                        "line {}: unknown key {other:?} (known: TAM_BLOCO, VALTAM_BLOCO, THRESHOLD_MIN, THRESHOLD_MAX, WORKERS_ADD, PERC_CONS_ADD, T_REF)",
                        no + 1
                    )))
                }
            }
        }
        c.validate()?;
        Ok(c)
    }

    /// Check ranges: `TAM_BLOCO ≥ 1`, `0 < THRESHOLD_MIN ≤ THRESHOLD_MAX`, `PERC_CONS_ADD` in
    /// [0, 100], an EWMA weight in (0, 1].
    pub fn validate(&self) -> Result<()> {
        if self.tam_bloco == 0 {
            return Err(Error::Config("TAM_BLOCO must be at least 1 task".into()));
        }
        if !(self.threshold_min > 0.0 && self.threshold_min <= self.threshold_max) {
            return Err(Error::Config(format!(
                "need 0 < THRESHOLD_MIN ({}) <= THRESHOLD_MAX ({})",
                self.threshold_min, self.threshold_max
            )));
        }
        if !(0.0..=100.0).contains(&self.perc_cons_add) {
            return Err(Error::Config(format!(
                "PERC_CONS_ADD={} must be a percentage in [0, 100]",
                self.perc_cons_add
            )));
        }
        if let TRef::Ewma(a) = self.t_ref {
            if !(a > 0.0 && a <= 1.0) {
                return Err(Error::Config(format!(
                    "T_REF=ewma:{a}: the weight must be in (0, 1]"
                )));
            }
        }
        Ok(())
    }
}

fn parse_t_ref(v: &str) -> std::result::Result<TRef, String> {
    match v.to_ascii_lowercase().as_str() {
        "worst" | "worst-of-last-iteration" => Ok(TRef::WorstOfLastIteration),
        "characterization" | "characterization-worst" => Ok(TRef::CharacterizationWorst),
        s if s.starts_with("ewma:") => s[5..]
            .parse::<f64>()
            .map(TRef::Ewma)
            .map_err(|_| format!("T_REF={v:?}: ewma needs a weight, e.g. ewma:0.5")),
        _ => Err(format!(
            "T_REF={v:?} is not worst, characterization or ewma:W"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_spellings_and_comments_parse() {
        let c = Config::parse(
            "# HNOW\nVALTAM BLOCO = 25\nTHRESHOLD MIN=70 # percent\nthreshold_max=130\nWORKERS ADD=3\nPERC CONS ADD=40\nT_REF=ewma:0.5\n",
        )
        .unwrap();
        assert_eq!(c.tam_bloco, 25);
        assert_eq!((c.threshold_min, c.threshold_max), (70.0, 130.0));
        assert_eq!((c.workers_add, c.perc_cons_add), (3, 40.0));
        assert_eq!(c.t_ref, TRef::Ewma(0.5));
    }

    #[test]
    fn bad_input_names_the_line_and_the_key() {
        let e = Config::parse("TAM_BLOCO=10\nTHRESHOLD_MIN=abc\n").unwrap_err();
        assert!(
            e.to_string().contains("line 2") && e.to_string().contains("THRESHOLD_MIN"),
            "{e}"
        );
        let e = Config::parse("TAMBLOCO=1").unwrap_err();
        assert!(e.to_string().contains("unknown key"), "{e}");
        let e = Config::parse("THRESHOLD_MIN=130\nTHRESHOLD_MAX=120").unwrap_err();
        assert!(
            e.to_string()
                .contains("THRESHOLD_MIN (130) <= THRESHOLD_MAX (120)"),
            "{e}"
        );
        assert!(Config::parse("TAM_BLOCO=0").is_err());
        assert!(Config::parse("PERC_CONS_ADD=150").is_err());
        assert!(Config::parse("T_REF=ewma:2").is_err());
        assert!(Config::parse("no equals sign").is_err());
    }
}
