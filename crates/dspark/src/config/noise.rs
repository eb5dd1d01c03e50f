//! The noise (mask) token chain: one function, used everywhere.
