//! `classes:` of the gateway (docs/gateway.md, "Classes"): the entries and their
//! checks; what they mean for the limits is `limits/classes.rs`.

use ratelimiter::scheduler::{WorkClass, CLASSES_MAX, CLASS_SHARE_MAX};
use serde::Deserialize;

/// Headroom is held in millionths: exact integer arithmetic on capacities, and
/// finer than any capacity a provider publishes needs.
pub const HEADROOM_PPM_ONE: u64 = 1_000_000;

/// One `classes:` entry of the gateway's configuration.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// The name tenants and the class header refer to; also a metrics label.
    pub name: String,
    /// The class's weight when waiting classes compete for freed capacity.
    #[serde(default = "share_default")]
    pub share: u32,
    /// The part of every model limit the classes below this one may not take, in
    /// `[0, 1)`; read from YAML as a fraction such as `0.10`.
    #[serde(default)]
    pub headroom: Headroom,
}

fn share_default() -> u32 {
    1
}

/// A fraction in `[0, 1)` held in millionths.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(try_from = "f64")]
pub struct Headroom(u64);

impl TryFrom<f64> for Headroom {
    type Error = String;

    fn try_from(value: f64) -> Result<Self, String> {
        if !(0.0..1.0).contains(&value) {
            return Err(format!("headroom must be in [0, 1), got {value}"));
        }
        Ok(Self((value * HEADROOM_PPM_ONE as f64).round() as u64))
    }
}

impl Headroom {
    /// The fraction in millionths.
    pub fn ppm(self) -> u64 {
        self.0
    }
}

/// Checks the `classes:` entries and the tenants' `class` references. `entry`
/// builds the error's entry name.
pub fn validate_classes(configs: &[ClassConfig], tenant_classes: &[Option<&str>]) -> Result<(), (String, String)> {
    if configs.len() > CLASSES_MAX {
        return Err(("classes".into(), format!("at most {CLASSES_MAX} entries")));
    }
    let mut sum_ppm = 0;
    for (i, config) in configs.iter().enumerate() {
        if let Err(e) = WorkClass::new(config.name.clone(), 1) {
            return Err((format!("classes[{i}].name"), e.0));
        }
        if configs[..i].iter().any(|c| c.name == config.name) {
            return Err((format!("classes[{i}].name"), "appears twice".into()));
        }
        if !(1..=CLASS_SHARE_MAX).contains(&config.share) {
            return Err((format!("classes[{i}].share"), format!("must be 1..={CLASS_SHARE_MAX}")));
        }
        // The lowest class's headroom would hold capacity back from nobody.
        if i + 1 < configs.len() {
            sum_ppm += config.headroom.ppm();
        }
    }
    if sum_ppm >= HEADROOM_PPM_ONE {
        return Err((
            "classes".into(),
            "the headrooms of the classes above the lowest add up to 1 or more: the lowest would get nothing".into(),
        ));
    }
    for (i, class) in tenant_classes.iter().enumerate() {
        if let Some(name) = class {
            if !configs.iter().any(|c| c.name == *name) {
                return Err((
                    format!("tenants[{i}].class"),
                    format!("names no entry of classes: {name:?}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Class entries of (name, share, headroom).
    pub(crate) fn configs(entries: &[(&str, u32, f64)]) -> Vec<ClassConfig> {
        (entries.iter())
            .map(|(name, share, headroom)| ClassConfig {
                name: (*name).to_owned(),
                share: *share,
                headroom: Headroom::try_from(*headroom).unwrap(),
            })
            .collect()
    }

    #[test]
    fn bad_classes_are_named() {
        let check = |entries: &[(&str, u32, f64)], tenants: &[Option<&str>]| {
            validate_classes(&configs(entries), tenants).unwrap_err().0
        };
        assert_eq!(check(&[("a", 0, 0.0)], &[]), "classes[0].share");
        assert_eq!(check(&[("a", 1, 0.0), ("a", 1, 0.0)], &[]), "classes[1].name");
        assert_eq!(check(&[("a b", 1, 0.0)], &[]), "classes[0].name");
        assert_eq!(check(&[("a", 1, 0.6), ("b", 1, 0.4), ("c", 1, 0.0)], &[]), "classes");
        assert_eq!(
            check(&[("a", 1, 0.1), ("b", 1, 0.0)], &[None, Some("c")]),
            "tenants[1].class"
        );
        assert!(Headroom::try_from(1.0).is_err());
        assert!(Headroom::try_from(-0.1).is_err());
        assert!(Headroom::try_from(f64::NAN).is_err());
        assert!(validate_classes(&configs(&[("a", 1, 0.1), ("b", 1, 0.0)]), &[Some("a"), None]).is_ok());
    }
}
