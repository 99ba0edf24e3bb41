//! The store moved between backends (export, import, migrate) with the real binary.

mod e2e_transfer;
