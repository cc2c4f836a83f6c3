//! What an operator reaches for beside a running service: the admin
//! router for axum ([`admin`], feature `axum`) and moving dead letters
//! back ([`replay`]).

#[cfg(feature = "axum")]
pub mod admin;
pub mod replay;
