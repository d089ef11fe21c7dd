//! What a configuration builds: the parameter count by its formula, the state's size, the
//! keys of configs that cannot build, the fixed decay's base.

use burn::prelude::*;
use hla_model::lm::{DecayKind, LmConfig, MixerKind, MlpKind, Positions};

use crate::common::{MIXERS, Rng, devices, rel_rms, tiny};
use crate::{tokens, variants};

/// Parameters: embedding, learned positions when on, per block two norms (a gain each: the
/// LayerNorm has no bias), q/k/v/out projections, the short convolution, gate, output norm
/// and gate when on, and the MLP (SwiGLU: three matrices, GELU: two); a final norm; the
/// head when untied.
fn expected_params(c: &LmConfig) -> usize {
    let (v, d, h) = (c.vocab_size, c.d_model, c.n_heads);
    let d_head = d / h;
    let recurrent = c.mixer != MixerKind::Softmax;
    let d_k = if c.shared_keys && recurrent {
        d_head
    } else {
        d
    };
    let conv = c.short_conv * (2 * d + d_k);
    let gate = if c.decay == DecayKind::Gated && recurrent {
        d * h
    } else {
        0
    };
    let out_norm = if c.resolved_output_norm() && recurrent {
        d_head
    } else {
        0
    };
    let out_gate = if c.output_gate { d * d } else { 0 };
    let mixer = 3 * d * d + d * d_k + conv + gate + out_norm + out_gate;
    let matrices = match c.mlp_kind {
        MlpKind::Swiglu => 3,
        MlpKind::Gelu => 2,
    };
    let mlp = if c.mlp {
        d + matrices * d * c.d_ff()
    } else {
        0
    };
    let block = d + mixer + mlp;
    let head = if c.tie_embeddings { 0 } else { v * d };
    let positions = match c.positions {
        Positions::Rope => 0,
        Positions::Learned => c.max_seq_len * d,
    };
    v * d + positions + c.n_layers * block + d + head
}

#[test]
fn parameter_count_matches_formula() {
    let device = &devices()[0];
    for mixer in MIXERS {
        for config in variants(mixer)
            .into_iter()
            .chain([tiny(mixer).with_tie_embeddings(false)])
        {
            let model = config.init(device);
            assert_eq!(
                model.num_params(),
                expected_params(&config),
                "{mixer:?}: {config:?}"
            );
        }
    }
    // nanoGPT's CPU shape (4 layers, width 128, vocab 65) with the defaults.
    let config = LmConfig::new(65);
    assert_eq!(config.d_ff(), 352);
    assert_eq!(config.clone().with_mlp_kind(MlpKind::Gelu).d_ff(), 512);
    assert_eq!(config.init(device).num_params(), expected_params(&config));
}

#[test]
fn state_size_is_constant_except_for_softmax() {
    let device = &devices()[0];
    let (d, h) = (32, 2);
    let dh = d / h;
    let conv = 3 * 3 * d; // (kernel − 1) × channels of q, k, v
    let size = |config: LmConfig| config.init(device).state_sizes(1000)[0];
    let plain = |mixer| tiny(mixer).with_normalize(Some(false));
    assert_eq!(size(plain(MixerKind::Linear)), h * dh * dh + conv);
    assert_eq!(size(plain(MixerKind::Hla2)), h * (dh * dh + dh * dh) + conv);
    assert_eq!(
        size(plain(MixerKind::Hla3)),
        h * (dh * dh + 2 * dh * dh) + conv
    );
    assert_eq!(size(plain(MixerKind::Ahla)), h * 2 * dh * dh + conv);
    assert_eq!(size(tiny(MixerKind::Softmax)), 2 * d * 1000 + conv);
    // The linear-time mixers divide by the masked denominator by default: its running
    // sums of keys (the recurrences with v = 1) add dh per head for first and second
    // order and 2·dh for third order and AHLA.
    assert_eq!(size(tiny(MixerKind::Linear)), h * (dh * dh + dh) + conv);
    assert_eq!(size(tiny(MixerKind::Hla2)), h * (2 * dh * dh + dh) + conv);
    assert_eq!(
        size(tiny(MixerKind::Hla3)),
        h * (3 * dh * dh + 2 * dh) + conv
    );
    assert_eq!(
        size(tiny(MixerKind::Ahla)),
        h * (2 * dh * dh + 2 * dh) + conv
    );
}

#[test]
fn invalid_configs_name_the_key() {
    let bad = [
        (tiny(MixerKind::Hla2).with_n_heads(3), "n_heads"),
        (tiny(MixerKind::Hla2).with_chunk_size(0), "chunk_size"),
        (tiny(MixerKind::Hla2).with_short_conv(1), "short_conv"),
        (tiny(MixerKind::Hla2).with_decay_base(0.0), "decay_base"),
        (
            tiny(MixerKind::Linear).with_decay_base(f64::NAN),
            "decay_base",
        ),
        (tiny(MixerKind::Hla2).with_dropout(1.5), "dropout"),
        (tiny(MixerKind::Softmax).with_n_heads(32), "n_heads"),
        // Two layers, one mixer named.
        (
            tiny(MixerKind::Hla2).with_layers(Some(vec![MixerKind::Hla2])),
            "layers",
        ),
        (
            tiny(MixerKind::Linear).with_layers(Some(vec![MixerKind::Hla2; 2])),
            "mixer",
        ),
        // A softmax layer among HLA layers needs an even head dimension too.
        (
            tiny(MixerKind::Hla2)
                .with_n_heads(32)
                .with_layers(Some(vec![MixerKind::Hla2, MixerKind::Softmax])),
            "n_heads",
        ),
    ];
    for (config, key) in bad {
        let err = config.validate().expect_err(key).to_string();
        assert!(err.starts_with(key), "{err}");
    }
    assert!(tiny(MixerKind::Hla2).validate().is_ok());
}

/// `decay_base` reaches the fixed decay: the same weights give other logits under another
/// base, and the same logits when the decay is off.
#[test]
fn decay_base_sets_the_fixed_decay() {
    let device = devices()[0].clone();
    let ids = tokens(&mut Rng::new(5), 1, 16, 37, &device);
    for (decay, differs) in [(DecayKind::Fixed, true), (DecayKind::None, false)] {
        let config = |base: f64| {
            tiny(MixerKind::Hla2)
                .with_decay(decay)
                .with_decay_base(base)
        };
        let strong = config(1.0).init(&device);
        let weak = config(5.0)
            .init(&device)
            .load_record(strong.clone().into_record());
        let err = rel_rms(&strong.forward(ids.clone()), &weak.forward(ids.clone()));
        assert_eq!(err > 1e-3, differs, "{decay:?}: relative change {err:.2e}");
    }
}
