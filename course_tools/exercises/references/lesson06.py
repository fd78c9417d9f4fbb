"""Exercises of lesson 06: the encoder's padding mask, a post-LN encoder block by hand, mean
pooling that ignores padding, BERT's weight names, and cosine similarity of contextual vectors;
five self-check questions and one experiment (which block of the real model, removed, changes the
sentence embeddings most).

Each exercise has random cases plus one on the real all-MiniLM-L6-v2 weights or file.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close, known_wrong
from course_tools.messages import N_, _
from course_utils.blocks import make_block
from course_utils.cpu_threads import torch_threads
from course_utils.encoder import (
    POSITION_IDS_KEY,
    SentenceEncoder,
    bert_key_to_encoder,
    load_minilm,
    mean_pool,
    minilm_dir,
)
from course_utils.encoder import extended_attention_mask as _extended_mask

EPS = 1e-12  # BERT's LayerNorm ε
REAL_SENTENCES = ["The cat walks.", "The animal didn't cross the street because it was too tired."]
PLAY_SENTENCES = ["She likes to play the piano every evening.",
                  "The kids play football in the park after school.",
                  "The actors rehearsed the play at the theatre."]


@functools.lru_cache(maxsize=1)
def _minilm() -> SentenceEncoder:
    return load_minilm()


def _random_mask(gen: torch.Generator, b: int, s: int) -> torch.Tensor:
    """(B, S) int64 mask of 1s then 0s; the first row is full, the others have random lengths >= 1."""
    lengths = torch.randint(1, s + 1, (b,), generator=gen)
    lengths[0] = s
    return (torch.arange(s) < lengths[:, None]).long()


# --- 1. the extended attention mask ---------------------------------------------------------------

def _mask_cases(gen: torch.Generator) -> list[Case]:
    return [Case(N_("attention_mask (B={b}, S={s}) of 1s and 0s", b=b, s=s), (_random_mask(gen, b, s),))
            for b, s in [(1, 4), (3, 6), (4, 9)]]


def _mask_hint(case: Case, got, expected) -> str | None:
    if not isinstance(got, torch.Tensor):
        return None
    if got.dtype != torch.bool:
        return _("return a bool tensor (True = may attend): compare with 1 or call .bool()")
    if got.shape == expected.shape and torch.equal(got, ~expected):
        return _("the mask is inverted: True marks the real tokens, which may be attended to")
    b, s = case.args[0].shape
    if got.shape == (b, 1, s, 1):
        return _("that masks queries; mask the keys: the key axis S is the last one, (B, 1, 1, S)")
    if got.shape == (b, s):
        return _("add two axes for heads and queries so it broadcasts to (B, H, T, S): mask[:, None, None, :]")
    return None


@exercise(cases=_mask_cases, hints=[_mask_hint])
def extended_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """attention_mask (B, S) with 1 at real tokens, 0 at padding -> bool (B, 1, 1, S), True = may attend."""
    return _extended_mask(attention_mask)


# --- 2. a post-LN encoder block -------------------------------------------------------------------

def _random_block_weights(gen: torch.Generator, d: int, f: int) -> dict[str, torch.Tensor]:
    def linear(name: str, d_in: int, d_out: int) -> dict[str, torch.Tensor]:
        return {f"{name}.weight": torch.randn(d_out, d_in, generator=gen) / math.sqrt(d_in),
                f"{name}.bias": 0.1 * torch.randn(d_out, generator=gen)}

    def norm(name: str) -> dict[str, torch.Tensor]:
        return {f"{name}.gamma": 1 + 0.3 * torch.randn(d, generator=gen),
                f"{name}.beta": 0.3 * torch.randn(d, generator=gen)}

    return {**linear("attn.W_Q", d, d), **linear("attn.W_K", d, d), **linear("attn.W_V", d, d),
            **linear("attn.W_O", d, d), **norm("norm1"), **linear("ffn.W_in", d, f),
            **linear("ffn.W_out", f, d), **norm("norm2")}


def _block_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, t, d, h in [(1, 3, 8, 2), (2, 5, 16, 4), (3, 6, 12, 3)]:
        x = torch.randn(b, t, d, generator=gen)
        cases.append(Case(N_("x (B={b}, T={t}, D={d}), H={h}, random weights, padded mask", b=b, t=t, d=d, h=h),
                          (x, _random_mask(gen, b, t), _random_block_weights(gen, d, 4 * d), h)))
    enc = _minilm()
    batch = enc.batch(REAL_SENTENCES)
    with torch.no_grad():
        x = enc.model.embeddings(batch.input_ids, batch.token_type_ids)
    weights = {k: v.detach().clone() for k, v in enc.model.blocks[0].state_dict().items()}
    b, t, d = x.shape
    cases.append(Case(N_("layer 0 of all-MiniLM-L6-v2 on 2 real sentences (B={b}, T={t}, D={d}), H=12", b=b, t=t, d=d),
                      (x, batch.attention_mask, weights, 12)))
    return cases


def _reference_block(x, attention_mask, weights, n_heads, norm_first=False, use_mask=True, activation="gelu"):
    d, f = x.shape[-1], weights["ffn.W_in.weight"].shape[0]
    block = make_block(d, n_heads, f, activation=activation, norm_first=norm_first, eps=EPS)
    block.load_state_dict(weights)
    with torch.no_grad():
        return block.eval()(x, mask=_extended_mask(attention_mask) if use_mask else None)


def _block_hint(case: Case, got, expected) -> str | None:
    x, mask, weights, h = case.args
    if close(got, _reference_block(x, mask, weights, h, norm_first=True)):
        return _("that is pre-LN (x + F(LN(x))); BERT is post-LN: LN(x + F(x)) after each sublayer")
    if close(got, _reference_block(x, mask, weights, h, use_mask=False)):
        return _("the padding leaks in: mask the padded keys (scores to -inf before the softmax)")
    if close(got, _reference_block(x, mask, weights, h, activation="gelu_tanh")):
        return _("that is GPT-2's tanh approximation of GELU; BERT uses the exact GELU (F.gelu without approximate)")
    return None


def _block_recipe(case: Case, got, expected) -> str:
    return (_("step by step: q, k, v = x @ W.T + b, split_heads into n_heads, scaled_dot_product_attention with the "
              "(B, 1, 1, S) mask of exercise 1, merge_heads, W_O; then F.layer_norm(x + that, eps=1e-12) with norm1; "
              "then W_out(F.gelu(W_in x)) and F.layer_norm(x + that) with norm2"))


@exercise(cases=_block_cases, hints=[_block_hint, _block_recipe])
def post_ln_encoder_block(x: torch.Tensor, attention_mask: torch.Tensor, weights: dict[str, torch.Tensor],
                          n_heads: int) -> torch.Tensor:
    """x (B, T, D), attention_mask (B, T), the block's weights by our names -> (B, T, D):
    x = LN1(x + MultiHeadAttention(x)), then LN2(x + W_out GELU(W_in x)), with LayerNorm ε = 1e-12."""
    return _reference_block(x, attention_mask, weights, n_heads)


# --- 3. mean pooling --------------------------------------------------------------------------------

def _pool_cases(gen: torch.Generator) -> list[Case]:
    return [Case(N_("hidden (B={b}, T={t}, D={d}), padded attention_mask (B, T)", b=b, t=t, d=d),
                 (torch.randn(b, t, d, generator=gen), _random_mask(gen, b, t)))
            for b, t, d in [(1, 4, 3), (3, 7, 5), (4, 10, 8)]]


def _pool_hint(case: Case, got, expected) -> str | None:
    hidden, mask = case.args
    m = mask.unsqueeze(-1).float()
    if close(got, hidden.mean(dim=1)):
        return _("you averaged the padding too: sum only the real tokens (multiply by the mask)")
    if close(got, (hidden * m).sum(dim=1)):
        return _("that is the sum of the real tokens; divide by how many there are (mask.sum over T)")
    if close(got, (hidden * m).sum(dim=1) / hidden.shape[1]):
        return _("divide by the number of real tokens, not by T (which counts the padding)")
    return None


@exercise(cases=_pool_cases, hints=[_pool_hint])
def masked_mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """hidden (B, T, D), attention_mask (B, T) -> (B, D): the mean of each sentence's real tokens."""
    return mean_pool(hidden, attention_mask)


# --- 4. BERT's weight names -------------------------------------------------------------------------

LAYER_PARTS = ["attention.self.query", "attention.self.key", "attention.self.value",
               "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
               "output.dense", "output.LayerNorm"]


def _layer_names(i: int) -> list[str]:
    return [f"encoder.layer.{i}.{part}.{kind}" for part in LAYER_PARTS for kind in ("weight", "bias")]


def _names_cases(gen: torch.Generator) -> list[Case]:
    from safetensors import safe_open

    layer = int(torch.randint(1, 6, (1,), generator=gen))
    with safe_open(str(minilm_dir() / "model.safetensors"), "pt") as f:
        in_file = [k for k in f.keys() if k != POSITION_IDS_KEY]
    # the grader takes at most 64 items per result: the file's names go in two halves
    late = tuple(f"encoder.layer.{i}." for i in (3, 4, 5))
    first, second = [k for k in in_file if not k.startswith(late)], [k for k in in_file if k.startswith(late)]
    return [Case(N_("the 16 tensor names of encoder layer 0"), (_layer_names(0),)),
            Case(N_("the 16 tensor names of another layer"), (_layer_names(layer),)),
            Case(N_("{len_first} names of the real model.safetensors: embeddings, pooler, layers 0-2",
                    len_first=len(first)), (first,)),
            Case(N_("{len_second} names of the real model.safetensors: layers 3-5", len_second=len(second)), (second,))]


def _names_hint(case: Case, got, expected) -> str | None:
    if not isinstance(got, (list, tuple)) or len(got) != len(expected):
        return _("return one name per input name, in the same order")
    for g, e in zip(got, expected, strict=True):
        if g == e:
            continue
        if isinstance(g, str) and g.replace("norm1", "#").replace("norm2", "norm1").replace("#", "norm2") == e:
            return (_("attention.output.LayerNorm is the first Add & Norm (norm1); output.LayerNorm, after the FFN, "
                      "is norm2"))
        if isinstance(g, str) and e.endswith((".gamma", ".beta")) and g.endswith((".weight", ".bias")):
            return _("our LayerNorm calls its weight gamma and its bias beta")
        return None
    return None


@exercise(cases=_names_cases, hints=[_names_hint])
def bert_layer_names(names: list[str]) -> list[str]:
    """BERT tensor names -> our parameter names, e.g. 'encoder.layer.3.attention.self.query.weight'
    -> 'blocks.3.attn.W_Q.weight' (see the mapping table in the lesson)."""
    return [bert_key_to_encoder(name) for name in names]


# --- 5. cosine similarity of contextual vectors -------------------------------------------------

def _play_vectors() -> torch.Tensor:
    enc = _minilm()
    batch = enc.batch(PLAY_SENTENCES)
    hidden = enc.token_vectors(batch)
    rows = [tokens.index("play") for tokens in batch.tokens]
    return hidden[torch.arange(len(rows)), torch.tensor(rows)]


def _similarity_cases(gen: torch.Generator) -> list[Case]:
    cases = [Case(f"a (N={n}, D={d}), b (M={m}, D={d})",
                  (3 * torch.randn(n, d, generator=gen), torch.randn(m, d, generator=gen) + 1))
             for n, m, d in [(1, 1, 4), (3, 5, 8), (6, 4, 16)]]
    play = _play_vectors()
    cases.append(Case(N_("the contextual vectors of 'play' in 3 real sentences, against themselves"), (play, play)))
    return cases


def _similarity_hint(case: Case, got, expected) -> str | None:
    a, b = case.args
    if close(got, a @ b.T):
        return _("those are dot products; divide by both lengths (normalise the rows first)")
    if isinstance(got, torch.Tensor) and got.shape == expected.T.shape != expected.shape:
        return _("the result is (N, M): rows for a, columns for b")
    if close(got, F.normalize(a, dim=0) @ F.normalize(b, dim=0).T):
        return _("normalise each vector (each row, dim=-1), not each feature column")
    return None


@exercise(cases=_similarity_cases, hints=[_similarity_hint])
def contextual_similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (N, D), b (M, D) -> (N, M): cos(a_i, b_j) = a_i · b_j / (|a_i| |b_j|)."""
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


# --- self-check questions ------------------------------------------------------------------------

@question(explain=N_("with 6 heads each of the 384 numbers of a token goes to one of 6 heads of 384 / 6 = 64, and "
                     "the head axis moves before T: (B, H, T, d_k) = (2, 6, 7, 64)."),
          hints=[known_wrong({
              (2, 12, 7, 32): N_("that is the real model's 12 heads; with 6 heads each one is 384 / 6 = 64 wide"),
              (2, 7, 6, 64): N_("the head axis goes before T, so that each head is a batch of its own: (B, H, T, d_k)"),
              (2, 6, 7, 384): N_("the heads share the 384 numbers of a token: each gets d_model / H = 64"),
              (2, 6, 7, 32): N_("fewer heads means wider heads: 384 / 6 = 64, not 32"),
          })])
def six_head_queries_shape() -> tuple:
    """The shape of the queries after split_heads in all-MiniLM-L6-v2's width (D = 384) cut into 6 heads
    instead of 12, for B = 2 sentences of T = 7 tokens."""
    return (2, 6, 7, 384 // 6)


BLOCK_ORDERS = {"a": "x + F(LN(x))", "b": "x + LN(F(x))", "c": "LN(F(x))", "d": "LN(x + F(x))"}


@question(explain=N_("BERT, like the 2017 paper, is post-LN: each sublayer's output is added to its input and the "
                     "sum is normalised, LN(x + F(x))."),
          hints=[known_wrong({
              "a": N_("(a) is pre-LN, GPT-2's order (lesson 04): x + F(LN(x)); BERT normalises after the addition"),
              "b": N_("(b) normalises only the sublayer's output; BERT normalises the sum x + F(x)"),
              "c": N_("(c) has no residual connection: the block's input must be added back before the norm"),
          })])
def bert_block_order() -> str:
    """Multiple choice: which order of operations is BERT's encoder block."""
    return next(k for k, rule in BLOCK_ORDERS.items() if rule == "LN(x + F(x))")


MINILM_PARAMETERS = 22_713_216  # printed by the lesson: embeddings, 6 blocks, pooler


def _minilm_block_parameters() -> int:
    with torch.device("meta"):
        block = make_block(384, 12, d_ff=1536, norm_first=False)
    return sum(p.numel() for p in block.parameters())


@question(explain=N_("one block holds 4·384² + 4·384 (attention) + 2·384·1,536 + 1,536 + 384 (FFN) + 4·384 (two "
                     "LayerNorms) = 1,774,464; six more blocks add 10,646,784 to 22,713,216: 33,360,000."),
          hints=[known_wrong({
              2 * MINILM_PARAMETERS: N_("the embeddings (over half of the model) and the pooler do not double: only "
                                        "the blocks are added"),
              MINILM_PARAMETERS + 6 * 1_772_928: N_("each block also has two LayerNorms of 2·384 parameters"),
              MINILM_PARAMETERS + 12 * 1_774_464: N_("the model already has 6 blocks: 6 more make 12"),
          })])
def twelve_block_parameters() -> int:
    """The parameters of all-MiniLM-L6-v2 with 12 blocks instead of 6, everything else unchanged."""
    return MINILM_PARAMETERS + 6 * _minilm_block_parameters()


@question(explain=N_("only the real tokens count: (1 + 2 + 3 + 6) / 4 = 3; the padded positions count neither in the "
                     "sum nor in the divisor."),
          atol=1e-3,
          hints=[known_wrong({
              4: N_("that averages the padding too: (12 + 0 + 12) / 6; leave the [PAD] positions out"),
              2: N_("you summed the real tokens but divided by all 6 positions: divide by the 4 real ones"),
              12: N_("that is the sum of the real tokens; divide by how many there are"),
          })])
def pooled_first_coordinate() -> float:
    """The first coordinate of the mean-pooled embedding of 4 real tokens (1, 2, 3, 6) and 2 [PAD] (0, 12)."""
    return 3.0


@question(explain=N_("an encoder has no causal mask: every token attends to every token, so token 2's vector depends "
                     "on token 5 (the lesson's 'cat' changed with the last word)."),
          hints=[known_wrong({
              "b": N_("GPT's causal mask lets token 2 see only tokens 0, 1 and 2"),
              "c": N_("T5's decoder self-attention is causal too; only its cross-attention sees a whole input (the "
                      "encoder's)"),
              "d": N_("the encoder has no causal mask: in BERT every token sees every other token"),
          })])
def sees_later_tokens() -> str:
    """Multiple choice: in which model can token 2's vector depend on token 5 of the same input."""
    return "a"


# --- experiment ----------------------------------------------------------------------------------

EXPERIMENT_DOCUMENTS = [
    "A man is playing a guitar on stage.",
    "The new movie is a thriller set in space.",
    "Stock markets fell sharply on Monday.",
    "The chef cooked pasta with fresh tomatoes.",
    "Heavy rain is expected across the north tomorrow.",
    "The striker scored twice in the final.",
    "Scientists found water ice on the moon.",
    "Our cat sleeps on the sofa all afternoon.",
    "The central bank raised interest rates again.",
    "She baked bread for the whole family.",
]


@torch.no_grad()
def block_removal_similarities() -> list[float]:
    """For each block i, the mean cosine similarity between the documents' sentence embeddings without
    block i (its input passed straight to block i + 1) and with all blocks."""
    enc = _minilm()
    batch = enc.batch(EXPERIMENT_DOCUMENTS)
    mask = _extended_mask(batch.attention_mask)
    states = enc.layer_vectors(batch)  # states[i]: the input of block i

    def embed(x: torch.Tensor) -> torch.Tensor:
        return F.normalize(mean_pool(x, batch.attention_mask), dim=-1)

    full, sims = embed(states[-1]), []
    for i in range(len(enc.model.blocks)):
        x = states[i]
        for block in enc.model.blocks[i + 1:]:
            x = block(x, mask=mask)
        sims.append(float((embed(x) * full).sum(-1).mean()))
    return sims


@question(explain=N_("without the last block the embeddings keep a cosine similarity of about 0.46 with the real "
                     "ones, without any other block 0.81 or more: the sentence embedding was trained on the last "
                     "block's output, and the middle blocks each add a small residual change."),
          hints=[known_wrong({
              1: N_("block 1 is among those whose removal changes the least: did you take the highest similarity, or "
                    "stop the loop at the removed block (that removes every later block too)?"),
              2: N_("block 2 is among those whose removal changes the least: the question asks for the lowest "
                    "similarity to the full model's embeddings"),
              0: N_("removing block 0 changes the embeddings (about 0.81), but removing another block changes them "
                    "more: measure all six"),
              6: N_("the blocks are numbered 0 to 5, as in model.blocks"),
          })])
def most_changing_block() -> int:
    """Experiment: the block of all-MiniLM-L6-v2 whose removal (its input passed on unchanged) moves the
    mean-pooled sentence embeddings of ten documents the most (lowest mean cosine similarity)."""
    with torch_threads(1):  # small batches: on busy shared cores more threads only slow the grader down
        sims = block_removal_similarities()
    return min(range(len(sims)), key=sims.__getitem__)
