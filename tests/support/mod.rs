#![allow(dead_code)]
//! Real servers on 127.0.0.1 for the integration tests. Each test binary uses part of it.

pub(crate) mod recorder;
