//! What a pass costs on a CubeCL device, read off the operations Burn's fusion runs: each
//! block of them (one fused kernel's worth, or one op run alone) with the kernels it
//! launched, the multiply-adds of its matmuls and the bytes it reads and writes. The pass
//! runs as a dry run (cubecl compiles every launch and drops it), so the figures of a shape
//! no device here could compute in reasonable time come in a moment; only the autotuner's
//! own measurements execute.
//!
//! What a block moves is what it reads from outside itself and what it writes for later:
//! the tensors its ops take that no op of the block made, and the tensors its ops make that
//! a later block reads or that no op of the block reads (an output of the pass). A block
//! that launched nothing (a reshape, a view) costs nothing.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use burn::backend::fusion::observer::{BlockOperations, FusionObservation, FusionObserver};
use burn::backend::ir::{CustomOpIr, FloatOperationIr, OperationIr, TensorId, TensorIr};
use burn::prelude::*;
use burn_cubecl::cubecl::dry_run::DryRun;
use burn_cubecl::cubecl::logging::{LaunchObservation, LaunchObserver};

/// One block of operations fusion ran: its launches and its work.
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// Kernels it launched.
    pub launches: usize,
    /// Its matmuls' FLOPs (2 per multiply-add).
    pub matmul_flops: f64,
    /// One FLOP per element of every other op's output.
    pub other_flops: f64,
    /// Bytes it reads from outside itself and writes for later.
    pub bytes: f64,
    /// The id of the custom op it ran (a hand-written kernel), if it ran one.
    pub custom: Option<String>,
    /// The shapes of that custom op's inputs (none without one).
    pub custom_inputs: Vec<Vec<usize>>,
    /// The shapes of its outputs.
    pub custom_outputs: Vec<Vec<usize>>,
}

/// Runs `work` as a dry run on `device` (a CubeCL device) and returns the blocks it ran,
/// in order. `work` must end with a device sync, so every block has run. It runs twice:
/// the first time fills the autotuner's caches (fusion's and the matmul's, whose
/// measurements run and launch kernels of their own), the second is the one read.
pub fn blocks<T>(device: &Device, mut work: impl FnMut() -> T) -> Result<(T, Vec<Block>), String> {
    {
        let _dry = DryRun::new();
        drop(work());
    }
    device.sync().map_err(|e| format!("{e:?}"))?;
    let tally = Arc::new(Tally::default());
    let out = {
        let _dry = DryRun::new();
        let _fusion = FusionObservation::new(tally.clone());
        let _launches = LaunchObservation::new(tally.clone());
        work()
    };
    let runs = std::mem::take(&mut *tally.lock());
    Ok((out, blocks_of(runs.blocks)))
}

/// What the observers saw: every block that ran, and the one running now.
#[derive(Default)]
struct Runs {
    blocks: Vec<Ran>,
    open: bool,
}

/// One block as it ran: its operations and the kernels launched inside it.
struct Ran {
    operations: Vec<OperationIr>,
    launches: usize,
}

#[derive(Default)]
struct Tally(Mutex<Runs>);

impl Tally {
    fn lock(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FusionObserver for Tally {
    fn registered(&self, _operation: &OperationIr) {}

    fn block_starts(&self, block: BlockOperations<'_>) {
        let mut runs = self.lock();
        runs.blocks.push(Ran {
            operations: block.iter().cloned().collect(),
            launches: 0,
        });
        runs.open = true;
    }

    fn block_ran(&self) {
        self.lock().open = false;
    }
}

impl LaunchObserver for Tally {
    fn launched(&self, _kernel: &'static str) {
        let mut runs = self.lock();
        // Fusion launches every kernel of a block on its own thread between the block's
        // start and end; a launch outside a block (none in Burn's ops) goes unattributed.
        if runs.open
            && let Some(block) = runs.blocks.last_mut()
        {
            block.launches += 1;
        }
    }
}

/// The blocks' costs: a tensor a block makes counts as written when a later block reads it
/// or no op of its own block does.
fn blocks_of(runs: Vec<Ran>) -> Vec<Block> {
    let read_by = |ran: &Ran| -> HashSet<TensorId> {
        let made: HashSet<TensorId> = made_in(ran).map(|t| t.id).collect();
        ran.operations
            .iter()
            .flat_map(|op| op.inputs())
            .filter(|t| !made.contains(&t.id))
            .map(|t| t.id)
            .collect()
    };
    let reads: Vec<HashSet<TensorId>> = runs.iter().map(read_by).collect();
    runs.iter()
        .enumerate()
        .map(|(i, ran)| {
            let later: HashSet<TensorId> = reads[i + 1..].iter().flatten().copied().collect();
            cost(ran, &later)
        })
        .collect()
}

/// Every tensor the block's operations make.
fn made_in(ran: &Ran) -> impl Iterator<Item = &TensorIr> {
    ran.operations.iter().flat_map(|op| op.outputs())
}

fn cost(ran: &Ran, read_later: &HashSet<TensorId>) -> Block {
    let shapes = |tensors: &[TensorIr]| tensors.iter().map(|t| t.shape.to_vec()).collect();
    let (custom, custom_inputs, custom_outputs) = ran
        .operations
        .iter()
        .find_map(|op| match op {
            OperationIr::Custom(CustomOpIr {
                id,
                inputs,
                outputs,
                ..
            }) => Some((Some(id.clone()), shapes(inputs), shapes(outputs))),
            _ => None,
        })
        .unwrap_or_default();
    if ran.launches == 0 {
        return Block {
            launches: 0,
            matmul_flops: 0.0,
            other_flops: 0.0,
            bytes: 0.0,
            custom,
            custom_inputs,
            custom_outputs,
        };
    }
    let made: HashSet<TensorId> = made_in(ran).map(|t| t.id).collect();
    let read_inside: HashSet<TensorId> = ran
        .operations
        .iter()
        .flat_map(|op| op.inputs())
        .map(|t| t.id)
        .collect();
    let mut counted = HashSet::new();
    let mut bytes = 0.0;
    // Dropping a tensor frees its memory: it reads nothing (and makes nothing).
    let moving = ran
        .operations
        .iter()
        .filter(|op| !matches!(op, OperationIr::Drop(_)));
    for op in moving {
        for t in op.inputs() {
            if !made.contains(&t.id) && counted.insert(t.id) {
                bytes += size(t);
            }
        }
        for t in op.outputs() {
            let kept = read_later.contains(&t.id) || !read_inside.contains(&t.id);
            if kept && counted.insert(t.id) {
                bytes += size(t);
            }
        }
    }
    let (matmul_flops, other_flops) = ran
        .operations
        .iter()
        .map(flops)
        .fold((0.0, 0.0), |(m, o), (dm, d_o)| (m + dm, o + d_o));
    Block {
        launches: ran.launches,
        matmul_flops,
        other_flops,
        bytes,
        custom,
        custom_inputs,
        custom_outputs,
    }
}

/// `(matmul, other)` FLOPs of one operation: 2·m·k·n per matrix of a matmul's batch, one
/// per output element of any other op but a custom one (whose kernel says its own).
fn flops(op: &OperationIr) -> (f64, f64) {
    match op {
        OperationIr::Float(_, FloatOperationIr::Matmul(mm)) => {
            let k = mm.lhs.shape[mm.lhs.shape.num_dims() - 1] as f64;
            (2.0 * k * mm.out.shape.num_elements() as f64, 0.0)
        }
        OperationIr::Custom(_) => (0.0, 0.0),
        _ => (
            0.0,
            op.outputs().map(|t| t.shape.num_elements() as f64).sum(),
        ),
    }
}

/// Bytes of a tensor.
fn size(t: &TensorIr) -> f64 {
    (t.shape.num_elements() * t.dtype.size()) as f64
}

#[cfg(test)]
mod tests {
    use burn::backend::ir::{BinaryOpIr, NumericOperationIr, TensorStatus};
    use burn::tensor::{DType, Shape};

    use super::*;

    fn tensor(id: u64, len: usize) -> TensorIr {
        TensorIr {
            id: TensorId::new(id),
            shape: Shape::new([len]),
            status: TensorStatus::ReadOnly,
            dtype: DType::F32,
        }
    }

    /// A block that adds two tensors and drops another moves the two it reads and the sum
    /// it writes; the dropped tensor's bytes are freed, not read.
    #[test]
    fn a_dropped_tensor_costs_no_read() {
        let add = BinaryOpIr {
            lhs: tensor(1, 10),
            rhs: tensor(2, 10),
            out: tensor(3, 10),
        };
        let ran = Ran {
            operations: vec![
                OperationIr::NumericFloat(DType::F32, NumericOperationIr::Add(add)),
                OperationIr::Drop(tensor(4, 1000)),
            ],
            launches: 1,
        };
        let block = cost(&ran, &HashSet::new());
        assert_eq!(block.bytes, 3.0 * 10.0 * 4.0);
        assert_eq!(block.other_flops, 10.0);
    }
}
