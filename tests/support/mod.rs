#![allow(dead_code, unreachable_pub)]
//! Real servers on 127.0.0.1 for the integration tests. Each test binary uses part of it.

pub(crate) mod recorder;
pub(crate) mod verifier;
