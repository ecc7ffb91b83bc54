"""The rules of transformers' `generate` that the package's own decoding loops follow, written once.

transformers' `generate` runs its loop for the eager and the static-cache paths (`compiled_decoding.py`); the
package's other engines run their own: the fused step (`fast_decoding.FastDecoding`), the onnxruntime decoders
(`hf_vit_plus.serving.onnx`) and CTranslate2 (`pipeline_text2text_generation.CTranslate2Generator`, which maps the
settings onto CTranslate2's options). Each reads the settings through `DecodingRules` and applies the per-token rules
through the functions here, so that they mean what they mean in `generate`:

- lengths: `max_length` counts the decoder start token (or the prompt), `max_new_tokens` the new tokens only; the
  minimum likewise (`min_length` / `min_new_tokens`: both apply, the larger wins), and only where there is an end
  token, as transformers' min-length processors;
- the logits processors of translation, in `generate`'s order (`process_scores`): single-token bad words, the
  minimum length, forced BOS at the first new token, forced EOS at the last;
- end of sequence and padding (`advance_greedy`): a row that produced an end token (or reached `max_length`) is
  finished, and a finished row gets the pad token (`pad_token_id`, else the first end token, else 0);
- beam search's filler (`beam_fill_value`: `pad_token_id or eos_token_id[0]`, -1 without either), its length
  penalty (`length_penalty_denominators`: `n ** length_penalty`, computed in Python as transformers does) and its
  bookkeeping (`beam_search_update`: the top continuations, the running and finished beams, the early stop).

The per-token functions work on tensors and are traced into the fused step's compiled graph. This module ships
with the checkpoints (remote code): it imports only torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NEG_INF = float("-inf")
# `generate`'s number of new tokens when neither max_length nor max_new_tokens is set (GenerationConfig's max_length
# 20 counts the decoder start token)
DEFAULT_MAX_LENGTH = 20


def token_ids(value) -> list[int]:
    """An id or a list of ids (a generation config's eos / forced-eos setting) as a list; None -> []."""
    if value is None:
        return []
    if torch.is_tensor(value):
        return [int(v) for v in value.flatten().tolist()]
    return [int(value)] if isinstance(value, int) else [int(v) for v in value]


@dataclass(frozen=True)
class DecodingRules:
    """The settings of one decoding call, resolved as `generate` resolves them (`from_generation_config`).

    Lengths count the decoder start token (encoder-decoder) or the prompt (`start_length`)."""

    eos_token_ids: tuple[int, ...]
    pad_token_id: int  # what finished rows get in greedy decoding
    beam_fill_value: int  # what beam search fills unfinished positions with
    max_length: int
    min_length: int  # 0: no minimum (always 0 without an end token)
    bad_token_ids: tuple[int, ...]  # single-token bad words, the end tokens left out (as generate does)
    forced_bos_token_id: int | None
    forced_eos_token_ids: tuple[int, ...]
    length_penalty: float
    early_stopping: bool | str
    num_beams: int
    num_return_sequences: int

    @classmethod
    def from_generation_config(cls, config, start_length: int = 1) -> DecodingRules:
        """The rules of `config` (a `GenerationConfig`) for sequences that start with `start_length` tokens.

        `max_new_tokens` / `min_new_tokens` win over `max_length` / `min_length` as in `generate` (which also rewrites
        `max_length` before a custom loop sees it: both spellings then agree)."""
        eos = token_ids(config.eos_token_id)
        pad = config.pad_token_id
        if pad is None and eos:
            pad = eos[0]  # generate's own fallback
        if config.max_new_tokens is not None:
            max_length = start_length + config.max_new_tokens
        else:
            max_length = config.max_length if config.max_length is not None else DEFAULT_MAX_LENGTH
        min_length = 0
        if eos:  # the min-length processors exist only with an end token
            min_length = config.min_length or 0
            if config.min_new_tokens:
                min_length = max(min_length, start_length + config.min_new_tokens)
        bad_words = config.bad_words_ids or []
        return cls(
            eos_token_ids=tuple(eos),
            pad_token_id=0 if pad is None else int(pad),
            beam_fill_value=pad if pad else (eos[0] if eos else -1),  # a pad id of 0 counts as missing there
            max_length=int(max_length),
            min_length=int(min_length),
            bad_token_ids=tuple(s[0] for s in bad_words if len(s) == 1 and s[0] not in eos),
            forced_bos_token_id=config.forced_bos_token_id,
            forced_eos_token_ids=tuple(token_ids(config.forced_eos_token_id)),
            length_penalty=1.0 if config.length_penalty is None else config.length_penalty,
            early_stopping=config.early_stopping,
            num_beams=config.num_beams or 1,
            num_return_sequences=config.num_return_sequences or 1,
        )

    def new_token_bounds(self, start_length: int = 1) -> tuple[int, int]:
        """(min, max) new tokens after `start_length` tokens."""
        return max(0, self.min_length - start_length), max(0, self.max_length - start_length)

    def controls(self, vocab_size: int, device) -> tuple:
        """The tensors `process_scores` and `advance_greedy` read, each (V,) float32: the bad-token bias (-inf at bad
        tokens, 0 elsewhere), the end-token flags (1 at end tokens, 0 elsewhere), the scores of a forced first token
        and of a forced last token (0 at the forced tokens, -inf elsewhere); and (min_length, max_length, has forced
        bos, has forced eos, early_stopping is True) as an int64 (5,) tensor.

        Flags and scores are float, not bool: a compiled step reads them in the same vector loop as the (R, V) scores,
        where inductor loads float vectors directly but bool ones element by element (`bench_seq2seq.py` measures
        the step)."""
        bad_bias = torch.zeros(vocab_size, device=device)
        bad_bias[list(self.bad_token_ids)] = NEG_INF
        eos = torch.zeros(vocab_size, device=device)
        eos[list(self.eos_token_ids)] = 1.0
        bos_forced = torch.full((vocab_size,), NEG_INF, device=device)
        if self.forced_bos_token_id is not None:
            bos_forced[self.forced_bos_token_id] = 0.0
        eos_forced = torch.full((vocab_size,), NEG_INF, device=device)
        eos_forced[list(self.forced_eos_token_ids)] = 0.0
        lengths = [
            self.min_length,
            self.max_length,
            int(self.forced_bos_token_id is not None),
            int(bool(self.forced_eos_token_ids)),
            int(self.early_stopping is True),
        ]
        return bad_bias, eos, bos_forced, eos_forced, torch.tensor(lengths, device=device)

    def length_penalty_denominators(self, total: int, device) -> torch.Tensor:
        """(2, total + 1): the length penalty's `n ** length_penalty` for n new tokens, and beam search's early-stop
        heuristic's denominator after n new tokens, computed in Python as transformers does."""
        penalty = self.length_penalty
        never = self.early_stopping == "never" and penalty > 0.0
        final = [1.0] + [n**penalty for n in range(1, total + 1)]
        heuristic = [1.0] + [((self.max_length - 1) if never else n) ** penalty for n in range(1, total + 1)]
        return torch.tensor([final, heuristic], dtype=torch.float32, device=device)


def process_scores(scores, cur_len, controls, ids=None):
    """transformers' logits processors of translation, in `generate`'s order, with the lengths as tensors: bad words,
    the minimum length, forced BOS at `cur_len == 1`, forced EOS at `cur_len == max_length - 1`.

    Args:
        scores: (R, V) scores of every token, or (R, k) scores of the tokens `ids`.
        cur_len: 0-d tensor, the length of the sequences so far (start token or prompt included).
        controls: `DecodingRules.controls`.
        ids: None, or (R, k) the tokens of the k scores of each row.

    Returns:
        The processed scores, shaped as `scores`.
    """
    bad_bias, eos_flags, bos_forced, eos_forced, lengths = controls
    if ids is not None:
        bad_bias, eos_flags, bos_forced, eos_forced = (t[ids] for t in (bad_bias, eos_flags, bos_forced, eos_forced))
    scores = scores + bad_bias
    scores = torch.where((eos_flags > 0) & (cur_len < lengths[0]), NEG_INF, scores)
    scores = torch.where((cur_len == 1) & (lengths[2] > 0), bos_forced, scores)
    return torch.where((cur_len == lengths[1] - 1) & (lengths[3] > 0), eos_forced, scores)


def advance_greedy(next_tokens, cur_len, unfinished, pad, controls):
    """End of sequence and padding after one greedy token: finished rows get `pad`; a row finishes on an end token
    or at `max_length`.

    Args:
        next_tokens: (R,) the tokens chosen for every row.
        cur_len: 0-d tensor, the length before these tokens.
        unfinished: (R,) int64, 1 where the row was still running.
        pad: 0-d tensor, the pad token (`DecodingRules.pad_token_id`).
        controls: `DecodingRules.controls`.

    Returns:
        The tokens appended (R,), the rows still unfinished (R,) int64, and whether any is (0-d bool).
    """
    eos_flags, lengths = controls[1], controls[4]
    next_tokens = next_tokens * unfinished + pad * (1 - unfinished)
    done = (eos_flags[next_tokens] > 0) | (cur_len + 1 >= lengths[1])
    unfinished = unfinished & ~done
    return next_tokens, unfinished, unfinished.any()


def beam_search_update(log_probs, cur_len, search, denominators, controls, keep: int, steps=None, topk=torch.topk):
    """One step of transformers' vectorised beam search (`_beam_search` without sampling), after the model's
    processed log-probabilities of the next token.

    Args:
        log_probs: (B x K, V) the processed log-probabilities of every running row (`process_scores`).
        cur_len: 0-d tensor, the length of the sequences so far (start token included).
        search: the running sequences (B, K, T), scores (B, K) and beam indices (B, K, T - 1) int32, the finished
            sequences, scores and beam indices, the finished flags (B, K) and the early-stop flags (B, 1).
        denominators: (2, T + 1) float32 (`DecodingRules.length_penalty_denominators`).
        controls: `DecodingRules.controls`.
        keep: candidates per source, `max(2, 1 + number of end tokens) x K`.
        steps: `torch.arange(T)` where the caller has it already (one fewer operation in a compiled step).
        topk: the top-k of the candidates, `topk(scores (B, K x V), keep) -> (values, indices)`, largest first, as
            `torch.topk` (the default) computes it; an engine may pass a faster kernel of the same result (the order
            of exactly equal scores, which `torch.topk` leaves unspecified, may differ).

    Returns:
        The new `search`, the row each running row continues (B x K,) int64 (the cache follows it), and whether the
        search is over (0-d bool).
    """
    (running, running_scores, running_indices, sequences, scores, indices, finished, improvable) = search
    batch, beams, total = running.shape
    rows = batch * beams
    steps = torch.arange(total, device=running.device) if steps is None else steps
    eos_flags, lengths = controls[1], controls[4]
    early_stopping = lengths[4] == 1  # early_stopping is True
    vocab = log_probs.shape[-1]
    log_probs = (log_probs.view(batch, beams, vocab) + running_scores[:, :, None]).view(batch, beams * vocab)

    # _get_top_k_continuations
    topk_log_probs, topk_indices = topk(log_probs, keep)
    topk_beams = topk_indices // vocab
    topk_ids = topk_indices % vocab
    topk_running = running.gather(1, topk_beams[:, :, None].expand(batch, keep, total))
    topk_running = torch.where(steps == cur_len, topk_ids[:, :, None], topk_running)
    offsets = torch.arange(batch, device=running.device).view(batch, 1) * beams
    topk_running_indices = running_indices.gather(1, topk_beams[:, :, None].expand(batch, keep, total - 1))
    topk_running_indices = torch.where(
        steps[: total - 1] == cur_len - 1, (topk_beams + offsets).to(torch.int32)[:, :, None], topk_running_indices
    )
    # the stopping criteria on the candidates: an eos token as the new token, or max_length reached
    hits = (eos_flags[topk_ids] > 0) | (cur_len + 1 >= lengths[1])  # (B, keep)

    # _get_running_beams_for_next_iteration
    topk_running_log_probs = topk_log_probs + hits.to(torch.float32) * -1.0e9
    next_indices = torch.topk(topk_running_log_probs, k=beams)[1]
    running = topk_running.gather(1, next_indices[:, :, None].expand(batch, beams, total))
    running_scores = topk_running_log_probs.gather(1, next_indices)
    running_indices = topk_running_indices.gather(1, next_indices[:, :, None].expand(batch, beams, total - 1))

    # _update_finished_beams
    just_finished = hits & (torch.arange(keep, device=hits.device) < beams)[None, :]
    candidate_scores = topk_log_probs / denominators[0].index_select(0, cur_len.view(1))
    full = torch.all(finished, dim=-1, keepdim=True) & early_stopping
    candidate_scores += full.to(torch.float32) * -1.0e9
    candidate_scores += (~improvable).to(torch.float32) * -1.0e9
    candidate_scores += (~just_finished) * -1.0e9
    merged_sequences = torch.cat((sequences, topk_running), dim=1)
    merged_scores = torch.cat((scores, candidate_scores), dim=1)
    merged_indices = torch.cat((indices, topk_running_indices), dim=1)
    merged_finished = torch.cat((finished, just_finished), dim=1)
    best = torch.topk(merged_scores, k=beams)[1]
    sequences = merged_sequences.gather(1, best[:, :, None].expand(batch, beams, total))
    scores = merged_scores.gather(1, best)
    indices = merged_indices.gather(1, best[:, :, None].expand(batch, beams, total - 1))
    finished = merged_finished.gather(1, best)

    # the row each running row continues (transformers reorders the cache by it)
    beam_idx = running_indices.view(rows, total - 1).gather(1, (cur_len - 1).view(1, 1).expand(rows, 1))

    # _check_early_stop_heuristic, at the length after this step
    best_running = running_scores[:, :1] / denominators[1].index_select(0, cur_len.view(1))
    worst_finished = torch.where(finished, torch.min(scores, dim=1, keepdim=True)[0], -1.0e9)
    improvable = improvable & torch.any(best_running > worst_finished, dim=-1, keepdim=True)
    # _beam_search_has_unfinished_sequences
    go_on = torch.any(improvable) & ~(torch.all(finished) & early_stopping) & ~torch.all(hits)
    search = (running, running_scores, running_indices, sequences, scores, indices, finished, improvable)
    return search, beam_idx.view(rows).long(), ~go_on


__all__ = ["NEG_INF", "DecodingRules", "advance_greedy", "beam_search_update", "process_scores", "token_ids"]
