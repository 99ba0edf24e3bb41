//! Media ids: an accepted id never resolves outside the media root.
#![no_main]

use std::sync::LazyLock;

use agent_gateway_fuzz::props::MediaRig;
use agent_gateway_fuzz::RUNTIME;
use libfuzzer_sys::fuzz_target;

static RIG: LazyLock<MediaRig> =
    LazyLock::new(|| RUNTIME.block_on(MediaRig::new()).expect("media rig"));

fuzz_target!(|data: &[u8]| {
    RUNTIME.block_on(RIG.check(data));
});
