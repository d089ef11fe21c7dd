//! Which form an operator, or a training step's ops, runs in: chosen on the command line of
//! the commands that measure or check the forms (`hla bench --form`, `hla verify --form`),
//! and where their tile products run (`--tensor-cores`).

use hla_model::backend::{Kernels, TensorCores};

use crate::run::config::Form;

/// Which form of an operator, or of a training step's ops, a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Route {
    /// The hand-written kernels (the CPU's, or the GPU's, which training leaves off).
    #[value(name = "fused")]
    Kernels,
    /// The chunked HLA's node (`Kernels::Nodes`), every other op as by default.
    Node,
    /// The composed forms.
    Composed,
}

impl Route {
    /// The kernels the case runs with, as a run of the same form trains with
    /// ([`Kernels::default`] puts the default back).
    pub(crate) fn kernels(self) -> Kernels {
        Form::from(self).kernels()
    }

    /// The form's name in the training steps' table.
    pub(crate) fn form(self) -> &'static str {
        match self {
            Self::Kernels => "fused",
            Self::Node => "node",
            Self::Composed => "composed",
        }
    }

    /// The suffix of the operator's name in a row (none for an operator's one form).
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            Self::Kernels => "",
            Self::Node => " node",
            Self::Composed => " composed",
        }
    }
}

impl From<Route> for Form {
    fn from(route: Route) -> Self {
        match route {
            Route::Kernels => Self::Fused,
            Route::Node => Self::Node,
            Route::Composed => Self::Composed,
        }
    }
}

/// `--tensor-cores on|off` of the commands that measure or check the forms.
#[derive(clap::Args, Clone, Copy, Debug)]
pub(crate) struct TensorCoresArg {
    /// GPU devices: the tile products of the kernels written for the tensor cores (the
    /// node's passes over the chunks, output step, hla2's moments and the backward's
    /// moment products; the attention's tiles), `on` where the device has them (TF32 on
    /// CUDA) or `off` (their register-tile kernels everywhere: to measure what the tensor
    /// cores gain, or to run without them).
    #[arg(
        long = "tensor-cores",
        default_value = "on",
        value_parser = parse_on_off,
        action = clap::ArgAction::Set
    )]
    pub(crate) on: bool,
}

impl TensorCoresArg {
    /// Sets where the GPU kernels' tile products run, process-wide.
    pub(crate) fn apply(self) {
        hla_model::backend::set_tensor_cores(match self.on {
            true => TensorCores::Device,
            false => TensorCores::Off,
        });
    }
}

fn parse_on_off(name: &str) -> Result<bool, String> {
    match name {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("`{name}`: expected `on` or `off`")),
    }
}
