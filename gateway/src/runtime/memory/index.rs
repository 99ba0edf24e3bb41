//! Memory recall's vector lane: every embedded entry's vector, held per tenant, scanned exactly.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::mem::size_of;

/// Vectors of every tenant, scanned per query. Cheap to share behind the caller's lock
/// (the caller wraps it in std::sync::RwLock); no interior locking here.
//
// Storage is plain f32. Measured at 100k x 384 dims on one core at baseline x86-64 (SSE2), the
// f32 scan is bound by memory bandwidth at ~14 ms, well inside the 50 ms budget and exact.
// i8 (scale 127 per vector) cut memory 4x but was no faster under SSE2 (the i8 -> wider
// unpacking costs what the bandwidth saves) and kept only ~98% of the exact top-10 on random
// unit vectors; f16 without F16C decoded in software at twice the f32 time.
#[derive(Default)]
pub struct VectorIndex {
    /// Indexed by tenant number; a tenant that empties is freed (None) so its dims, agent table
    /// and buffers do not outlive its last entry, and the number is reused.
    tenants: Vec<Option<Tenant>>,
    free_tenants: Vec<u32>,
    tenant_numbers: HashMap<String, u32>,
    /// Where each entry lives, so remove and cross-tenant upsert need no scan.
    slots: HashMap<i64, Slot>,
}

#[derive(Clone, Copy)]
struct Slot {
    tenant: u32,
    slot: u32,
}

/// Struct-of-arrays so the scan reads one contiguous f32 buffer.
struct Tenant {
    name: String,
    /// Fixed by the first vector stored; reset when the tenant empties and is freed.
    dims: usize,
    vectors: Vec<f32>,
    ids: Vec<i64>,
    agents: Vec<u32>,
    /// Agent names by number. Names stay until the tenant empties: a tenant has few agents and
    /// keeping them avoids renumbering `agents`.
    agent_names: Vec<String>,
}

impl Tenant {
    fn new(name: &str, dims: usize) -> Self {
        Tenant {
            name: name.to_owned(),
            dims,
            vectors: Vec::new(),
            ids: Vec::new(),
            agents: Vec::new(),
            agent_names: Vec::new(),
        }
    }

    fn agent_number(&self, agent: &str) -> Option<u32> {
        let pos = self.agent_names.iter().position(|a| a == agent)?;
        u32::try_from(pos).ok()
    }

    fn agent_number_or_insert(&mut self, agent: &str) -> Option<u32> {
        if let Some(n) = self.agent_number(agent) {
            return Some(n);
        }
        let n = u32::try_from(self.agent_names.len()).ok()?;
        self.agent_names.push(agent.to_owned());
        Some(n)
    }

    /// Grows the vector buffer by a quarter rather than Vec's doubling: at ~1.5 KB a row the
    /// doubling slack alone could hold ~75 MB for a 100k tenant. Large reallocations are
    /// mremap'd by the allocator, so the extra growth steps stay cheap.
    fn reserve_row(&mut self) {
        if self.vectors.capacity() - self.vectors.len() < self.dims {
            let rows = (self.ids.len() / 4).max(16);
            self.vectors.reserve_exact(rows * self.dims);
        }
    }

    /// Moves the last entry into `slot`; the id now at `slot`, if one moved.
    fn swap_remove(&mut self, slot: usize) -> Option<i64> {
        if slot >= self.ids.len() {
            return None;
        }
        let last = self.ids.len() - 1;
        if slot != last {
            self.vectors
                .copy_within(last * self.dims..(last + 1) * self.dims, slot * self.dims);
        }
        self.vectors.truncate(last * self.dims);
        self.ids.swap_remove(slot);
        self.agents.swap_remove(slot);
        let moved = self.ids.get(slot).copied();
        self.shrink_if_sparse();
        moved
    }

    /// Gives memory back after a tenant shrinks a lot (a 100k tenant holds ~150 MB); only
    /// below a quarter full, so alternating push/remove does not reallocate every time.
    fn shrink_if_sparse(&mut self) {
        let len = self.ids.len();
        if self.ids.capacity() > 64 && len < self.ids.capacity() / 4 {
            self.ids.shrink_to(len * 2);
            self.agents.shrink_to(len * 2);
            self.vectors.shrink_to(len * 2 * self.dims);
        }
    }

    fn approx_bytes(&self) -> usize {
        size_of::<Tenant>()
            + self.name.capacity()
            + self.vectors.capacity() * size_of::<f32>()
            + self.ids.capacity() * size_of::<i64>()
            + self.agents.capacity() * size_of::<u32>()
            + self.agent_names.capacity() * size_of::<String>()
            + self.agent_names.iter().map(String::capacity).sum::<usize>()
    }
}

impl VectorIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts or replaces the vector of entry `id` (ids are unique across tenants).
    /// A vector whose length differs from the first vector stored in that tenant is rejected
    /// (returns false) - mixing models would make scores meaningless.
    /// An empty vector or one with a non-finite component is rejected too: it has no
    /// meaningful similarity and a NaN would poison the ranking.
    pub fn upsert(&mut self, tenant: &str, agent: &str, id: i64, vector: &[f32]) -> bool {
        if vector.is_empty() || !vector.iter().all(|x| x.is_finite()) {
            return false;
        }
        let number = self.tenant_numbers.get(tenant).copied();
        let existing = self.slots.get(&id).copied();
        if let Some(t) = number.and_then(|n| self.tenant(n)) {
            if !t.ids.is_empty() && t.dims != vector.len() {
                return false;
            }
            if t.ids.len() >= u32::MAX as usize {
                return false;
            }
        }
        if let (Some(n), Some(at)) = (number, existing) {
            if at.tenant == n {
                return self.replace_in_place(at, agent, vector);
            }
        }
        if existing.is_some() {
            // The entry moves between tenants (ids are global): drop the old copy first.
            self.remove(id);
        }
        let Some(n) = self.tenant_number_or_insert(tenant, vector.len()) else {
            return false;
        };
        let Some(Some(t)) = self.tenants.get_mut(n as usize) else {
            return false;
        };
        if t.ids.is_empty() {
            t.dims = vector.len();
        }
        let (Ok(slot), Some(agent_number)) =
            (u32::try_from(t.ids.len()), t.agent_number_or_insert(agent))
        else {
            return false;
        };
        t.reserve_row();
        t.vectors.extend_from_slice(vector);
        t.ids.push(id);
        t.agents.push(agent_number);
        self.slots.insert(id, Slot { tenant: n, slot });
        true
    }

    fn replace_in_place(&mut self, at: Slot, agent: &str, vector: &[f32]) -> bool {
        let Some(Some(t)) = self.tenants.get_mut(at.tenant as usize) else {
            return false;
        };
        let Some(agent_number) = t.agent_number_or_insert(agent) else {
            return false;
        };
        let slot = at.slot as usize;
        let row = slot * t.dims..(slot + 1) * t.dims;
        match (t.vectors.get_mut(row), t.agents.get_mut(slot)) {
            (Some(stored), Some(stored_agent)) => {
                stored.copy_from_slice(vector);
                *stored_agent = agent_number;
                true
            }
            _ => false,
        }
    }

    /// Removes one entry; whether it was there.
    pub fn remove(&mut self, id: i64) -> bool {
        let Some(at) = self.slots.remove(&id) else {
            return false;
        };
        let Some(Some(t)) = self.tenants.get_mut(at.tenant as usize) else {
            return true;
        };
        if let Some(moved) = t.swap_remove(at.slot as usize) {
            if let Some(moved_at) = self.slots.get_mut(&moved) {
                moved_at.slot = at.slot;
            }
        }
        if t.ids.is_empty() {
            self.free_tenant(at.tenant);
        }
        true
    }

    /// Removes every entry of a tenant (agent None) or of one agent in it; how many.
    pub fn remove_scope(&mut self, tenant: &str, agent: Option<&str>) -> usize {
        let Some(&n) = self.tenant_numbers.get(tenant) else {
            return 0;
        };
        let Some(Some(t)) = self.tenants.get_mut(n as usize) else {
            return 0;
        };
        let removed = match agent {
            None => {
                for id in &t.ids {
                    self.slots.remove(id);
                }
                let removed = t.ids.len();
                // Emptied, so freed below along with its buffers.
                t.ids.clear();
                removed
            }
            Some(agent) => {
                let Some(a) = t.agent_number(agent) else {
                    return 0;
                };
                Self::remove_agent(t, &mut self.slots, a)
            }
        };
        if t.ids.is_empty() {
            self.free_tenant(n);
        }
        removed
    }

    /// One compacting pass (order kept, each survivor moved at most once) rather than repeated
    /// swap_remove, so wiping a large agent is linear.
    fn remove_agent(t: &mut Tenant, slots: &mut HashMap<i64, Slot>, agent: u32) -> usize {
        let d = t.dims;
        let n = t.ids.len();
        let mut kept = 0;
        for read in 0..n {
            let id = t.ids[read];
            if t.agents[read] == agent {
                slots.remove(&id);
                continue;
            }
            if kept != read {
                t.vectors.copy_within(read * d..(read + 1) * d, kept * d);
                t.ids[kept] = id;
                t.agents[kept] = t.agents[read];
                if let (Some(at), Ok(slot)) = (slots.get_mut(&id), u32::try_from(kept)) {
                    at.slot = slot;
                }
            }
            kept += 1;
        }
        t.vectors.truncate(kept * d);
        t.ids.truncate(kept);
        t.agents.truncate(kept);
        t.shrink_if_sparse();
        n - kept
    }

    /// Whether the entry has a vector.
    pub fn contains(&self, id: i64) -> bool {
        self.slots.contains_key(&id)
    }

    /// Entries held (all tenants).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Entries held for one tenant.
    pub fn tenant_len(&self, tenant: &str) -> usize {
        self.named_tenant(tenant).map_or(0, |t| t.ids.len())
    }

    /// Every tenant holding entries, with how many (for the metrics gauge; in no set order).
    pub fn tenant_entries(&self) -> impl Iterator<Item = (&str, usize)> + '_ {
        self.tenants
            .iter()
            .flatten()
            .map(|t| (t.name.as_str(), t.ids.len()))
    }

    /// Bytes held by vectors and bookkeeping (approximate, for stats and the bench).
    pub fn approx_bytes(&self) -> usize {
        // hashbrown: one control byte per bucket, buckets ~ capacity * 8 / 7.
        fn map_bytes<K, V>(map: &HashMap<K, V>) -> usize {
            map.capacity() * 8 / 7 * (size_of::<(K, V)>() + 1)
        }
        let tenants: usize = self
            .tenants
            .iter()
            .flatten()
            .map(Tenant::approx_bytes)
            .sum();
        size_of::<Self>()
            + tenants
            + self.tenants.capacity() * size_of::<Option<Tenant>>()
            + self.free_tenants.capacity() * size_of::<u32>()
            + map_bytes(&self.tenant_numbers)
            + self
                .tenant_numbers
                .keys()
                .map(String::capacity)
                .sum::<usize>()
            + map_bytes(&self.slots)
    }

    /// The `k` entries of `tenant` (only `agent`'s when Some) most similar to `query`
    /// (cosine = dot for unit vectors), best first, with similarity >= `min_similarity`.
    /// Ties broken by the larger id (newer entry) first. Empty when the tenant has none or the
    /// query's length does not match.
    pub fn search(
        &self,
        tenant: &str,
        agent: Option<&str>,
        query: &[f32],
        k: usize,
        min_similarity: f32,
    ) -> Vec<(i64, f32)> {
        let Some(t) = self.named_tenant(tenant) else {
            return Vec::new();
        };
        if k == 0 || query.len() != t.dims || t.ids.is_empty() {
            return Vec::new();
        }
        let only = match agent {
            None => None,
            Some(name) => match t.agent_number(name) {
                Some(a) => Some(a),
                None => return Vec::new(),
            },
        };
        let mut top = TopK::new(k.min(t.ids.len()));
        let rows = t.vectors.chunks_exact(t.dims).zip(&t.ids).zip(&t.agents);
        for ((vector, &id), &a) in rows {
            if only.is_some_and(|only| only != a) {
                continue;
            }
            // + 0.0 turns -0.0 into 0.0 so total_cmp sees them as the tie they are.
            let score = dot(query, vector) + 0.0;
            // Written so a NaN score (NaN query) or NaN threshold admits nothing.
            if score >= min_similarity {
                top.offer(Hit { score, id });
            }
        }
        top.into_best_first()
    }

    fn tenant(&self, number: u32) -> Option<&Tenant> {
        self.tenants.get(number as usize)?.as_ref()
    }

    fn named_tenant(&self, name: &str) -> Option<&Tenant> {
        self.tenant(*self.tenant_numbers.get(name)?)
    }

    fn tenant_number_or_insert(&mut self, name: &str, dims: usize) -> Option<u32> {
        if let Some(&n) = self.tenant_numbers.get(name) {
            return Some(n);
        }
        let n = match self.free_tenants.pop() {
            Some(n) => n,
            None => {
                let n = u32::try_from(self.tenants.len()).ok()?;
                self.tenants.push(None);
                n
            }
        };
        let slot = self.tenants.get_mut(n as usize)?;
        *slot = Some(Tenant::new(name, dims));
        self.tenant_numbers.insert(name.to_owned(), n);
        Some(n)
    }

    fn free_tenant(&mut self, number: u32) {
        if let Some(slot) = self.tenants.get_mut(number as usize) {
            if let Some(t) = slot.take() {
                self.tenant_numbers.remove(&t.name);
                self.free_tenants.push(number);
            }
        }
    }
}

/// Dot product with 16 independent accumulators: without them LLVM may not reorder float adds,
/// so a single running sum would stay scalar; with them it becomes four SSE2 lanes of 4.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (chunks_a, chunks_b) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = chunks_a
        .remainder()
        .iter()
        .zip(chunks_b.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in chunks_a.zip(chunks_b) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Ordered by score, then id, so "better" means higher score or, on a tie, the newer entry.
#[derive(Clone, Copy)]
struct Hit {
    score: f32,
    id: i64,
}

impl Ord for Hit {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then(self.id.cmp(&other.id))
    }
}

impl PartialOrd for Hit {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Hit {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Hit {}

/// Bounded min-heap: the worst kept hit sits on top, so most candidates cost one comparison
/// and selection is O(n log k) rather than sorting the whole tenant.
struct TopK {
    cap: usize,
    heap: BinaryHeap<Reverse<Hit>>,
}

impl TopK {
    fn new(cap: usize) -> Self {
        TopK {
            cap,
            heap: BinaryHeap::with_capacity(cap),
        }
    }

    fn offer(&mut self, hit: Hit) {
        if self.heap.len() < self.cap {
            self.heap.push(Reverse(hit));
        } else if let Some(mut worst) = self.heap.peek_mut() {
            if hit > worst.0 {
                *worst = Reverse(hit);
            }
        }
    }

    fn into_best_first(self) -> Vec<(i64, f32)> {
        // Ascending Reverse<Hit> is descending Hit: best first.
        self.heap
            .into_sorted_vec()
            .into_iter()
            .map(|Reverse(h)| (h.id, h.score))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64: deterministic test data without a dev-dependency.
    struct Rng(u64);

    impl Rng {
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        fn open01(&mut self) -> f64 {
            ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }

        fn gauss(&mut self) -> f32 {
            let (a, b) = (self.open01(), self.open01());
            ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
        }

        fn unit_vec(&mut self, dims: usize) -> Vec<f32> {
            let mut v: Vec<f32> = (0..dims).map(|_| self.gauss()).collect();
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.iter_mut().for_each(|x| *x /= norm);
            v
        }
    }

    fn axis(dims: usize, i: usize, value: f32) -> Vec<f32> {
        let mut v = vec![0.0; dims];
        v[i] = value;
        v
    }

    /// Checks every slot record points at the row holding that id, and the counts agree.
    fn assert_consistent(ix: &VectorIndex) {
        let mut total = 0;
        for (n, t) in ix.tenants.iter().enumerate() {
            let Some(t) = t else { continue };
            assert_eq!(ix.tenant_numbers.get(&t.name), Some(&(n as u32)));
            assert!(!t.ids.is_empty(), "an empty tenant should have been freed");
            assert_eq!(t.vectors.len(), t.ids.len() * t.dims);
            assert_eq!(t.agents.len(), t.ids.len());
            for (slot, id) in t.ids.iter().enumerate() {
                let at = ix.slots[id];
                assert_eq!((at.tenant, at.slot), (n as u32, slot as u32), "id {id}");
            }
            total += t.ids.len();
        }
        assert_eq!(total, ix.len());
        assert_eq!(ix.tenant_numbers.len(), ix.tenants.iter().flatten().count());
    }

    fn ids(hits: &[(i64, f32)]) -> Vec<i64> {
        hits.iter().map(|h| h.0).collect()
    }

    #[test]
    fn insert_replace_and_counts() {
        let mut ix = VectorIndex::new();
        assert!(ix.is_empty());
        assert!(ix.upsert("t1", "a", 1, &axis(4, 0, 1.0)));
        assert!(ix.upsert("t1", "b", 2, &axis(4, 1, 1.0)));
        assert!(ix.upsert("t2", "a", 3, &axis(8, 2, 1.0)));
        assert_eq!(
            (ix.len(), ix.tenant_len("t1"), ix.tenant_len("t2")),
            (3, 2, 1)
        );
        assert_eq!(ix.tenant_len("nobody"), 0);
        assert!(ix.contains(2) && !ix.contains(4));
        assert_consistent(&ix);

        // Replacing keeps the count and changes what search sees, agent included.
        assert!(ix.upsert("t1", "b", 1, &axis(4, 1, 1.0)));
        assert_eq!(ix.len(), 3);
        assert_eq!(
            ix.search("t1", Some("a"), &axis(4, 1, 1.0), 10, 0.5),
            vec![]
        );
        assert_eq!(
            ids(&ix.search("t1", Some("b"), &axis(4, 1, 1.0), 10, 0.5)),
            vec![2, 1]
        );
        assert_consistent(&ix);

        // Moving an id to another tenant takes it out of the first.
        assert!(ix.upsert("t2", "a", 1, &axis(8, 0, 1.0)));
        assert_eq!(
            (ix.len(), ix.tenant_len("t1"), ix.tenant_len("t2")),
            (3, 1, 2)
        );
        assert_eq!(
            ids(&ix.search("t1", None, &axis(4, 1, 1.0), 10, -1.0)),
            vec![2]
        );
        assert_consistent(&ix);
        assert!(ix.approx_bytes() > 3 * 4 * 4);
        let mut sizes: Vec<(&str, usize)> = ix.tenant_entries().collect();
        sizes.sort_unstable();
        assert_eq!(sizes, vec![("t1", 1), ("t2", 2)]);
    }

    #[test]
    fn dimension_mismatch_is_rejected() {
        let mut ix = VectorIndex::new();
        assert!(ix.upsert("t", "a", 1, &axis(4, 0, 1.0)));
        assert!(!ix.upsert("t", "a", 2, &axis(5, 0, 1.0)));
        // Replacing with another model's vector is refused too, and the old one stays.
        assert!(!ix.upsert("t", "a", 1, &axis(5, 0, 1.0)));
        assert!(!ix.contains(2));
        assert_eq!(
            ids(&ix.search("t", None, &axis(4, 0, 1.0), 5, 0.0)),
            vec![1]
        );
        // A rejected move to another tenant leaves the entry where it was.
        assert!(ix.upsert("u", "a", 7, &axis(3, 0, 1.0)));
        assert!(!ix.upsert("u", "a", 1, &axis(4, 0, 1.0)));
        assert_eq!(ix.tenant_len("t"), 1);
        // Other tenants are independent.
        assert!(ix.upsert("v", "a", 2, &axis(5, 0, 1.0)));
        // Empty and non-finite vectors are refused.
        assert!(!ix.upsert("w", "a", 3, &[]));
        assert!(!ix.upsert("t", "a", 3, &[f32::NAN, 0.0, 0.0, 0.0]));
        assert!(!ix.upsert("t", "a", 3, &[f32::INFINITY, 0.0, 0.0, 0.0]));
        // Queries of the wrong length find nothing.
        assert_eq!(ix.search("t", None, &axis(5, 0, 1.0), 5, -1.0), vec![]);
        assert_eq!(ix.search("t", None, &[], 5, -1.0), vec![]);
        assert_eq!(ix.len(), 3);
        assert_consistent(&ix);

        // Once a tenant is emptied its dimension is free again.
        assert!(ix.remove(1));
        assert!(ix.upsert("t", "a", 1, &axis(6, 0, 1.0)));
        assert_eq!(
            ids(&ix.search("t", None, &axis(6, 0, 1.0), 5, 0.5)),
            vec![1]
        );
        assert_consistent(&ix);
    }

    #[test]
    fn remove_fixes_the_moved_slot() {
        let mut ix = VectorIndex::new();
        for id in 0..5 {
            assert!(ix.upsert("t", "a", id, &axis(8, id as usize, 1.0)));
        }
        // Removing slot 1 moves id 4 (the last) into it.
        assert!(ix.remove(1));
        assert!(!ix.remove(1));
        assert_eq!(
            ix.tenants[0].as_ref().map(|t| t.ids.clone()),
            Some(vec![0, 4, 2, 3])
        );
        assert_eq!(ix.slots[&4].slot, 1);
        assert_consistent(&ix);
        // The moved entry's vector moved with it.
        assert_eq!(
            ix.search("t", None, &axis(8, 4, 1.0), 1, 0.5),
            vec![(4, 1.0)]
        );
        // And it can still be removed and replaced through its new slot.
        assert!(ix.upsert("t", "a", 4, &axis(8, 7, 1.0)));
        assert_eq!(
            ix.search("t", None, &axis(8, 7, 1.0), 1, 0.5),
            vec![(4, 1.0)]
        );
        assert!(ix.remove(4));
        // Removing the last slot moves nothing.
        assert!(ix.remove(3));
        assert_consistent(&ix);
        assert!(ix.remove(0) && ix.remove(2));
        assert!(ix.is_empty());
        assert!(ix.tenants.iter().all(Option::is_none));
        assert!(ix.tenant_numbers.is_empty());
        assert_eq!(ix.search("t", None, &axis(8, 0, 1.0), 3, -1.0), vec![]);
    }

    #[test]
    fn remove_scope_by_tenant_and_agent() {
        let mut ix = VectorIndex::new();
        for id in 0..12 {
            let agent = ["a", "b", "c"][id as usize % 3];
            assert!(ix.upsert("t", agent, id, &axis(16, id as usize, 1.0)));
            assert!(ix.upsert("u", agent, 100 + id, &axis(16, id as usize, 1.0)));
        }
        assert_eq!(ix.remove_scope("t", Some("b")), 4);
        assert_eq!(ix.remove_scope("t", Some("b")), 0);
        assert_eq!(ix.remove_scope("t", Some("zz")), 0);
        assert_eq!(ix.remove_scope("nobody", None), 0);
        assert_eq!((ix.tenant_len("t"), ix.tenant_len("u")), (8, 12));
        assert_consistent(&ix);
        for id in 0..12 {
            assert_eq!(ix.contains(id), id % 3 != 1, "id {id}");
            // Every survivor's vector is still the one it was stored with.
            let hit = ix.search("t", None, &axis(16, id as usize, 1.0), 1, 0.5);
            assert_eq!(ids(&hit), if id % 3 == 1 { vec![] } else { vec![id] });
        }
        assert_eq!(
            ids(&ix.search("t", Some("b"), &axis(16, 1, 1.0), 5, -1.0)),
            Vec::<i64>::new()
        );

        assert_eq!(ix.remove_scope("t", None), 8);
        assert_eq!((ix.len(), ix.tenant_len("t")), (12, 0));
        assert!((0..12).all(|id| !ix.contains(id)));
        assert_consistent(&ix);
        // The freed tenant number is reused and the other tenant is untouched.
        assert!(ix.upsert("x", "a", 50, &axis(2, 0, 1.0)));
        assert_eq!(ix.slots[&50].tenant, 0);
        assert_consistent(&ix);
        assert_eq!(ix.remove_scope("u", Some("a")), 4);
        assert_eq!(ix.remove_scope("u", Some("b")), 4);
        assert_eq!(ix.remove_scope("u", Some("c")), 4);
        assert_eq!(ix.len(), 1);
        assert_consistent(&ix);
    }

    #[test]
    fn agent_filter_threshold_and_k() {
        let mut ix = VectorIndex::new();
        let q = [1.0, 0.0];
        // Similarities 1.0, 0.8, 0.6, 0.0, -0.6
        let rows: [(i64, &str, [f32; 2]); 5] = [
            (1, "a", [1.0, 0.0]),
            (2, "b", [0.8, 0.6]),
            (3, "a", [0.6, 0.8]),
            (4, "b", [0.0, 1.0]),
            (5, "a", [-0.6, 0.8]),
        ];
        for (id, agent, v) in rows {
            assert!(ix.upsert("t", agent, id, &v));
        }
        let all = ix.search("t", None, &q, 10, -1.0);
        assert_eq!(ids(&all), vec![1, 2, 3, 4, 5]);
        assert_eq!(all[0].1, 1.0);
        assert!((all[4].1 + 0.6).abs() < 1e-6);
        assert_eq!(ids(&ix.search("t", None, &q, 2, -1.0)), vec![1, 2]);
        assert_eq!(ix.search("t", None, &q, 0, -1.0), vec![]);
        assert_eq!(ids(&ix.search("t", Some("a"), &q, 10, -1.0)), vec![1, 3, 5]);
        assert_eq!(ids(&ix.search("t", Some("b"), &q, 1, -1.0)), vec![2]);
        assert_eq!(ix.search("t", Some("nobody"), &q, 10, -1.0), vec![]);
        // The threshold is inclusive.
        assert_eq!(ids(&ix.search("t", None, &q, 10, 0.0)), vec![1, 2, 3, 4]);
        assert_eq!(ids(&ix.search("t", None, &q, 10, 0.6)), vec![1, 2, 3]);
        assert_eq!(ids(&ix.search("t", Some("a"), &q, 10, 0.7)), vec![1]);
        assert_eq!(ix.search("t", None, &q, 10, 1.5), vec![]);
        // NaN in the query or threshold admits nothing rather than garbage.
        assert_eq!(ix.search("t", None, &[f32::NAN, 0.0], 10, -1.0), vec![]);
        assert_eq!(ix.search("t", None, &q, 10, f32::NAN), vec![]);
        assert_eq!(ix.search("other", None, &q, 10, -1.0), vec![]);
    }

    #[test]
    fn ties_prefer_the_larger_id() {
        let mut ix = VectorIndex::new();
        for id in [5, 9, 2, 7] {
            assert!(ix.upsert("t", "a", id, &[0.0, 1.0]));
        }
        assert!(ix.upsert("t", "a", 3, &[1.0, 0.0]));
        assert!(ix.upsert("t", "a", 1, &[-0.0, -1.0]));
        assert_eq!(
            ids(&ix.search("t", None, &[0.0, 1.0], 10, -2.0)),
            vec![9, 7, 5, 2, 3, 1]
        );
        // The heap keeps the newest among equals when k cuts through a tie.
        assert_eq!(ids(&ix.search("t", None, &[0.0, 1.0], 2, -2.0)), vec![9, 7]);
        // 0.0 and -0.0 are the same score, so the id decides.
        assert_eq!(
            ids(&ix.search("t", None, &[1.0, 0.0], 10, -2.0))[1..],
            [9, 7, 5, 2, 1]
        );
    }

    #[test]
    fn dot_handles_any_length() {
        for n in [1, 15, 16, 17, 33, 384, 385] {
            let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
            let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32 * 0.25).collect();
            let want: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let got = f64::from(dot(&a, &b));
            assert!(
                (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                "n {n}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn search_matches_brute_force() {
        let dims = 384;
        let mut rng = Rng(42);
        let mut ix = VectorIndex::new();
        let mut rows: Vec<(i64, u32, Vec<f32>)> = Vec::new();
        for id in 0..2_000i64 {
            let agent = (rng.next_u64() % 3) as u32;
            let v = rng.unit_vec(dims);
            assert!(ix.upsert("t", &format!("agent{agent}"), id, &v));
            rows.push((id, agent, v));
        }
        // Some churn first so slots are not in id order.
        for id in (0..2_000i64).step_by(7) {
            assert!(ix.remove(id));
        }
        rows.retain(|r| r.0 % 7 != 0);
        for r in rows.iter_mut().step_by(5) {
            r.2 = rng.unit_vec(dims);
            assert!(ix.upsert("t", &format!("agent{}", r.1), r.0, &r.2));
        }
        // Duplicate a vector so exact ties occur.
        let twin = rows[10].2.clone();
        assert!(ix.upsert("t", "agent0", 5_000, &twin));
        rows.push((5_000, 0, twin));
        assert_consistent(&ix);

        for round in 0..40 {
            let query = if round == 0 {
                rows[10].2.clone()
            } else {
                rng.unit_vec(dims)
            };
            let agent = [None, Some(0u32), Some(2)][round % 3];
            let (k, min) = [(10, -1.0f32), (1, -1.0), (25, 0.05), (3_000, 0.0)][round % 4];
            let mut want: Vec<(i64, f32)> = rows
                .iter()
                .filter(|r| agent.is_none_or(|a| a == r.1))
                .map(|r| (r.0, dot(&query, &r.2) + 0.0))
                .filter(|h| h.1 >= min)
                .collect();
            want.sort_by(|x, y| y.1.total_cmp(&x.1).then(y.0.cmp(&x.0)));
            want.truncate(k);
            let name = agent.map(|a| format!("agent{a}"));
            let got = ix.search("t", name.as_deref(), &query, k, min);
            assert_eq!(got, want, "round {round}");
            if round == 0 {
                assert_eq!(ids(&got[..2]), vec![5_000, rows[10].0]);
            }
        }
    }
}
