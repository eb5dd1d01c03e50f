//! Drafting and verification kernels.
