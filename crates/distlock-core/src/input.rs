//! Checks shared by the backends' URL and option parsers.

use std::time::Duration;

use crate::error::{Error, InputKind, Result};

/// The longest network timeout a backend accepts (connect, request,
/// per-node and session timeouts): one hour. A longer one would make a call
/// to an unreachable server look like a hang.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// The key and value of each `key=value` pair of a URL's query string (a
/// pair without `=` has an empty value), in order. A key given twice is
/// refused: which of two values was meant cannot be known. `what` names
/// the URL in the error (`"redis://"`).
pub fn query_pairs<'a>(what: &str, query: &'a str) -> Result<Vec<(&'a str, &'a str)>> {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if let Some((_, first)) = pairs.iter().find(|(key, _)| *key == k) {
            return Err(Error::invalid(
                InputKind::Url,
                format!(
                    "{what} URL: parameter {k} is given twice ({k}={first:?} and {k}={v:?}); give it once"
                ),
            ));
        }
        pairs.push((k, v));
    }
    Ok(pairs)
}

/// Checks a duration option against its range: `name` is the URL
/// parameter that sets it (in milliseconds), `min` and `max` the range.
pub fn check_millis(name: &str, value: Duration, min: Duration, max: Duration) -> Result<()> {
    if value < min || value > max {
        return Err(Error::invalid(
            InputKind::Config,
            format!(
                "{name}={} is out of range; it must be from {} to {} (ms)",
                value.as_millis(),
                min.as_millis(),
                max.as_millis()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_query_key_is_refused() {
        assert_eq!(
            query_pairs("x://", "a=1&&b&c=").unwrap(),
            [("a", "1"), ("b", ""), ("c", "")]
        );
        let e = query_pairs("x://", "fifo=true&b=1&fifo=false").unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidInput {
                    kind: InputKind::Url,
                    ..
                }
            ),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(text.contains("fifo is given twice"), "{text}");
        assert!(
            text.contains("\"true\"") && text.contains("\"false\""),
            "{text}"
        );
    }

    #[test]
    fn durations_out_of_range_are_refused_with_the_range() {
        let (min, max) = (Duration::from_millis(1), MAX_TIMEOUT);
        assert!(check_millis("timeout_ms", Duration::from_secs(2), min, max).is_ok());
        assert!(check_millis("timeout_ms", MAX_TIMEOUT, min, max).is_ok());
        for bad in [Duration::ZERO, Duration::from_millis(u64::MAX)] {
            let e = check_millis("timeout_ms", bad, min, max).unwrap_err();
            let text = e.to_string();
            assert!(text.contains("timeout_ms="), "{text}");
            assert!(text.contains("from 1 to 3600000"), "{text}");
        }
    }
}
