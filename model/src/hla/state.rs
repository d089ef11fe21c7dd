//! Every order behind one trait ([`Operator`]: its state, its forms, its kernels), the one
//! place that maps an [`Order`] to it ([`with_operator!`]), and the recurrent state of any
//! order as one type for callers that pick the order at run time ([`HlaState`]).

use burn::prelude::*;

use super::{HlaInput, Order, Output, ahla, first, second, third};

/// What every order provides, implemented by its state type: the forms its folder holds
/// and the kernels that replace the chunked form where they apply.
pub(crate) trait Operator {
    /// The order's state type.
    type State;

    /// The quadratic definition.
    fn reference(input: &HlaInput, state: Self::State) -> (Tensor<4>, Self::State);

    /// The serial recurrence.
    fn recurrent(input: &HlaInput, state: Self::State) -> (Tensor<4>, Self::State);

    /// The composed chunk-parallel form.
    fn chunked(input: &HlaInput, state: Self::State, chunk: usize) -> (Tensor<4>, Self::State);

    /// One head's state as `[rows, cols]` parts, in the order of [`Operator::tensors`].
    fn state_parts(d: usize, dv: usize) -> Vec<[usize; 2]>;

    /// The zero state of `b` sequences with `h` heads (`sh` for the key moment) and widths
    /// `d`, `dv`.
    fn zeros(heads: [usize; 3], widths: [usize; 2], device: &Device) -> Self::State;

    fn tensors(state: &Self::State) -> Vec<Tensor<4>>;

    fn from_tensors(tensors: Vec<Tensor<4>>) -> Self::State;

    fn wrap(state: Self::State) -> HlaState;

    /// # Panics
    ///
    /// If `state` belongs to another order.
    fn unwrap(state: HlaState) -> Self::State;

    /// The CPU kernels of its chunked and serial forms.
    #[cfg(cpu_kernels)]
    const CPU: crate::hla::cpu::HeadKernels;

    /// The GPU kernels of its chunked form.
    #[cfg(gpu_kernels)]
    const GPU: crate::hla::gpu::GpuKernels;

    /// Its chunked form as one autodiff node.
    #[cfg(any(cpu_kernels, gpu_kernels))]
    const NODE: crate::hla::node::NodeKernels;
}

macro_rules! operators {
    ($($order:ident => $variant:ident),+ $(,)?) => {$(
        impl Operator for $order::State {
            type State = Self;

            fn reference(input: &HlaInput, state: Self) -> (Tensor<4>, Self) {
                $order::reference(input, state)
            }

            fn recurrent(input: &HlaInput, state: Self) -> (Tensor<4>, Self) {
                $order::recurrent(input, state)
            }

            fn chunked(input: &HlaInput, state: Self, chunk: usize) -> (Tensor<4>, Self) {
                $order::chunked(input, state, chunk)
            }

            fn state_parts(d: usize, dv: usize) -> Vec<[usize; 2]> {
                $order::state_parts(d, dv)
            }

            fn zeros(heads: [usize; 3], widths: [usize; 2], device: &Device) -> Self {
                Self::zeros(heads, widths, device)
            }

            fn tensors(state: &Self) -> Vec<Tensor<4>> {
                state.tensors()
            }

            fn from_tensors(tensors: Vec<Tensor<4>>) -> Self {
                Self::from_tensors(tensors)
            }

            fn wrap(state: Self) -> HlaState {
                HlaState::$variant(state)
            }

            fn unwrap(state: HlaState) -> Self {
                match state {
                    HlaState::$variant(s) => s,
                    other => panic!(
                        "a {:?} state passed to the {:?} operator",
                        other.order(),
                        Order::$variant
                    ),
                }
            }

            #[cfg(cpu_kernels)]
            const CPU: crate::hla::cpu::HeadKernels = $order::cpu::KERNELS;

            #[cfg(gpu_kernels)]
            const GPU: crate::hla::gpu::GpuKernels = $order::gpu::KERNELS;

            #[cfg(any(cpu_kernels, gpu_kernels))]
            const NODE: crate::hla::node::NodeKernels = $order::node::NODE;
        }
    )+};
}

operators!(
    first => First,
    second => Second,
    third => Third,
    ahla => Asymmetric,
);

/// Evaluates `$body` with `$O` the [`Operator`] of `$order`: the one `match` over the
/// orders.
macro_rules! with_operator {
    ($order:expr, $O:ident => $body:expr) => {
        match $order {
            $crate::hla::Order::First => {
                type $O = $crate::hla::first::State;
                $body
            }
            $crate::hla::Order::Second => {
                type $O = $crate::hla::second::State;
                $body
            }
            $crate::hla::Order::Third => {
                type $O = $crate::hla::third::State;
                $body
            }
            $crate::hla::Order::Asymmetric => {
                type $O = $crate::hla::ahla::State;
                $body
            }
        }
    };
}
pub(crate) use with_operator;

/// One head's state of `order` as `[rows, cols]` parts, in the order of
/// [`HlaState::tensors`]: `S [d, dv]` (first order); `S [d, d]`, `Z [d, dv]` (second);
/// `S [d, d]`, `P`, `Y [d, dv]` (third); `P`, `E [d, dv]` (AHLA).
pub(crate) fn state_parts(order: Order, d: usize, dv: usize) -> Vec<[usize; 2]> {
    with_operator!(order, O => O::state_parts(d, dv))
}

/// The CPU kernels of `order` (for the mixer's kernels, which take q, k and v packed).
#[cfg(cpu_kernels)]
pub(crate) fn cpu_kernels(order: Order) -> crate::hla::cpu::HeadKernels {
    with_operator!(order, O => O::CPU)
}

/// The GPU kernels of `order` (for the cost model, which reads their workspace).
#[cfg(gpu_kernels)]
pub(crate) fn gpu_kernels(order: Order) -> crate::hla::gpu::GpuKernels {
    with_operator!(order, O => O::GPU)
}

/// The constant-size state carried between tokens and between calls.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one tensor handle apart; boxing would allocate per token
pub enum HlaState {
    First(first::State),
    Second(second::State),
    Third(third::State),
    Asymmetric(ahla::State),
}

impl HlaState {
    /// The zero state for `input`'s batch, heads and dimensions; with
    /// [`Output::Normalized`] the value-side tensors get the denominator column.
    pub fn zeros(order: Order, input: &HlaInput, output: Output) -> Self {
        let extra = usize::from(matches!(output, Output::Normalized { .. }));
        with_operator!(order, O => O::wrap(zeros_with::<O>(input, extra)))
    }

    /// Which operator this state belongs to.
    pub fn order(&self) -> Order {
        match self {
            Self::First(_) => Order::First,
            Self::Second(_) => Order::Second,
            Self::Third(_) => Order::Third,
            Self::Asymmetric(_) => Order::Asymmetric,
        }
    }

    /// Every tensor of the state, in the order of docs/math.md's names.
    pub fn tensors(&self) -> Vec<Tensor<4>> {
        match self {
            Self::First(s) => s.tensors(),
            Self::Second(s) => s.tensors(),
            Self::Third(s) => s.tensors(),
            Self::Asymmetric(s) => s.tensors(),
        }
    }

    /// Rebuilds a state of `order` from [`tensors`](Self::tensors) (e.g. after making
    /// them leaves for autodiff).
    pub fn from_tensors(order: Order, tensors: Vec<Tensor<4>>) -> Self {
        with_operator!(order, O => O::wrap(O::from_tensors(tensors)))
    }

    /// Floats per sequence (all heads).
    pub fn num_floats(&self) -> usize {
        self.tensors()
            .iter()
            .map(|t| t.shape().num_elements() / t.dims()[0])
            .sum()
    }
}

/// The zero state of `O` for `input`'s batch, heads and widths.
pub(crate) fn zeros<O: Operator>(input: &HlaInput) -> O::State {
    zeros_with::<O>(input, 0)
}

/// [`zeros`] with `extra` value columns (the denominator's).
fn zeros_with<O: Operator>(input: &HlaInput, extra: usize) -> O::State {
    let [b, h, _, d] = input.q.dims();
    let dv = input.v.dims()[3] + extra;
    O::zeros([b, h, input.key_state_heads()], [d, dv], &input.q.device())
}
