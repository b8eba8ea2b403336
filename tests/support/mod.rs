#![allow(dead_code, unreachable_pub)]
//! Real-server test support shared by the integration tests.

pub mod verifier;
