//! Transport traits between actors and the learner, and their replay-log implementation.
//!
//! Actors hand finished groups to a [`RolloutSink`]; the learner takes them from a
//! [`RolloutSource`]. The memory-mapped replay log ([`ReplaySink`], [`ReplaySource`]) is the
//! first implementation; a network transport can be added beside it without touching the actor
//! or the learner.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cascade_replay::{
    Cursors, ReaderOptions, Record, RecordMeta, ReplayError, ReplayReader, ReplayWriter,
    WriterOptions,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::rollout::{RolloutDecodeError, RolloutGroup};

/// Record kind byte of a [`RolloutGroup`] in the replay header.
pub const KIND_ROLLOUT_GROUP: u8 = 0;

/// Why a transport call failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The replay log failed (I/O, backpressure timeout, cancelled, lost cursor...).
    #[error(transparent)]
    Replay(#[from] ReplayError),
    /// A record's payload is not a group this build can read (e.g. another format version).
    #[error("record {seq} of {actor} cannot be decoded: {source}")]
    Decode {
        /// Actor that wrote it.
        actor: String,
        /// Its seq.
        seq: u64,
        /// The decoding error.
        #[source]
        source: RolloutDecodeError,
    },
}

/// Where actors put finished groups.
pub trait RolloutSink {
    /// Hands over one group; returns its sequence number in this sink. May block for
    /// backpressure.
    fn send(&mut self, group: &RolloutGroup) -> Result<u64, TransportError>;
    /// Makes everything sent so far durable.
    fn flush(&mut self) -> Result<(), TransportError>;
}

/// A group as the learner receives it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedGroup<M> {
    /// The stream (actor directory) that produced it.
    pub actor: String,
    /// Sequence number within that stream.
    pub seq: u64,
    /// Where the group ends in its stream: a consumer that tracks what it has really used (not
    /// just received) folds this into its own position with [`RolloutSource::advance`].
    pub mark: M,
    /// The group.
    pub group: RolloutGroup,
}

/// Records a source could not deliver and skipped (reported, never silent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The stream.
    pub actor: String,
    /// First sequence number skipped.
    pub from_seq: u64,
    /// First sequence number delivered again.
    pub to_seq: u64,
}

/// Where the learner takes groups from. Positions are opaque to the learner: it stores them in
/// its snapshots and hands them back, nothing else.
pub trait RolloutSource {
    /// A resumable position (stored in the learner's snapshots).
    type Position: Serialize + DeserializeOwned + Clone + Default + PartialEq + std::fmt::Debug;
    /// Where one received group ends in its stream.
    type Mark: Clone + std::fmt::Debug;
    /// The next available groups, waiting up to `timeout` for one; empty on timeout.
    fn recv(&mut self, timeout: Duration)
        -> Result<Vec<ReceivedGroup<Self::Mark>>, TransportError>;
    /// Moves `position` past `group` (and everything before it in its stream).
    fn advance(position: &mut Self::Position, group: &ReceivedGroup<Self::Mark>);
    /// Position just after the last group returned by `recv`.
    fn position(&self) -> Self::Position;
    /// Tells the producers that everything up to [`RolloutSource::position`] is consumed.
    fn commit(&mut self) -> Result<(), TransportError> {
        let position = self.position();
        self.commit_at(&position)
    }
    /// Tells the producers that everything up to `position` (at most
    /// [`RolloutSource::position`]) is consumed. A learner that buffers received groups commits
    /// the position of what its last snapshot covers, so that retention never deletes a
    /// record a resumed learner still needs.
    fn commit_at(&mut self, position: &Self::Position) -> Result<(), TransportError>;
    /// Tells the producers how far the consumer has read and decided, beyond what it has
    /// committed (backpressure follows this; retention follows only commits). The default
    /// does nothing.
    fn report_progress(&mut self, _position: &Self::Position) -> Result<(), TransportError> {
        Ok(())
    }
    /// Records skipped since the last call because they could no longer be read (see
    /// [`Gap`]); the default source never skips.
    fn take_gaps(&mut self) -> Vec<Gap> {
        Vec::new()
    }
}

/// [`RolloutSink`] over one actor directory of the replay log.
#[derive(Debug)]
pub struct ReplaySink {
    writer: ReplayWriter,
}

impl ReplaySink {
    /// Opens the actor directory (e.g. `RUN_DIR/replay/actor-3`).
    pub fn open(
        actor_dir: impl AsRef<Path>,
        opts: WriterOptions,
    ) -> Result<ReplaySink, TransportError> {
        Ok(ReplaySink {
            writer: ReplayWriter::open(actor_dir, opts)?,
        })
    }
}

impl RolloutSink for ReplaySink {
    fn send(&mut self, group: &RolloutGroup) -> Result<u64, TransportError> {
        let meta = RecordMeta {
            policy_version: group.min_policy_version(),
            stage: group.stage.to_u8(),
            kind: KIND_ROLLOUT_GROUP,
        };
        Ok(self.writer.append(meta, &group.encode())?)
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        Ok(self.writer.sync()?)
    }
}

/// [`RolloutSource`] over every actor directory of the replay log.
///
/// When a stream's records were deleted before they were read (its cursor is lost: another
/// consumer or an operator removed segments; the learner's own retention never does), the
/// source reads on from the oldest record still on disk and reports the skipped range through
/// [`RolloutSource::take_gaps`].
pub struct ReplaySource {
    reader: ReplayReader,
    /// How the reader was opened, to reopen it after a lost cursor.
    root: PathBuf,
    opts: ReaderOptions,
    /// Skipped ranges not yet taken.
    gaps: Vec<Gap>,
    /// Records read from the log but not yet returned (after a decode error).
    pending: VecDeque<Record>,
    /// Cursors just after the last record returned.
    position: Cursors,
    /// The consumer name of the consumed-position files.
    consumer: String,
}

impl ReplaySource {
    /// Opens the replay root (e.g. `RUN_DIR/replay`), resuming from `position` when given.
    pub fn open(
        root: impl AsRef<Path>,
        opts: ReaderOptions,
        position: Option<Cursors>,
    ) -> Result<ReplaySource, TransportError> {
        let consumer = opts.consumer.clone();
        let root = root.as_ref().to_path_buf();
        let reader = ReplayReader::open(&root, opts.clone(), position.clone())?;
        Ok(ReplaySource {
            consumer,
            reader,
            root,
            opts,
            gaps: Vec::new(),
            pending: VecDeque::new(),
            position: position.unwrap_or_default(),
        })
    }

    /// Corrupt records the log skipped (each with file and offset).
    pub fn corruptions(&self) -> &[cascade_replay::Corruption] {
        self.reader.corruptions()
    }
}

impl ReplaySource {
    /// Reads the next records, recovering from lost cursors.
    fn poll(&mut self, timeout: Duration) -> Result<Vec<Record>, TransportError> {
        match self.reader.poll(timeout) {
            Ok(records) => Ok(records),
            Err(ReplayError::CursorLost {
                actor,
                next_seq,
                oldest_seq,
                ..
            }) => {
                tracing::warn!(
                    "{actor}: records {next_seq}..{oldest_seq} were deleted before they were \
                     read; continuing at {oldest_seq}"
                );
                self.gaps.push(Gap {
                    actor: actor.clone(),
                    from_seq: next_seq,
                    to_seq: oldest_seq,
                });
                // Reopen at what was returned, without the lost stream's cursor: records read
                // but not returned are read again, nothing returned is returned twice.
                self.position.actors.remove(&actor);
                self.pending.clear();
                self.reader =
                    ReplayReader::open(&self.root, self.opts.clone(), Some(self.position.clone()))?;
                Ok(Vec::new())
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl RolloutSource for ReplaySource {
    type Position = Cursors;
    type Mark = cascade_replay::Cursor;

    fn recv(
        &mut self,
        timeout: Duration,
    ) -> Result<Vec<ReceivedGroup<Self::Mark>>, TransportError> {
        if self.pending.is_empty() {
            let records = self.poll(timeout)?;
            self.pending.extend(records);
        }
        let mut out = Vec::with_capacity(self.pending.len());
        while let Some(record) = self.pending.pop_front() {
            match RolloutGroup::decode(&record.payload) {
                Ok(group) => {
                    self.position
                        .actors
                        .insert(record.actor.to_string(), record.cursor_after);
                    out.push(ReceivedGroup {
                        actor: record.actor.to_string(),
                        seq: record.seq,
                        mark: record.cursor_after,
                        group,
                    });
                }
                // Reported once; the stream goes on past it with the next call.
                Err(source) if out.is_empty() => {
                    self.position
                        .actors
                        .insert(record.actor.to_string(), record.cursor_after);
                    return Err(TransportError::Decode {
                        actor: record.actor.to_string(),
                        seq: record.seq,
                        source,
                    });
                }
                // Hand out what decoded first; the bad record's error comes on the next call.
                Err(_) => {
                    self.pending.push_front(record);
                    break;
                }
            }
        }
        Ok(out)
    }

    fn advance(position: &mut Cursors, group: &ReceivedGroup<Self::Mark>) {
        position.actors.insert(group.actor.clone(), group.mark);
    }

    fn position(&self) -> Cursors {
        // Only what was returned, not what is still pending.
        self.position.clone()
    }

    fn take_gaps(&mut self) -> Vec<Gap> {
        std::mem::take(&mut self.gaps)
    }

    fn report_progress(&mut self, position: &Cursors) -> Result<(), TransportError> {
        for (actor, cursor) in &position.actors {
            cascade_replay::write_progress(
                &self.reader.root().join(actor),
                &self.consumer,
                cursor,
            )?;
        }
        Ok(())
    }

    fn commit_at(&mut self, position: &Cursors) -> Result<(), TransportError> {
        for (actor, cursor) in &position.actors {
            cascade_replay::write_consumed(
                &self.reader.root().join(actor),
                &self.consumer,
                cursor,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::{FinishReason, Mode, Sample, SampleTiming, StageKind, VersionSpan};

    fn group(prompt_id: u64, version: u64) -> RolloutGroup {
        RolloutGroup {
            stage: StageKind::Code,
            stage_index: 4,
            prompt_id,
            mode: Mode::NoThink,
            actor_id: 2,
            prompt_ids: vec![5, 6, 7],
            temperature: 1.0,
            samples: vec![Sample {
                response_ids: vec![1, 2],
                behaviour_logprobs: vec![-0.25, -2.0],
                policy_versions: vec![VersionSpan {
                    start_token: 0,
                    version,
                }],
                finish_reason: FinishReason::Length,
                reward: 0.5,
                reward_breakdown: vec![("tests".into(), 0.5)],
                timing: SampleTiming {
                    generate_ms: 1.0,
                    reward_ms: 2.0,
                },
            }],
        }
    }

    #[test]
    fn groups_travel_through_the_log_and_resume_from_the_position() {
        let root = tempfile::tempdir().unwrap();
        let opts = WriterOptions {
            segment_size: 8192,
            ..Default::default()
        };
        let mut sink = ReplaySink::open(root.path().join("actor-2"), opts).unwrap();
        for i in 0..10 {
            assert_eq!(sink.send(&group(i, 7 + i)).unwrap(), i);
        }
        sink.flush().unwrap();
        let rd = ReaderOptions {
            max_batch: 4,
            ..Default::default()
        };
        let mut source = ReplaySource::open(root.path(), rd.clone(), None).unwrap();
        let first = source.recv(Duration::from_millis(10)).unwrap();
        assert_eq!(first.len(), 4);
        assert_eq!(first[0].group, group(0, 7));
        source.commit().unwrap();
        assert_eq!(
            cascade_replay::read_min_consumed(&root.path().join("actor-2")).unwrap(),
            Some(4)
        );
        let saved = serde_json::to_string(&source.position()).unwrap();
        let mut source =
            ReplaySource::open(root.path(), rd, Some(serde_json::from_str(&saved).unwrap()))
                .unwrap();
        let mut rest = Vec::new();
        while rest.len() < 6 {
            rest.extend(source.recv(Duration::from_millis(10)).unwrap());
        }
        let ids: Vec<u64> = rest.iter().map(|g| g.group.prompt_id).collect();
        assert_eq!(ids, (4..10).collect::<Vec<_>>());
    }

    #[test]
    fn an_unknown_format_version_is_a_clear_error_and_the_stream_goes_on() {
        let root = tempfile::tempdir().unwrap();
        let mut w =
            ReplayWriter::open(root.path().join("actor-0"), WriterOptions::default()).unwrap();
        let mut bad = group(0, 1).encode();
        bad[2] = 99;
        w.append(RecordMeta::default(), &group(1, 1).encode())
            .unwrap();
        w.append(RecordMeta::default(), &bad).unwrap();
        w.append(RecordMeta::default(), &group(2, 1).encode())
            .unwrap();
        let mut source = ReplaySource::open(root.path(), ReaderOptions::default(), None).unwrap();
        let ok = source.recv(Duration::from_millis(10)).unwrap();
        assert_eq!(ok.len(), 1);
        let err = source.recv(Duration::from_millis(10)).unwrap_err();
        assert!(
            err.to_string().contains("version 99 is not supported"),
            "{err}"
        );
        let after = source.recv(Duration::from_millis(10)).unwrap();
        assert_eq!(after[0].group.prompt_id, 2);
    }

    #[test]
    fn a_lost_cursor_is_reported_as_a_gap_and_reading_goes_on() {
        let root = tempfile::tempdir().unwrap();
        let opts = WriterOptions {
            segment_size: 4096,
            max_segments: 3,
            ..Default::default()
        };
        let mut sink = ReplaySink::open(root.path().join("actor-2"), opts).unwrap();
        let rd = ReaderOptions::default();
        let mut source = ReplaySource::open(root.path(), rd.clone(), None).unwrap();
        sink.send(&group(0, 1)).unwrap();
        sink.flush().unwrap();
        assert_eq!(source.recv(Duration::from_millis(10)).unwrap().len(), 1);
        let stale = source.position();
        // Another consumer reads on and commits: the writer recycles the old segments.
        let mut sent = 1;
        while cascade_replay::read_min_consumed(&root.path().join("actor-2"))
            .unwrap()
            .is_none_or(|c| c < 400)
        {
            sink.send(&group(sent, 1)).unwrap();
            sent += 1;
            sink.flush().unwrap();
            source.recv(Duration::ZERO).unwrap();
            source.commit().unwrap();
        }
        let mut late = ReplaySource::open(root.path(), rd, Some(stale)).unwrap();
        let mut got = Vec::new();
        while got.is_empty() {
            got = late.recv(Duration::from_millis(10)).unwrap();
        }
        let gaps = late.take_gaps();
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert_eq!(gaps[0].actor, "actor-2");
        assert_eq!(gaps[0].from_seq, 1);
        assert_eq!(
            got[0].seq, gaps[0].to_seq,
            "reading resumes at the oldest record on disk"
        );
        assert!(late.take_gaps().is_empty(), "reported once");
        // The position moves on with what is read after the gap.
        let mut position = Cursors::default();
        ReplaySource::advance(&mut position, &got[0]);
        assert_eq!(position.actors["actor-2"], got[0].mark);
    }
}
