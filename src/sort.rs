//! One stable sort for the short lists of the cold paths (directory entries, job ids, findings,
//! install paths), so the binary carries one copy of std's sort instead of one per element type
//! and comparator: each `sort`/`sort_by` call site of a new kind is its own instantiation of
//! std's driftsort, 7-9 KB of code each (issue 20, docs/PERFORMANCE.md). Here the comparisons go
//! through one `&mut dyn FnMut` on a permutation of indices, which is then applied with swaps.
//! The listings over a whole registry (`mam jobs`, `registry list`) keep std's sort inline: a
//! call through a pointer per comparison is measurable at 100,000 records, not at 100.
//!
//! Must never allocate more than the one index vector, or change the order std's stable sort gives.

use std::cmp::Ordering;

/// Sorts `v` in place, stably, by `cmp` (what `v.sort_by(cmp)` gives).
pub fn by<T>(v: &mut [T], mut cmp: impl FnMut(&T, &T) -> Ordering) {
    if v.len() < 2 {
        return;
    }
    let mut order: Vec<usize> = (0..v.len()).collect();
    indices(&mut order, &mut |a, b| cmp(&v[a], &v[b]));
    apply(v, &mut order);
}

/// Sorts `v` in place, stably, by the key `f` gives (what `v.sort_by_key(f)` gives).
pub fn by_key<T, K: Ord>(v: &mut [T], mut f: impl FnMut(&T) -> K) {
    by(v, |a, b| f(a).cmp(&f(b)));
}

/// Sorts `v` in place, stably, in its natural order (what `v.sort()` gives).
pub fn natural<T: Ord>(v: &mut [T]) {
    by(v, T::cmp);
}

/// A `BTreeMap` or `BTreeSet` of `items` built by insertion: what `collect()` gives (for equal
/// keys the last value), without the stable sort that `collect()` into one instantiates for each
/// key type (4-9 KB of code each).
pub fn ordered<C: Default + Extend<T>, T>(items: impl IntoIterator<Item = T>) -> C {
    let mut c = C::default();
    c.extend(items);
    c
}

/// The one instantiation of std's stable sort: a permutation of indices under a comparator
/// behind a pointer.
#[inline(never)]
fn indices(order: &mut [usize], cmp: &mut dyn FnMut(usize, usize) -> Ordering) {
    order.sort_by(|&a, &b| cmp(a, b));
}

/// Rearranges `v` so that position `k` holds what was at `order[k]`, following each cycle of the
/// permutation with swaps; `order` is used up (each visited position is marked as its own index).
fn apply<T>(v: &mut [T], order: &mut [usize]) {
    for start in 0..v.len() {
        let mut cur = start;
        while order[cur] != start {
            let next = order[cur];
            v.swap(cur, next);
            order[cur] = cur;
            cur = next;
        }
        order[cur] = cur;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*), enough to shuffle test input.
    fn mix(seed: &mut u64) -> u64 {
        *seed ^= *seed >> 12;
        *seed ^= *seed << 25;
        *seed ^= *seed >> 27;
        seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Built by insertion, the same map and set as `collect()`: duplicate keys keep the last value.
    #[test]
    fn ordered_is_what_collect_gives() {
        use std::collections::{BTreeMap, BTreeSet};
        let mut seed = 7;
        let pairs: Vec<(u64, u64)> = (0..300).map(|i| (mix(&mut seed) % 40, i)).collect();
        let built: BTreeMap<u64, u64> = ordered(pairs.iter().copied());
        assert_eq!(built, pairs.iter().copied().collect::<BTreeMap<_, _>>());
        assert_eq!(built.len(), 40);
        let set: BTreeSet<u64> = ordered(pairs.iter().map(|p| p.0));
        assert_eq!(set, pairs.iter().map(|p| p.0).collect::<BTreeSet<_>>());
        let small: BTreeMap<u8, char> = ordered([(2, 'a'), (1, 'b'), (1, 'c')]);
        assert_eq!(small, BTreeMap::from([(1, 'c'), (2, 'a')]));
    }

    #[test]
    fn agrees_with_std_stable_sort_including_the_order_of_equal_keys() {
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        for len in [0usize, 1, 2, 3, 7, 20, 21, 64, 257, 1000] {
            // Keys with many repeats; the second field tells equal keys apart.
            let input: Vec<(u64, usize)> = (0..len).map(|i| (mix(&mut seed) % 7, i)).collect();
            let mut ours = input.clone();
            by_key(&mut ours, |p| p.0);
            let mut std_ = input.clone();
            std_.sort_by_key(|p| p.0);
            assert_eq!(ours, std_, "len {len}");
            let mut rev = input.clone();
            by(&mut rev, |a, b| b.0.cmp(&a.0));
            let mut std_rev = input;
            std_rev.sort_by_key(|p| std::cmp::Reverse(p.0));
            assert_eq!(rev, std_rev, "len {len}, reversed");
        }
    }

    #[test]
    fn natural_order_of_owned_values() {
        let mut v: Vec<String> = ["b", "a", "c", "a"].iter().map(|s| s.to_string()).collect();
        natural(&mut v);
        assert_eq!(v, ["a", "a", "b", "c"]);
    }
}
