#![doc = include_str!("../README.md")]

pub use distlock_core::*;
