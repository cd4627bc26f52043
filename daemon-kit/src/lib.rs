//! Plumbing shared by the Flyt daemons.
#![forbid(unsafe_code)]
