//! Queue and group name validation.
//!
//! Names are embedded in keys (`consumer:<group>:<queue>`, `queue:<name>`), so the alphabet
//! excludes `:` and anything else that could make two different (group, queue) pairs encode to
//! the same key.

use crate::error::{NameError, NameKind};

/// Longest accepted queue or group name, in bytes.
pub const MAX_NAME_LEN: usize = 128;

pub(crate) fn validate(kind: NameKind, name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty { kind });
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong { kind, len: name.len(), max: MAX_NAME_LEN });
    }
    if let Some((index, ch)) =
        name.char_indices().find(|&(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(NameError::InvalidChar { kind, ch, index });
    }
    // `.` and `..` are path segments every browser and HTTP client resolves away (encoded or
    // not): such a queue could never be reached in the console or by URL.
    if name.bytes().all(|b| b == b'.') {
        return Err(NameError::OnlyDots { kind });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_alphabet() {
        assert!(validate(NameKind::Queue, "orders.v2_EU-1").is_ok());
        assert!(validate(NameKind::Group, &"a".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn rejects_separator_and_other_characters() {
        for bad in ["a:b", "a b", "é", "a/b", "a\0"] {
            assert!(
                matches!(validate(NameKind::Group, bad), Err(NameError::InvalidChar { .. })),
                "{bad:?} accepted"
            );
        }
        assert_eq!(validate(NameKind::Queue, ""), Err(NameError::Empty { kind: NameKind::Queue }));
        for dots in [".", "..", "..."] {
            assert_eq!(validate(NameKind::Group, dots), Err(NameError::OnlyDots { kind: NameKind::Group }));
        }
        assert!(validate(NameKind::Queue, ".hidden").is_ok() && validate(NameKind::Queue, "a..b").is_ok());
        assert!(matches!(
            validate(NameKind::Queue, &"a".repeat(MAX_NAME_LEN + 1)),
            Err(NameError::TooLong { len: 129, .. })
        ));
    }
}
