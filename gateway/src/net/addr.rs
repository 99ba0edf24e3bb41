//! The one address classifier of the gateway: what kind of destination an IP address is
//! (loopback, private, shared CGNAT space, link-local, cloud metadata, ...). IPv6 forms that
//! carry an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64
//! `64:ff9b::/96` and `64:ff9b:1::/48`, 6to4 `2002::/16`) are judged by the IPv4 address they
//! carry, so a spelling never changes the verdict. Pure arithmetic on the octets: no
//! allocation, no lookup.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What an address is, as far as reaching it from the gateway goes. `Public` is the only class
/// reachable without an allowance; `Metadata` is never reachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Anything not listed below: the public internet.
    Public,
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// RFC 1918 (10/8, 172.16/12, 192.168/16) and IPv6 unique local addresses (fc00::/7).
    Private,
    /// Shared address space 100.64.0.0/10 (carrier-grade NAT, many cloud internal networks).
    Cgnat,
    /// 169.254.0.0/16, fe80::/10.
    LinkLocal,
    /// Cloud instance metadata and platform endpoints (169.254.169.254, 169.254.170.2,
    /// 100.100.100.200, 168.63.129.16, 192.0.0.192, fd00:ec2::/32): never reachable.
    Metadata,
    /// 0.0.0.0/8 and `::` (connecting to them reaches this host).
    Unspecified,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 240.0.0.0/4 and 255.255.255.255, IETF protocol assignments (192.0.0.0/24, 2001::/23
    /// outside its documentation block), benchmarking (198.18.0.0/15), the IPv6 discard prefix
    /// (100::/64), deprecated site-local (fec0::/10), 6to4 relay anycast (192.88.99.0/24).
    Reserved,
    /// 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32, 3fff::/20.
    Documentation,
}

impl Class {
    /// The class as the refusal messages name it.
    pub const fn name(self) -> &'static str {
        match self {
            Class::Public => "public",
            Class::Loopback => "loopback",
            Class::Private => "private",
            Class::Cgnat => "shared (CGNAT)",
            Class::LinkLocal => "link-local",
            Class::Metadata => "cloud metadata",
            Class::Unspecified => "unspecified",
            Class::Multicast => "multicast",
            Class::Reserved => "reserved",
            Class::Documentation => "documentation",
        }
    }
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The class of `ip`; an IPv6 address carrying an IPv4 address is the class of that address.
pub fn classify(ip: IpAddr) -> Class {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// The class of an IPv4 address.
pub fn classify_v4(ip: Ipv4Addr) -> Class {
    let [a, b, c, d] = ip.octets();
    match (a, b, c, d) {
        (169, 254, 169, 254) | (169, 254, 170, 2) | (100, 100, 100, 200) | (168, 63, 129, 16) => {
            Class::Metadata
        }
        (192, 0, 0, 192) => Class::Metadata,
        (0, ..) => Class::Unspecified,
        (127, ..) => Class::Loopback,
        (10, ..) | (192, 168, ..) => Class::Private,
        (172, 16..=31, ..) => Class::Private,
        (100, 64..=127, ..) => Class::Cgnat,
        (169, 254, ..) => Class::LinkLocal,
        (192, 0, 2, _) | (198, 51, 100, _) | (203, 0, 113, _) => Class::Documentation,
        (192, 0, 0, _) | (192, 88, 99, _) | (198, 18..=19, ..) => Class::Reserved,
        (224..=239, ..) => Class::Multicast,
        (240..=255, ..) => Class::Reserved,
        _ => Class::Public,
    }
}

/// The IPv4 address an IPv6 address carries, if it is one of the forms that do: IPv4-mapped,
/// IPv4-compatible (not `::` or `::1`), NAT64 well-known (`64:ff9b::/96`), local-use NAT64
/// (`64:ff9b:1::/48`, the /96 layout), 6to4 (`2002:a.b.c.d::/48`).
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let last = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo] => Some(last(hi, lo)),
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, hi, lo] => Some(last(hi, lo)),
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(last(hi, lo)),
        [0x64, 0xff9b, 1, _, _, _, hi, lo] => Some(last(hi, lo)),
        [0x2002, hi, lo, ..] => Some(last(hi, lo)),
        _ => None,
    }
}

/// The class of an IPv6 address.
pub fn classify_v6(ip: Ipv6Addr) -> Class {
    let s = ip.segments();
    if let Some(v4) = embedded_v4(ip) {
        let class = classify_v4(v4);
        // Local-use NAT64 may also carry the address in the RFC 6052 /48 layout (octets in
        // segments 3 to 5, skipping the u octet): metadata in either reading wins, then any
        // reading that is not public.
        if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
            let [a, b] = s[3].to_be_bytes();
            let [_, c] = s[4].to_be_bytes();
            let [d, _] = s[5].to_be_bytes();
            let other = classify_v4(Ipv4Addr::new(a, b, c, d));
            if other == Class::Metadata || class == Class::Public {
                return other;
            }
        }
        return class;
    }
    match s {
        [0, 0, 0, 0, 0, 0, 0, 0] => Class::Unspecified,
        [0, 0, 0, 0, 0, 0, 0, 1] => Class::Loopback,
        [0xfd00, 0x0ec2, ..] => Class::Metadata,
        [0x0100, 0, 0, 0, ..] => Class::Reserved,
        [0x2001, 0x0db8, ..] => Class::Documentation,
        [0x2001, 0x0000..=0x01ff, ..] => Class::Reserved,
        [x, ..] if x & 0xfff0 == 0x3ff0 => Class::Documentation,
        [x, ..] if x & 0xfe00 == 0xfc00 => Class::Private,
        [x, ..] if x & 0xffc0 == 0xfe80 => Class::LinkLocal,
        [x, ..] if x & 0xffc0 == 0xfec0 => Class::Reserved,
        [x, ..] if x & 0xff00 == 0xff00 => Class::Multicast,
        _ => Class::Public,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn classes_at_their_edges() {
        use Class::*;
        let cases: &[(&str, Class)] = &[
            ("127.0.0.1", Loopback),
            ("127.255.255.255", Loopback),
            ("128.0.0.1", Public),
            ("126.255.255.255", Public),
            ("10.0.0.0", Private),
            ("9.255.255.255", Public),
            ("11.0.0.0", Public),
            ("172.16.0.0", Private),
            ("172.31.255.255", Private),
            ("172.15.255.255", Public),
            ("172.32.0.0", Public),
            ("192.168.1.1", Private),
            ("192.169.0.0", Public),
            ("100.64.0.0", Cgnat),
            ("100.127.255.255", Cgnat),
            ("100.63.255.255", Public),
            ("100.128.0.0", Public),
            ("169.254.0.1", LinkLocal),
            ("169.254.169.254", Metadata),
            ("169.254.170.2", Metadata),
            ("100.100.100.200", Metadata),
            ("168.63.129.16", Metadata),
            ("192.0.0.192", Metadata),
            ("192.0.0.1", Reserved),
            ("192.0.2.1", Documentation),
            ("198.51.100.7", Documentation),
            ("203.0.113.255", Documentation),
            ("198.18.0.0", Reserved),
            ("198.19.255.255", Reserved),
            ("198.20.0.0", Public),
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Unspecified),
            ("255.255.255.255", Reserved),
            ("240.0.0.1", Reserved),
            ("224.0.0.1", Multicast),
            ("239.255.255.255", Multicast),
            ("8.8.8.8", Public),
            ("::1", Loopback),
            ("::", Unspecified),
            ("fc00::1", Private),
            ("fdff:ffff::1", Private),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("fec0::1", Reserved),
            ("ff02::1", Multicast),
            ("fd00:ec2::254", Metadata),
            ("2001:db8::1", Documentation),
            ("3fff::1", Documentation),
            ("2001::1", Reserved),
            ("100::1", Reserved),
            ("2606:4700::1111", Public),
            // IPv6 spellings of IPv4 addresses: judged by the address they carry.
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:7f00:1", Loopback),
            ("::ffff:8.8.8.8", Public),
            ("::ffff:169.254.169.254", Metadata),
            ("::127.0.0.1", Loopback),
            ("::10.0.0.1", Private),
            ("::8.8.8.8", Public),
            ("64:ff9b::a9fe:a9fe", Metadata),
            ("64:ff9b::7f00:1", Loopback),
            ("64:ff9b::808:808", Public),
            ("64:ff9b:1::a9fe:a9fe", Metadata),
            ("64:ff9b:1:a9fe:a9:fe00::", Metadata),
            ("64:ff9b:1:7f00:0:100:0:0", Unspecified),
            ("64:ff9b:1:7f00:0:100:808:808", Loopback),
            ("2002:7f00:1::", Loopback),
            ("2002:a9fe:a9fe::1", Metadata),
            ("2002:808:808::1", Public),
        ];
        for (text, expected) in cases {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(classify(ip), *expected, "{text}");
        }
    }

    #[test]
    fn every_spelling_of_a_metadata_address_is_metadata() {
        for v4 in [
            Ipv4Addr::new(169, 254, 169, 254),
            Ipv4Addr::new(169, 254, 170, 2),
            Ipv4Addr::new(100, 100, 100, 200),
        ] {
            let [a, b, c, d] = v4.octets();
            let hi = u16::from_be_bytes([a, b]);
            let lo = u16::from_be_bytes([c, d]);
            for v6 in [
                v4.to_ipv6_mapped(),
                v4.to_ipv6_compatible(),
                Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo),
                Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, hi, lo),
                Ipv6Addr::new(
                    0x64,
                    0xff9b,
                    1,
                    hi,
                    c.into(),
                    u16::from(d) << 8,
                    0x0808,
                    0x0808,
                ),
                Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1),
            ] {
                assert_eq!(classify_v6(v6), Class::Metadata, "{v6}");
            }
        }
    }
}
