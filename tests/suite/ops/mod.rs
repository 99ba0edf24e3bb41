//! What an operator relies on: the admin boundary, admission and limits, failures, hardening,
//! metrics and observability, the real binary as a process, the fuzz harness, the outbound URL guard (`net`), and the floor plan
//! of the sources (layering).

mod e2e_admin_boundary;
mod e2e_admission;
mod e2e_billing_load;
mod e2e_failures;
mod e2e_hardening;
mod e2e_limits;
mod e2e_metrics;
mod e2e_obs;
mod e2e_process;
mod fuzz_harness;
mod layering;
mod net_guard;
