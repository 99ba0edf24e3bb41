//! The gateway's token estimator: how many tokens a text costs when no provider reported a
//! count (context budgets, summaries, prompt reports, the scripted provider's usage). One rule
//! everywhere, so the budget the turn plans with is the one reports show.

/// Tokens of a text, estimated as 4 characters a token (at least 1 for non-empty text).
pub fn estimate_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4)
}
