//! Several devices: burn-train's execution strategies over an even split of every batch,
//! with the gradient kept the mean over the whole batch, so that N devices train as one
//! device with the same `batch_size` does.

use burn::prelude::*;
use burn::tensor::distributed::{DistributedConfig, ReduceOperation};
use burn::train::{ExecutionStrategy, MultiDeviceOptim};

use crate::run::config::{Strategy, TrainSection};

/// Batches whose gradients burn-train adds up into one optimiser step: the accumulated
/// batches times one per device (`multi` sums them on the main device; `ddp` is asked to
/// sum too).
pub fn batches_per_step(t: &TrainSection, devices: usize) -> usize {
    t.grad_accumulation * devices
}

/// The execution strategy for `devices`; `None` for one device, which trains as it always
/// has (burn-train's single-device loop on the model's device).
pub fn execution(devices: &[Device], strategy: Strategy) -> Option<ExecutionStrategy> {
    if devices.len() < 2 {
        return None;
    }
    Some(match strategy {
        Strategy::Multi => {
            ExecutionStrategy::multi(devices.to_vec(), MultiDeviceOptim::OptimMainDevice)
        }
        Strategy::Ddp => ExecutionStrategy::ddp(
            devices.to_vec(),
            DistributedConfig {
                all_reduce_op: ReduceOperation::Sum,
            },
        ),
    })
}
