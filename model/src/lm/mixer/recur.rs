//! The recurrent mixers (HLA of every order and linear attention): the CPU kernels on CPU
//! devices ([`super::qkv`]), in chunks or by the serial recurrence, and the composed
//! forms of [`crate::hla`] elsewhere; and the state they carry between calls.

use burn::prelude::*;
use burn::tensor::activation::log_sigmoid;

#[cfg(cpu_kernels)]
use super::qkv;
use super::{GATE_TEMPERATURE, Memory, Mixer};
use crate::hla::{
    self, Form, HlaInput, HlaState, Order, Output, fixed_log_gates, multi_scale_decay, state_parts,
    unpack_state,
};
use crate::lm::linear::linear;
use crate::lm::{DecayKind, MixerKind};

/// How the CPU kernels compute a call.
#[cfg(cpu_kernels)]
pub(super) struct CpuCall {
    hla: qkv::QkvHla,
    /// By the serial recurrence in place (evaluation, generation: no gradient), not in
    /// chunks.
    serial: bool,
}

impl Mixer {
    /// The CPU kernels' settings, if it computes this call: HLA of any order or linear
    /// attention in one chunk-parallel pass or by the serial recurrence, keys per head, on
    /// a CPU device.
    #[cfg(cpu_kernels)]
    pub(super) fn cpu_call(
        &self,
        qkv: &Tensor<3>,
        widths: [usize; 3],
        form: Form,
        memory: Option<&Memory>,
    ) -> Option<CpuCall> {
        let s = &self.settings;
        let order = self.order()?;
        // The serial recurrence on the CPU kernels only where no gradient is asked for (it has no
        // backward pass): evaluation and generation.
        let (chunk, serial) = match form {
            Form::Chunked(chunk) => (chunk, false),
            Form::Recurrent if !qkv.is_tracked() => (1, true),
            _ => return None,
        };
        let recurrent = matches!(
            memory,
            None | Some(Memory::Recurrent(_) | Memory::Packed { .. })
        );
        let hla = qkv::QkvHla {
            order,
            kernels: hla::cpu_kernels(order),
            heads: s.heads,
            map: s.feature_map,
            chunk,
            denominator: match s.output {
                Output::Raw => None,
                Output::Normalized { eps } => Some(eps as f32),
            },
            gates: false,
        };
        let keys_per_head = widths[0] == widths[1];
        // The nodes, when turned on, take the chunked form from the mixer's kernels.
        let node = !serial && crate::backend::kernels() == crate::backend::Kernels::Nodes;
        (keys_per_head && recurrent && !node && crate::backend::takes_cpu_kernel(qkv))
            .then_some(CpuCall { hla, serial })
    }

    /// [`Self::recur`] by the CPU kernels from qkv: `qkv [batch, time, 3·d]` → the heads' outputs
    /// after the denominator (the output norm comes after), `[batch, time, d]`.
    #[cfg(cpu_kernels)]
    pub(super) fn recur_on_cpu(
        &self,
        x: &Tensor<3>,
        qkv: Tensor<3>,
        memory: Option<Memory>,
        call: CpuCall,
    ) -> (Tensor<3>, Memory) {
        let [b, t, _] = qkv.dims();
        let device = qkv.device();
        let log_g = self
            .log_gates(x, t, &device)
            .unwrap_or_else(|| Tensor::zeros([1, 1, t], &device));
        let hla = qkv::QkvHla {
            gates: log_g.is_tracked(),
            ..call.hla
        };
        if call.serial {
            let packed = match memory {
                Some(Memory::Packed { packed, .. }) => packed,
                other => hla::pack_state(self.state_or_zeros(other, b, &device).tensors()),
            };
            let (o, packed) = qkv::serial::forward(qkv, log_g, packed, hla);
            return (o, Memory::Packed { packed, batch: b });
        }
        let state = self.state_or_zeros(memory, b, &device);
        let (o, state) = qkv::chunked::forward(qkv, log_g, state, hla);
        (o, Memory::Recurrent(state))
    }

    /// HLA or linear attention over the feature-mapped q, k; the state after it when
    /// `keep`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn recur(
        &self,
        x: &Tensor<3>,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        memory: Option<Memory>,
        form: Form,
        keep: bool,
    ) -> (Tensor<4>, Option<Memory>) {
        let s = &self.settings;
        let order = self.order().expect("softmax attention has no recurrence");
        let (q, k) = s.feature_map.apply(q, k);
        let log_g = self.log_gates(x, q.dims()[2], &q.device());
        let input = HlaInput::new(q, k, v, log_g).expect("the mixer builds consistent shapes");
        let state = self.recurrent_state(memory);
        match keep {
            true => {
                let (o, state) = hla::forward(order, form, input, state, s.output);
                (o, Some(Memory::Recurrent(state)))
            }
            false => (hla::output(order, form, input, state, s.output), None),
        }
    }

    /// The operator of HLA and linear attention (`None` for softmax attention).
    pub(super) fn order(&self) -> Option<Order> {
        match self.settings.kind {
            MixerKind::Linear => Some(Order::First),
            MixerKind::Hla2 => Some(Order::Second),
            MixerKind::Hla3 => Some(Order::Third),
            MixerKind::Ahla => Some(Order::Asymmetric),
            MixerKind::Softmax => None,
        }
    }

    /// The log gates `[batch or 1, heads, time]` of `time` tokens of the mixer's input `x`
    /// (`None` without decay): data-dependent, or the fixed multi-scale decay.
    fn log_gates(&self, x: &Tensor<3>, time: usize, device: &Device) -> Option<Tensor<3>> {
        let s = &self.settings;
        match (&self.gate, s.decay) {
            (Some(gate), _) => {
                Some(log_sigmoid(linear(gate, x.clone())).swap_dims(1, 2) / GATE_TEMPERATURE)
            }
            (None, DecayKind::Fixed) => Some(
                fixed_log_gates(&multi_scale_decay(s.heads, s.decay_base), time, device)
                    .expect("γ in (0, 1)"),
            ),
            (None, _) => None,
        }
    }

    /// The recurrent state a mixer carries, as its tensors (`None` before the first call).
    ///
    /// # Panics
    ///
    /// On a softmax attention's KV cache.
    pub(super) fn recurrent_state(&self, memory: Option<Memory>) -> Option<HlaState> {
        let heads = self.settings.heads;
        match memory? {
            Memory::Recurrent(state) => Some(state),
            Memory::Packed { packed, batch } => {
                let parts = self.state_parts();
                let len = parts.iter().map(|[r, c]| r * c).sum::<usize>() * batch * heads;
                let parts = unpack_state(packed.narrow(0, 0, len), [batch, heads], &parts);
                Some(HlaState::from_tensors(self.order()?, parts))
            }
            Memory::Cache { .. } | Memory::Projected(_) => {
                unreachable!("a KV cache passed to a recurrent mixer")
            }
        }
    }

    /// [`Self::recurrent_state`], or zeros for `batch` sequences before the first call.
    #[cfg(cpu_kernels)]
    fn state_or_zeros(&self, memory: Option<Memory>, batch: usize, device: &Device) -> HlaState {
        self.recurrent_state(memory).unwrap_or_else(|| {
            let heads = self.settings.heads;
            let zeros = |[r, c]: [usize; 2]| Tensor::zeros([batch, heads, r, c], device);
            let parts = self.state_parts().into_iter().map(zeros).collect();
            HlaState::from_tensors(self.order().expect("a recurrent mixer"), parts)
        })
    }

    /// One head's state as `[rows, cols]` parts (keys per head; the value side with the
    /// denominator's column).
    fn state_parts(&self) -> Vec<[usize; 2]> {
        let s = &self.settings;
        let dv = s.d_head + usize::from(matches!(s.output, Output::Normalized { .. }));
        state_parts(self.order().expect("a recurrent mixer"), s.d_head, dv)
    }
}
