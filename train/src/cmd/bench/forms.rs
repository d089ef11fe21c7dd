//! Which forms of an operator, or of a training step's ops, the bench measures.

pub(super) use crate::cmd::forms::Route;

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
