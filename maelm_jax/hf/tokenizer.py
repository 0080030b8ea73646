"""The run's SentencePiece model as a HuggingFace fast tokenizer with the same ids.

Built directly from the model's pieces and scores (a `tokenizers` Unigram model), not
through XLM-R's converter, which shifts every id by one for fairseq's dictionary: our
SentencePiece ids already are the model's ids (`<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3,
`<mask>`=4). SentencePiece's `nmt_nfkc` normalization is its precompiled character map
followed by whitespace cleanup (strip, collapse runs of spaces), reproduced here in that
order; byte fallback becomes the Unigram model's `byte_fallback`.

Text is cut at special tokens first and each section normalized alone, exactly as
`Tokenizer.encode_query` does: a section's trailing whitespace is dropped, and only the
first section, or one that starts with whitespace, gets the word-start "▁" (Metaspace
`prepend_scheme="first"`; the leading space itself becomes that "▁").

HF semantics for special tokens: the literal strings `<s>`, `</s>`, `<pad>`, `<unk>` and
`<mask>` in text become their ids (the fill-mask convention), and encoding adds
`<s> ... </s>` (RoBERTa's pair template `<s> A </s></s> B </s>` for pairs).
"""

from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as RustTokenizer

from maelm_jax.data.tokenizer import BOS_ID, EOS_ID, SPECIAL_PIECES, UNK_ID, Tokenizer


def _rust_tokenizer(proto: bytes) -> RustTokenizer:
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(proto)
    vocab = [(p.piece, p.score) for p in model.pieces]
    tok = RustTokenizer(models.Unigram(vocab, unk_id=UNK_ID, byte_fallback=True))
    spec = model.normalizer_spec
    steps = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:
        steps += [
            normalizers.Strip(left=False, right=True),
            normalizers.Replace(Regex(" {2,}"), " "),
        ]
    tok.normalizer = normalizers.Sequence(steps)
    scheme = "first" if spec.add_dummy_prefix else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1 if spec.add_dummy_prefix else 0, right=0),
        ]
    )
    tok.add_special_tokens(
        [
            AddedToken(piece, special=True, normalized=False, lstrip=piece == "<mask>")
            for piece in SPECIAL_PIECES
        ]
    )
    bos, eos = SPECIAL_PIECES[BOS_ID], SPECIAL_PIECES[EOS_ID]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, BOS_ID), (eos, EOS_ID)],
    )
    return tok


def hf_tokenizer(tokenizer: Tokenizer, max_length: int):
    """A `PreTrainedTokenizerFast` for `tokenizer`; `save_pretrained` writes tokenizer.json."""
    from transformers import PreTrainedTokenizerFast

    s = SPECIAL_PIECES
    return PreTrainedTokenizerFast(
        tokenizer_object=_rust_tokenizer(tokenizer.serialized()),
        bos_token=s[BOS_ID],
        eos_token=s[EOS_ID],
        cls_token=s[BOS_ID],
        sep_token=s[EOS_ID],
        pad_token=s[1],
        unk_token=s[UNK_ID],
        mask_token=AddedToken(s[4], lstrip=True, special=True, normalized=False),
        model_max_length=max_length,
        padding_side="right",
    )
