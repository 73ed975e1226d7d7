//! What EC2 and EBS strings mean, parsed without the host: instance ids and types, an instance
//! metadata answer, the attach-limit table, EBS serials and the identify strings sysfs shows.
//! The daemon reads sysfs, DMI and IMDS and hands the text here, so every parser of that outside
//! input is pure, unit-tested as any user, and fuzzed without the daemon (`fuzz/`).

pub mod attach_limit;
pub mod ebs;
pub mod imds;

/// `family.size`, lowercase letters, digits and `-` (`m7i.large`, `m8i-flex.xlarge`,
/// `c8gn.metal-24xl`).
pub fn is_instance_type(s: &str) -> bool {
    let ok = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    s.len() <= 32
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.split_once('.')
            .is_some_and(|(family, size)| ok(family) && ok(size))
}

/// `i-` and 8 or 17 lowercase hex digits, the two forms EC2 has issued.
pub fn is_instance_id(s: &str) -> bool {
    s.strip_prefix("i-").is_some_and(|hex| {
        (hex.len() == 8 || hex.len() == 17)
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_type_forms() {
        assert!(is_instance_type("m7i.large"));
        assert!(is_instance_type("c8gn.metal-24xl"));
        assert!(is_instance_type("m8i-flex.xlarge"));
        assert!(!is_instance_type("Standard PC (Q35 + ICH9, 2009)"));
        assert!(!is_instance_type("HVM domU"));
        assert!(!is_instance_type("m7i"));
    }

    #[test]
    fn instance_id_forms() {
        assert!(is_instance_id("i-12345678"));
        assert!(is_instance_id("i-0123456789abcdef0"));
        assert!(!is_instance_id("i-0123456789ABCDEF0"));
        assert!(!is_instance_id("i-123"));
        assert!(!is_instance_id("vol-0123456789abcdef0"));
    }
}
