//! The recurrent state of any order, as one type for callers that pick the order at run
//! time.

use burn::prelude::*;

use super::{HlaInput, Order, Output, ahla, first, second, third};

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
        let [b, h, _, d] = input.q.dims();
        let dv = input.v.dims()[3] + usize::from(matches!(output, Output::Normalized { .. }));
        let sh = input.key_state_heads();
        let device = input.q.device();
        let zeros =
            |heads: usize, rows: usize, cols: usize| Tensor::zeros([b, heads, rows, cols], &device);
        match order {
            Order::First => Self::First(first::State { s: zeros(h, d, dv) }),
            Order::Second => Self::Second(second::State {
                s: zeros(sh, d, d),
                z: zeros(h, d, dv),
            }),
            Order::Third => Self::Third(third::State {
                s: zeros(sh, d, d),
                p: zeros(h, d, dv),
                y: zeros(h, d, dv),
            }),
            Order::Asymmetric => Self::Asymmetric(ahla::State {
                p: zeros(h, d, dv),
                e: zeros(h, d, dv),
            }),
        }
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

    /// Every tensor of the state, in the order of the spec's names.
    pub fn tensors(&self) -> Vec<Tensor<4>> {
        match self {
            Self::First(s) => vec![s.s.clone()],
            Self::Second(s) => vec![s.s.clone(), s.z.clone()],
            Self::Third(s) => vec![s.s.clone(), s.p.clone(), s.y.clone()],
            Self::Asymmetric(s) => vec![s.p.clone(), s.e.clone()],
        }
    }

    /// Rebuilds a state of `order` from [`tensors`](Self::tensors) (e.g. after making
    /// them leaves for autodiff).
    pub fn from_tensors(order: Order, tensors: Vec<Tensor<4>>) -> Self {
        let mut it = tensors.into_iter();
        let mut next = || it.next().expect("too few state tensors");
        match order {
            Order::First => Self::First(first::State { s: next() }),
            Order::Second => Self::Second(second::State {
                s: next(),
                z: next(),
            }),
            Order::Third => Self::Third(third::State {
                s: next(),
                p: next(),
                y: next(),
            }),
            Order::Asymmetric => Self::Asymmetric(ahla::State {
                p: next(),
                e: next(),
            }),
        }
    }

    /// Floats per sequence (all heads).
    pub fn num_floats(&self) -> usize {
        self.tensors()
            .iter()
            .map(|t| t.shape().num_elements() / t.dims()[0])
            .sum()
    }
}

/// An order's own state type, convertible to and from [`HlaState`] (what the fused forms,
/// written once for every order, take).
pub(crate) trait OrderState: Sized {
    const ORDER: Order;

    fn into_state(self) -> HlaState;

    /// # Panics
    ///
    /// If `state` belongs to another order.
    fn from_state(state: HlaState) -> Self;
}

macro_rules! order_state {
    ($($ty:ty => $variant:ident),+ $(,)?) => {$(
        impl OrderState for $ty {
            const ORDER: Order = Order::$variant;

            fn into_state(self) -> HlaState {
                HlaState::$variant(self)
            }

            fn from_state(state: HlaState) -> Self {
                match state {
                    HlaState::$variant(s) => s,
                    other => unreachable!("a {:?} state for {:?}", other.order(), Order::$variant),
                }
            }
        }
    )+};
}

order_state!(
    first::State => First,
    second::State => Second,
    third::State => Third,
    ahla::State => Asymmetric,
);
