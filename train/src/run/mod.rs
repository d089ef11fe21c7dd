//! The library of the commands: run configs, devices, data, run folders, training,
//! evaluation, export, and the experiments, reports and charts of `hla compare`. Nothing
//! here knows the command line.

pub mod config;
pub mod data;
pub mod devices;
pub mod evaluate;
pub mod experiment;
pub mod export;
pub mod finish;
pub mod history;
pub mod identity;
pub mod plots;
pub mod progress;
pub mod report;
pub mod run_dir;
pub mod run_eval;
pub mod trainer;
pub mod usage;
