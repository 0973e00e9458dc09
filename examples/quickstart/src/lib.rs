//! `docs/LIBRARY.md`'s code blocks, compiled and run as this crate's doctests, so the
//! guide cannot drift from the crates it shows. The binary is `main.rs`.

#[cfg(doctest)]
#[doc = include_str!("../../../docs/LIBRARY.md")]
pub struct LibraryGuide;
