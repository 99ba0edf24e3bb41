//! The portable memory format (`agent-gateway-memory-export-v1`): what an import of entries
//! will do to each one - block it, store it at its trust capped to `learned`, or downgrade it
//! further when the write validator finds it suspicious. Documented in docs/memory-export.md.

use super::write::{check, lowered, Checked};

/// What an import does with one entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Refused by the write validator.
    Blocked,
    /// Stored as checked; `downgraded` when its trust is lower than the file said.
    Store { checked: Checked, downgraded: bool },
}

/// The plan for one entry carrying `trust` (None: learned) and `tags`. Trust is capped at
/// `learned`: an import never creates a `system` entry, whatever the file says.
pub fn plan(content: &str, trust: Option<&str>, tags: &[String]) -> Plan {
    let asked = trust.unwrap_or("learned");
    let capped = if asked == "system" { "learned" } else { asked };
    match check(content, capped, tags) {
        Err(_) => Plan::Blocked,
        Ok(checked) => {
            let downgraded = lowered(asked, checked.trust_level);
            Plan::Store {
                checked,
                downgraded,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_entries_are_capped_and_counted_as_downgraded() {
        match plan("The office is on the third floor.", Some("system"), &[]) {
            Plan::Store {
                checked,
                downgraded,
            } => {
                assert_eq!(checked.trust_level, "learned");
                assert!(downgraded);
            }
            Plan::Blocked => panic!("a clean entry was blocked"),
        }
        match plan("The office is on the third floor.", None, &[]) {
            Plan::Store { downgraded, .. } => assert!(!downgraded),
            Plan::Blocked => panic!("a clean entry was blocked"),
        }
        match plan("The office is on the third floor.", Some("external"), &[]) {
            Plan::Store {
                checked,
                downgraded,
            } => {
                assert_eq!(checked.trust_level, "external");
                assert!(!downgraded);
            }
            Plan::Blocked => panic!("a clean entry was blocked"),
        }
    }
}
