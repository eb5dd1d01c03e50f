//! Checkpoint-name rules.
