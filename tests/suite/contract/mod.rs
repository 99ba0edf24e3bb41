//! The contract: the catalogue, the generated files and the documents served from it.

// The module keeps its file name, so its tests stay `contract::contract::*`.
#[allow(clippy::module_inception)]
mod contract;
