//! Shared counters (partitionable devices) as the scheduler applies them: a pool's counter sets
//! give budgets, every allocated device's `consumesCounters` draws on them, and a free device
//! is allocatable only if what it consumes still fits. knic publishes one set per SR-IOV PF
//! (`vfs`): each VF takes 1, the PF the whole budget.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{DeviceKey, uncountable};
use crate::Result;

/// (driver, pool, counter set, counter) → what is left.
#[derive(Debug, Default)]
pub(super) struct Budgets(BTreeMap<(String, String, String, String), i64>);

/// A counter's value as a whole number: knic's counters are counts; anything else (`1Gi`,
/// `500m`) is not something this count can reason about.
fn whole(q: &Quantity) -> Result<i64> {
    q.0.parse::<i64>()
        .map_err(|_| uncountable(format!("counter value {:?} is not a whole number", q.0)))
}

/// What `device` consumes in total, to try cheap devices first.
pub(super) fn total(device: &Device) -> i64 {
    device
        .consumes_counters
        .iter()
        .flatten()
        .flat_map(|c| c.counters.values())
        .map(|c| whole(&c.value).unwrap_or(i64::MAX))
        .fold(0i64, i64::saturating_add)
}

impl Budgets {
    /// The budgets of the pools in `slices` (one generation each), less what allocated devices
    /// consume.
    pub(super) fn of(slices: &[&ResourceSlice], allocated: &BTreeSet<DeviceKey>) -> Result<Self> {
        let mut budgets = Budgets::default();
        for s in slices {
            for set in s.spec.shared_counters.iter().flatten() {
                for (name, counter) in &set.counters {
                    budgets.0.insert(
                        (
                            s.spec.driver.clone(),
                            s.spec.pool.name.clone(),
                            set.name.clone(),
                            name.clone(),
                        ),
                        whole(&counter.value)?,
                    );
                }
            }
        }
        for s in slices {
            for device in s.spec.devices.iter().flatten() {
                let id = (
                    s.spec.driver.clone(),
                    s.spec.pool.name.clone(),
                    device.name.clone(),
                );
                if allocated.contains(&id) {
                    budgets.draw(&s.spec.driver, &s.spec.pool.name, device)?;
                }
            }
        }
        Ok(budgets)
    }

    fn draw(&mut self, driver: &str, pool: &str, device: &Device) -> Result<()> {
        for consumption in device.consumes_counters.iter().flatten() {
            for (name, counter) in &consumption.counters {
                let key = (
                    driver.to_owned(),
                    pool.to_owned(),
                    consumption.counter_set.clone(),
                    name.clone(),
                );
                let left = self.0.entry(key).or_insert(0);
                *left = left.saturating_sub(whole(&counter.value)?);
            }
        }
        Ok(())
    }

    /// Takes what `device` consumes if it all fits (a set nobody publishes has no room, as
    /// for the scheduler); whether it did.
    pub(super) fn take(&mut self, driver: &str, pool: &str, device: &Device) -> Result<bool> {
        for consumption in device.consumes_counters.iter().flatten() {
            for (name, counter) in &consumption.counters {
                let key = (
                    driver.to_owned(),
                    pool.to_owned(),
                    consumption.counter_set.clone(),
                    name.clone(),
                );
                if self.0.get(&key).copied().unwrap_or(0) < whole(&counter.value)? {
                    return Ok(false);
                }
            }
        }
        self.draw(driver, pool, device)?;
        Ok(true)
    }
}
