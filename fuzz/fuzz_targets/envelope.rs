//! JSON-RPC envelope: any text gets valid responses, one per request owed one, in order.
#![no_main]

use std::sync::LazyLock;

use agent_gateway_fuzz::props::EnvelopeRig;
use agent_gateway_fuzz::RUNTIME;
use libfuzzer_sys::fuzz_target;

static RIG: LazyLock<EnvelopeRig> =
    LazyLock::new(|| RUNTIME.block_on(EnvelopeRig::new()).expect("envelope rig"));

fuzz_target!(|data: &[u8]| {
    RUNTIME.block_on(RIG.check(data));
});
