//! Typed reads of a workload YAML's keys: each names the section and key it refuses.

use anyhow::{bail, Result};
use serde_yaml::Value;

pub(crate) fn section<'a>(root: &'a Value, name: &str) -> Result<&'a Value> {
    match root.get(name) {
        Some(v @ Value::Mapping(_)) => Ok(v),
        Some(_) => bail!("section '{name}' must be a mapping"),
        None => bail!("section '{name}' is missing"),
    }
}

pub(crate) fn to_f64(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(crate) fn number(sec: &Value, sec_name: &str, key: &str) -> Result<Option<f64>> {
    match sec.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match to_f64(v) {
            Some(x) if x.is_finite() => Ok(Some(x)),
            Some(x) => bail!("{sec_name}.{key} must be a finite number, got {x}"),
            None => bail!("{sec_name}.{key} must be a number, got {}", short(v)),
        },
    }
}

/// The largest whole number a workload key may hold: every integer below it is exact in
/// a YAML float, and products of a few of them stay far from u64's end.
const MAX_WHOLE: f64 = (1u64 << 48) as f64;

pub(crate) fn first_number(sec: &Value, sec_name: &str, keys: &[&str]) -> Result<Option<f64>> {
    for key in keys {
        if let Some(v) = number(sec, sec_name, key)? {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

pub(crate) fn uint(sec: &Value, sec_name: &str, key: &str) -> Result<Option<u64>> {
    match number(sec, sec_name, key)? {
        None => Ok(None),
        Some(v) if v > MAX_WHOLE => bail!("{sec_name}.{key} is too large: {v} (at most {MAX_WHOLE})"),
        Some(v) if v >= 0.0 && v.fract() == 0.0 => Ok(Some(v as u64)),
        Some(v) => bail!("{sec_name}.{key} must be a whole number ≥ 0, got {v}"),
    }
}

pub(crate) fn boolean(sec: &Value, sec_name: &str, key: &str) -> Result<Option<bool>> {
    match sec.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(Some(true)),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(Some(false)),
        Some(v) => bail!("{sec_name}.{key} must be true or false, got {}", short(v)),
    }
}

pub(crate) fn string(sec: &Value, key: &str) -> Option<String> {
    sec.get(key).and_then(|v| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    })
}

pub(crate) fn short(v: &Value) -> String {
    let s = serde_yaml::to_string(v).unwrap_or_default();
    let s = s.trim();
    if s.len() > 40 {
        format!("{}…", &s[..40])
    } else {
        s.to_string()
    }
}
