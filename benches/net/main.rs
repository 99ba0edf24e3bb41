//! The address classifier of `net` (`net::addr::classify`) and the policy over it
//! (`NetPolicy::refused`, with and without `allowCidrs`), in nanoseconds per address, on a mix
//! of IPv4, IPv6 and IPv6-carrying-IPv4 addresses; and the URL check that needs no lookup
//! (`NetPolicy::check_url`, the `url` crate's parse included), in nanoseconds per URL. See
//! README.md.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::net::IpAddr;
use std::time::Instant;

use agent_gateway::config::net::NetConfig;
use agent_gateway::net::addr::classify;
use agent_gateway::net::NetPolicy;

const ADDRESSES: &[&str] = &[
    "8.8.8.8",
    "127.0.0.1",
    "10.1.2.3",
    "172.20.0.1",
    "192.168.1.1",
    "100.64.0.1",
    "169.254.169.254",
    "169.254.1.1",
    "0.0.0.0",
    "224.0.0.1",
    "203.0.113.5",
    "1.1.1.1",
    "::1",
    "2606:4700::1111",
    "fd12::1",
    "fe80::1",
    "fd00:ec2::254",
    "::ffff:127.0.0.1",
    "64:ff9b::a9fe:a9fe",
    "2002:a9fe:a9fe::1",
];

const URLS: &[&str] = &[
    "https://api.example.com/v1/models",
    "http://127.0.0.1:8080/x",
    "http://2130706433/",
    "http://[::ffff:127.0.0.1]/",
    "http://169.254.169.254/latest/meta-data/",
    "https://user@example.com/",
    "http://localhost./",
    "https://8.8.8.8/dns-query",
];

/// Runs `f` over `items` `rounds` times; nanoseconds per item.
fn per_item<T: Copy>(items: &[T], rounds: usize, mut f: impl FnMut(T)) -> f64 {
    for &i in items {
        f(i);
    }
    let started = Instant::now();
    for _ in 0..rounds {
        for &i in items {
            f(black_box(i));
        }
    }
    started.elapsed().as_nanos() as f64 / (rounds * items.len()) as f64
}

fn main() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500_000);
    let ips: Vec<IpAddr> = ADDRESSES.iter().map(|a| a.parse().unwrap()).collect();
    let closed = NetPolicy::default();
    let ranges = NetPolicy::new(&NetConfig {
        allow_cidrs: vec![
            "127.0.0.0/8".parse().unwrap(),
            "10.0.0.0/8".parse().unwrap(),
            "fd00::/8".parse().unwrap(),
        ],
        ..NetConfig::default()
    });
    let classify_ns = per_item(&ips, rounds, |ip| {
        black_box(classify(ip));
    });
    let refused_ns = per_item(&ips, rounds, |ip| {
        black_box(closed.refused(ip));
    });
    let ranges_ns = per_item(&ips, rounds, |ip| {
        black_box(ranges.refused(ip));
    });
    let url_ns = per_item(URLS, (rounds / 50).max(1), |u| {
        let _ = black_box(closed.check_url(u));
    });
    println!("classify                  {classify_ns:8.1} ns/address");
    println!("NetPolicy::refused        {refused_ns:8.1} ns/address");
    println!("refused, 3 allowCidrs     {ranges_ns:8.1} ns/address");
    println!("NetPolicy::check_url      {url_ns:8.1} ns/URL");
}
