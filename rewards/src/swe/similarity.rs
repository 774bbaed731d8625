//! A port of Python's `difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()`.
//!
//! Same longest-match search and tie-breaking (earliest in `a`, then earliest in `b`), same
//! recursion order, so the matched-character count and therefore the ratio are identical;
//! checked against CPython on generated pairs (`scripts/gen-swe-fixtures.py`).

use std::collections::HashMap;
use std::hash::Hash;

/// `2 * matches / (len(a) + len(b))`, or 1.0 when both are empty.
pub fn ratio<T: Eq + Hash + Copy>(a: &[T], b: &[T]) -> f64 {
    let total = a.len() + b.len();
    if total == 0 {
        return 1.0;
    }
    2.0 * matching_chars(a, b) as f64 / total as f64
}

/// [`ratio`] over the Unicode code points of two strings, as Python compares `str`.
pub fn str_ratio(a: &str, b: &str) -> f64 {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    ratio(&a, &b)
}

/// Total size of the matching blocks (`sum(m.size for m in get_matching_blocks())`).
pub fn matching_chars<T: Eq + Hash + Copy>(a: &[T], b: &[T]) -> usize {
    let mut b2j: HashMap<T, Vec<usize>> = HashMap::new();
    for (j, &x) in b.iter().enumerate() {
        b2j.entry(x).or_default().push(j);
    }
    let mut finder = Finder {
        a,
        b2j,
        prev: vec![0; b.len() + 1],
        cur: vec![0; b.len() + 1],
    };
    let mut queue = vec![(0, a.len(), 0, b.len())];
    let mut total = 0;
    while let Some((alo, ahi, blo, bhi)) = queue.pop() {
        let (i, j, k) = finder.longest_match(alo, ahi, blo, bhi);
        if k > 0 {
            total += k;
            if alo < i && blo < j {
                queue.push((alo, i, blo, j));
            }
            if i + k < ahi && j + k < bhi {
                queue.push((i + k, ahi, j + k, bhi));
            }
        }
    }
    total
}

struct Finder<'a, T> {
    a: &'a [T],
    b2j: HashMap<T, Vec<usize>>,
    /// `prev[j + 1]`: length of the match ending at `a[i - 1]`, `b[j]` (0 when untouched).
    prev: Vec<usize>,
    cur: Vec<usize>,
}

impl<T: Eq + Hash + Copy> Finder<'_, T> {
    /// `find_longest_match(alo, ahi, blo, bhi)` without junk: (i, j, size).
    fn longest_match(
        &mut self,
        alo: usize,
        ahi: usize,
        blo: usize,
        bhi: usize,
    ) -> (usize, usize, usize) {
        let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0);
        let mut prev_touched: Vec<usize> = Vec::new();
        let mut cur_touched: Vec<usize> = Vec::new();
        for i in alo..ahi {
            if let Some(js) = self.b2j.get(&self.a[i]) {
                for &j in js {
                    if j < blo {
                        continue;
                    }
                    if j >= bhi {
                        break;
                    }
                    let k = self.prev[j] + 1;
                    self.cur[j + 1] = k;
                    cur_touched.push(j + 1);
                    if k > bestsize {
                        besti = i + 1 - k;
                        bestj = j + 1 - k;
                        bestsize = k;
                    }
                }
            }
            for &t in &prev_touched {
                self.prev[t] = 0;
            }
            std::mem::swap(&mut self.prev, &mut self.cur);
            std::mem::swap(&mut prev_touched, &mut cur_touched);
            cur_touched.clear();
        }
        for &t in &prev_touched {
            self.prev[t] = 0;
        }
        (besti, bestj, bestsize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_python_values() {
        // difflib.SequenceMatcher(None, "abcd", "bcde", autojunk=False).ratio() == 0.75
        assert_eq!(str_ratio("abcd", "bcde"), 0.75);
        assert_eq!(str_ratio("", ""), 1.0);
        assert_eq!(str_ratio("abc", ""), 0.0);
        // The difflib docs' example, without the junk function: CPython 3.11 gives
        // 0.8656716417910447.
        let r = str_ratio(
            "private Thread currentThread;",
            "private volatile Thread currentThread;",
        );
        assert!((r - 0.8656716417910447).abs() < 1e-15, "{r}");
    }
}
