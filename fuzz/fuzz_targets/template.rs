//! Webhook templates: bounded output, no panic, no secret header in the output.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    agent_gateway_fuzz::props::check_template(data);
});
