//! The one resolver between DeepSpec and capture semantics for target layer ids.
