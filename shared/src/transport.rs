//! Transport traits between actors and the learner, and their replay-log implementation.
