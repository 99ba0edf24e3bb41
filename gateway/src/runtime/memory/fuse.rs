//! Reciprocal rank fusion of memory recall's ranked lanes into one ranking.

use std::collections::HashSet;

/// RRF constant (the usual 60).
pub const RRF_K: f64 = 60.0;

/// Fuses ranked lanes (each a list of entry ids, best first; an id may appear in several
/// lanes and at most once per lane - later duplicates in one lane are ignored) by reciprocal
/// rank fusion: score(id) = sum over lanes of 1 / (RRF_K + rank), rank starting at 1.
/// Result: (id, normalised score), best first, ties by larger id first. Scores are normalised to
/// (0, 1] by dividing by the best score a single id could get from the lanes that returned
/// anything (`n_nonempty_lanes / (RRF_K + 1)`), so an id ranked first by every non-empty lane
/// scores exactly 1.0. Empty lanes are ignored; no lanes -> empty.
///
/// A duplicate is dropped before ranking, so it does not push the ids after it down:
/// in `[a, b, a, c]`, `c` has rank 3.
pub fn rrf(lanes: &[&[i64]]) -> Vec<(i64, f64)> {
    // Each term is pre-multiplied by (RRF_K + 1): a first place then contributes exactly 1.0,
    // so n first places sum to exactly n and divide to exactly 1.0, which dividing a sum of
    // 1/61s by n/61 would not guarantee.
    let mut terms: Vec<(i64, f64)> = Vec::with_capacity(lanes.iter().map(|l| l.len()).sum());
    let mut seen = HashSet::new();
    let mut nonempty = 0usize;
    for lane in lanes.iter().filter(|lane| !lane.is_empty()) {
        nonempty += 1;
        seen.clear();
        let mut rank = 0.0;
        for &id in lane.iter() {
            if seen.insert(id) {
                rank += 1.0;
                terms.push((id, (RRF_K + 1.0) / (RRF_K + rank)));
            }
        }
    }
    if nonempty == 0 {
        return Vec::new();
    }
    // Summing each id's terms in ascending order, not lane order, makes the sum depend only on
    // the multiset of ranks: ids ranked (1, 3, 2) and (2, 1, 3) then tie exactly and the id
    // decides, instead of an ulp of rounding.
    terms.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let best = nonempty as f64;
    let mut fused: Vec<(i64, f64)> = terms
        .chunk_by(|a, b| a.0 == b.0)
        .filter_map(|group| {
            let id = group.first()?.0;
            Some((id, group.iter().map(|t| t.1).sum::<f64>() / best))
        })
        .collect();
    fused.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
    fused
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(fused: &[(i64, f64)]) -> Vec<i64> {
        fused.iter().map(|f| f.0).collect()
    }

    fn close(got: f64, want: f64) -> bool {
        (got - want).abs() < 1e-12
    }

    #[test]
    fn two_lanes_by_hand() {
        // raw: 10 = 1/61 + 1/62, 30 = 1/63 + 1/61, 20 = 1/62; best = 2/61.
        let fused = rrf(&[&[10, 20, 30], &[30, 10]]);
        assert_eq!(ids(&fused), vec![10, 30, 20]);
        assert!(close(fused[0].1, 123.0 / 124.0), "{fused:?}");
        assert!(close(fused[1].1, 62.0 / 63.0), "{fused:?}");
        assert!(close(fused[2].1, 61.0 / 124.0), "{fused:?}");
        // The same figures straight from the documented formula.
        let raw = 1.0 / (RRF_K + 1.0) + 1.0 / (RRF_K + 2.0);
        assert!(close(fused[0].1, raw / (2.0 / (RRF_K + 1.0))));
    }

    #[test]
    fn first_everywhere_is_exactly_one() {
        let fused = rrf(&[&[7, 1], &[7], &[7, 2, 3]]);
        assert_eq!(fused[0], (7, 1.0));
        // 1 and 2 both rank 2 in one lane of three: 61/62/3 each, so the larger id leads.
        assert_eq!(ids(&fused), vec![7, 2, 1, 3]);
        assert!(close(fused[1].1, 61.0 / 186.0));
        assert_eq!(fused[1].1, fused[2].1);
        assert!(close(fused[3].1, 61.0 / 189.0));
        // Exactly 1.0 however many lanes agree.
        for n in 1..=12 {
            let lane: &[i64] = &[42, 1, 2];
            let lanes = vec![lane; n];
            assert_eq!(rrf(&lanes)[0], (42, 1.0), "{n} lanes");
        }
    }

    #[test]
    fn empty_lanes_and_duplicates() {
        assert_eq!(rrf(&[]), vec![]);
        assert_eq!(rrf(&[&[], &[]]), vec![]);
        // Empty lanes do not count towards the best possible score.
        let fused = rrf(&[&[], &[4, 3], &[]]);
        assert_eq!(fused, rrf(&[&[4, 3]]));
        assert_eq!(fused[0], (4, 1.0));
        assert!(close(fused[1].1, 61.0 / 62.0));
        // A repeated id counts once, at its first rank, and does not push later ids down.
        let fused = rrf(&[&[5, 6, 5, 7, 6]]);
        assert_eq!(ids(&fused), vec![5, 6, 7]);
        assert_eq!(fused[0].1, 1.0);
        assert!(close(fused[1].1, 61.0 / 62.0));
        assert!(close(fused[2].1, 61.0 / 63.0));
        // Negative ids are ids like any other.
        assert_eq!(ids(&rrf(&[&[-1, -5]])), vec![-1, -5]);
    }

    #[test]
    fn equal_rank_sets_tie_exactly() {
        let fused = rrf(&[&[1, 2], &[2, 1]]);
        assert_eq!(ids(&fused), vec![2, 1]);
        assert_eq!(fused[0].1, fused[1].1);
        let fused = rrf(&[&[1, 2, 3], &[2, 3, 1], &[3, 1, 2], &[9]]);
        assert_eq!(ids(&fused), vec![3, 2, 1, 9]);
        assert_eq!(fused[0].1, fused[1].1);
        assert_eq!(fused[1].1, fused[2].1);
        assert!(close(fused[0].1, (1.0 + 61.0 / 62.0 + 61.0 / 63.0) / 4.0));
        assert!(close(fused[3].1, 0.25));
    }

    #[test]
    fn scores_stay_in_range() {
        let long: Vec<i64> = (0..1_000).collect();
        let reversed: Vec<i64> = (0..1_000).rev().collect();
        let fused = rrf(&[&long, &reversed, &long[..10]]);
        assert_eq!(fused.len(), 1_000);
        assert!(fused.iter().all(|f| f.1 > 0.0 && f.1 <= 1.0));
        assert!(fused.windows(2).all(|w| w[0].1 >= w[1].1));
        // 0 is first in two of three lanes and last in the third.
        assert_eq!(fused[0].0, 0);
        assert!(close(fused[0].1, (2.0 + 61.0 / 1_060.0) / 3.0));
    }
}
