//! The address classifier and URL check of `net`: no panic; a metadata address is never
//! allowed, in any spelling, under any policy.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    agent_gateway_fuzz::props::check_addr_classifier(data);
});
