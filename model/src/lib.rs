//! Higher-order Linear Attention on Burn: the operators in their reference, recurrent and
//! chunk-parallel forms, and the language models built from them.
//!
//! Dependencies run one way: [`backend`] (machinery every kernel shares) ← [`hla`] (the
//! operators, with their CPU and GPU kernels) ← [`lm`] (the language model, its ops with
//! their kernels) ← [`optim`]; [`agreement`] and [`bench`] serve tests and benchmarks.
//! See `docs/architecture.md`.

pub mod agreement;
pub mod backend;
pub mod bench;
pub mod hla;
pub mod lm;
pub mod optim;
#[cfg(all(test, feature = "cuda"))]
mod ptx_tests;
#[cfg(test)]
mod testing;
