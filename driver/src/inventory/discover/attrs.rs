//! The attribute map of one device, within the ResourceSlice limits.

use std::collections::BTreeMap;

use crate::inventory::{AttrValue, MAX_ATTRIBUTES, MAX_STRING_LEN};

/// Attribute map builder enforcing the ResourceSlice limits.
#[derive(Default)]
pub(super) struct Attrs(BTreeMap<String, AttrValue>);

impl Attrs {
    pub(super) fn str(&mut self, key: &str, value: &str) {
        if value.len() > MAX_STRING_LEN && crate::slices::limits::DESCRIPTIVE.contains(&key) {
            let short = crate::slices::limits::shorten(value);
            tracing::warn!(attribute = key, value, short = %short,
                "descriptive attribute longer than {MAX_STRING_LEN} bytes; shortened");
            self.0.insert(key.to_owned(), AttrValue::Str(short));
            return;
        }
        if value.len() > MAX_STRING_LEN {
            tracing::warn!(
                attribute = key,
                value,
                "attribute value longer than {MAX_STRING_LEN} bytes; left out"
            );
            return;
        }
        self.0
            .insert(key.to_owned(), AttrValue::Str(value.to_owned()));
    }

    pub(super) fn int(&mut self, key: &str, value: i64) {
        self.0.insert(key.to_owned(), AttrValue::Int(value));
    }

    pub(super) fn bool(&mut self, key: &str, value: bool) {
        self.0.insert(key.to_owned(), AttrValue::Bool(value));
    }

    pub(super) fn finish(self, device: &str) -> BTreeMap<String, AttrValue> {
        let mut map = self.0;
        if map.len() > MAX_ATTRIBUTES {
            tracing::warn!(
                device,
                count = map.len(),
                "more than {MAX_ATTRIBUTES} attributes; dropping descriptions first, then the last by name"
            );
            for key in crate::slices::limits::DROP_ORDER {
                if map.len() <= MAX_ATTRIBUTES {
                    break;
                }
                map.remove(*key);
            }
            while map.len() > MAX_ATTRIBUTES {
                map.pop_last();
            }
        }
        map
    }
}
