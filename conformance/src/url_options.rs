//! The check each backend's URL parser runs in its unit tests: query options are strict.

use std::fmt::Debug;

use tenure_api::LockError;

/// Asserts that `parse` is strict about query options appended to `base`:
///
/// - `bogus=1`, and a misspelling of every known option, are [`LockError::Config`] errors
///   that name the option and list every name in `known`;
/// - each `(name, value)` of `samples` is accepted and changes the parsed configuration
///   (its `Debug` output), so no documented option is accepted and then ignored;
/// - `samples` names every option of `known` exactly once.
///
/// # Panics
/// On any violation (it is a test helper).
pub fn assert_strict_options<C: Debug>(
    parse: impl Fn(&str) -> Result<C, LockError>,
    base: &str,
    known: &[&[&str]],
    samples: &[(&str, &str)],
) {
    let with = |option: &str| {
        let sep = if base.contains('?') { '&' } else { '?' };
        format!("{base}{sep}{option}")
    };
    let all: Vec<&str> = known.iter().flat_map(|list| list.iter().copied()).collect();
    let mut sampled: Vec<&str> = samples.iter().map(|(name, _)| *name).collect();
    sampled.sort_unstable();
    let mut expected = all.clone();
    expected.sort_unstable();
    assert_eq!(
        sampled, expected,
        "the samples must cover every known option once"
    );

    let misspelt = all
        .iter()
        .map(|name| format!("{}{}", &name[..1], &name[2..]));
    for name in std::iter::once("bogus".to_string()).chain(misspelt) {
        if all.contains(&name.as_str()) {
            continue;
        }
        let url = with(&format!("{name}=1"));
        match parse(&url) {
            Err(LockError::Config(msg)) => {
                assert!(msg.contains(&format!("{name:?}")), "{url}: {msg}");
                for known in &all {
                    assert!(msg.contains(known), "{url}: {msg} does not list {known}");
                }
            }
            other => panic!("{url}: expected a Config error, got {other:?}"),
        }
    }

    let plain = format!(
        "{:?}",
        parse(base).unwrap_or_else(|e| panic!("{base}: {e}"))
    );
    for (name, value) in samples {
        let url = with(&format!("{name}={value}"));
        let parsed = format!("{:?}", parse(&url).unwrap_or_else(|e| panic!("{url}: {e}")));
        assert_ne!(parsed, plain, "{url}: option {name} had no effect");
    }
}

/// Asserts that option `alias` is read as option `name` on `base` (the same parsed
/// configuration for `value`), and that giving both is a [`LockError::Config`] naming
/// them.
///
/// # Panics
/// On any violation (it is a test helper).
pub fn assert_alias<C: Debug>(
    parse: impl Fn(&str) -> Result<C, LockError>,
    base: &str,
    (alias, name): (&str, &str),
    value: &str,
) {
    let sep = if base.contains('?') { '&' } else { '?' };
    let parsed = |option: &str| {
        let url = format!("{base}{sep}{option}");
        format!("{:?}", parse(&url).unwrap_or_else(|e| panic!("{url}: {e}")))
    };
    assert_eq!(
        parsed(&format!("{alias}={value}")),
        parsed(&format!("{name}={value}"))
    );
    for (first, second) in [(alias, name), (name, alias)] {
        let both = format!("{base}{sep}{first}={value}&{second}={value}");
        match parse(&both) {
            Err(LockError::Config(msg)) => assert!(
                msg.contains(&format!("given twice (as {first} and as {second})")),
                "{both}: {msg}"
            ),
            other => panic!("{both}: expected a Config error, got {other:?}"),
        }
    }
}
