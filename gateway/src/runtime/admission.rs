//! Admission of turns and background runs: how many may run at once per client id
//! (`gateway.limits.maxConcurrentTurnsPerClient`) and for the whole process
//! (`gateway.limits.maxConcurrentTurns`). One place for every surface: `Engine::run_turn`
//! and `Engine::start_run` take a [`Permit`] before anything else, and hold it until the turn
//! or run ends. Over a cap the call is refused at once, never queued.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::api::error::GatewayError;
use crate::config::LimitsConfig;
use crate::runtime::turn::TurnRequest;

/// The caps and what holds them now; shared by every server generation of the process, so
/// that turns still running in a stopping generation keep counting.
#[derive(Clone, Default)]
pub struct Admission {
    inner: Arc<Mutex<Counts>>,
}

#[derive(Default)]
struct Counts {
    /// Only clients holding at least one permit have an entry: memory follows the turns
    /// running, not the clients ever seen.
    /// Keyed by client ids of verified tokens (not attacker-chosen), hashed with foldhash.
    per_client: HashMap<Arc<str>, u32, foldhash::fast::RandomState>,
    total: u32,
    limits: Option<LimitsConfig>,
}

/// The right to run one turn or run; released when dropped.
#[must_use = "the turn is admitted only while the permit is held"]
pub struct Permit {
    inner: Arc<Mutex<Counts>>,
    client: Option<Arc<str>>,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("client", &self.client)
            .finish()
    }
}

impl Admission {
    /// Sets the caps (each server generation applies its configuration; permits already held
    /// stay valid and count against the new caps).
    pub fn configure(&self, limits: &LimitsConfig) {
        let mut c = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        c.limits = Some(limits.clone());
    }

    /// A permit for a turn or run of `client` (None: the gateway's own work, e.g. heartbeat
    /// turns, which counts against the global cap only). Refused with a message naming the
    /// limit when either cap is reached.
    pub fn admit(&self, client: Option<&str>) -> Result<Permit, GatewayError> {
        let mut c = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let limits = c.limits.clone().unwrap_or_default();
        if c.total >= limits.max_concurrent_turns {
            crate::metrics::rate_limited(crate::metrics::Limiter::TurnsGlobal);
            return Err(GatewayError::Busy(format!(
                "Too many turns running: the gateway runs at most {} at once (gateway.limits.maxConcurrentTurns)",
                limits.max_concurrent_turns
            )));
        }
        if let Some(id) = client {
            let held = c.per_client.get(id).copied().unwrap_or(0);
            if held >= limits.max_concurrent_turns_per_client {
                crate::metrics::rate_limited(crate::metrics::Limiter::TurnsPerClient);
                return Err(GatewayError::Busy(format!(
                    "Too many turns running for client {id}: at most {} at once (gateway.limits.maxConcurrentTurnsPerClient)",
                    limits.max_concurrent_turns_per_client
                )));
            }
        }
        // The map's key and the permit share one allocation.
        let client: Option<Arc<str>> = client.map(Arc::from);
        if let Some(id) = &client {
            *c.per_client.entry(id.clone()).or_insert(0) += 1;
        }
        c.total += 1;
        Ok(Permit {
            inner: self.inner.clone(),
            client,
        })
    }

    /// Admits a turn: None when it already holds a permit (a background run's turn, admitted
    /// by `start_run`), else a new permit for its client.
    pub fn admit_turn(&self, req: &TurnRequest) -> Result<Option<Permit>, GatewayError> {
        if req.admitted.is_some() {
            return Ok(None);
        }
        self.admit(Some(req.caller.client_id.as_str())).map(Some)
    }

    /// Turns and runs admitted now: in total, and for `client`.
    pub fn running(&self, client: &str) -> (u32, u32) {
        let c = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        (c.total, c.per_client.get(client).copied().unwrap_or(0))
    }
}

impl Permit {
    /// Gives the slot back while the turn waits for something that may take long (an
    /// operator's approval): other callers may use it meanwhile. Dropping the returned guard
    /// takes the slot again, past the limits if need be (the turn was admitted).
    pub fn park(&self) -> Parked<'_> {
        self.release();
        Parked(self)
    }

    fn release(&self) {
        let mut c = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        c.total = c.total.saturating_sub(1);
        if let Some(id) = &self.client {
            if let Some(n) = c.per_client.get_mut(&**id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    c.per_client.remove(&**id);
                }
            }
        }
    }
}

/// A parked permit (see [`Permit::park`]).
#[must_use = "the slot is taken again when the guard drops"]
pub struct Parked<'a>(&'a Permit);

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        let mut c = self.0.inner.lock().unwrap_or_else(PoisonError::into_inner);
        c.total += 1;
        if let Some(id) = &self.0.client {
            *c.per_client.entry(id.clone()).or_insert(0) += 1;
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn admission(per_client: u32, total: u32) -> Admission {
        let a = Admission::default();
        a.configure(&LimitsConfig {
            max_concurrent_turns_per_client: per_client,
            max_concurrent_turns: total,
        });
        a
    }

    #[test]
    fn the_per_client_cap_at_the_limit_and_one_past_it() {
        let a = admission(2, 10);
        let p1 = a.admit(Some("alice")).unwrap();
        let _p2 = a.admit(Some("alice")).unwrap();
        let err = a.admit(Some("alice")).unwrap_err();
        assert!(matches!(&err, GatewayError::Busy(m) if m.contains("maxConcurrentTurnsPerClient")));
        // Another client is not affected.
        let _b = a.admit(Some("bob")).unwrap();
        assert_eq!(a.running("alice"), (3, 2));
        drop(p1);
        let _p3 = a.admit(Some("alice")).unwrap();
    }

    #[test]
    fn the_global_cap_counts_everyone_and_internal_work() {
        let a = admission(5, 3);
        let _p = [
            a.admit(Some("alice")).unwrap(),
            a.admit(Some("bob")).unwrap(),
            a.admit(None).unwrap(),
        ];
        for who in [Some("carol"), None] {
            let err = a.admit(who).unwrap_err();
            assert!(matches!(&err, GatewayError::Busy(m) if m.contains("maxConcurrentTurns)")));
        }
    }

    #[test]
    fn released_permits_leave_no_entry_behind() {
        let a = admission(1, 100);
        for i in 0..50 {
            let _p = a.admit(Some(&format!("client-{i}"))).unwrap();
        }
        assert_eq!(a.running("client-1"), (0, 0));
        assert!(a.inner.lock().unwrap().per_client.is_empty());
    }
}
