//! Higher-order Linear Attention on Burn: the operators in their reference, recurrent and
//! chunk-parallel forms.

pub mod bench;
pub mod compare;
pub mod fused;
pub mod hla;
pub mod lm;
pub mod optim;
