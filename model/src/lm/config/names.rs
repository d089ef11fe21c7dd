//! The enums of [`LmConfig`](super::LmConfig) by their names in config files: `name()`,
//! `FromStr`, and the serde helpers of its config-file form.

use std::str::FromStr;

use burn::serde::{Deserialize, Deserializer, Serializer};

use super::{DecayKind, FeatureMap, MixerKind, MlpKind, NormKind, Positions};

/// `NAMES`, `name()` and `FromStr` for an enum of unit variants, by the lowercase names
/// config files use: `config_names!(Kind { A => "a", B => "b" })`. The language model's
/// enums use it, and so do the binary's.
#[macro_export]
macro_rules! config_names {
    ($ty:ty { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The name in config files.
            pub fn name(&self) -> &'static str {
                match self { $(Self::$variant => $name),+ }
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = ::std::string::String;

            fn from_str(s: &str) -> ::std::result::Result<Self, ::std::string::String> {
                match s {
                    $($name => Ok(Self::$variant),)+
                    _ => Err(format!("{s:?} is not one of {}", Self::NAMES.join(", "))),
                }
            }
        }
    };
}

/// [`config_names!`](crate::config_names) and [`Named`], for the config-file serde helpers
/// below.
macro_rules! names {
    ($ty:ty { $($names:tt)+ }) => {
        crate::config_names!($ty { $($names)+ });

        impl Named for $ty {
            fn config_name(&self) -> &'static str {
                self.name()
            }
        }
    };
}

/// The enums of [`LmConfig`](super::LmConfig) by their names in config files.
pub(super) trait Named: FromStr<Err = String> {
    fn config_name(&self) -> &'static str;
}

names!(MixerKind { Hla2 => "hla2", Hla3 => "hla3", Ahla => "ahla", Linear => "linear", Softmax => "softmax" });
names!(FeatureMap { L2 => "l2", Scale => "scale", EluPlusOne => "elu_plus_one", Identity => "identity" });
names!(DecayKind { None => "none", Fixed => "fixed", Gated => "gated" });
names!(Positions { Rope => "rope", Learned => "learned" });
names!(MlpKind { Swiglu => "swiglu", Gelu => "gelu" });
names!(NormKind { Rms => "rms", Layer => "layer" });

/// An enum of [`LmConfig`](super::LmConfig) by its name in config files.
pub(super) mod by_name {
    use super::*;

    pub fn serialize<S: Serializer, T: Named>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(value.config_name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Named>(d: D) -> Result<T, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(burn::serde::de::Error::custom)
    }
}

/// An optional enum of [`LmConfig`](super::LmConfig) by its name in config files.
pub(super) mod by_name_opt {
    use super::*;

    pub fn serialize<S: Serializer, T: Named>(value: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.serialize_str(v.config_name()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Named>(d: D) -> Result<Option<T>, D::Error> {
        Some(
            String::deserialize(d)?
                .parse()
                .map_err(burn::serde::de::Error::custom),
        )
        .transpose()
    }
}

/// An optional list of enums of [`LmConfig`](super::LmConfig) by their names in config files.
pub(super) mod by_name_list {
    use burn::serde::ser::SerializeSeq;

    use super::*;

    pub fn serialize<S: Serializer, T: Named>(
        value: &Option<Vec<T>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(list) => {
                let mut seq = s.serialize_seq(Some(list.len()))?;
                for v in list {
                    seq.serialize_element(v.config_name())?;
                }
                seq.end()
            }
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Named>(
        d: D,
    ) -> Result<Option<Vec<T>>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|name| name.parse().map_err(burn::serde::de::Error::custom))
            .collect::<Result<_, _>>()
            .map(Some)
    }
}
