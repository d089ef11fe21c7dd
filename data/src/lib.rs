//! Data for hla.
