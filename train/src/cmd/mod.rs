//! The subcommands of `hla`, one module each: its arguments and what it does, over the
//! library in [`crate::run`]. No command calls another; what several choose on their command
//! lines is in [`forms`].

pub mod bench;
pub mod compare;
pub mod eval;
pub mod export;
pub mod forms;
pub mod generate;
pub mod info;
pub mod prepare;
pub mod train;
pub mod verify;
