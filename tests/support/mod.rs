//! Real-server test support: connection strings and private server processes.
#![allow(dead_code, unreachable_pub)]
