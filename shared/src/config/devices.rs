//! `[devices]`: where the learner and the actors run.

use serde::{Deserialize, Serialize};

use super::error::{invalid, Result};

/// One compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Device {
    /// The CPU.
    Cpu,
    /// CUDA device with this ordinal.
    Cuda(usize),
}

const DEVICE_FORMS: &str = "allowed: \"cpu\", \"cuda:N\"";
const DEVICES_FORMS: &str = "allowed: \"cpu\", \"cuda:N\", \"cuda:A-B\" (A ≤ B)";

impl Device {
    /// Parses `cpu` or `cuda:N`.
    pub fn parse(text: &str) -> std::result::Result<Device, String> {
        match parse_devices(text)?.as_slice() {
            [one] if !text.contains('-') => Ok(*one),
            _ => Err(format!("{text:?} is not a single device ({DEVICE_FORMS})")),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl TryFrom<String> for Device {
    type Error = String;
    fn try_from(text: String) -> std::result::Result<Self, String> {
        Device::parse(&text)
    }
}

impl From<Device> for String {
    fn from(d: Device) -> String {
        d.to_string()
    }
}

/// Parses `cpu`, `cuda:N` or the range `cuda:A-B` into a list of devices.
pub fn parse_devices(text: &str) -> std::result::Result<Vec<Device>, String> {
    let bad = || format!("{text:?} is not a device ({DEVICES_FORMS})");
    if text == "cpu" {
        return Ok(vec![Device::Cpu]);
    }
    let spec = text.strip_prefix("cuda:").ok_or_else(bad)?;
    let number = |s: &str| -> std::result::Result<usize, String> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    match spec.split_once('-') {
        None => Ok(vec![Device::Cuda(number(spec)?)]),
        Some((a, b)) => {
            let (a, b) = (number(a)?, number(b)?);
            if a > b {
                return Err(bad());
            }
            Ok((a..=b).map(Device::Cuda).collect())
        }
    }
}

/// A device string that may name a range (`cuda:0-6`); expands to one or more devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DeviceSpec {
    text: String,
    devices: Vec<Device>,
}

impl DeviceSpec {
    /// The devices this spec names, in order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }
}

impl TryFrom<String> for DeviceSpec {
    type Error = String;
    fn try_from(text: String) -> std::result::Result<Self, String> {
        let devices = parse_devices(&text)?;
        Ok(DeviceSpec { text, devices })
    }
}

impl From<DeviceSpec> for String {
    fn from(d: DeviceSpec) -> String {
        d.text
    }
}

fn default_learner() -> Device {
    Device::Cpu
}

fn default_actors() -> Vec<DeviceSpec> {
    vec![DeviceSpec::try_from("cpu".to_string()).expect("valid")]
}

/// `[devices]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "DevicesToml", into = "DevicesToml")]
pub struct DevicesConfig {
    /// The learner's device (`cpu` or `cuda:N`); with several ranks, rank 0's.
    pub learner: Device,
    /// Actor devices; each entry `cpu`, `cuda:N` or a range `cuda:A-B`.
    pub actors: Vec<DeviceSpec>,
    /// Number of actor processes; default one per listed device. Actors are assigned to the
    /// listed devices round-robin, so `actors = ["cpu"]` with `num_actors = 2` runs two CPU
    /// actors.
    pub num_actors: Option<usize>,
    /// Number of learner processes working as one learner (issue 17): data-parallel with the
    /// optimizer state sharded over them. On `cuda:N` rank `r` runs on `cuda:N+r`; on `cpu`
    /// every rank runs on the CPU. Default 1 (or the length of a learner device list).
    pub learner_ranks: Option<usize>,
    /// The learner ranks' devices when `learner` names several (`"cuda:4-7"` or a list such
    /// as `["cuda:4", "cuda:6"]`): rank r runs on the r-th; `None` when it names one.
    pub learner_list: Option<Vec<Device>>,
}

/// `[devices]` as written: `learner` is one device, a range or a list of devices and ranges.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DevicesToml {
    #[serde(default = "default_learner_toml")]
    learner: LearnerToml,
    #[serde(default = "default_actors")]
    actors: Vec<DeviceSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    num_actors: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    learner_ranks: Option<usize>,
}

/// `devices.learner`: a string or a list of strings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum LearnerToml {
    One(String),
    Many(Vec<String>),
}

fn default_learner_toml() -> LearnerToml {
    LearnerToml::One(default_learner().to_string())
}

/// The learner devices `devices.learner` (`--learner-device`) names: `cpu`, `cuda:N`, a range
/// `cuda:A-B`, or (from a list) several of these; an error names the entry and says why.
pub fn parse_learner_devices(entries: &[String]) -> std::result::Result<Vec<Device>, String> {
    let mut out: Vec<Device> = Vec::new();
    for e in entries {
        for d in parse_devices(e)? {
            if d == Device::Cpu && entries.len() + out.len() > 1 {
                return Err(format!(
                    "{e:?}: CPU learner ranks are asked with learner_ranks (--learner-ranks), not listed"
                ));
            }
            if out.contains(&d) {
                return Err(format!("{d} is listed twice"));
            }
            out.push(d);
        }
    }
    if out.is_empty() {
        return Err("no device listed".into());
    }
    Ok(out)
}

impl DevicesConfig {
    /// Sets the learner's devices from `devices.learner`'s forms (see [`parse_learner_devices`]).
    pub fn set_learner(&mut self, entries: &[String]) -> std::result::Result<(), String> {
        let list = parse_learner_devices(entries)?;
        self.learner = list[0];
        self.learner_list = (list.len() > 1).then_some(list);
        Ok(())
    }
}

impl TryFrom<DevicesToml> for DevicesConfig {
    type Error = String;
    fn try_from(t: DevicesToml) -> std::result::Result<Self, String> {
        let entries = match t.learner {
            LearnerToml::One(s) => vec![s],
            LearnerToml::Many(v) => v,
        };
        let mut cfg = DevicesConfig {
            learner: default_learner(),
            actors: t.actors,
            num_actors: t.num_actors,
            learner_ranks: t.learner_ranks,
            learner_list: None,
        };
        cfg.set_learner(&entries)
            .map_err(|e| format!("devices.learner: {e}"))?;
        Ok(cfg)
    }
}

impl From<DevicesConfig> for DevicesToml {
    fn from(c: DevicesConfig) -> DevicesToml {
        DevicesToml {
            learner: match c.learner_list {
                Some(list) => LearnerToml::Many(list.iter().map(Device::to_string).collect()),
                None => LearnerToml::One(c.learner.to_string()),
            },
            actors: c.actors,
            num_actors: c.num_actors,
            learner_ranks: c.learner_ranks,
        }
    }
}

impl Default for DevicesConfig {
    fn default() -> Self {
        DevicesConfig {
            learner: default_learner(),
            actors: default_actors(),
            num_actors: None,
            learner_ranks: None,
            learner_list: None,
        }
    }
}

impl DevicesConfig {
    /// All listed actor devices, ranges expanded.
    pub fn actor_devices(&self) -> Vec<Device> {
        self.actors
            .iter()
            .flat_map(|s| s.devices().iter().copied())
            .collect()
    }

    /// The device of each actor process (round-robin over [`Self::actor_devices`]).
    pub fn actor_assignment(&self) -> Vec<Device> {
        let devices = self.actor_devices();
        let n = self.num_actors.unwrap_or(devices.len());
        (0..n).map(|i| devices[i % devices.len()]).collect()
    }

    /// The device of each learner rank, rank 0 first.
    pub fn learner_devices(&self) -> Vec<Device> {
        if let Some(list) = &self.learner_list {
            return list.clone();
        }
        let n = self.learner_ranks.unwrap_or(1);
        (0..n)
            .map(|r| match self.learner {
                Device::Cuda(i) => Device::Cuda(i + r),
                other => other,
            })
            .collect()
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.learner_ranks == Some(0) {
            return Err(invalid("devices.learner_ranks", "must be at least 1"));
        }
        if let Some(list) = &self.learner_list {
            if list.first() != Some(&self.learner) {
                return Err(invalid(
                    "devices.learner",
                    format!(
                        "rank 0's device {} is not the first of the listed {:?}",
                        self.learner, list
                    ),
                ));
            }
        }
        if let (Some(list), Some(n)) = (&self.learner_list, self.learner_ranks) {
            if list.len() != n {
                return Err(invalid(
                    "devices.learner_ranks",
                    format!(
                        "{n} ranks, but devices.learner lists {} devices (one rank per device; leave learner_ranks out)",
                        list.len()
                    ),
                ));
            }
        }
        // With several learner ranks, each GPU goes to one rank and to no actor.
        let learners = if self.learner_ranks.is_some() || self.learner_list.is_some() {
            self.learner_devices()
        } else {
            Vec::new()
        };
        for (r, d) in learners.iter().enumerate() {
            if matches!(d, Device::Cuda(_)) && self.actor_devices().contains(d) {
                return Err(invalid(
                    if self.learner_list.is_some() {
                        "devices.learner"
                    } else {
                        "devices.learner_ranks"
                    },
                    format!("learner rank {r} would run on {d}, which is also an actor device"),
                ));
            }
        }
        if self.actors.is_empty() {
            return Err(invalid(
                "devices.actors",
                "at least one actor device is needed",
            ));
        }
        if self.num_actors == Some(0) {
            return Err(invalid("devices.num_actors", "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_forms() {
        assert_eq!(parse_devices("cpu").unwrap(), vec![Device::Cpu]);
        assert_eq!(parse_devices("cuda:3").unwrap(), vec![Device::Cuda(3)]);
        assert_eq!(parse_devices("cuda:0-2").unwrap().len(), 3);
        for bad in [
            "gpu", "cuda:", "cuda:x", "cuda:3-1", "cuda:-1", "cuda:+1", "CPU",
        ] {
            let err = parse_devices(bad).unwrap_err();
            assert!(err.contains("allowed"), "{bad}: {err}");
        }
        assert!(Device::parse("cuda:0-6").is_err());
        assert_eq!(Device::parse("cuda:7").unwrap(), Device::Cuda(7));
    }

    #[test]
    fn round_robin_assignment() {
        let cfg = DevicesConfig {
            learner: Device::Cuda(7),
            actors: vec![DeviceSpec::try_from("cuda:0-1".to_string()).unwrap()],
            num_actors: Some(3),
            learner_ranks: None,
            learner_list: None,
        };
        assert_eq!(
            cfg.actor_assignment(),
            vec![Device::Cuda(0), Device::Cuda(1), Device::Cuda(0)]
        );
    }
}
