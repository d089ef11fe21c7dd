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

/// One head's state as `[rows, cols]` parts, in the order of
/// [`HlaState::tensors`]: `S [d, dv]` (first order); `S [d, d]`, `Z [d, dv]`
/// (second); `S [d, d]`, `P`, `Y [d, dv]` (third); `P`, `E [d, dv]` (AHLA).
pub(crate) fn state_parts(order: Order, d: usize, dv: usize) -> Vec<[usize; 2]> {
    match order {
        Order::First => vec![[d, dv]],
        Order::Second => vec![[d, d], [d, dv]],
        Order::Third => vec![[d, d], [d, dv], [d, dv]],
        Order::Asymmetric => vec![[d, dv], [d, dv]],
    }
}

/// Floats of one head's state.
pub(crate) fn state_len(order: Order, d: usize, dv: usize) -> usize {
    state_parts(order, d, dv).iter().map(|[r, c]| r * c).sum()
}

/// The state tensors `[batch, heads, rows, cols]` as one `[batch · heads · len]` tensor,
/// each head's parts one after the other (the layout of the kernels).
pub(crate) fn pack_state(parts: Vec<Tensor<4>>) -> Tensor<1> {
    let [b, h, ..] = parts[0].dims();
    let rows: Vec<Tensor<2>> = parts
        .into_iter()
        .map(|part| part.reshape([(b * h) as i32, -1]))
        .collect();
    Tensor::cat(rows, 1).reshape([-1])
}

/// A kernel's packed `[o, final state]` for `input` as `o [batch, heads, time, dv]` and
/// the state's tensors (in the order of [`HlaState::tensors`]).
pub(crate) fn unpack_output(
    packed: Tensor<1>,
    order: Order,
    input: &HlaInput,
) -> (Tensor<4>, Vec<Tensor<4>>) {
    let [b, h, t, d] = input.q.dims();
    let dv = input.v.dims()[3];
    let o_len = b * h * t * dv;
    let state = packed.clone().narrow(0, o_len, packed.dims()[0] - o_len);
    let o = packed.narrow(0, 0, o_len).reshape([b, h, t, dv]);
    (o, unpack_state(state, [b, h], &state_parts(order, d, dv)))
}

/// The inverse of [`pack_state`] for `[batch, heads]` and each head's `parts`.
pub(crate) fn unpack_state(
    packed: Tensor<1>,
    [b, h]: [usize; 2],
    parts: &[[usize; 2]],
) -> Vec<Tensor<4>> {
    let len = parts.iter().map(|[r, c]| r * c).sum();
    let rows = packed.reshape([b * h, len]);
    let mut offset = 0;
    parts
        .iter()
        .map(|&[r, c]| {
            let part = rows.clone().narrow(1, offset, r * c).reshape([b, h, r, c]);
            offset += r * c;
            part
        })
        .collect()
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
