//! The orchestrated script runs of a session (`obs.explain`'s `orchestrate` and
//! `cronWakeGate` members): the wake gates of a cron job's fires, read from the gate records
//! the fires stored (`store::records::GateRecord`). Pure functions of those records.

use crate::api::generated::types::{
    ObsCronWakeGateRun, ObsOrchestrateRun, ObsOrchestrateRunFailureClass as Class,
    ObsOrchestrateRunOutcome, ObsOrchestrateRunResultRefs, ObsOrchestrateRunToolCallsItem,
    ObsOrchestrateRunToolCallsItemDecision as CallDecision,
};
use crate::store::records::{GateRecord, GatedFire};

/// The `orchestrate` entry of a gate run; None for a record written before the gateway kept
/// the gate's run (no run id).
pub fn orchestrate_run(r: &GateRecord) -> Option<ObsOrchestrateRun> {
    let run_id = r.run_id.clone().filter(|id| !id.is_empty())?;
    let failure_class = r.failure_class.as_deref().and_then(Class::from_wire);
    let outcome = if failure_class.is_none() && matches!(r.exit_code, Some(0 | 10)) {
        ObsOrchestrateRunOutcome::Success
    } else {
        ObsOrchestrateRunOutcome::Failure
    };
    // A failure always names its class: an old or odd record without one is a nonzero exit.
    let failure_class = match outcome {
        ObsOrchestrateRunOutcome::Success => None,
        ObsOrchestrateRunOutcome::Failure => Some(failure_class.unwrap_or(Class::NonzeroExit)),
    };
    Some(ObsOrchestrateRun {
        run_id,
        lease_id: r.lease_id.clone(),
        outcome,
        duration_ms: r.duration_ms.max(0),
        exit_code: r.exit_code.map(i64::from),
        failure_class,
        tool_calls: r
            .tool_calls
            .iter()
            .filter(|c| c.count > 0 && !c.tool.is_empty())
            .filter_map(|c| {
                Some(ObsOrchestrateRunToolCallsItem {
                    tool: c.tool.clone(),
                    capability: c.capability.clone(),
                    decision: CallDecision::from_wire(&c.decision)?,
                    count: c.count,
                })
            })
            .collect(),
        result_refs: ObsOrchestrateRunResultRefs {
            count: r.result_count.max(0),
            bytes: r.result_bytes.max(0),
        },
        savings: None,
    })
}

/// The `cronWakeGate` member: the newest gated fire's decision.
pub fn cron_wake_gate(newest: &GatedFire) -> ObsCronWakeGateRun {
    ObsCronWakeGateRun {
        job_id: newest.job_id.clone(),
        wake: newest.record.decision != "skip",
        duration_ms: newest.record.duration_ms.max(0),
        tool_calls: newest.tool_calls.unwrap_or(0).max(0),
        est_turns_saved: newest.est_turns_saved.unwrap_or(0).max(0),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::store::records::GateCall;

    fn record(exit: Option<i32>, class: Option<&str>) -> GateRecord {
        GateRecord {
            decision: "wake".into(),
            duration_ms: 42,
            run_id: Some("gate_1".into()),
            lease_id: Some("lease_gate_1".into()),
            exit_code: exit,
            failure_class: class.map(str::to_owned),
            tool_calls: vec![
                GateCall {
                    tool: "current_time".into(),
                    capability: "tool:current_time".into(),
                    decision: "allowed".into(),
                    count: 2,
                },
                GateCall {
                    tool: "tokens.create".into(),
                    capability: "scope:admin".into(),
                    decision: "denied".into(),
                    count: 1,
                },
            ],
            result_count: 2,
            result_bytes: 60,
            ..GateRecord::default()
        }
    }

    #[test]
    fn outcomes_follow_the_exit_code_and_the_failure_class() {
        let ok = orchestrate_run(&record(Some(0), None)).unwrap();
        assert_eq!(ok.outcome, ObsOrchestrateRunOutcome::Success);
        assert_eq!(ok.failure_class, None);
        assert_eq!(ok.tool_calls.len(), 2);
        assert_eq!((ok.result_refs.count, ok.result_refs.bytes), (2, 60));
        let skip = orchestrate_run(&record(Some(10), None)).unwrap();
        assert_eq!(
            skip.outcome,
            ObsOrchestrateRunOutcome::Success,
            "the skip code"
        );
        let cap = orchestrate_run(&record(Some(0), Some("stdout_cap"))).unwrap();
        assert_eq!(cap.outcome, ObsOrchestrateRunOutcome::Failure);
        assert_eq!(cap.failure_class, Some(Class::StdoutCap));
        let exit = orchestrate_run(&record(Some(3), None)).unwrap();
        assert_eq!(
            exit.failure_class,
            Some(Class::NonzeroExit),
            "a class is always named"
        );
        let killed = orchestrate_run(&record(None, Some("lease_absent"))).unwrap();
        assert_eq!(
            (killed.exit_code, killed.failure_class),
            (None, Some(Class::LeaseAbsent))
        );
    }

    #[test]
    fn a_record_without_a_run_is_no_entry() {
        let old = GateRecord {
            decision: "skip".into(),
            duration_ms: 5,
            ..GateRecord::default()
        };
        assert_eq!(orchestrate_run(&old), None);
        let fire = GatedFire {
            job_id: "j".into(),
            record: old,
            tool_calls: Some(3),
            est_turns_saved: Some(1),
        };
        let g = cron_wake_gate(&fire);
        assert!(!g.wake);
        assert_eq!((g.tool_calls, g.est_turns_saved, g.duration_ms), (3, 1, 5));
    }
}
