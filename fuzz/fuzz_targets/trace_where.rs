//! The `where` filter of obs.trace.search: no panic, SQL from the static vocabulary only, and
//! a canonical form that parses back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    agent_gateway_fuzz::props::check_trace_where(data);
});
