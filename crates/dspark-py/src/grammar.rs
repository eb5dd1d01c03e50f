//! Structured output for the Python engine: the grammar compiler of the target's directory
//! (its `tokenizer.json`, vocabulary and end-of-sequence id, read as `dspark serve` reads
//! them), built at the first request that asks for one; each such request compiles its own
//! `response_format` into a constraint.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use dspark::Error;
use dspark::engine::Constraint;
use dspark_server::grammar::Grammars;
use dspark_server::model::ModelInfo;

/// The grammar compiler of one engine.
pub struct PyGrammars {
    dir: Option<PathBuf>,
    built: OnceLock<Result<Arc<Grammars>, String>>,
}

impl PyGrammars {
    /// For the target in `dir` (`None`: structured output is unavailable).
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self {
            dir,
            built: OnceLock::new(),
        }
    }

    fn grammars(&self) -> Result<Arc<Grammars>, String> {
        self.built
            .get_or_init(|| {
                let dir = self.dir.as_ref().ok_or_else(|| {
                    "the engine knows no tokenizer: pass tokenizer_dir= (the target's directory)"
                        .to_string()
                })?;
                let model = ModelInfo::load(dir, None, Some(usize::MAX))
                    .map_err(|e| format!("{}: {e}", dir.display()))?;
                model.grammars
            })
            .clone()
    }

    /// The constraint of `response_format` (JSON text of an OpenAI `response_format`, or of
    /// the `regex` / `grammar` extensions); `None` for free text. Errors are
    /// `invalid-argument` naming `response_format`.
    pub fn constraint(&self, response_format: &str) -> Result<Option<Constraint>, Error> {
        let bad = |m: String| Error::invalid("response_format", m);
        let value: serde_json::Value =
            serde_json::from_str(response_format).map_err(|e| bad(format!("not JSON: {e}")))?;
        let grammar =
            dspark_server::api::format::grammar(Some(&value)).map_err(|e| bad(e.message))?;
        let Some(grammar) = grammar else {
            return Ok(None);
        };
        let grammars = self
            .grammars()
            .map_err(|why| bad(format!("structured output is unavailable: {why}")))?;
        let guided = grammars
            .compile(grammar)
            .map_err(|e| bad(format!("the grammar: {e}")))?;
        Ok(Some(Constraint::new(guided)))
    }
}
