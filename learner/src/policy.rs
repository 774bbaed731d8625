//! The one thing the learner needs from a language model: per-token log-probabilities.

use candle_core::Tensor;

/// A causal LM the learner can train. `cascade_shared::model::CausalLm` implements it with a
/// one-line forward; tests use small stand-in models.
pub trait PolicyModel {
    /// `log p(input_ids[:, i + 1] | input_ids[:, ..= i])` for every position.
    ///
    /// * `input_ids`: `(b, t)` u32.
    /// * `attention_mask`: `(b, t)` u8, 1 on real tokens, 0 on padding (left or right).
    ///
    /// Returns `(b, t - 1)` f32. Values at padded positions are arbitrary but finite; the learner
    /// masks them out.
    fn token_logprobs(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> candle_core::Result<Tensor>;

    /// The same log-probs of the tempered distribution `softmax(logits / T_b)`, one temperature
    /// per row: what the actors' samplers report as behaviour log-probs. Models without
    /// temperature support accept only `T = 1`.
    fn token_logprobs_at(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        temperatures: &[f32],
    ) -> candle_core::Result<Tensor> {
        if temperatures.iter().all(|&t| t == 1.0) {
            return self.token_logprobs(input_ids, attention_mask);
        }
        Err(candle_core::Error::Msg(
            "this policy model computes log-probs at temperature 1 only".into(),
        ))
    }

    /// [`PolicyModel::token_logprobs_at`] at the positions `selected` `(n)` u32 of the
    /// flattened `(b, t - 1)` grid only (the ones that carry a loss), returned as `(n)` f32.
    /// A model can run its LM head there alone; by default the full grid is computed and
    /// gathered.
    fn token_logprobs_at_selected(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        temperatures: &[f32],
        selected: &Tensor,
    ) -> candle_core::Result<Tensor> {
        self.token_logprobs_at(input_ids, attention_mask, temperatures)?
            .flatten_all()?
            .index_select(selected, 0)
    }
}

impl PolicyModel for cascade_shared::model::CausalLm {
    fn token_logprobs(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
    ) -> candle_core::Result<Tensor> {
        cascade_shared::model::CausalLm::token_logprobs(self, input_ids, Some(attention_mask))
            .map_err(candle_core::Error::wrap)
    }

    fn token_logprobs_at(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        temperatures: &[f32],
    ) -> candle_core::Result<Tensor> {
        cascade_shared::model::CausalLm::token_logprobs_at(
            self,
            input_ids,
            Some(attention_mask),
            temperatures,
        )
        .map_err(candle_core::Error::wrap)
    }

    fn token_logprobs_at_selected(
        &self,
        input_ids: &Tensor,
        attention_mask: &Tensor,
        temperatures: &[f32],
        selected: &Tensor,
    ) -> candle_core::Result<Tensor> {
        cascade_shared::model::CausalLm::token_logprobs_at_selected(
            self,
            input_ids,
            Some(attention_mask),
            temperatures,
            selected,
        )
        .map_err(candle_core::Error::wrap)
    }
}
