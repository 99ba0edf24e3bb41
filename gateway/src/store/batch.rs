//! Multi-row INSERTs for the record writer: a batch goes in as a few statements of fixed row
//! counts (largest first), each text built once and prepared once per connection, every
//! value bound. One statement per row cost a round trip to the database's thread (SQLite) or
//! server (PostgreSQL) per row, and under load the writer fell behind the answers.

use std::sync::OnceLock;

/// Rows per statement: a batch is split into statements of these sizes, largest first
/// (64 rows of 22 values is 1,408 parameters, within both backends' limits).
pub const CHUNKS: [usize; 4] = [64, 16, 4, 1];

/// The INSERT texts of one table for each size of [`CHUNKS`]: `head` (`INSERT INTO t (a, b)
/// VALUES `) followed by that many tuples of `width` `$N` parameters.
pub struct MultiInsert {
    head: &'static str,
    width: usize,
    texts: OnceLock<Vec<String>>,
}

impl MultiInsert {
    pub const fn new(head: &'static str, width: usize) -> Self {
        Self {
            head,
            width,
            texts: OnceLock::new(),
        }
    }

    /// The statement for `n` rows (`n` one of [`CHUNKS`]; any other size gets the one-row
    /// text).
    pub fn text(&'static self, n: usize) -> &'static str {
        let all = self.texts.get_or_init(|| {
            CHUNKS
                .iter()
                .map(|&n| {
                    let rows: Vec<String> = (0..n)
                        .map(|r| {
                            let cols: Vec<String> = (1..=self.width)
                                .map(|c| format!("${}", r * self.width + c))
                                .collect();
                            format!("({})", cols.join(","))
                        })
                        .collect();
                    format!("{}{}", self.head, rows.join(","))
                })
                .collect()
        });
        let at = CHUNKS
            .iter()
            .position(|&c| c == n)
            .unwrap_or(CHUNKS.len() - 1);
        all.get(at).map_or(self.head, String::as_str)
    }
}

/// `rows` split into statement-sized chunks, largest first.
pub fn chunks<T>(rows: &[T]) -> Vec<&[T]> {
    let mut out = Vec::new();
    let mut rest = rows;
    for size in CHUNKS {
        while rest.len() >= size {
            let (chunk, tail) = rest.split_at(size);
            out.push(chunk);
            rest = tail;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_split_into_statement_sizes_largest_first() {
        let sizes = |n| {
            chunks(&vec![0u8; n])
                .iter()
                .map(|c| c.len())
                .collect::<Vec<_>>()
        };
        assert_eq!(sizes(0), Vec::<usize>::new());
        assert_eq!(sizes(1), [1]);
        assert_eq!(sizes(64), [64]);
        assert_eq!(sizes(27), [16, 4, 4, 1, 1, 1]);
        assert_eq!(sizes(500).iter().sum::<usize>(), 500);
    }

    #[test]
    fn texts_number_every_value_once_in_order() {
        static T: MultiInsert = MultiInsert::new("INSERT INTO t (a, b) VALUES ", 2);
        assert_eq!(T.text(1), "INSERT INTO t (a, b) VALUES ($1,$2)");
        assert_eq!(
            T.text(4),
            "INSERT INTO t (a, b) VALUES ($1,$2),($3,$4),($5,$6),($7,$8)"
        );
        assert_eq!(T.text(64).matches('$').count(), 128);
        assert!(T.text(64).ends_with("($127,$128)"));
    }
}
