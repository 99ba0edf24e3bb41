//! Webhook signature header: only the body's true HMAC is accepted, in any accepted spelling.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    agent_gateway_fuzz::props::check_signature(data);
});
