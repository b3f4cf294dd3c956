//! Reading a mapping of a Traefik configuration field by field, where a field this translation
//! does not know is a reason to refuse (fail closed: an option left unread could be one that
//! restricts who is served), and a value of the wrong kind says which field it is.
//!
//! Traefik reads its options case-insensitively (its file provider decodes through `paerser`,
//! which folds case): `loadbalancer` is `loadBalancer`. The keys are compared the same way here.

use serde_json::Value;

/// A mapping and what it is, for messages.
pub struct Fields<'a> {
    map: &'a serde_json::Map<String, Value>,
    what: String,
}

impl<'a> Fields<'a> {
    pub fn new(value: &'a Value, what: &str) -> Result<Fields<'a>, String> {
        static EMPTY: std::sync::OnceLock<serde_json::Map<String, Value>> =
            std::sync::OnceLock::new();
        match value {
            Value::Object(map) => Ok(Fields {
                map,
                what: what.to_owned(),
            }),
            // `tls: {}` is often written `tls:` (null) in YAML.
            Value::Null => Ok(Fields {
                map: EMPTY.get_or_init(Default::default),
                what: what.to_owned(),
            }),
            other => Err(format!(
                "{what}: expected a mapping, got {}",
                super::document::kind(other)
            )),
        }
    }

    /// The value of `key`, its case folded; a null value is absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
            .filter(|v| !v.is_null())
    }

    /// The keys written, in the case of `known` where they are known.
    pub fn keys(&self) -> Vec<&'a str> {
        self.map
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// Refuses a key outside `known`.
    pub fn only(&self, known: &[&str]) -> Result<(), String> {
        for key in self.map.keys() {
            if !known.iter().any(|k| k.eq_ignore_ascii_case(key)) {
                return Err(format!(
                    "{}: `{key}` is not carried (an option this translation does not know is refused, never ignored)",
                    self.what
                ));
            }
        }
        Ok(())
    }

    pub fn string(&self, key: &str) -> Result<Option<String>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(Value::Bool(b)) => Ok(Some(b.to_string())),
            Some(other) => Err(format!(
                "{} `{key}`: expected a string, got {}",
                self.what,
                super::document::kind(other)
            )),
        }
    }

    pub fn boolean(&self, key: &str) -> Result<Option<bool>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(Some(true)),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(Some(false)),
            Some(other) => Err(format!(
                "{} `{key}`: expected true or false, got {}",
                self.what,
                super::document::kind(other)
            )),
        }
    }

    /// A whole number that is not negative (written as a number or a string of digits).
    pub fn whole(&self, key: &str) -> Result<Option<u64>, String> {
        let bad = || format!("{} `{key}`: expected a whole number", self.what);
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(bad),
            Some(Value::String(s)) => s.trim().parse().map(Some).map_err(|_| bad()),
            Some(_) => Err(bad()),
        }
    }

    /// A signed whole number (a router's `priority`).
    pub fn integer(&self, key: &str) -> Result<Option<i64>, String> {
        let bad = || format!("{} `{key}`: expected a whole number", self.what);
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n.as_i64().map(Some).ok_or_else(bad),
            Some(Value::String(s)) => s.trim().parse().map(Some).map_err(|_| bad()),
            Some(_) => Err(bad()),
        }
    }

    /// A list (a lone string counts as a list of one, as Traefik's decoder reads it).
    pub fn list(&self, key: &str) -> Result<Option<Vec<&'a Value>>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items.iter().collect())),
            Some(v @ Value::String(_)) => Ok(Some(vec![v])),
            Some(other) => Err(format!(
                "{} `{key}`: expected a list, got {}",
                self.what,
                super::document::kind(other)
            )),
        }
    }

    /// A list of strings.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<String>>, String> {
        let Some(items) = self.list(key)? else {
            return Ok(None);
        };
        items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(format!(
                    "{} `{key}`: expected strings, got {}",
                    self.what,
                    super::document::kind(other)
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A mapping of strings to strings (custom headers), in the order written.
    pub fn string_map(&self, key: &str) -> Result<Vec<(String, String)>, String> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    Value::Null => Ok((k.clone(), String::new())),
                    Value::Number(n) => Ok((k.clone(), n.to_string())),
                    Value::Bool(b) => Ok((k.clone(), b.to_string())),
                    other => Err(format!(
                        "{} `{key}.{k}`: expected a string, got {}",
                        self.what,
                        super::document::kind(other)
                    )),
                })
                .collect(),
            Some(other) => Err(format!(
                "{} `{key}`: expected a mapping, got {}",
                self.what,
                super::document::kind(other)
            )),
        }
    }
}

/// A Go duration (`5s`, `1m30s`, `500ms`) or a number of seconds, in whole seconds rounded up
/// (sozu's health checks count in seconds).
pub fn duration_seconds(value: &Value) -> Result<u64, String> {
    let text = match value {
        Value::Number(n) => return n.as_u64().ok_or_else(|| format!("`{n}` is not a duration")),
        Value::String(s) => s.trim(),
        other => {
            return Err(format!(
                "expected a duration, got {}",
                super::document::kind(other)
            ))
        }
    };
    if let Ok(n) = text.parse::<u64>() {
        return Ok(n);
    }
    let mut nanos: u128 = 0;
    let mut rest = text;
    if rest.is_empty() {
        return Err("an empty duration".into());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("`{text}` has a number without a unit"))?;
        let (number, after) = rest.split_at(digits);
        let number: f64 = number
            .parse()
            .map_err(|_| format!("`{text}` is not a duration"))?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale: f64 = match unit {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(format!("`{text}` has an unknown unit `{unit}`")),
        };
        nanos = nanos.saturating_add((number * scale) as u128);
        rest = next;
    }
    Ok(nanos.div_ceil(1_000_000_000).min(u64::MAX as u128) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn go_durations_in_whole_seconds() {
        for (text, secs) in [
            ("5s", 5),
            ("1m30s", 90),
            ("500ms", 1),
            ("2", 2),
            ("1h", 3600),
        ] {
            assert_eq!(duration_seconds(&json!(text)).unwrap(), secs, "{text}");
        }
        assert_eq!(duration_seconds(&json!(7)).unwrap(), 7);
        for bad in ["", "5", "s", "5 parsecs", "1.2.3s"] {
            if bad == "5" {
                continue;
            }
            assert!(duration_seconds(&json!(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_are_read_without_regard_to_case_and_unknown_ones_refused() {
        let v = json!({"loadbalancer": {"x": 1}, "Odd": 2});
        let f = Fields::new(&v, "service `a`").unwrap();
        assert!(f.get("loadBalancer").is_some());
        let e = f.only(&["loadBalancer"]).unwrap_err();
        assert!(e.contains("`Odd` is not carried"), "{e}");
    }
}
