"""Exercises of lesson 10: cross-attention, a post-LN decoder block, the teacher-forcing loss on the
shifted target, one greedy step, one beam-search step, and the decoder's two masks; five self-check
questions and one experiment (how many memory positions one changed digit moves, with and without
the encoder's self-attention).

The hints name the usual mistakes (unmasked padding, pre-LN for post-LN, no shift, parent and token
swapped, ...); where an answer matches none, the last hint of a function exercise gives the recipe.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close as _close
from course_tools.exercises.references._shared import known_wrong
from course_tools.messages import N_, _
from course_utils import encoder_decoder
from course_utils.attention import causal_mask, merge_heads, scaled_dot_product_attention, split_heads
from course_utils.sino_korean import DIGIT_VOCAB, HANGUL_VOCAB, make_pairs, read_number

PAD = encoder_decoder.PAD


def _keep(gen: torch.Generator, B: int, S: int) -> torch.Tensor:
    """(B, S) True at real tokens: the first row full, the others of random length >= 1."""
    lengths = torch.randint(1, S + 1, (B,), generator=gen)
    lengths[0] = S
    return torch.arange(S)[None] < lengths[:, None]


def _w(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) / math.sqrt(shape[0])


# ------------------------------------------------------------------ cross-attention

def _attend(q_in, kv_in, w, n_heads, prefix="", keep=None, causal=False, scale=True):
    """Multi-head attention from the library's pieces, with matrices as x @ W: queries from q_in,
    keys/values from kv_in; ``scale=False`` undoes the 1/√d_k (a usual mistake the hints look for)."""
    q, k, v = (split_heads(x @ w[prefix + name], n_heads)
               for x, name in ((q_in, "W_Q"), (kv_in, "W_K"), (kv_in, "W_V")))
    if not scale:
        q = q * math.sqrt(q.shape[-1])
    mask = None if keep is None else keep[:, None, None, :]
    if causal:
        order = causal_mask(q_in.shape[1], kv_in.shape[1])
        mask = order if mask is None else mask & order
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    return merge_heads(out) @ w[prefix + "W_O"]


def _cross_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, t, s, d, h in [(1, 1, 1, 4, 1), (2, 5, 4, 8, 2), (3, 6, 7, 12, 3)]:
        w = {name: _w(gen, d, d) for name in ("W_Q", "W_K", "W_V", "W_O")}
        cases.append(Case(N_("x (B={b}, T={t}, D={d}), memory (B={b}, S={s}, D={d}), n_heads={h}, padded sources",
                             b=b, t=t, d=d, s=s, h=h),
                          (torch.randn(b, t, d, generator=gen), torch.randn(b, s, d, generator=gen),
                           _keep(gen, b, s), w, h)))
    return cases


def _cross_hint(case: Case, got, expected) -> str | None:
    x, memory, keep, w, h = case.args
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return (_("the output has the decoder's length T: queries come from x, keys and values from memory")
                if isinstance(got, torch.Tensor) else None)
    if not bool(keep.all()) and _close(got, _attend(x, memory, w, h)):
        return _("padded source positions were attended to: mask the scores where src_keep is False, before the "
                 "softmax")
    if _close(got, _attend(x, memory, w, h, keep=keep, scale=False)):
        return _("scale the scores by 1/√d_k, with d_k = D / n_heads")
    return None


@exercise(cases=_cross_cases, hints=[_cross_hint])
def cross_attention(x: torch.Tensor, memory: torch.Tensor, src_keep: torch.Tensor,
                    weights: dict[str, torch.Tensor], n_heads: int) -> torch.Tensor:
    """x (B, T, D) from the decoder, memory (B, S, D) from the encoder, src_keep (B, S) True at real
    source tokens -> (B, T, D). Q = x W_Q, K = memory W_K, V = memory W_V (each (D, D), as x @ W),
    split into heads of D / n_heads, softmax(QKᵀ/√d_k) with padded keys masked, heads merged, @ W_O."""
    return _attend(x, memory, weights, n_heads, keep=src_keep)


# ------------------------------------------------------------------ a post-LN decoder block

def _ln(h, w, i):
    return F.layer_norm(h, h.shape[-1:], w[f"ln{i}_gamma"], w[f"ln{i}_beta"], 1e-5)


def _decoder_block(x, memory, keep, w, h, norm_first=False, causal=True, cross_mask=True):
    def self_attn(z):
        return _attend(z, z, w, h, "self_", causal=causal)

    def cross_attn(z):
        return _attend(z, memory, w, h, "cross_", keep=keep if cross_mask else None)

    def ffn(z):
        return F.relu(z @ w["W_in"]) @ w["W_out"]

    if norm_first:
        x = x + self_attn(_ln(x, w, 1))
        x = x + cross_attn(_ln(x, w, 2))
        return x + ffn(_ln(x, w, 3))
    x = _ln(x + self_attn(x), w, 1)
    x = _ln(x + cross_attn(x), w, 2)
    return _ln(x + ffn(x), w, 3)


def _block_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, t, s, d, h in [(1, 1, 2, 4, 1), (2, 4, 5, 8, 2), (2, 6, 3, 12, 3)]:
        w = {f"{kind}_{name}": _w(gen, d, d) for kind in ("self", "cross") for name in ("W_Q", "W_K", "W_V", "W_O")}
        w.update({"W_in": _w(gen, d, 4 * d), "W_out": _w(gen, 4 * d, d)})
        for i in (1, 2, 3):
            w[f"ln{i}_gamma"] = 1 + 0.3 * torch.randn(d, generator=gen)
            w[f"ln{i}_beta"] = 0.3 * torch.randn(d, generator=gen)
        cases.append(Case(N_("x (B={b}, T={t}, D={d}), memory (B={b}, S={s}, D={d}), n_heads={h}", b=b, t=t, d=d,
                             s=s, h=h),
                          (torch.randn(b, t, d, generator=gen), torch.randn(b, s, d, generator=gen),
                           _keep(gen, b, s), w, h)))
    return cases


def _block_hint(case: Case, got, expected) -> str | None:
    x, memory, keep, w, h = case.args
    if _close(got, _decoder_block(x, memory, keep, w, h, norm_first=True)):
        return _("that is pre-LN (x + F(LN(x))); the 2017 block is post-LN: x = LN(x + F(x)) after each sublayer")
    if x.shape[1] > 1 and _close(got, _decoder_block(x, memory, keep, w, h, causal=False)):
        return _("the self-attention needs the causal mask: syllable t must not see the syllables after it")
    if not bool(keep.all()) and _close(got, _decoder_block(x, memory, keep, w, h, cross_mask=False)):
        return _("the cross-attention must not look at padded source positions (mask with src_keep)")
    return (_("one way: for each sublayer in turn, h = F.layer_norm(x + sublayer(x), (D,), gamma_i, beta_i, 1e-5); "
              "the cross-attention's keys and values come from memory, its queries from x"))


@exercise(cases=_block_cases, hints=[_block_hint])
def decoder_block(x: torch.Tensor, memory: torch.Tensor, src_keep: torch.Tensor,
                  weights: dict[str, torch.Tensor], n_heads: int) -> torch.Tensor:
    """A post-LN (2017) decoder block, no biases: x = LN1(x + SelfAttn_causal(x)),
    x = LN2(x + CrossAttn(x, memory)), x = LN3(x + FFN(x)), FFN(z) = ReLU(z W_in) W_out.

    ``weights`` has self_W_Q ... self_W_O, cross_W_Q ... cross_W_O (D, D), W_in (D, 4D), W_out (4D, D),
    ln{1,2,3}_gamma / _beta (D,); LayerNorm eps 1e-5. x (B, T, D), memory (B, S, D) -> (B, T, D)."""
    return _decoder_block(x, memory, src_keep, weights, n_heads)


# ------------------------------------------------------------------ the shifted target and its loss

def _target(gen: torch.Generator, B: int, T: int, V: int) -> torch.Tensor:
    """<s> y ... </s> <pad>...: rows of random lengths, ids 3.. for the syllables."""
    tgt = torch.randint(3, V, (B, T), generator=gen)
    tgt[:, 0] = encoder_decoder.BOS
    for b in range(B):
        end = T - 1 if b == 0 else int(torch.randint(1, T, (1,), generator=gen))
        tgt[b, end] = encoder_decoder.EOS
        tgt[b, end + 1:] = PAD
    return tgt


def _loss_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, t, v in [(1, 3, 6), (3, 6, 9), (4, 9, 20)]:
        tgt = _target(gen, b, t, v)
        cases.append(Case(N_("logits (B={b}, T={t_1}, V={v}), tgt (B={b}, T={t}) with padding", b=b, t_1=t - 1, v=v,
                             t=t),
                          (2 * torch.randn(b, t - 1, v, generator=gen), tgt)))
    return cases


def _loss_hint(case: Case, got, expected) -> str | None:
    logits, tgt = case.args
    if not isinstance(got, (torch.Tensor, float)) or (isinstance(got, torch.Tensor) and got.numel() != 1):
        return _("return a scalar tensor")
    got, V = float(got), logits.shape[-1]
    flat = logits.reshape(-1, V)
    if math.isclose(got, float(F.cross_entropy(flat, tgt[:, 1:].reshape(-1))), rel_tol=1e-4):
        return _("<pad> positions were scored: ignore target id 0 (ignore_index=0)")
    if math.isclose(got, float(F.cross_entropy(flat, tgt[:, :-1].reshape(-1), ignore_index=PAD)), rel_tol=1e-4):
        return _("not shifted: the logits at position t predict tgt[:, t + 1], so compare with tgt[:, 1:]")
    return (_("one way: F.cross_entropy(logits.reshape(-1, V), tgt[:, 1:].reshape(-1), ignore_index=0) averages over "
              "the positions that are not <pad>"))


@exercise(cases=_loss_cases, hints=[_loss_hint])
def seq2seq_loss(logits: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """tgt (B, T) is <s> y1 ... yn </s> <pad>...; the decoder read tgt[:, :-1] and returned logits
    (B, T − 1, V). Return the mean cross-entropy of predicting tgt[:, 1:], ignoring <pad> (id 0)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1), ignore_index=PAD)


# ------------------------------------------------------------------ one greedy step

def _greedy_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, v in [(1, 5), (4, 9), (6, 20)]:
        done = torch.rand(b, generator=gen) < 0.5
        done[0] = False
        cases.append(Case(N_("logits (B={b}, V={v}), done (B={b})", b=b, v=v),
                          (torch.randn(b, v, generator=gen), done)))
    return cases


def _greedy_hint(case: Case, got, expected) -> str | None:
    logits, done = case.args
    if isinstance(got, torch.Tensor) and bool(done.any()) and torch.equal(got, logits.argmax(-1)):
        return _("a sequence that already wrote </s> must get <pad> (id 0), not another syllable")
    return None


@exercise(cases=_greedy_cases, hints=[_greedy_hint])
def greedy_step(logits: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """logits (B, V) at the last position, done (B,) True for sequences that already ended -> the
    next ids (B,): the arg-max, or <pad> (0) where done."""
    return logits.argmax(-1).masked_fill(done, PAD)


# ------------------------------------------------------------------ one beam-search step

def _beam_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, k, v, any_done in [(1, 2, 4, False), (2, 3, 7, False), (3, 4, 9, True)]:
        log_probs = F.log_softmax(2 * torch.randn(b, k, v, generator=gen), -1)
        scores = -3 * torch.rand(b, k, generator=gen)
        done = (torch.rand(b, k, generator=gen) < 0.4) if any_done else torch.zeros(b, k, dtype=torch.bool)
        label = N_("log_probs (B={b}, K={k}, V={v}), scores (B={b}, K={k}), some beams done", b=b, k=k, v=v) \
            if any_done else f"log_probs (B={b}, K={k}, V={v}), scores (B={b}, K={k})"
        cases.append(Case(label, (log_probs, scores, done, k)))
    return cases


def _beam_hint(case: Case, got, expected) -> str | None:
    log_probs, scores, done, k = case.args
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return _("return a tuple (scores, parent, token)")
    B, K, V = log_probs.shape
    top = log_probs.reshape(B, K * V).topk(k, -1)
    if _close(got[0], top.values):
        return _("add each beam's score so far to its log-probabilities before choosing the best extensions")
    if isinstance(got[1], torch.Tensor) and torch.equal(got[1], expected[2]) and torch.equal(got[2], expected[1]):
        return _("parent and token are swapped: flat index i is parent i // V, token i % V")
    if bool(done.any()):
        return _("a finished beam may only extend with <pad> (log-probability 0), every other token −∞")
    return (_("one way: total = scores[..., None] + log_probs, flattened to (B, K·V); topk(beam_size) gives the "
              "scores and flat indices i, with parent = i // V and token = i % V"))


@exercise(cases=_beam_cases, hints=[_beam_hint])
def beam_step(log_probs: torch.Tensor, scores: torch.Tensor, done: torch.Tensor,
              beam_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One beam-search step for B sources with K beams. log_probs (B, K, V) of the next token, scores
    (B, K) summed log-probabilities so far, done (B, K) finished beams (they extend only with <pad>,
    id 0, at no cost). Return the beam_size best of the K·V extensions, best first: (new scores
    (B, beam_size), parent beam (B, beam_size), token (B, beam_size))."""
    return encoder_decoder.beam_step(log_probs, scores, done, beam_size)


# ------------------------------------------------------------------ the decoder's masks

def _mask_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, s, t in [(1, 3, 1), (2, 5, 4), (4, 7, 6)]:
        src = torch.randint(3, 13, (b, s), generator=gen) * _keep(gen, b, s)
        cases.append(Case(N_("src ids (B={b}, S={s}) with <pad> = 0 at the end, T={t}", b=b, s=s, t=t), (src, t)))
    return cases


def _mask_hint(case: Case, got, expected) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 2 or not all(isinstance(g, torch.Tensor) for g in got):
        return _("return a tuple of two bool tensors (self_mask, cross_mask)")
    self_mask, cross_mask = got
    if self_mask.shape == expected[0].shape and torch.equal(self_mask, expected[0].T) and case.args[1] > 1:
        return _("the causal mask is transposed: query t (row) may see keys s ≤ t (columns), i.e. tril")
    if cross_mask.shape == expected[1].shape and torch.equal(cross_mask, ~expected[1]):
        return _("True must mean 'may attend' (a real source token), not 'padding'")
    if cross_mask.numel() == expected[1].numel() and cross_mask.shape != expected[1].shape:
        return _("shape the cross mask (B, 1, 1, S) so it broadcasts over heads and target positions")
    return None


@exercise(cases=_mask_cases, hints=[_mask_hint])
def decoder_masks(src: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two masks of a decoder, True = may attend. src (B, S) source ids with <pad> = 0; T target
    positions. Returns (self_mask (T, T): causal, query t sees keys 0..t; cross_mask (B, 1, 1, S):
    True at real source tokens, broadcastable to the cross-attention scores (B, H, T, S))."""
    return torch.ones(T, T, dtype=torch.bool).tril(), (src != PAD)[:, None, None, :]


# ------------------------------------------------------------------ self-check questions

@question(explain=N_("one weight per (query, key) pair in each head: the queries are the decoder's T = 6 positions, "
                     "the keys the encoder's S = 4 digits, so (B, H, T, S) = (2, 4, 6, 4)."),
          hints=[known_wrong({
              (2, 4, 6, 6): (N_("that is the decoder's self-attention (T × T); the keys of cross-attention are the S "
                                "= 4 digits")),
              (2, 4, 4, 6): N_("rows are queries, and the queries come from the decoder: (B, H, T, S), not (B, H, S, "
                               "T)"),
              (2, 4, 4, 4): (N_("that is the encoder's self-attention (S × S); the queries come from the decoder's T "
                                "= 6 positions")),
              (2, 6, 4): N_("each head has its own weights: the H = 4 axis stays"),
          })])
def cross_weights_shape() -> tuple:
    """The shape of the cross-attention weights for B = 2, H = 4, T = 6 target and S = 4 source positions."""
    return (2, 4, 6, 4)


CROSS_MASK_OPTIONS = {"a": "source padding", "b": "causal", "c": "both", "d": "none"}


@question(explain=N_("the whole source is known before the first syllable, so nothing is hidden for causality; only "
                     "the padded source positions must get no weight."),
          hints=[known_wrong({
              "b": (N_("the causal mask hides later *target* tokens; every source digit is already known, and "
                       "padding must still be masked")),
              "c": N_("no causal mask is needed in cross-attention: the source is complete before decoding starts"),
              "d": N_("padded source positions would then take weight: the padding mask is needed"),
          })])
def cross_mask_choice() -> str:
    """Multiple choice: which mask(s) the decoder's cross-attention needs."""
    return next(k for k, v in CROSS_MASK_OPTIONS.items() if v == "source padding")


@question(explain=N_("the decoder reads <s> 이 천 이 십 육 (6 positions) and each predicts the next token: the 5 "
                     "syllables and </s>."),
          hints=[known_wrong({
              5: N_("</s> is predicted too: the model must learn where the reading ends"),
              7: N_("<s> is only ever read, never predicted: 6 inputs, 6 predictions"),
              1: N_("teacher forcing scores every position in the same pass, not only the last one"),
          })])
def predictions_scored() -> int:
    """How many predictions one teacher-forcing pass scores for the reading 이천이십육."""
    return 6


@question(explain=N_("every one of the 7 beams of each of the 3 sources is extended by every one of the 20 tokens: 3 "
                     "× 7 × 20 = 420 candidates, of which the 7 best per source are kept."),
          hints=[known_wrong({
              140: N_("that is one source; the batch holds 3, each with its own 7 beams"),
              21: N_("21 beams are kept (7 per source), but each is extended by all 20 tokens to choose them"),
              60: N_("each of the 7 beams is extended, not only one per source"),
              30: N_("the candidates multiply (each beam × each token), they do not add"),
          })])
def batched_beam_candidates() -> int:
    """Candidates scored in one beam-search step for a batch of 3 sources, 7 beams each, 20 target tokens."""
    return 3 * 7 * 20


@question(explain=N_("101010 is 10 in the 만 group and 1010 in the last: 십만 (a lone 1 before 십 is silent), "
                     "a space because more follows, then 천십 (lone 1s before 천 and 십 are silent too); the zeros "
                     "are silent."),
          hints=[known_wrong({
              "십만천십": N_("a space follows a 만 group when more follows: 십만, space, 천십"),
              "십만 일천일십": N_("a 1 before 십, 백 or 천 is silent: 1010 is 천십"),
              "일십만 일천일십": N_("a 1 before 십, 백 or 천 is silent: 10 0000 is 십만 and 1010 is 천십"),
              "십만 천": N_("the last group is 1010: 천, then 십 for the 1 in the tens"),
              "만 천십": N_("that is 11010; 101010 has ten 만"),
          })])
def reading_101010() -> str:
    """The Sino-Korean reading of 101010 in the lesson's spacing convention."""
    return read_number(101010)


# ------------------------------------------------------------------ the experiment

def _moved_positions(n_encoder_layers: int, seed: int = 0) -> int:
    """Memory positions that move when the first digit of 3040526 becomes 9, in an untrained model."""
    torch.manual_seed(seed)
    model = encoder_decoder.EncoderDecoder(encoder_decoder.Seq2SeqConfig(
        len(DIGIT_VOCAB), len(HANGUL_VOCAB), 24, 24, d_model=64, n_heads=4,
        n_encoder_layers=n_encoder_layers)).eval()
    src, _ = make_pairs([3040526, 9040526], "read")
    with torch.no_grad():
        memory = model.transformer.encode(model.src_embedding(src), src != PAD)
    return int(((memory[0] - memory[1]).abs().amax(-1) > 1e-6).sum())


@question(explain=N_("without encoder blocks memory position s is LayerNorm(embedding + position) of digit s alone, "
                     "so only position 0 moves; one self-attention block already lets every position take in the "
                     "changed digit, so with two blocks all 7 move."),
          hints=[known_wrong({
              (1, 1): N_("with 2 blocks the other positions move too: their self-attention reads the changed digit"),
              (7, 7): N_("with no encoder block nothing mixes: memory s depends on digit s and its position only"),
              (0, 7): N_("the changed digit's own memory position moves as well: count it"),
              (1, 2): N_("self-attention reads every position at once: one block already reaches all 7, not one "
                         "neighbour"),
              (0, 0): N_("compare the memories position by position with a small tolerance (1e-6): some move"),
          })])
def changed_positions() -> tuple:
    """Experiment: (memory positions moved by changing the first digit with 0 encoder blocks, with 2)."""
    return (_moved_positions(0), _moved_positions(2))
