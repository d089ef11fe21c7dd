//! Data for hla: text corpora and their tokenizers, prepared token files read through a
//! memory map, the MQAR recall task, and the Burn datasets and batcher that feed training.

pub mod batch;
pub mod config;
pub mod corpus;
mod error;
pub mod mqar;
pub mod prepared;
pub mod tokenizer;
pub mod windows;

pub use error::DataError;
