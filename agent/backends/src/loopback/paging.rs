//! Paging for ListVolumes and ListSnapshots: entries in id order, and a token that is the last
//! id of the page before. A page starts after the token's place in the order, not at a position,
//! so entries deleted or added between two pages neither shift nor repeat the rest.

use ebs_node_core::error::{ControllerError, Result};

pub struct Page<T> {
    pub entries: Vec<T>,
    pub next_token: String,
}

/// One page of `all` (sorted by `id`); `max` 0 means no limit. A token that cannot be one of
/// ours (not `prefix`-shaped) is ABORTED, as the spec asks for an invalid starting_token.
pub fn page<T>(
    all: Vec<T>,
    id: impl Fn(&T) -> &str,
    prefix: &str,
    max: usize,
    token: &str,
) -> Result<Page<T>> {
    if !token.is_empty() && !token.starts_with(prefix) {
        return Err(ControllerError::UnknownStartingToken {
            token: token.to_string(),
        }
        .into());
    }
    let take = if max == 0 { usize::MAX } else { max };
    let mut rest = all
        .into_iter()
        .filter(|e| token.is_empty() || id(e) > token)
        .peekable();
    let entries: Vec<T> = rest.by_ref().take(take).collect();
    let next_token = match (rest.peek(), entries.last()) {
        (Some(_), Some(last)) => id(last).to_string(),
        _ => String::new(),
    };
    Ok(Page {
        entries,
        next_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ebs_node_core::error::Error;

    fn ids(p: &Page<String>) -> Vec<&str> {
        p.entries.iter().map(String::as_str).collect()
    }

    #[test]
    fn pages_follow_the_order_across_deletions() {
        let all: Vec<String> = ["lv-1", "lv-2", "lv-3", "lv-4", "lv-5"]
            .map(String::from)
            .to_vec();
        let p = page(all.clone(), |s| s, "lv-", 2, "").unwrap();
        assert_eq!(
            (ids(&p), p.next_token.as_str()),
            (vec!["lv-1", "lv-2"], "lv-2")
        );
        // lv-2 is deleted before the next page is asked for.
        let after: Vec<String> = all.iter().filter(|s| *s != "lv-2").cloned().collect();
        let p = page(after, |s| s, "lv-", 0, "lv-2").unwrap();
        assert_eq!(
            (ids(&p), p.next_token.as_str()),
            (vec!["lv-3", "lv-4", "lv-5"], "")
        );
        let p = page(all.clone(), |s| s, "lv-", 5, "").unwrap();
        assert_eq!(p.next_token, "");
        assert!(matches!(
            page(all, |s| s, "lv-", 0, "invalid-token"),
            Err(Error::Controller(
                ControllerError::UnknownStartingToken { .. }
            ))
        ));
    }
}
