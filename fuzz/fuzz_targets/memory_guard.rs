//! The memory write guard: no panic, one verdict per text, the folded look never less strict
//! than the raw one, and bounded time on 4096-byte inputs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    agent_gateway_fuzz::props::check_guard(data);
});
