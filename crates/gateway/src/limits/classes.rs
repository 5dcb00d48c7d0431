//! Priority classes (docs/gateway.md, "Classes"): interactive calls never wait
//! behind a batch flood, and batch still gets what is left.
//!
//! Two mechanisms, each exact on one server and across a fleet:
//!
//! - **Headroom.** A class's `headroom` is the part of every model limit that the
//!   classes below it may not take. A call of class `i` reserves, all or nothing and
//!   besides the model's own keys, a *ceiling key* per model key for every class
//!   `1..=i` that has headroom above it: `class:<name>:<model key>`, whose capacity
//!   is the model key's capacity less the headroom of the classes above `<name>`.
//!   So the calls of class `j` and below never hold more than that ceiling of the
//!   model's limit, and the headroom stays free for the classes above, whichever
//!   server admitted them: the ceilings are ordinary limits in the backend, nothing
//!   new in either backend. The top class reserves no ceiling and may take it all.
//! - **Shares.** When calls wait in a model's queue, freed capacity goes to the
//!   waiting classes in proportion to their shares, round robin between tenants
//!   within a class: the library scheduler's rule, `ratelimiter::scheduler::ClassTurns`.

use crate::config::{ClassConfig, HEADROOM_PPM_ONE};
use crate::wire::error::{ErrorKind, GatewayError};
use axum::http::HeaderMap;
use ratelimiter::scheduler::{ClassTurns, WorkClass};
use ratelimiter::{Actual, DefinitionFields, LimitDefinition, LimitKey, Requirement};

/// The request header that asks for a lower class than the tenant's own.
pub const CLASS_HEADER: &str = "x-ratelimit-class";
/// The prefix of every ceiling key; the model key follows the class name.
const CEILING_PREFIX: &str = "class:";
/// The prefix of the model keys that classes apply to: the gateway's per-model limits.
const MODEL_KEY_PREFIX: &str = "global:llm:";

/// The configuration's classes, resolved: names, shares, and for each class the
/// part of a model limit its calls may hold together with the classes below it.
#[derive(Debug, Clone)]
pub struct Classes {
    classes: Vec<WorkClass>,
    /// Per class, the headroom of every class above it, in millionths.
    above_ppm: Vec<u64>,
}

impl Classes {
    /// The classes of `configs`, highest first; one implicit class without headroom
    /// when none are configured. `configs` must have passed [`validate`].
    pub fn new(configs: &[ClassConfig]) -> Self {
        if configs.is_empty() {
            let class = WorkClass::new(ratelimiter::scheduler::DEFAULT_CLASS, 1).expect("the default class is valid");
            return Self {
                classes: vec![class],
                above_ppm: vec![0],
            };
        }
        let classes = (configs.iter())
            .map(|c| WorkClass::new(c.name.clone(), c.share).expect("validated with the configuration"))
            .collect();
        let mut above_ppm = Vec::with_capacity(configs.len());
        let mut sum = 0;
        for config in configs {
            above_ppm.push(sum);
            sum += config.headroom.ppm();
        }
        Self { classes, above_ppm }
    }

    /// The classes, highest first, as the queue's turns take them.
    pub fn work_classes(&self) -> &[WorkClass] {
        &self.classes
    }

    /// Turns among these classes for one model's queue.
    pub fn turns(&self) -> ClassTurns {
        ClassTurns::new(&self.classes)
    }

    /// The name of class `class`.
    pub fn name(&self, class: usize) -> &str {
        self.classes[class].name()
    }

    /// The part of every model limit held back from class `class` for the
    /// classes above it, in millionths: its ceilings hold the rest.
    pub fn above_ppm(&self, class: usize) -> u64 {
        self.above_ppm[class]
    }

    /// Class `class`'s own headroom in millionths: what it keeps from the classes
    /// below it (0 for the lowest, which keeps nothing from anyone).
    pub fn headroom_ppm(&self, class: usize) -> u64 {
        (self.above_ppm.get(class + 1)).map_or(0, |below| below - self.above_ppm[class])
    }

    /// The class of a tenant whose configuration names `class`: the named one, or
    /// the lowest for a tenant that names none (work not said to be urgent is not).
    pub fn of_tenant(&self, class: Option<&str>) -> usize {
        match class {
            None => self.classes.len() - 1,
            Some(name) => self.index(name).expect("validated with the configuration"),
        }
    }

    /// True when the gateway has a class named `name`.
    pub fn knows(&self, name: &str) -> bool {
        self.index(name).is_some()
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.classes.iter().position(|c| c.name() == name)
    }

    /// The class a request runs in: the tenant's own, or the lower one its
    /// `x-ratelimit-class` header asks for. A higher class is a 403, an unknown one a 400.
    pub fn of_request(&self, tenant_class: usize, headers: &HeaderMap) -> Result<usize, GatewayError> {
        let Some(value) = headers.get(CLASS_HEADER) else {
            return Ok(tenant_class);
        };
        let asked = value.to_str().unwrap_or("").trim();
        let Some(class) = self.index(asked) else {
            let names: Vec<&str> = self.classes.iter().map(WorkClass::name).collect();
            return Err(GatewayError::invalid(format!(
                "The {CLASS_HEADER} header names no class of this gateway: {asked:?}; the classes are {}.",
                names.join(", ")
            )));
        };
        if class < tenant_class {
            return Err(GatewayError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "This key's calls run in class {:?}; {CLASS_HEADER} may ask for a lower class, not {asked:?}.",
                    self.name(tenant_class)
                ),
            ));
        }
        Ok(class)
    }

    /// The classes `1..=class` whose ceilings a call of `class` reserves: those with
    /// headroom above them.
    fn ceilings_of(&self, class: usize) -> impl Iterator<Item = usize> + '_ {
        (1..=class).filter(|c| self.above_ppm[*c] > 0)
    }

    /// The ceiling key of class `class` over `key`; `None` for a key that is not a
    /// model limit (tenants' keys have no ceilings).
    fn ceiling_key(&self, class: usize, key: &LimitKey) -> Option<LimitKey> {
        let key = self.checked_ceiling_key(class, key)?;
        Some(key.expect("ceiling keys were checked with the configuration"))
    }

    /// [`Self::ceiling_key`], with the key's validation error (a key too long).
    fn checked_ceiling_key(&self, class: usize, key: &LimitKey) -> Option<Result<LimitKey, String>> {
        if !key.as_str().starts_with(MODEL_KEY_PREFIX) {
            return None;
        }
        let text = format!("{CEILING_PREFIX}{}:{}", self.name(class), key.as_str());
        Some(LimitKey::new(text).map_err(|e| format!("class {:?}: the ceiling of {key}: {e}", self.name(class))))
    }

    /// Adds to `requirements` the ceilings a call of `class` reserves, each for the
    /// amount of the model key it bounds.
    pub fn add_ceilings(&self, class: usize, requirements: &mut Vec<Requirement>) {
        let base = requirements.len();
        for ceiling in self.ceilings_of(class) {
            for i in 0..base {
                if let Some(key) = self.ceiling_key(ceiling, &requirements[i].key) {
                    let amount = requirements[i].amount;
                    requirements.push(Requirement { key, amount });
                }
            }
        }
    }

    /// Adds to `actuals` the ceilings' reconciliations: each ceiling to what its
    /// model key is reconciled to, so that a ceiling counts what the model's limit counts.
    pub fn add_ceiling_actuals(&self, class: usize, actuals: &mut Vec<Actual>) {
        let base = actuals.len();
        for ceiling in self.ceilings_of(class) {
            for i in 0..base {
                if let Some(key) = self.ceiling_key(ceiling, &actuals[i].key) {
                    let actual_amount = actuals[i].actual_amount;
                    actuals.push(Actual { key, actual_amount });
                }
            }
        }
    }

    /// The ceiling definitions over `definition`, a model limit: for every class
    /// with headroom above it, the same limit with the capacity less that headroom.
    /// Empty for a key that is not a model limit. Errors name the class whose ceiling
    /// would hold nothing.
    pub fn ceilings_over(&self, definition: &LimitDefinition) -> Result<Vec<LimitDefinition>, String> {
        let mut out = Vec::new();
        for class in 1..self.classes.len() {
            if self.above_ppm[class] == 0 {
                continue;
            }
            let Some(key) = self.checked_ceiling_key(class, definition.key()) else {
                return Ok(out);
            };
            let key = key?;
            let capacity = ceiling_capacity(definition.capacity(), self.above_ppm[class]);
            if capacity == 0 {
                return Err(format!(
                    "class {:?}: the headroom above it leaves nothing of {} (capacity {})",
                    self.name(class),
                    definition.key(),
                    definition.capacity()
                ));
            }
            let fields = DefinitionFields {
                key,
                capacity,
                description: format!(
                    "what class {} and below may hold of {}",
                    self.name(class),
                    definition.key()
                ),
                ..definition.fields().clone()
            };
            out.push(LimitDefinition::new(fields).map_err(|e| format!("class {:?}: {e}", self.name(class)))?);
        }
        Ok(out)
    }

    /// Every ceiling definition over `definitions`.
    pub fn ceiling_definitions(&self, definitions: &[LimitDefinition]) -> Result<Vec<LimitDefinition>, String> {
        let mut out = Vec::new();
        for definition in definitions {
            out.extend(self.ceilings_over(definition)?);
        }
        Ok(out)
    }
}

/// `capacity` less `above_ppm` millionths of it, rounded down: a ceiling never
/// lets lower classes into a part of the headroom.
pub fn ceiling_capacity(capacity: u64, above_ppm: u64) -> u64 {
    let kept = u128::from(capacity) * u128::from(HEADROOM_PPM_ONE - above_ppm) / u128::from(HEADROOM_PPM_ONE);
    u64::try_from(kept).expect("at most the capacity")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::class_configs as configs;

    fn key(text: &str) -> LimitKey {
        LimitKey::new(text).unwrap()
    }

    #[test]
    fn each_class_reserves_the_ceilings_at_and_above_it_and_the_top_class_none() {
        let classes = Classes::new(&configs(&[
            ("interactive", 4, 0.10),
            ("agents", 2, 0.10),
            ("batch", 1, 0.0),
        ]));
        let base = vec![
            Requirement {
                key: key("global:llm:openai:gpt-4o:tpm"),
                amount: 500,
            },
            Requirement {
                key: key("tenant:etl:llm:daily_tokens"),
                amount: 500,
            },
        ];
        let keys = |class: usize| {
            let mut requirements = base.clone();
            classes.add_ceilings(class, &mut requirements);
            requirements
                .into_iter()
                .map(|r| (r.key.to_string(), r.amount))
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(0).len(), 2, "the top class reserves no ceiling");
        assert_eq!(
            keys(1)[2],
            ("class:agents:global:llm:openai:gpt-4o:tpm".to_owned(), 500)
        );
        let batch = keys(2);
        assert_eq!(
            batch.len(),
            4,
            "batch reserves its own ceiling and the one above: {batch:?}"
        );
        assert_eq!(batch[3].0, "class:batch:global:llm:openai:gpt-4o:tpm");
    }

    #[test]
    fn ceilings_keep_the_headroom_above_and_follow_the_model_limit() {
        let classes = Classes::new(&configs(&[("interactive", 4, 0.10), ("batch", 1, 0.0)]));
        let tpm = LimitDefinition::rolling(key("global:llm:openai:gpt-4o:tpm"), 30_000, 60).unwrap();
        let ceilings = classes.ceilings_over(&tpm).unwrap();
        assert_eq!(ceilings.len(), 1);
        assert_eq!(ceilings[0].capacity(), 27_000);
        assert_eq!(ceilings[0].window_seconds(), 60);
        // 10 % of 7 is 0.7: the lower class gets 6, never a part of the headroom.
        let rpm = LimitDefinition::rolling(key("global:llm:openai:gpt-4o:rpm"), 7, 60).unwrap();
        assert_eq!(classes.ceilings_over(&rpm).unwrap()[0].capacity(), 6);
        let tenant = LimitDefinition::rolling(key("tenant:etl:llm:rpm"), 7, 60).unwrap();
        assert!(classes.ceilings_over(&tenant).unwrap().is_empty());
        let one = LimitDefinition::concurrency(key("global:llm:openai:gpt-4o:concurrency"), 1, 60).unwrap();
        assert!(classes.ceilings_over(&one).unwrap_err().contains("batch"));
    }

    #[test]
    fn the_header_may_lower_the_class_never_raise_it() {
        let classes = Classes::new(&configs(&[("interactive", 4, 0.10), ("batch", 1, 0.0)]));
        let headers = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(CLASS_HEADER, value.parse().unwrap());
            headers
        };
        assert_eq!(classes.of_request(0, &HeaderMap::new()).unwrap(), 0);
        assert_eq!(classes.of_request(0, &headers("batch")).unwrap(), 1);
        assert_eq!(classes.of_request(1, &headers("batch")).unwrap(), 1);
        let higher = classes.of_request(1, &headers("interactive")).unwrap_err();
        assert_eq!(higher.status().as_u16(), 403);
        let unknown = classes.of_request(0, &headers("urgent")).unwrap_err();
        assert_eq!(unknown.status().as_u16(), 400);
    }
}
