//! The memory plan of a run (`cascade plan`): for every stage, what each process of the run holds
//! on its device — weights, gradients, optimizer state, activations at the stage's largest
//! micro-batch, the KL reference model, the actors' KV caches — added up per device and compared
//! with the device's memory, with the knob to turn when a stage does not fit.
//!
//! The figures come from what the code keeps alive, item by item (each function below names the
//! tensors it counts), not from a fitted constant. What is not counted is named in
//! [`Plan::notes`]: the figures are a floor for what the allocator will ask, which is why a
//! fraction of every device is kept free ([`PlanOptions::headroom`]).

mod bytes;
mod model;

use std::collections::BTreeMap;

use crate::collective::{bucket_width, BUCKET};
use crate::config::{Device, DtypeChoice, GradAccum, RunConfig, StageConfig};
use crate::model::ModelConfig;
use crate::StageKind;

pub use bytes::{format_bytes, parse_bytes};
pub use model::{ActivationModel, MemoryModel};

/// Inputs of a plan besides the run config.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// The longest prompt, in tokens, the run will see (RL prompts are not tokenized to plan).
    pub prompt_tokens: usize,
    /// Memory of each device, where known (queried, or `--device-memory` for all).
    pub capacity: BTreeMap<Device, u64>,
    /// Fraction of each device's memory kept free for what the plan does not count (CUDA
    /// context, allocator fragmentation, transient copies).
    pub headroom: f64,
}

/// One line of a process's memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// What it is, with its shape in words.
    pub what: String,
    /// Bytes.
    pub bytes: u64,
}

/// What one process holds on its device during one stage.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessUse {
    /// `learner` or `actor N`.
    pub process: String,
    /// Its device.
    pub device: Device,
    /// Its items.
    pub items: Vec<Item>,
}

impl ProcessUse {
    /// Sum of the items.
    pub fn total(&self) -> u64 {
        self.items.iter().map(|i| i.bytes).sum()
    }
}

/// One device during one stage: the sum of its processes against its memory.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceUse {
    /// The device.
    pub device: Device,
    /// Bytes its processes hold.
    pub used: u64,
    /// Its memory, when known.
    pub capacity: Option<u64>,
    /// Usable memory: capacity less the headroom.
    pub usable: Option<u64>,
    /// Whether `used <= usable` (`None`: capacity unknown).
    pub fits: Option<bool>,
    /// What to change when it does not fit.
    pub advice: Vec<String>,
}

/// The plan of one stage.
#[derive(Debug, Clone, PartialEq)]
pub struct StagePlan {
    /// Stage name.
    pub stage: String,
    /// Every process.
    pub processes: Vec<ProcessUse>,
    /// Every device used.
    pub devices: Vec<DeviceUse>,
}

impl StagePlan {
    /// Whether every device fits (unknown capacity counts as not fitting).
    pub fn fits(&self) -> bool {
        self.devices.iter().all(|d| d.fits == Some(true))
    }
}

/// The whole plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Parameters of the policy.
    pub parameters: u64,
    /// The stages in order.
    pub stages: Vec<StagePlan>,
    /// What the figures assume or leave out.
    pub notes: Vec<String>,
}

impl Plan {
    /// Whether every stage fits on every device.
    pub fn fits(&self) -> bool {
        self.stages.iter().all(StagePlan::fits)
    }

    /// The devices whose memory is unknown.
    pub fn unknown_devices(&self) -> Vec<Device> {
        let mut out: Vec<Device> = self
            .stages
            .iter()
            .flat_map(|s| s.devices.iter())
            .filter(|d| d.capacity.is_none())
            .map(|d| d.device)
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The plan as text: per stage, each process's items, each device's total against its
    /// memory and the verdict; then the notes and the overall verdict.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        for stage in &self.stages {
            let verdict = if stage.fits() { "fits" } else { "DOES NOT FIT" };
            let _ = writeln!(out, "stage {}: {verdict}", stage.stage);
            for p in &stage.processes {
                let _ = writeln!(
                    out,
                    "  {} on {}: {}",
                    p.process,
                    p.device,
                    format_bytes(p.total())
                );
                for item in &p.items {
                    let _ = writeln!(out, "    {:>9}  {}", format_bytes(item.bytes), item.what);
                }
            }
            for d in &stage.devices {
                let status = match (d.capacity, d.usable, d.fits) {
                    (Some(cap), Some(usable), Some(fits)) => format!(
                        "{} of {} usable ({} less {:.0} % headroom): {}",
                        format_bytes(d.used),
                        format_bytes(usable),
                        format_bytes(cap),
                        100.0 * (1.0 - usable as f64 / cap as f64),
                        if fits { "ok" } else { "over" }
                    ),
                    _ => format!(
                        "{} (device memory unknown: give --device-memory)",
                        format_bytes(d.used)
                    ),
                };
                let _ = writeln!(out, "  device {}: {status}", d.device);
                for a in &d.advice {
                    let _ = writeln!(out, "    → {a}");
                }
            }
        }
        for note in &self.notes {
            let _ = writeln!(out, "note: {note}");
        }
        let _ = writeln!(
            out,
            "{}",
            if self.fits() {
                "plan: every stage fits"
            } else {
                "plan: at least one stage does not fit"
            }
        );
        out
    }
}

/// Bytes per element of the in-memory dtype on `device`.
pub fn dtype_bytes(choice: DtypeChoice, device: Device) -> u64 {
    match (choice, device) {
        (DtypeChoice::F32, _) | (DtypeChoice::Auto, Device::Cpu) => 4,
        _ => 2,
    }
}

/// Whether the training forward on `device` uses the fused attention (no `t × t` scores):
/// always on the CPU; on CUDA for f32/bf16 with a head dimension the kernel covers
/// (`model::flash_attn::supported`), which a `cuda` build has.
pub fn fused_attention_on(device: Device, model: &ModelConfig, dtype: DtypeChoice) -> bool {
    match device {
        Device::Cpu => true,
        Device::Cuda(_) => {
            dtype != DtypeChoice::F16
                && (1..=crate::model::flash_attn::kernels::MAX_HEAD_DIM).contains(&model.head_dim())
        }
    }
}

/// What the learner writes to disk per step: every `publish_every` steps the weights in the
/// training dtype; every `checkpoint_every` steps (a multiple of the publishes) also the f32
/// master weights and Adam moments, 12 bytes per parameter, each rank its 1/W in parallel.
fn snapshot_note(config: &RunConfig, model: &ModelConfig, learner_device: Device) -> String {
    let params = model.num_parameters() as u64;
    let weights = params * dtype_bytes(config.model.dtype, learner_device);
    let optimizer = params * 12;
    let publish = config.learner.publish_every.max(1) as u64;
    // A checkpoint is the first publish at least `checkpoint_every` steps after the last one.
    let checkpoint = config
        .learner
        .checkpoint_every
        .max(1)
        .div_ceil(publish as usize) as u64
        * publish;
    let ranks = config.devices.learner_devices().len() as u64;
    format!(
        "snapshots: {} of weights every {publish} step(s); a checkpoint every {checkpoint} \
         step(s) adds {} of optimizer state ({} per learner rank, written in parallel): {} \
         written per step on average (learner.publish_every, learner.checkpoint_every)",
        format_bytes(weights),
        format_bytes(optimizer),
        format_bytes(optimizer.div_ceil(ranks)),
        format_bytes(weights / publish + optimizer / checkpoint)
    )
}

/// Builds the plan of `config` with the policy architecture `model`. `reward_model` gives the
/// architecture of a stage's reward model (by stage index) where it differs from the policy's
/// or is known; without an entry the policy's architecture is assumed (the in-run reward model
/// starts from the policy) and a note says so.
pub fn plan(
    config: &RunConfig,
    model: &ModelConfig,
    reward_models: &BTreeMap<usize, ModelConfig>,
    opts: &PlanOptions,
) -> Plan {
    let learner_device = config.devices.learner;
    let learner_mm = MemoryModel::new(model, dtype_bytes(config.model.dtype, learner_device));
    let mut notes = vec![format!(
        "prompts assumed at most {} tokens (--prompt-tokens); the actors' prefill and the \
         learner's RL sequences grow with it. Each actor's KV cache is {} tokens \
         (actor.kv_cache_tokens{})",
        opts.prompt_tokens,
        config.actor_kv_tokens(model.max_position_embeddings),
        if config.actor.kv_cache_tokens == 0 {
            format!(
                " = 0: actor.gen_batch × ({} prompt tokens + the longest response), each row \
                 capped at the context",
                crate::config::AUTO_KV_PROMPT_TOKENS
            )
        } else {
            String::new()
        }
    )];
    let mut assumed_rm = false;
    let stages = config
        .stages
        .iter()
        .enumerate()
        .map(|(index, stage)| {
            let mut processes = learner_use(config, stage, model, &learner_mm, opts);
            let actors = config.devices.actor_assignment();
            if stage.kind != StageKind::Sft {
                let rm = uses_reward_model(config, index).then(|| {
                    reward_models.get(&index).unwrap_or_else(|| {
                        assumed_rm = true;
                        model
                    })
                });
                for (i, device) in actors.iter().enumerate() {
                    processes.push(actor_use(config, model, rm, i, *device, opts));
                }
            }
            let devices = device_uses(&processes, opts, config, model);
            StagePlan {
                stage: stage.name.clone(),
                processes,
                devices,
            }
        })
        .collect();
    if assumed_rm {
        notes.push(
            "a reward model trained in the run (from the policy), or whose config.json could not \
             be read, is counted with the policy's architecture"
                .into(),
        );
    }
    notes.push(
        "not counted: the held-out evaluation (after the stages' processes stop; on a CPU run \
         with eval.during_run, in the supervisor while later stages train: one more copy of \
         the policy, a reward model where a domain needs one, and a KV cache of \
         actor.gen_batch × group_size rows, at most 64), the SWE judge, tokenizer and \
         host-side buffers"
            .into(),
    );
    notes.push(snapshot_note(config, model, learner_device));
    Plan {
        parameters: model.num_parameters() as u64,
        stages,
        notes,
    }
}

fn uses_reward_model(config: &RunConfig, index: usize) -> bool {
    config.stages[index].verifier.reward_model.is_some() || config.uses_trained_reward_model(index)
}

/// Tokens of the stage's largest training row and rows per micro-batch.
fn learner_rows(config: &RunConfig, stage: &StageConfig, opts: &PlanOptions) -> (usize, usize) {
    let micro = config.learner.micro_batch.max(1);
    match stage.kind {
        StageKind::Sft => (
            micro,
            stage.token_budget.unwrap_or(DEFAULT_SFT_TOKEN_BUDGET),
        ),
        // Packed GRPO rows hold at most `learner.token_budget` tokens; unpacked, a row is one
        // sample padded to the longest of its micro-batch.
        _ if config.learner.token_budget > 0 => (micro, config.learner.token_budget),
        _ => (
            micro,
            opts.prompt_tokens + stage.longest_response(config.actor.max_new_tokens),
        ),
    }
}

/// The learner's SFT packing budget when a stage gives none (`learner/src/run/sft.rs`).
pub const DEFAULT_SFT_TOKEN_BUDGET: usize = 2048;

/// The stage's longest response over its curriculum.
/// One entry per learner rank (the same use on each rank's device).
fn learner_use(
    config: &RunConfig,
    stage: &StageConfig,
    model: &ModelConfig,
    mm: &MemoryModel,
    opts: &PlanOptions,
) -> Vec<ProcessUse> {
    let devices = config.devices.learner_devices();
    let world = devices.len();
    let one = learner_rank_use(config, stage, model, mm, opts, world);
    devices
        .into_iter()
        .enumerate()
        .map(|(rank, device)| ProcessUse {
            process: if world == 1 {
                "learner".into()
            } else {
                format!("learner rank {rank}")
            },
            device,
            items: one.clone(),
        })
        .collect()
}

fn learner_rank_use(
    config: &RunConfig,
    stage: &StageConfig,
    model: &ModelConfig,
    mm: &MemoryModel,
    opts: &PlanOptions,
    world: usize,
) -> Vec<Item> {
    let device = config.devices.learner;
    let accum_bytes = match config.learner.grad_accum {
        GradAccum::F32 => 4,
        GradAccum::F64 => 8,
    };
    let mut items = mm.learner_state(world as u64, accum_bytes);
    if world > 1 {
        // The sharded optimizer's collectives run a bucket at a time (`collective::BUCKET`
        // elements per rank): the bucket's parts and their concatenation; with the TCP backend
        // (CPU) also its host copy and, on rank 0, the rank-order sum and one rank's payload.
        let width = bucket_width(model.num_parameters(), world, BUCKET) as u64;
        let (copies, how) = if device == Device::Cpu {
            (
                4,
                "the bucket, its host copy, rank 0's sum and one payload (TCP collectives)",
            )
        } else {
            (
                2,
                "the bucket's parts and their concatenation, on the device (NCCL)",
            )
        };
        items.push(Item {
            what: format!(
                "learner group: gradient buckets of {world} × {width} {} elements: {how}",
                if accum_bytes == 8 { "f64" } else { "f32" }
            ),
            bytes: copies * accum_bytes * world as u64 * width,
        });
    }
    if stage.kind != StageKind::Sft && stage.kl_coef > 0.0 {
        items.push(Item {
            what: format!(
                "KL reference model: the stage-start weights ({})",
                mm.dtype_name()
            ),
            bytes: mm.weights(),
        });
    }
    let (rows, tokens) = learner_rows(config, stage, opts);
    let fused_ops = device == Device::Cpu && dtype_bytes(config.model.dtype, device) == 4;
    let act = ActivationModel {
        fused_attention: fused_attention_on(device, model, config.model.dtype),
        checkpoint_every: config.learner.activation_checkpointing,
        fused_ops,
        fused_loss: fused_ops && stage.kind == StageKind::Sft,
    };
    let mut activations = mm.training_activations(rows, tokens, act);
    // An RL stage's sft_mix (validated: RL stages only) runs its SFT micro-batches after the
    // GRPO backward has freed the GRPO activations: the peak is the larger of the two.
    if let Some(mix) = &stage.sft_mix {
        // The replayed rows (sft_mix.replay) are packed with the dataset's in one step.
        let replay_rows = if mix.replay.is_empty() {
            0
        } else {
            mix.replay_rows
        };
        let mix_rows = config
            .learner
            .micro_batch
            .max(1)
            .min(mix.rows + replay_rows);
        let mix_tokens = mix.token_budget.unwrap_or(DEFAULT_SFT_TOKEN_BUDGET);
        let mix_act = ActivationModel {
            fused_loss: fused_ops,
            ..act
        };
        let mix_items = mm.training_activations(mix_rows, mix_tokens, mix_act);
        let total = |items: &[Item]| items.iter().map(|i| i.bytes).sum::<u64>();
        if total(&mix_items) > total(&activations) {
            activations = mix_items
                .into_iter()
                .map(|i| Item {
                    what: format!("{} (sft_mix rows, larger than the GRPO rows)", i.what),
                    bytes: i.bytes,
                })
                .collect();
        }
    }
    // The optimizer update runs after backward has freed the activations and the gradients
    // have been added to the sum (the micro-batch's gradients freed): the peak is the larger
    // of the two phases, so only the update's excess over both is added.
    let act_total: u64 = activations.iter().map(|i| i.bytes).sum();
    let step = mm.optimizer_step_transient(world as u64);
    items.extend(activations);
    let freed = act_total + mm.weights();
    if step > freed {
        items.push(Item {
            what: "optimizer update: its temporaries beyond the activations and the micro-batch's \
                   gradients (freed by then)"
                .into(),
            bytes: step - freed,
        });
    }
    items
}

/// What an actor's decoding adds to its weights with a KV cache of `kv_tokens` tokens.
fn actor_decode(
    config: &RunConfig,
    model: &ModelConfig,
    device: Device,
    opts: &PlanOptions,
    kv_tokens: usize,
) -> Vec<Item> {
    let mm = MemoryModel::new(model, dtype_bytes(config.model.dtype, device));
    let packed = fused_attention_on(device, model, config.model.dtype);
    let row = opts.prompt_tokens + config.longest_response();
    let slots = config.actor.gen_batch.max(1);
    mm.decode(slots, kv_tokens, (opts.prompt_tokens, row), packed)
}

fn actor_use(
    config: &RunConfig,
    model: &ModelConfig,
    reward_model: Option<&ModelConfig>,
    index: usize,
    device: Device,
    opts: &PlanOptions,
) -> ProcessUse {
    let mm = MemoryModel::new(model, dtype_bytes(config.model.dtype, device));
    let mut items = vec![Item {
        what: format!("policy weights ({})", mm.dtype_name()),
        bytes: mm.weights(),
    }];
    let kv_tokens = config.actor_kv_tokens(model.max_position_embeddings);
    items.extend(actor_decode(config, model, device, opts, kv_tokens));
    if let Some(rm) = reward_model {
        let rm = MemoryModel::new(rm, dtype_bytes(config.model.dtype, device));
        items.push(Item {
            what: format!("reward model weights ({})", rm.dtype_name()),
            bytes: rm.weights(),
        });
    }
    ProcessUse {
        process: format!("actor {index}"),
        device,
        items,
    }
}

fn device_uses(
    processes: &[ProcessUse],
    opts: &PlanOptions,
    config: &RunConfig,
    model: &ModelConfig,
) -> Vec<DeviceUse> {
    let mut used: BTreeMap<Device, u64> = BTreeMap::new();
    for p in processes {
        *used.entry(p.device).or_default() += p.total();
    }
    used.into_iter()
        .map(|(device, used)| {
            let capacity = opts.capacity.get(&device).copied();
            let usable = capacity.map(|c| (c as f64 * (1.0 - opts.headroom)) as u64);
            let fits = usable.map(|u| used <= u);
            let advice = match (fits, usable) {
                (Some(false), Some(usable)) => {
                    advise(processes, device, usable, (config, model, opts))
                }
                _ => Vec::new(),
            };
            DeviceUse {
                device,
                used,
                capacity,
                usable,
                fits,
                advice,
            }
        })
        .collect()
}

/// The knobs that would bring `device` under `usable`, most effective first.
fn advise(
    processes: &[ProcessUse],
    device: Device,
    usable: u64,
    (config, model, opts): (&RunConfig, &ModelConfig, &PlanOptions),
) -> Vec<String> {
    let on: Vec<&ProcessUse> = processes.iter().filter(|p| p.device == device).collect();
    let total: u64 = on.iter().map(|p| p.total()).sum();
    let over = total.saturating_sub(usable);
    let mut advice = vec![format!("{} over", format_bytes(over))];
    let sum = |p: &ProcessUse, key: &str| -> u64 {
        p.items
            .iter()
            .filter(|i| i.what.starts_with(key))
            .map(|i| i.bytes)
            .sum()
    };
    for p in &on {
        if p.process.starts_with("learner") {
            let state: u64 = p
                .items
                .iter()
                .filter(|i| !i.what.starts_with("activations") && !i.what.starts_with("KL"))
                .map(|i| i.bytes)
                .sum();
            if state > usable {
                advice.push(format!(
                    "the learner's weights, gradients and optimizer state alone need {} on each \
                     rank: more learner ranks (devices.learner_ranks or a devices.learner list, \
                     now {}) shard the f32 master weights and Adam moments{}; a smaller model \
                     or a device with more memory also helps",
                    format_bytes(state),
                    config.devices.learner_devices().len(),
                    if config.learner.grad_accum == GradAccum::F64 {
                        "; learner.grad_accum = \"f32\" halves the gradient sums (the steps' \
                         last bits then depend on the rank count)"
                    } else {
                        ""
                    }
                ));
            }
            let act = sum(p, "activations");
            if act > 0 && act >= over {
                advice.push(format!(
                    "the learner's activations take {}: lower learner.micro_batch (now {}), the \
                     token budget (the stage's for SFT, learner.token_budget for RL) or \
                     max_response_tokens{}",
                    format_bytes(act),
                    config.learner.micro_batch,
                    if config.learner.activation_checkpointing == 1 {
                        ""
                    } else {
                        "; set learner.activation_checkpointing = 1 (every layer)"
                    }
                ));
            }
        } else {
            let cache = sum(p, "KV cache");
            let prefill = sum(p, "prefill");
            if cache + prefill > 0 && cache + prefill >= over / on.len().max(1) as u64 {
                let block = crate::model::paged::BLOCK_TOKENS;
                let tokens = config
                    .actor_kv_tokens(model.max_position_embeddings)
                    .div_ceil(block)
                    * block;
                // The largest cache (whole blocks) with which this process takes at most its
                // share: the decode items are recounted, since a cache smaller than every row
                // at its longest plans for a preempted row's prefill.
                let share = usable / on.len().max(1) as u64;
                let rest = p.total() - cache - prefill - sum(p, "logits");
                let takes = |kv: usize| -> u64 {
                    rest + actor_decode(config, model, device, opts, kv)
                        .iter()
                        .map(|i| i.bytes)
                        .sum::<u64>()
                };
                let (mut lo, mut hi) = (0usize, tokens / block);
                while lo < hi {
                    let mid = (lo + hi).div_ceil(2);
                    if takes(mid * block) <= share {
                        lo = mid;
                    } else {
                        hi = mid - 1;
                    }
                }
                let fit = lo * block;
                let row = model
                    .max_position_embeddings
                    .min(opts.prompt_tokens + config.longest_response());
                advice.push(format!(
                    "{}: the KV cache takes {} ({tokens} tokens at actor.kv_cache_tokens = {}, \
                     actor.gen_batch = {}) and the prefill {}; about {fit} tokens of cache \
                     fit{}: set actor.kv_cache_tokens to at most that, the smallest any \
                     stage advises (one cache serves every RL stage; rows then wait for \
                     blocks, or are preempted and prefilled again, when it is full){}",
                    p.process,
                    format_bytes(cache),
                    config.actor.kv_cache_tokens,
                    config.actor.gen_batch,
                    format_bytes(prefill),
                    if on.len() > 1 {
                        " with the device shared evenly"
                    } else {
                        ""
                    },
                    if fit < row {
                        format!(
                            ", though that is less than one row of prompt + longest response \
                             ({row} tokens): lower max_response_tokens or use a device with \
                             more memory"
                        )
                    } else {
                        String::new()
                    }
                ));
            }
        }
    }
    if on.len() > 1 {
        advice.push(format!(
            "{} processes share {device}: give them separate devices ([devices])",
            on.len()
        ));
    }
    advice
}
