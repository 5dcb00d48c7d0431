//! The sums a spend ledger keeps in memory: one per finest group (day, tenant,
//! key, model, deployment), so a report adds up groups, never calls, and reads
//! no history.

use std::collections::BTreeMap;

use super::{SpendEntry, SpendField, SpendQuery, SpendRow, UtcDay};

/// The sums by name, one level per grouped name: a call is counted by looking
/// its names up by reference, so counting copies a name only for a group's
/// first call (a map keyed by the tuple of names would copy all four per call).
type ByName<T> = BTreeMap<String, T>;
/// The finest groups of one day: tenant, key, model, deployment.
type DayGroups = ByName<ByName<ByName<ByName<Totals>>>>;

/// The sums of a group's calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Totals {
    calls: u64,
    input_tokens: u64,
    cached_tokens: u64,
    output_tokens: u64,
    micro_usd: u64,
    unpriced_calls: u64,
}

impl Totals {
    /// Adds `other`, saturating: a sum is a report, never a balance that wraps.
    fn add(&mut self, other: &Totals) {
        self.calls = self.calls.saturating_add(other.calls);
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.micro_usd = self.micro_usd.saturating_add(other.micro_usd);
        self.unpriced_calls = self.unpriced_calls.saturating_add(other.unpriced_calls);
    }

    fn of(entry: &SpendEntry) -> Self {
        Self {
            calls: 1,
            input_tokens: entry.input_tokens,
            cached_tokens: entry.cached_tokens,
            output_tokens: entry.output_tokens,
            micro_usd: entry.micro_usd,
            unpriced_calls: u64::from(entry.unpriced),
        }
    }
}

/// Every entry counted so far, summed by its finest group. Memory grows with the
/// groups (days × tenants × keys × models × deployments that had calls), not
/// with the calls.
#[derive(Debug, Default)]
pub struct SpendSums {
    days: BTreeMap<UtcDay, DayGroups>,
}

/// The value of `map` under `name`, made (and `name` copied) only when missing.
fn named<'a, T: Default>(map: &'a mut ByName<T>, name: &str) -> &'a mut T {
    if !map.contains_key(name) {
        map.insert(name.to_owned(), T::default());
    }
    map.get_mut(name).expect("inserted above")
}

impl SpendSums {
    /// Counts `entry` in its group.
    pub fn add(&mut self, entry: &SpendEntry) {
        let day = self.days.entry(UtcDay::of_unix_ms(entry.at_unix_ms)).or_default();
        let key = named(named(day, &entry.tenant), &entry.key);
        named(named(key, &entry.model), &entry.deployment).add(&Totals::of(entry));
    }

    /// The report `query` asks for: one row per group of the calls completed on
    /// its days, ordered by the grouped fields (tenant, key, model, deployment,
    /// day); no row for a group without calls.
    pub fn report(&self, query: &SpendQuery) -> Vec<SpendRow> {
        let mut groups: BTreeMap<SpendRow, Totals> = BTreeMap::new();
        for (day, tenants) in self.days.range(query.from()..=query.to()) {
            for (tenant, keys) in tenants {
                for (key, models) in keys {
                    for (model, deployments) in models {
                        for (deployment, totals) in deployments {
                            let pick = |field, value: &String| query.groups_by(field).then(|| value.clone());
                            let group = SpendRow {
                                tenant: pick(SpendField::Tenant, tenant),
                                key: pick(SpendField::Key, key),
                                model: pick(SpendField::Model, model),
                                deployment: pick(SpendField::Deployment, deployment),
                                day: query.groups_by(SpendField::Day).then_some(*day),
                                ..SpendRow::default()
                            };
                            groups.entry(group).or_default().add(totals);
                        }
                    }
                }
            }
        }
        (groups.into_iter())
            .map(|(group, t)| SpendRow {
                calls: t.calls,
                input_tokens: t.input_tokens,
                cached_tokens: t.cached_tokens,
                output_tokens: t.output_tokens,
                micro_usd: t.micro_usd,
                unpriced_calls: t.unpriced_calls,
                ..group
            })
            .collect()
    }
}
