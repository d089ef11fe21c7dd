//! Which forms of an operator, or of a training step's ops, the bench measures.

use hla_model::backend::Kernels;

/// Which form of an operator, or of a training step's ops, a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum Route {
    /// The hand-written kernels (the CPU's, or the GPU's, which training leaves off).
    #[value(name = "fused")]
    Kernels,
    /// The chunked HLA's node (`Kernels::Nodes`), every other op as by default.
    Node,
    /// The composed forms.
    Composed,
}

impl Route {
    /// The kernels the case runs with ([`Kernels::default`] puts the default back).
    pub(super) fn kernels(self) -> Kernels {
        match self {
            Self::Kernels => Kernels::All,
            Self::Node => Kernels::Nodes,
            Self::Composed => Kernels::None,
        }
    }

    /// The form's name in the training steps' table.
    pub(super) fn form(self) -> &'static str {
        match self {
            Self::Kernels => "fused",
            Self::Node => "node",
            Self::Composed => "composed",
        }
    }

    /// The suffix of the operator's name in a row (none for an operator's one form).
    pub(super) fn suffix(self) -> &'static str {
        match self {
            Self::Kernels => "",
            Self::Node => " node",
            Self::Composed => " composed",
        }
    }
}

/// The forms the train and operators sections measure: `--composed`'s and `--form`'s.
#[derive(Clone, Debug, Default)]
pub(super) struct Forms {
    /// Every form of each case (`--composed`).
    pub(super) all: bool,
    /// Only these (`--form`; empty: no filter).
    pub(super) only: Vec<Route>,
}

impl Forms {
    /// The forms of a case with hand-written kernels (`fused`) and a node (`node`) to
    /// measure: fused where it has kernels, else composed; with `--composed` or `--form`
    /// also its node and its composed form, then only those `--form` names.
    pub(super) fn routes(&self, fused: bool, node: bool) -> Vec<Route> {
        let mut routes = vec![if fused {
            Route::Kernels
        } else {
            Route::Composed
        }];
        if self.all || !self.only.is_empty() {
            if node {
                routes.push(Route::Node);
            }
            if fused {
                routes.push(Route::Composed);
            }
        }
        routes.retain(|route| self.only.is_empty() || self.only.contains(route));
        routes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By default a case runs in its fused form where it has kernels, else composed;
    /// `--composed` adds its node and composed forms; `--form` keeps those it names of
    /// what the case has, and alone implies `--composed`'s set.
    #[test]
    fn the_forms_are_the_defaults_composed_and_those_named() {
        use Route::{Composed, Kernels, Node};
        let default = Forms::default();
        let composed = Forms {
            all: true,
            only: vec![],
        };
        let node = Forms {
            all: false,
            only: vec![Node],
        };
        let fused_and_composed = Forms {
            all: true,
            only: vec![Composed, Kernels],
        };
        assert_eq!(default.routes(true, true), [Kernels]);
        assert_eq!(default.routes(false, true), [Composed]);
        assert_eq!(composed.routes(true, true), [Kernels, Node, Composed]);
        assert_eq!(composed.routes(false, true), [Composed, Node]);
        assert_eq!(composed.routes(true, false), [Kernels, Composed]);
        assert_eq!(node.routes(true, true), [Node]);
        assert_eq!(node.routes(true, false), []);
        assert_eq!(fused_and_composed.routes(true, true), [Kernels, Composed]);
        assert_eq!(fused_and_composed.routes(false, false), [Composed]);
    }
}
