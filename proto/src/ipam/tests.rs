//! Pure IPAM tests: pool arithmetic for every prefix class, exclusions, stable identity,
//! exhaustion, allocation names, and a simulated many-allocator race.

use std::net::IpAddr;

use super::*;
use crate::netconfig::Cidr;

mod allocate;
mod arithmetic;
mod names;
mod race;
mod rejections;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn cidr(s: &str) -> Cidr {
    s.parse().expect("test cidr")
}

fn pool(subnet: &str, gateway: Option<&str>, exclude: &[&str]) -> Pool {
    let exclude: Vec<Exclusion> = exclude
        .iter()
        .map(|e| e.parse().expect("test exclusion"))
        .collect();
    Pool::new(cidr(subnet), gateway.map(ip), &exclude).expect("valid pool")
}

fn pool_error(subnet: &str, gateway: Option<&str>, exclude: &[&str]) -> String {
    let exclude: Vec<Exclusion> = exclude
        .iter()
        .map(|e| e.parse().expect("test exclusion"))
        .collect();
    match Pool::new(cidr(subnet), gateway.map(ip), &exclude) {
        Ok(p) => panic!("expected an error, got {p:?}"),
        Err(e) => e.to_string(),
    }
}

/// A tiny deterministic PRNG (SplitMix64), so random samples are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn next_u128(&mut self) -> u128 {
        (u128::from(self.next()) << 64) | u128::from(self.next())
    }

    fn below(&mut self, n: u128) -> u128 {
        self.next_u128() % n
    }
}
